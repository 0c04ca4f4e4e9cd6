"""Folders close to the checkpoint's bytes (issue 52, item 1): the embedding kept as the checkpoint
stores it (a tied LM head's GGUF blocks read at lookup, or fp16 / bf16), GGUF's fp16 block scales and
minimums kept in fp16; every kept layout's rows bitwise the checkpoint's (gguf's own
dequantization) and the NumPy reference's."""

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")

from tiny import GGUF_LINEARS, make_tiny_gguf  # noqa: E402

from edgespec.engines import rowop  # noqa: E402
from edgespec.export.target.quant.blocks import decode  # noqa: E402

LAYOUTS = ("Q4_0", "Q4_1", "Q4_K", "Q5_K", "Q6_K", "Q8_0")
needs_op = pytest.mark.skipif(bool(rowop.unavailable()), reason=f"row kernel: {rowop.unavailable()}")


def _table(type_name: str, rows: int = 48, width: int = 256, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(a GGUF tensor's raw rows [rows, bytes], gguf's dequantization of them [rows, width])."""
    rng = np.random.default_rng(seed)
    qtype = gguf.GGMLQuantizationType[type_name]
    if type_name.endswith("_K"):  # gguf-py cannot quantize K-quants: random blocks, small fp16 scales
        per_block, size = gguf.GGML_QUANT_SIZES[qtype]
        raw = rng.integers(0, 256, (rows * width // per_block, size), dtype=np.uint8)
        at = {"Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,)}[type_name]
        for off in at:
            d = rng.uniform(1e-4, 1e-3, len(raw)).astype(np.float16)
            raw[:, off : off + 2] = d.reshape(-1, 1).view(np.uint8)
        raw = raw.reshape(rows, -1)
    else:
        raw = gguf.quants.quantize(rng.normal(0, 0.05, (rows, width)).astype(np.float32), qtype)
    return raw, gguf.quants.dequantize(raw, qtype)


@needs_op
@pytest.mark.parametrize("type_name", LAYOUTS)
def test_row_gather_is_ggufs_rows_bitwise_in_numpy_the_library_and_the_op(type_name):
    """RowGather (the embedding read from a tied head packed for the row kernel) gives gguf's own
    rows: the NumPy reference, the library and the op in a session agree bitwise."""
    import onnx
    from onnx import TensorProto, helper
    from tiny import rowop_session

    raw, want = _table(type_name)
    b = decode(raw, type_name)
    assert np.array_equal(b.dequantized(), want)
    p = rowop.pack(b.codes, b.scales, b.zero_points, b.mins, b.bits, b.block_size)
    ids = np.array([[0, 5, 47, 5, 16, 17, 31]], np.int64)
    back = rowop.unpack(p.data, p.attrs)
    assert np.array_equal(rowop.gather_reference(ids, back), want[ids])
    assert np.array_equal(rowop.gather(ids, p), want[ids])
    node = helper.make_node(rowop.GATHER_TYPE, ["ids", "w"], ["y"], domain=rowop.DOMAIN, **p.attrs)
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, [1, "T"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, "T", want.shape[1]])],
        initializer=[helper.make_tensor("w", TensorProto.UINT8, p.data.shape, p.data.tobytes(), raw=True)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(rowop.DOMAIN, 1)])
    onnx.checker.check_model(model)
    for path in [q for q in rowop.PATHS if rowop.cpu_runs(q)]:
        got = rowop_session(model, path).run(None, {"ids": ids})[0]
        assert np.array_equal(got, want[ids]), path
    with pytest.raises(rowop.RowopUnavailable):
        rowop.gather(np.array([48]), p)  # an id past the table


def _embedding_rows(m, ids: np.ndarray) -> np.ndarray:
    """The exported target graph's embedding lookup run on its own (its /embed/ nodes and the
    weights they read from the folder)."""
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    from edgespec.engines.session import read_weight

    g = onnx.load(m.path(m.target.graph.file), load_external_data=False).graph
    nodes = [n for n in g.node if n.name.startswith("/embed/")]
    names = {i for n in nodes for i in n.input}
    inits = [
        numpy_helper.from_array(np.asarray(read_weight(m, m.target, m.target.weights[i.name])), i.name)
        if i.data_location == TensorProto.EXTERNAL
        else i
        for i in g.initializer
        if i.name in names
    ]
    out = nodes[-1].output[0]
    graph = helper.make_graph(
        nodes,
        "embed",
        [helper.make_tensor_value_info("input_ids", TensorProto.INT64, [1, "T"])],
        [helper.make_tensor_value_info(out, TensorProto.FLOAT, None)],
        initializer=inits,
    )
    domains = {n.domain for n in nodes if n.domain}
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17)] + [helper.make_opsetid(d, 1) for d in domains]
    )
    so = ort.SessionOptions()
    if rowop.DOMAIN in domains:
        rowop.register(so)
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(
        None, {"input_ids": ids}
    )[0]


def _ggufs_table(path) -> np.ndarray:
    r = gguf.GGUFReader(str(path))
    t = next(t for t in r.tensors if t.name == "token_embd.weight")
    return gguf.quants.dequantize(t.data, t.tensor_type)


@pytest.mark.parametrize(
    "embd, kernel, shared",
    [
        ("Q8_0", "nbits", True),  # the default model's layout: the 8-bit MatMulNBits head's codes
        ("Q6_K", "rowop", True),  # Llama 3.2's: the packed head (RowGather)
        ("Q4_K", "rowop", True),
        ("F16", "nbits", False),  # an fp16 table, kept fp16 (the head re-quantized: not its rows)
    ],
)
def test_a_tied_heads_blocks_are_the_embedding_and_rows_stay_the_checkpoints(embd, kernel, shared, tmp_path):
    from helpers.gguf_rows import export_manifest
    from tiny import assert_rows_bitwise_alike

    if kernel == "rowop" and rowop.unavailable():
        pytest.skip(rowop.unavailable())
    types = dict.fromkeys(GGUF_LINEARS, "Q4_1") | {"token_embd": embd}
    src = make_tiny_gguf(tmp_path / "m.gguf", types, tied=True)
    m = export_manifest(src, tmp_path / "e", int4_kernel=kernel, eagle="none", medusa="none")
    embed = next(o for o in m.target.weight_origins if o.kind == "model.embed_tokens")
    assert embed.exact, embed
    if shared:
        assert "embed" not in m.target.weights and "tied LM head" in embed.stored, embed
    else:
        assert m.target.weights["embed"].dtype == "float16", embed
    ids = np.array([[0, 1, 2, 255, 7, 7, 128]], np.int64)
    assert np.array_equal(_embedding_rows(m, ids)[0], _ggufs_table(src)[ids[0]])
    if kernel == "nbits":  # GGUF's fp16 block scales and minimums stay fp16
        assert m.target.weights["l0.gate_up.scales"].dtype == "float16"
    else:  # a K-quant head packed as its own codes (layout 2, recorded)
        assert "sub-scale codes" in next(o for o in m.target.weight_origins if o.kind == "lm_head").stored
        assert m.target.rowop_layout == rowop.LAYOUT_VERSION
    assert max(m.target.validation.values()) < 3.0
    assert_rows_bitwise_alike(m, embd)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_a_drafter_reads_the_targets_narrow_table_in_place(dtype, tiny_models, tmp_path):
    """An fp16 (bf16) checkpoint's table is stored fp16 (bf16) once; the EAGLE head's graph reads it
    from target.weights through the target's own lookup (validated against its PyTorch head)."""
    import torch
    from tiny import tiny_eagle_head
    from transformers import AutoModelForCausalLM

    from edgespec.engines.manifest import load_manifest
    from edgespec.export.target.exporter import ExportConfig, export

    src = tmp_path / dtype
    AutoModelForCausalLM.from_pretrained(tiny_models["llama"]).to(getattr(torch, dtype)).save_pretrained(src)
    for f in tiny_models["llama"].iterdir():
        if "token" in f.name:
            (src / f.name).write_bytes(f.read_bytes())
    head_dir, _, _ = tiny_eagle_head(src, tmp_path / "head", draft_vocab=48)
    kw = dict(max_len=128, k=3, prefill_chunk=16, kv_bucket=32, precision="fp32", progress=False)
    m = load_manifest(export(ExportConfig(target=str(src), eagle=str(head_dir), out=str(tmp_path / "e"), **kw)))
    assert m.target.weights["embed"].dtype == dtype
    eagle = m.models()["eagle"]
    assert eagle.weights["embed"].file == "target.weights" and eagle.weights["embed"].dtype == dtype
    assert max(eagle.validation.values()) < 2e-3


def _logits(m, toks: np.ndarray) -> np.ndarray:
    """The target's logits of a prefill of toks[:16], then of toks[16:] one by one."""
    from edgespec.engines.ort import OrtModel

    e = OrtModel(m, m.target)
    rows = [e.forward(toks[:16], 0).copy()]
    e.commit(0, 16)
    for i in range(16, len(toks)):
        rows.append(e.forward(toks[i : i + 1], i).copy())
        e.commit(i, 1)
    return np.concatenate(rows)


@pytest.mark.parametrize("tied", [True, False])
def test_a_bf16_table_is_stored_bf16_and_the_logits_are_the_fp32_tables_bitwise(tied, tmp_path, monkeypatch):
    """A bfloat16 HF checkpoint's table (Llama 3.2's, Gemma 3's) is stored bf16, half the fp32 table's
    bytes, and cast to fp32 at lookup (the Gather; a tied head's Gemm reads it cast): the streamed and
    the transformers folder give the logits of the same export with the fp32 table, bit for bit."""
    import torch
    from tiny import make_tiny
    from transformers import AutoModelForCausalLM

    from edgespec.engines.manifest import load_manifest
    from edgespec.export.target.exporter import ExportConfig, export
    from edgespec.export.target.quant import linears
    from edgespec.export.target.sources import weight_source

    checked = []  # the streamed export's bytes checked against the checkpoint's (the bf16 table's too)
    check = weight_source.check_floats
    monkeypatch.setattr(weight_source, "check_floats", lambda *a: checked.append(check(*a)))
    src = make_tiny("llama", tmp_path / "src", tie_word_embeddings=tied)
    AutoModelForCausalLM.from_pretrained(src).to(torch.bfloat16).save_pretrained(src)
    kw = dict(target=str(src), max_len=128, k=2, prefill_chunk=16, kv_bucket=32, precision="fp32", progress=False)
    kw |= dict(trees=False)
    streamed = load_manifest(export(ExportConfig(out=str(tmp_path / "s"), **kw)))
    loaded = load_manifest(export(ExportConfig(out=str(tmp_path / "t"), stream_weights="off", validate=False, **kw)))
    assert len(checked) == 1  # one streamed export
    assert (tmp_path / "s/target.weights").read_bytes() == (tmp_path / "t/target.weights").read_bytes()
    monkeypatch.setattr(linears, "NARROW_EMBED", linears.NARROW_EMBED[:1])  # fp16 only: the table stays fp32
    fp32 = load_manifest(export(ExportConfig(out=str(tmp_path / "f"), validate=False, **kw)))
    assert fp32.target.weights["embed"].dtype == "float32"
    toks = np.random.default_rng(2).integers(0, 256, 20)
    want = _logits(fp32, toks)
    for m in (streamed, loaded):
        embed = next(o for o in m.target.weight_origins if o.kind == "model.embed_tokens")
        assert embed.exact and embed.stored == "bf16 (every value exactly a bf16; fp32 at lookup)", embed
        w = m.target.weights["embed"]
        assert w.dtype == "bfloat16" and w.nbytes * 2 == fp32.target.weights["embed"].nbytes
        assert m.files["target.weights"].size < fp32.files["target.weights"].size
        assert np.array_equal(_logits(m, toks), want)
    assert max(streamed.target.validation.values()) < 1e-3, streamed.target.validation


@needs_op
@pytest.mark.parametrize("type_name, bits", [("Q4_K", 4), ("Q5_K", 5), ("Q6_K", 6)])
def test_k_quants_keep_their_codes_and_every_path_computes_the_same_bits(type_name, bits):
    """A K-quant packed as its own codes (5/6-bit unpacked in the kernel, sub-scale codes under fp16
    super-block scales): about the GGUF's bytes, its rows gguf's, and on every path the result of
    the NumPy reference and of the layout before (8-bit codes, fp32 d x sc) bit for bit."""
    raw, want = _table(type_name, rows=40, width=512)
    b = decode(raw, type_name)
    p = rowop.pack(b.codes, b.scales, b.zero_points, b.mins, b.bits, b.block_size, sub=b.sub)
    assert (p.attrs["bits"], p.attrs["sub"]) == (bits, 1)
    per_weight = {"Q4_K": 4.625, "Q5_K": 5.625, "Q6_K": 6.5625}[type_name]  # GGUF: 4.5, 5.5, 6.5625
    assert p.data.nbytes == 48 * 512 * per_weight / 8  # 3 panels of 16 outputs (40 rows padded)
    choices = rowop.pack_choices(b.scales, b.zero_points, b.mins)  # without the codes' widths: layout 1
    before = rowop.pack(b.codes, b.scales, b.zero_points, b.mins, b.bits, b.block_size, choices)
    assert (before.attrs["bits"], before.attrs["sub"]) == (b.bits, 0)
    back = rowop.unpack(p.data, p.attrs)
    assert np.array_equal(back.codes, b.codes) and np.array_equal(back.scales, before.scales)
    assert (back.mins is None and before.mins is None) or np.array_equal(back.mins, before.mins)
    ids = np.array([0, 5, 39, 16, 17], np.int64)
    assert np.array_equal(rowop.gather_reference(ids, back), want[ids])
    assert np.array_equal(rowop.gather(ids, p), want[ids])
    x = np.random.default_rng(4).standard_normal((9, 512)).astype(np.float32)
    x[2, :32] = 0.0  # an all-zero block
    ref = rowop.reference(x, back)
    assert np.array_equal(ref, rowop.reference(x, before))
    for path in [q for q in rowop.PATHS if rowop.cpu_runs(q)]:
        assert np.array_equal(rowop.matmul(x, p, path), ref), path
        assert np.array_equal(rowop.matmul(x, before, path), ref), path


def _untied_gguf(tmp_path, embd: str):
    types = dict.fromkeys(GGUF_LINEARS, "Q4_1") | {"token_embd": embd, "output": "Q6_K"}
    return make_tiny_gguf(tmp_path / "m.gguf", types, tied=False)


def _no_own_blocks(monkeypatch):
    """The row kernel's lookup as before: the untied table stored as floats (fp32 here)."""
    from edgespec.export.target.quant import row_linears

    monkeypatch.setattr(row_linears.RowLinears, "reads_embedding_blocks", lambda self: False)


@needs_op
@pytest.mark.parametrize("embd, stream", [("Q4_K", "auto"), ("Q8_0", "auto"), ("Q4_K", "off")])
def test_an_untied_quantized_table_is_read_from_its_own_blocks(embd, stream, tmp_path, monkeypatch):
    """Issue 52 on Llama 3.1 8B's layout: an untied Q4_K (Q8_0) embedding beside its own Q6_K head is
    packed as its GGUF blocks and read at lookup by RowGather (no float "embed"), streamed or loaded
    through transformers; the logits of a prefill and decodes are the fp32 table's bit for bit."""
    from helpers.gguf_rows import export_manifest

    from edgespec.engines.session import read_weight
    from edgespec.export.target.graph import store

    src = _untied_gguf(tmp_path, embd)
    kw = dict(int4_kernel="rowop", eagle="none", medusa="none", stream_weights=stream)
    monkeypatch.setattr(store, "CHUNK_BYTES", 1000)  # packed in row blocks of 16 rows
    m = export_manifest(src, tmp_path / "e", **kw)
    monkeypatch.undo()
    t = next(t for t in gguf.GGUFReader(str(src)).tensors if t.name == "token_embd.weight")
    b = decode(np.asarray(t.data).reshape(256, -1), embd)
    whole = rowop.pack(b.codes, b.scales, b.zero_points, b.mins, b.bits, b.block_size, sub=b.sub)
    assert np.array_equal(np.asarray(read_weight(m, m.target, m.target.weights["embed.rowop"])), whole.data)
    embed = next(o for o in m.target.weight_origins if o.kind == "model.embed_tokens")
    assert embed.exact and embed.source == embd and embed.stored.endswith("(rows read at lookup)"), embed
    assert "embed" not in m.target.weights and "embed.rowop" in m.target.weights
    if embd == "Q4_K":
        assert embed.stored.startswith("int4 codes + sub-scale codes + block mins"), embed
    ids = np.array([[0, 1, 2, 255, 7, 7, 128]], np.int64)
    assert np.array_equal(_embedding_rows(m, ids)[0], _ggufs_table(src)[ids[0]])
    _no_own_blocks(monkeypatch)
    f = export_manifest(src, tmp_path / "f", validate=False, **kw)
    assert f.target.weights["embed"].dtype == "float32" and "embed.rowop" not in f.target.weights
    assert m.files["target.weights"].size < f.files["target.weights"].size - f.target.weights["embed"].nbytes / 2
    toks = np.random.default_rng(2).integers(0, 256, 20)
    assert np.array_equal(_logits(m, toks), _logits(f, toks))
    assert max(m.target.validation.values()) < 3.0, m.target.validation


@needs_op
def test_a_drafter_reads_an_untied_tables_own_blocks_in_place(tmp_path, monkeypatch):
    """An EAGLE head's graph reads the target's embedding through the target's own lookup: RowGather
    of "embed.rowop" in target.weights; validated against its PyTorch head, it differs by the same
    bits as the same int4 head reading the fp32 table."""
    from helpers.gguf_rows import export_manifest
    from tiny import tiny_eagle_head
    from transformers import AutoModelForCausalLM

    src = _untied_gguf(tmp_path, "Q4_K")
    hf = tmp_path / "hf"
    loaded = AutoModelForCausalLM.from_pretrained(str(tmp_path), gguf_file=src.name)
    loaded.hf_quantizer = None  # dequantized float32 weights: saved as a plain checkpoint
    loaded.save_pretrained(hf)
    head_dir, _, _ = tiny_eagle_head(hf, tmp_path / "head", draft_vocab=48)
    m = export_manifest(src, tmp_path / "e", int4_kernel="rowop", eagle=str(head_dir), medusa="none", trees=False)
    assert "embed" not in m.target.weights
    eagle = m.models()["eagle"]
    assert eagle.weights["embed.rowop"].file == "target.weights" and "embed" not in eagle.weights
    _no_own_blocks(monkeypatch)  # the same head reading an fp32 table: its validation the same bits
    f = export_manifest(src, tmp_path / "f", int4_kernel="rowop", eagle=str(head_dir), medusa="none", trees=False)
    assert f.models()["eagle"].weights["embed"].file == "target.weights"
    assert eagle.validation == f.models()["eagle"].validation and max(eagle.validation.values()) < 0.1
