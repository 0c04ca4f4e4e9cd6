"""A GGUF's quantized blocks kept exactly in the int4 graphs (export/target/quant/blocks.py): every
GGUF type against gguf's own dequantization, then tiny GGUFs written by the gguf package exported
and read back from the engine folder."""

import numpy as np
import pytest

pytest.importorskip("torch")
gguf = pytest.importorskip("gguf")

from helpers.gguf_rows import MIXED, STORED, export_manifest, ggufs_own_rows  # noqa: E402
from tiny import GGUF_LINEARS, assert_rows_bitwise_alike, make_tiny_gguf  # noqa: E402

from edgespec.export.target.quant.blocks import DECODERS, concat, decode  # noqa: E402

HF_LINEARS = {  # GGUF kind -> the HF parameter it becomes
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}


@pytest.mark.parametrize("type_name", sorted(DECODERS))
def test_every_type_decodes_to_ggufs_own_dequantization_bitwise(type_name):
    """Random bytes (any d, any code; NaN scales included) decode to the bits gguf.quants gives."""
    qtype = gguf.GGMLQuantizationType[type_name]
    per_block, type_size = gguf.GGML_QUANT_SIZES[qtype]
    raw = np.random.default_rng(0).integers(0, 256, (6, 2 * type_size), dtype=np.uint8)
    b = decode(raw, type_name)
    with np.errstate(invalid="ignore", over="ignore"):
        ours, theirs = b.dequantized(), gguf.quants.dequantize(raw, qtype)
    assert np.array_equal(ours, theirs, equal_nan=True), (type_name, np.nanmax(np.abs(ours - theirs)))
    assert b.codes.shape == (6, 2 * per_block) and int(b.codes.max()) < 2**b.bits
    assert b.scales.shape == b.zero_points.shape == (6, 2 * per_block // b.block_size)


def test_concatenated_rows_keep_every_parts_weights():
    """q, k, v of three types in one packed linear: the widest layout (8 bits, blocks of 16, mins)
    holds each part's weights bitwise."""
    rng = np.random.default_rng(1)
    parts = []
    for t in ("Q4_K", "Q6_K", "Q8_0"):
        qtype = gguf.GGMLQuantizationType[t]
        per_block, type_size = gguf.GGML_QUANT_SIZES[qtype]
        raw = rng.integers(0, 256, (4, 256 // per_block * type_size), dtype=np.uint8)  # rows of 256 inputs
        parts.append(decode(raw, t))
    b = concat(parts)
    assert (b.bits, b.block_size, b.mins is not None, b.source) == (8, 16, True, "Q4_K+Q6_K+Q8_0")
    with np.errstate(invalid="ignore", over="ignore"):
        assert np.array_equal(b.dequantized(), np.concatenate([p.dequantized() for p in parts]), equal_nan=True)


def _stored_weights(m, name: str) -> np.ndarray:
    """What the graph's MatMulNBits (+ block mins) multiplies by for linear `name`, from the folder."""
    import onnx

    from edgespec.engines.session import read_weight

    node = next(
        n
        for n in onnx.load(m.path("target.onnx"), load_external_data=False).graph.node
        if n.name.endswith(f"{name}/MatMulNBits")
    )
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    bits, bs, n_out, n_in = attrs["bits"], attrs["block_size"], attrs["N"], attrs["K"]
    nb = n_in // bs

    def weight(suffix):
        return np.asarray(read_weight(m, m.target, m.target.weights[name + suffix]))

    codes, scales = weight(f".q{bits}").reshape(n_out, nb, -1), weight(".scales").reshape(n_out, nb)
    zp = weight(".zp")
    if bits == 4:
        codes = np.stack([codes & 0x0F, codes >> 4], axis=-1).reshape(n_out, nb, bs)
        zp = np.stack([zp & 0x0F, zp >> 4], axis=-1).reshape(n_out, -1)[:, :nb]
    w = (codes.astype(np.float32) - zp.reshape(n_out, nb)[..., None]) * scales[..., None]
    if name + ".mins" in m.target.weights:
        w = w + weight(".mins").T[..., None]
    return w.reshape(n_out, n_in)


@pytest.mark.parametrize(
    "name, types",
    [
        ("q4_1", dict.fromkeys(GGUF_LINEARS, "Q4_1")),  # the default model's type
        ("q4_0_q8_0", dict.fromkeys(GGUF_LINEARS, "Q4_0") | {"attn_v": "Q8_0", "ffn_down": "Q8_0"}),
        ("mixed", MIXED),
    ],
)
def test_gguf_blocks_are_kept_exactly_and_rows_stay_bitwise(name, types, tmp_path):
    src = make_tiny_gguf(tmp_path / f"{name}.gguf", types, tied="output" not in types)
    m = export_manifest(src, tmp_path / name, two_row_matmuls="on")
    origins = m.target.weight_origins
    assert origins and all(o.exact for o in origins), origins
    assert {o.kind: o.source for o in origins}["self_attn.q_proj"] == types["attn_q"]
    for layer in range(m.target.n_layers):
        for stored, kinds in STORED.items():
            theirs = np.concatenate([ggufs_own_rows(src, k, layer, 4, 2) for k in kinds])
            assert np.array_equal(_stored_weights(m, f"l{layer}.{stored}"), theirs), (name, layer, stored)
    assert max(m.target.validation.values()) < 3.0
    assert_rows_bitwise_alike(m, name)


def test_kept_blocks_rows_bitwise_in_the_portable_graph(tmp_path):
    src = make_tiny_gguf(tmp_path / "m.gguf", MIXED, tied=False)
    assert_rows_bitwise_alike(export_manifest(src, tmp_path / "p", graph="portable", two_row_matmuls="off"), "portable")


def test_float_parts_are_requantized_beside_kept_ones_and_the_report_says_so(tmp_path, capsys):
    src = make_tiny_gguf(tmp_path / "f.gguf", dict.fromkeys(GGUF_LINEARS, "Q4_0") | {"attn_v": "F16", "ffn_up": "F32"})
    m = export_manifest(src, tmp_path / "f", progress=True)  # the report is printed with the progress
    by_kind = {o.kind: o for o in m.target.weight_origins}
    assert by_kind["self_attn.v_proj"].stored == "int4 (re-quantized)" and not by_kind["self_attn.v_proj"].exact
    assert by_kind["self_attn.q_proj"].exact and by_kind["mlp.gate_proj"].exact and not by_kind["mlp.up_proj"].exact
    q_rows = 4 * 64  # the packed qkv: its q rows are the GGUF's, its v rows re-quantized
    assert np.array_equal(_stored_weights(m, "l0.qkv")[:q_rows], ggufs_own_rows(src, "attn_q", 0, 4, 2))
    err = capsys.readouterr().err
    assert "kept self_attn.q_proj" in " ".join(err.split()) and "re-quantized self_attn.v_proj F16" in " ".join(
        err.split()
    )


def test_8_bit_blocks_need_int8_activations_and_fp32_keeps_every_value(tmp_path):
    src = make_tiny_gguf(tmp_path / "q8.gguf", dict.fromkeys(GGUF_LINEARS, "Q8_0"))
    m = export_manifest(src, tmp_path / "a0", int4_accuracy_level=0)
    body = [o for o in m.target.weight_origins if o.kind not in ("lm_head", "model.embed_tokens")]  # fp32 head
    assert {(o.stored, o.why) for o in body} == {("int4 (re-quantized)", "8-bit blocks need --int4-accuracy-level 4")}
    m = export_manifest(src, tmp_path / "fp32", precision="fp32")
    assert {(o.source, o.stored, o.exact) for o in m.target.weight_origins} == {("Q8_0", "fp32", True)}


def test_greedy_output_of_kept_blocks_is_the_same_plain_and_speculative(tmp_path):
    """Speculative greedy output equals plain greedy output on the kept-block graphs (the rule), and
    the int4 graph picks the fp32 graph's tokens (the same GGUF weights, int8 activations)."""
    from edgespec.runtime.config import RuntimeConfig
    from edgespec.runtime.generator import Generator

    src = make_tiny_gguf(tmp_path / "g.gguf", dict.fromkeys(GGUF_LINEARS, "Q4_1"))
    int4 = Generator.load(export_manifest(src, tmp_path / "i", draft="self:1").folder, RuntimeConfig(drafter="none"))
    fp32 = Generator.load(export_manifest(src, tmp_path / "f", precision="fp32").folder, RuntimeConfig(drafter="none"))
    prompt = int4.codec.encode("def add(a, b):\n    return a + b\n\ndef add(a, b):\n")

    def ids(g, drafter, k=3):
        g.set_drafter(drafter, k=k)
        return [int(t) for c in g.generate_ids(prompt, 48) for t in c]

    plain = ids(int4, "none")
    assert len(plain) == 48 and max(plain) < 256
    for drafter in ("ngram", "draft"):
        assert ids(int4, drafter) == plain, drafter
    reference = ids(fp32, "none")
    assert sum(a == b for a, b in zip(plain, reference, strict=True)) >= 40, (plain, reference)


def test_requantize_gives_the_old_int4_blocks_and_says_why(tmp_path):
    src = make_tiny_gguf(tmp_path / "r.gguf", dict.fromkeys(GGUF_LINEARS, "Q4_1"))
    m = export_manifest(src, tmp_path / "r", gguf_blocks="requantize")
    assert {(o.stored, o.why) for o in m.target.weight_origins if o.kind not in ("lm_head", "model.embed_tokens")} == {
        ("int4 (re-quantized)", "--gguf-blocks requantize")
    }
    assert not any(name.endswith(".mins") for name in m.target.weights)
