"""Model families beyond Llama/Qwen: tiny random Granite, Phi-3 and SmolLM3 models exported fp32 in
both flavours, checked against transformers (validation and greedy ids), row parity, and
speculative == plain for the n-gram, suffix and self:1 drafters."""

import numpy as np
import pytest

pytest.importorskip("torch")

from tiny import GEMMA3_FIELDS, assert_rows_bitwise_alike, make_tiny  # noqa: E402

from edgespec.engines.manifest import load_manifest  # noqa: E402
from edgespec.export.target.arch import UnsupportedModelError, arch_from_config  # noqa: E402
from edgespec.export.target.exporter import ExportConfig, export  # noqa: E402
from edgespec.runtime.config import RuntimeConfig  # noqa: E402
from edgespec.runtime.generator import Generator  # noqa: E402

# each family with the config fields that make it differ from Llama set away from their neutral value
FAMILIES = {
    "granite": dict(embedding_multiplier=4.0, residual_multiplier=0.5, attention_multiplier=0.4, logits_scaling=2.0),
    "phi3": dict(),  # fused qkv_proj and gate_up_proj in the checkpoint
    "smollm3": dict(no_rope_layers=[0, 1]),  # layer 0 (the self:1 draft) without rope, layer 1 with
    # layer 0 (the self:1 draft) sliding with a window the prompt and a prefill chunk cross, layer 1
    # full; rope bases apart, the score scale not 1/sqrt(head_dim), random norms (their 1 + w folded)
    "gemma3_text": GEMMA3_FIELDS,
}
PROMPT = "hello hello world, hello world again and again; hello"
N_NEW = 40


@pytest.fixture(scope="module")
def family_models(tmp_path_factory):
    root = tmp_path_factory.mktemp("families")
    return {mt: make_tiny(mt, root / mt, **kw) for mt, kw in FAMILIES.items()}


def _hf_greedy(src, ids: list[int], n: int) -> list[int]:
    """n greedy tokens of the HF model itself (no EOS stop)."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32).eval()
    seq = list(ids)
    with torch.no_grad():
        for _ in range(n):
            logits = model(torch.tensor([seq])).logits[0, -1]
            seq.append(int(logits.argmax()))
    return seq[len(ids) :]


def _ids(g, n, drafter, k=4):
    g.set_drafter(drafter, k) if drafter != "none" else g.set_drafter("none")
    return [int(t) for c in g.generate_ids(g.codec.encode(PROMPT), n) for t in c]


@pytest.mark.parametrize("graph", ["portable", "lean"])
@pytest.mark.parametrize("family", list(FAMILIES))
def test_family_exports_matches_transformers_and_keeps_the_rule(family, graph, family_models, tmp_path):
    src = family_models[family]
    folder = export(
        ExportConfig(
            target=str(src),
            out=str(tmp_path / "e"),
            draft="self:1",
            max_len=128,
            k=4,
            prefill_chunk=16,
            kv_bucket=32,
            precision="fp32",
            graph=graph,
            progress=False,
        )
    )
    m = load_manifest(folder)
    for role in ("target", "draft"):  # ORT vs PyTorch, per phase width
        diffs = m.models()[role].validation
        assert diffs and max(diffs.values()) < 1e-4, (role, diffs)
    assert_rows_bitwise_alike(m, f"{family}/{graph}")

    g = Generator.load(folder, RuntimeConfig(drafter="none", adaptive=False))
    plain = _ids(g, N_NEW, "none")
    assert plain, "no tokens generated"
    assert plain == _hf_greedy(src, [int(t) for t in g.codec.encode(PROMPT)], len(plain))
    for drafter in ("ngram", "suffix", "draft"):
        for k in (1, 3):
            assert _ids(g, N_NEW, drafter, k) == plain, f"{family}/{graph}: {drafter} k={k} diverged"


def test_family_specific_refusals():
    from transformers import AutoConfig

    with pytest.raises(UnsupportedModelError, match="partial_rotary_factor=0.5"):
        arch_from_config(AutoConfig.for_model("phi3", partial_rotary_factor=0.5), 128)
    longrope = {"rope_type": "longrope", "short_factor": [1.0] * 48, "long_factor": [1.0] * 48}
    with pytest.raises(UnsupportedModelError, match="rope type 'longrope'"):
        arch_from_config(
            AutoConfig.for_model("phi3", rope_scaling=longrope, original_max_position_embeddings=4096), 128
        )
    a = arch_from_config(AutoConfig.for_model("smollm3", num_hidden_layers=8), 128)
    assert a.nope_layers == (3, 7)  # a NoPE layer every 4th (no_rope_layer_interval)
    a = arch_from_config(AutoConfig.for_model("granite", attention_multiplier=0.5, head_dim=64), 128)
    assert a.attn_scale == 0.5 and arch_from_config(AutoConfig.for_model("llama"), 128).attn_scale == pytest.approx(
        128**-0.5, rel=1e-12
    )


def _export_gemma(src, out, **kw):
    args = dict(
        target=str(src),
        out=str(out),
        draft="self:1",
        max_len=128,
        k=4,
        prefill_chunk=16,
        kv_bucket=32,
        precision="fp32",
        progress=False,
    )
    return export(ExportConfig(**(args | kw)))


@pytest.mark.parametrize("precision", ["int4", "int8"])
def test_gemma3_quantized_exports_keep_speculative_equal_to_plain(precision, family_models, tmp_path):
    """int4 (lean, MatMulNBits) and int8 (the integer flavour on the lean layers) of the tiny Gemma 3:
    validated against PyTorch by the export, rows alike across phases, speculative == plain."""
    folder = _export_gemma(family_models["gemma3_text"], tmp_path / "e", precision=precision)
    m = load_manifest(folder)
    assert m.target.graph.flavour == ("integer" if precision == "int8" else "lean")
    assert m.target.arch.sliding_window == 8
    assert_rows_bitwise_alike(m, f"gemma3/{precision}")
    g = Generator.load(folder, RuntimeConfig(drafter="none", adaptive=False))
    plain = _ids(g, N_NEW, "none")
    assert plain
    for drafter in ("ngram", "suffix", "draft"):
        assert _ids(g, N_NEW, drafter, 3) == plain, f"gemma3/{precision}: {drafter} diverged"


def test_gemma3_host_prologue_logits_are_the_in_graph_prologues(family_models, tmp_path):
    """--host-prologue on a windowed model: the engine builds the sliding layers' masks too
    (engines/prologue.py); every call's logits are the bits of the in-graph prologue's, chains and
    trees, across the window and at the end of the context."""
    from helpers.rows import assert_same_logits_over_calls

    from edgespec.engines.ort import OrtModel

    folders = [
        _export_gemma(family_models["gemma3_text"], tmp_path / f"h{host}", trees=True, host_prologue=host)
        for host in (False, True)
    ]
    m0, m1 = (load_manifest(f) for f in folders)
    assert "mask_past_local" in m1.target.graph.input_names()
    for role in ("target", "draft"):
        plain, host = OrtModel(m0, m0.models()[role]), OrtModel(m1, m1.models()[role])
        assert host.prologue is not None and host.prologue.window == 8
        assert_same_logits_over_calls(plain, host, role)


def test_host_prologue_window_masks_by_their_definition():
    """HostPrologue's sliding-layer masks, entry by entry: slot j (a cached one) or new node c seen
    from row t iff it is visible without the window and positions[t] - its position < window."""
    from edgespec.engines.prologue import NEG, HostPrologue
    from edgespec.engines.specs import GraphSpec, TensorSpec
    from edgespec.export.target.graph.lean_prologue import host_prologue_inputs

    n_q, window, width, slots = 2, 5, 4, 32
    inputs = tuple(TensorSpec(n, s, d) for n, s, d in host_prologue_inputs(n_q, "float32", True, False, True))
    graph = GraphSpec("t.onnx", (1, width), {"decode": (1,), "verify": (width,)}, inputs, (), "lean", ())
    hp = HostPrologue(graph, (1, width), slots, window)
    past = 11
    tree = np.array([[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 0, 1, 1]])  # 0 <- 1, 0 <- 2 <- 3
    depth = np.array([0, 1, 1, 2])
    v = hp.fill(width, slots, past, past + depth, tree)
    for t in range(width):
        p = past + depth[t]
        for j in range(slots):
            seen = j < past and p - j < window
            assert (v["mask_past_local"][t, :, j] == (0 if seen else NEG)).all(), (t, j)
        for c in range(width):
            seen = tree[t, c] and depth[t] - depth[c] < window
            assert (v["mask_new_local"][t, :, c] == (0 if seen else NEG)).all(), (t, c)
    assert (v["mask_past"][0, :past] == 0).all() and (v["mask_past"][0, past:] == NEG).all()


def test_gemma3_tiny_sequence_crosses_the_window(family_models):
    """The family test's sequence is longer than the tiny Gemma's window, and transformers' own
    greedy output changes when the window is lifted: the greedy check covers the window mask."""
    import torch
    from transformers import AutoModelForCausalLM

    src = family_models["gemma3_text"]
    ids = [ord(c) for c in PROMPT]
    assert len(ids) + N_NEW > 2 * FAMILIES["gemma3_text"]["sliding_window"]
    want = _hf_greedy(src, ids, N_NEW)
    model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32, sliding_window=1024).eval()
    seq = list(ids)
    with torch.no_grad():
        for _ in range(N_NEW):
            seq.append(int(model(torch.tensor([seq])).logits[0, -1].argmax()))
    assert seq[len(ids) :] != want


def test_gemma3_config_reading_and_refusals():
    from transformers import AutoConfig

    def gemma(**kw):
        return AutoConfig.for_model("gemma3_text", **kw)

    # Gemma 3 270M's shape: every 6th layer full, a 512 window under --max-len 2048, two rope bases
    rope = {
        "full_attention": {"rope_theta": 1e6, "rope_type": "default"},
        "sliding_attention": {"rope_theta": 10000.0, "rope_type": "default"},
    }
    a = arch_from_config(
        gemma(
            hidden_size=640,
            num_hidden_layers=18,
            num_attention_heads=4,
            num_key_value_heads=1,
            head_dim=256,
            sliding_window=512,
            rope_parameters=rope,
            query_pre_attn_scalar=256,
        ),
        2048,
    )
    assert a.sliding_layers == tuple(i for i in range(18) if (i + 1) % 6) and a.sliding_window == 512
    assert (a.rope_theta, a.local_rope) == (1e6, (10000.0, "default", ()))
    assert a.attn_scale == 256**-0.5 and a.embedding_multiplier == pytest.approx(640**0.5, rel=1e-15)
    assert (a.norm_weight_offset, a.sandwich_norms, a.mlp_act, a.qk_norm) == (1.0, True, "gelu_tanh", True)
    assert arch_from_config(gemma(sliding_window=512), 512).sliding_window is None  # the window covers max_len
    cos, _ = a.rope_tables()
    cos_local, _ = a.rope_tables(local=True)
    assert np.allclose(cos_local[7, 0], np.cos(7.0)) and not np.allclose(cos_local[7, 1], cos[7, 1])
    # transformers 4.x fields: rope_theta (+ rope_scaling) global, rope_local_base_freq local
    old = gemma(rope_theta=5e5, rope_local_base_freq=123.0, rope_scaling={"rope_type": "linear", "factor": 8.0})
    a = arch_from_config(old, 128)
    assert (a.rope_theta, a.rope_type, a.rope_params, a.local_rope) == (
        5e5,
        "linear",
        (("factor", 8.0),),
        (123.0, "default", ()),
    )
    for kw, match in (
        (dict(final_logit_softcapping=30.0), "final_logit_softcapping=30.0"),
        (dict(attn_logit_softcapping=50.0), "attn_logit_softcapping=50.0"),
        (dict(use_bidirectional_attention=True), "use_bidirectional_attention"),
        (dict(hidden_activation="gelu"), "hidden_activation 'gelu'"),
        (dict(rope_parameters=rope | {"sliding_attention": {"rope_type": "yarn", "factor": 2.0}}), "'yarn'"),
    ):
        with pytest.raises(UnsupportedModelError, match=match):
            arch_from_config(gemma(**kw), 128)
    with pytest.raises(UnsupportedModelError, match="gemma3_text"):
        arch_from_config(AutoConfig.for_model("gemma3"), 128)
    with pytest.raises(UnsupportedModelError, match="sliding_window=8"):  # other families keep the refusal
        arch_from_config(AutoConfig.for_model("mistral", sliding_window=8), 128)
