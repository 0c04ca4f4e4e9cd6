"""The lean graph flavour: fused ONNX Runtime ops where they keep a token's logits bitwise alike in
decode, verify and prefill calls, their portable form where the probe (here: forced) says not."""

import collections

import numpy as np
import pytest

pytest.importorskip("torch")

from tiny import assert_rows_bitwise_alike  # noqa: E402

from edgespec.engines.manifest import load_manifest  # noqa: E402
from edgespec.export.target.exporter import ExportConfig, ExportError, export  # noqa: E402
from edgespec.export.target.graph.lean import LEAN_OPS  # noqa: E402

FUSED = {"norm": "SkipSimplifiedLayerNormalization", "rotary": "RotaryEmbedding", "silu": "QuickGelu"}


def _export(src, out, monkeypatch=None, portable_ops=None, **kw):
    if portable_ops is not None:  # what the CPU probe would have found
        import edgespec.export.target.exporter as ex

        monkeypatch.setattr(ex, "probe_portable_ops", lambda: portable_ops)
    args = (
        dict(
            target=str(src),
            out=str(out),
            max_len=128,
            k=3,
            prefill_chunk=16,
            kv_bucket=32,
            progress=False,
            precision="fp32",
        )
        | kw
    )
    return export(ExportConfig(**args))


def _layer_ops(folder, layer: int = 1) -> collections.Counter:
    import onnx

    g = onnx.load(str(folder / "target.onnx"), load_external_data=False).graph
    return collections.Counter(
        n.op_type for n in g.node if n.name.startswith(f"/layers.{layer}/") or n.name.startswith(f"l{layer}.")
    )


def _rows_bitwise_alike(folder) -> None:
    """A token's logits: the same bits in a prefill, verify and decode call (tests/tiny.py)."""
    assert_rows_bitwise_alike(load_manifest(folder), str(folder))


@pytest.mark.parametrize("precision", ["fp32", "int4"])
@pytest.mark.parametrize("portable_ops", [(), ("norm",), ("rotary",), ("silu",), LEAN_OPS])
def test_each_fused_op_and_its_portable_form_keep_rows_bitwise(
    precision, portable_ops, tiny_models, tmp_path, monkeypatch
):
    folder = _export(tiny_models["qwen2"], tmp_path / "e", monkeypatch, portable_ops, precision=precision)
    m = load_manifest(folder)
    assert m.target.graph.flavour == "lean" and m.target.graph.portable_ops == portable_ops
    ops = _layer_ops(folder)
    for op, fused in FUSED.items():
        assert (ops[fused] > 0) == (op not in portable_ops), (op, ops)
    assert max(m.target.validation.values()) < (1e-4 if precision == "fp32" else 3.0)
    _rows_bitwise_alike(folder)


def test_lean_layers_have_a_third_of_the_portable_nodes(tiny_models, tmp_path):
    lean = _layer_ops(_export(tiny_models["llama"], tmp_path / "lean", precision="int4"))
    portable = _layer_ops(_export(tiny_models["llama"], tmp_path / "portable", precision="int4", graph="portable"))
    assert sum(lean.values()) <= 26 and sum(portable.values()) >= 60, (lean, portable)
    assert lean["MatMulNBits"] == portable["MatMulNBits"] == 4  # packed qkv and gate_up in both
    # no shape arithmetic left in a lean layer: masks and indices come from the per-call prologue
    assert not {"Shape", "Range", "Concat", "Tile", "Where", "Pad", "Transpose"} & set(lean), lean
    assert not set(FUSED.values()) & set(portable)
    assert load_manifest(tmp_path / "portable").target.graph.flavour == "portable"


def test_chain_graphs_and_trees_in_both_flavours(tiny_models, tmp_path):
    """A tree's rows equal the chain's rows (portable and lean, each its own tree attention)."""
    from helpers.rows import assert_tree_rows_are_chain_rows

    from edgespec.engines.ort import OrtModel

    for graph in ("lean", "portable"):
        m = load_manifest(_export(tiny_models["llama"], tmp_path / graph, graph=graph, max_len=192))
        # 126: the tree straddles a 128-slot block of the attention GEMM
        assert_tree_rows_are_chain_rows(OrtModel(m, m.target), (20, 126), 4, graph)


def test_rows_padded_past_the_last_slot_are_dropped(tiny_models, tmp_path):
    """A padded prefill chunk that runs past max_len (a long cached prefix): the new values that do
    not fit the window are left out, the real rows equal decode rows bitwise."""
    from edgespec.engines.ort import OrtModel

    m = load_manifest(_export(tiny_models["llama"], tmp_path / "e", max_len=64, kv_bucket=16))
    e = OrtModel(m, m.target)
    toks = np.random.default_rng(2).integers(3, 256, 64)
    e.forward(toks[:16], 0)
    e.commit(0, 16)
    for past in range(16, 50, 16):
        e.forward(toks[past : past + 16], past)
        e.commit(past, 16)
    wide = e.forward(toks[50:60], 50).copy()  # width 16 at past 50: 66 slots > max_len 64
    assert e._last_width == 16
    for i in range(10):
        one = e.forward(toks[50 + i : 51 + i], 50 + i)
        e.commit(50 + i, 1)
        assert np.array_equal(one[0], wide[i]), i


def test_flavour_choice_and_trt_refuses_lean_graphs(tiny_models, tmp_path, monkeypatch):
    import sys
    import types

    from edgespec.engines import device
    from edgespec.export.target.graph.op_probe import probe_portable_ops
    from edgespec.export.target.trt_build import TrtBuildError, build_trt

    assert set(probe_portable_ops()) <= set(LEAN_OPS)
    assert ExportConfig(precision="fp16").flavour() == "portable" and ExportConfig().flavour() == "lean"
    with pytest.raises(ExportError, match="--graph portable"):
        ExportConfig(precision="fp16", graph="lean").check()
    with pytest.raises(ExportError, match="--graph"):
        ExportConfig(graph="fused").check()
    folder = _export(tiny_models["llama"], tmp_path / "e")
    logger = type("Logger", (), {"WARNING": 0, "__init__": lambda self, level: None})
    monkeypatch.setitem(sys.modules, "tensorrt", types.SimpleNamespace(__version__="10.9.0", Logger=logger))
    monkeypatch.setattr(device, "CudaOps", lambda: types.SimpleNamespace(device_name=lambda: "GPU T"))
    with pytest.raises(TrtBuildError, match="lean"):
        build_trt(folder)


def test_gemm_reductions_of_128_give_the_same_bits_for_every_shape():
    """The ORT behaviour LayerOps.scores rests on: a Gemm's element with a reduction of <= 128 is the
    same bits whatever M (>= 2) and N are (wider reductions are split at places N decides)."""
    import onnxruntime as ort
    from onnx import TensorProto, helper

    from edgespec.export.target.graph.layer_ops import GEMM_K_MAX

    def io(name, shape):
        return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)

    node = helper.make_node("Gemm", ["a", "b", "c"], ["y"], transB=1, alpha=0.125)
    g = helper.make_graph(
        [node], "g", [io("a", ["M", "K"]), io("b", ["N", "K"]), io("c", ["M", "N"])], [io("y", ["M", "N"])]
    )
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    so = ort.SessionOptions()
    so.intra_op_num_threads = 2
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    a = rng.standard_normal((64, GEMM_K_MAX)).astype(np.float32)
    b = rng.standard_normal((1024, GEMM_K_MAX)).astype(np.float32)
    first = None
    for n in (1, 2, 5, 9, 64, 65, 192, 256, 1024):
        for m in (2, 4, 9, 36, 64):
            y = sess.run(None, {"a": a[:m], "b": b[:n], "c": np.zeros((m, n), np.float32)})[0][:2, 0]
            first = y if first is None else first
            assert np.array_equal(y, first), (n, m)


@pytest.mark.parametrize("graph", ["lean", "portable"])
def test_rows_alike_across_windows_with_kv_rows_wider_than_128(graph, tmp_path):
    """K/V rows of 256 (one kv head of 256, as Gemma 3's; SmolLM2's are 192): a token's logits are the
    same bits decoded alone, verified among 2, 5 or 9 and prefilled, with the cache window growing
    past 192 slots on the way (the scores' Gemms are split at 128: LayerOps.scores)."""
    from tiny import make_tiny

    from edgespec.engines.ort import OrtModel

    src = make_tiny(
        "llama", tmp_path / "src", hidden_size=64, num_attention_heads=2, num_key_value_heads=1, head_dim=256
    )
    folder = _export(src, tmp_path / "e", max_len=320, graph=graph)
    m = load_manifest(folder)
    toks = np.random.default_rng(2).integers(0, 256, 300)
    dec = OrtModel(m, m.target)
    one = []
    for p in range(len(toks)):
        one.append(dec.forward(toks[p : p + 1], p)[0].copy())
        dec.commit(p, 1)
    for w in (2, 5, 9, 16):
        e = OrtModel(m, m.target)
        for pos in range(0, len(toks), w):
            n = min(w, len(toks) - pos)
            rows = e.forward(toks[pos : pos + n], pos)
            bad = [pos + i for i in range(n) if not np.array_equal(rows[i], one[pos + i])]
            assert not bad, f"width {w}: rows {bad} differ from decode"
            e.commit(pos, n)
