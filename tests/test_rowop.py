"""edgespec's row kernel (engines/rowop, the ONNX Runtime custom op RowMatMul): every instruction-set
path computes the NumPy reference's integer arithmetic bit for bit, in ONNX Runtime a row's bits do
not depend on how many rows share the call (widths 1..16 and 64), and a tiny model exported with
--int4-kernel rowop decodes speculatively exactly as it decodes plainly."""

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from helpers.rowop_blocks import CHAIN, layout, rows
from tiny import TINY_EXPORT, assert_rows_bitwise_alike, rowop_session

from edgespec.engines import rowop

WHY = rowop.unavailable()
needs_op = pytest.mark.skipif(bool(WHY), reason=f"row kernel not available: {WHY}")

PROMPT = np.array([5, 9, 5, 9, 12, 30, 5, 9, 5, 9, 12, 41, 7], np.int64)


LAYOUTS = [
    (bits, bs, zp, mins, f16)
    for bits in (4, 5, 6, 8)
    for bs in (16, 32)
    for zp, mins in (("none", False), ("uniform", False), ("block", False), ("none", True), ("block", True))
    for f16 in (False, True)
]


def test_unpack_is_packs_inverse():
    for spec in LAYOUTS:
        p = layout(*spec, n=37)
        q = rowop.unpack(p.data, p.attrs)
        assert np.array_equal(q.codes, p.codes) and np.array_equal(q.scales, p.scales), spec
        assert np.array_equal(q.zero_points, p.zero_points) and (q.mins is None) == (p.mins is None), spec
        assert q.mins is None or np.array_equal(q.mins, p.mins), spec


def test_pack_folds_and_narrows_where_exact():
    # GGUF Q4_1 as gguf_blocks keeps it: centred codes, z, residual minimums r = m + z d (m, d fp16)
    rng = np.random.default_rng(2)
    d = rng.integers(1, 64, (24, 2)).astype(np.float32) / 4096
    m = -rng.integers(0, 512, (24, 2)).astype(np.float32) / 4096
    z = rng.integers(0, 16, (24, 2)).astype(np.uint8)
    p = rowop.pack(rng.integers(0, 16, (24, 64), dtype=np.uint8), d, z, m + z * d, 4, 32)
    assert p.attrs["zero_point"] == 0 and p.attrs["mins"] == 1 and p.attrs["f16"] == 1  # z folded: m again
    assert np.array_equal(p.mins, m)
    assert layout(8, 32, "uniform", False, False).attrs["zero_point"] == 128
    assert layout(4, 16, "block", False, False).attrs["zero_point"] == -1
    # the packed weights are the blocks' weights: d (code - z) + m, one rounding of the same real
    rng = np.random.default_rng(3)
    codes, d = rng.integers(0, 16, (20, 64), dtype=np.uint8), rng.random((20, 2), np.float32)
    z, m = rng.integers(0, 16, (20, 2), dtype=np.uint8), rng.random((20, 2), np.float32)
    p = rowop.pack(codes, d, z, m, 4, 32)
    blocks = codes.reshape(20, 2, 32).astype(np.float64)
    want = (d[..., None].astype(np.float64) * (blocks - z[..., None]) + m[..., None]).astype(np.float32)
    got = p.scales[..., None].astype(np.float64) * (blocks - p.zero_points[..., None])
    if p.mins is not None:
        got = got + p.mins[..., None]
    assert np.array_equal(got.astype(np.float32), want)


@needs_op
@pytest.mark.parametrize("path", rowop.PATHS)
def test_every_path_is_the_reference_bitwise(path):
    if not rowop.cpu_runs(path):
        pytest.skip(f"this CPU does not run the {path} path")
    x = rows()
    for spec in LAYOUTS:
        p = layout(*spec)
        want = rowop.reference(x, p)
        got = rowop.matmul(x, p, path)
        assert np.array_equal(got, want), f"{path} {spec}: max |diff| {np.abs(got - want).max():.3g}"


@needs_op
@pytest.mark.parametrize("path", rowop.PATHS)
def test_every_path_after_blocks_of_16(path):
    """Blocks of 32 after blocks of 16 with as many cells: the buffers hold each call's bytes."""
    if not rowop.cpu_runs(path):
        pytest.skip(f"this CPU does not run the {path} path")
    for m in (64, 9, 128):
        for spec, k, n in CHAIN[:2]:
            p, x = layout(*spec, n=n, k=k), rows(m=m, k=k)
            assert np.array_equal(rowop.matmul(x, p, path), rowop.reference(x, p)), (path, spec, k, m)


CHAIN_SCRIPT = """
import sys
import numpy as np, onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper
from helpers.rowop_blocks import CHAIN, layout, rows
from edgespec.engines import rowop

packed = [layout(*spec, n=n, k=k, seed=i) for i, (spec, k, n) in enumerate(CHAIN[: int(sys.argv[1])])]
names = ["x"] + [f"h{i}" for i in range(len(packed))]
nodes = [helper.make_node(rowop.OP_TYPE, [names[i], f"w{i}"], [names[i + 1]], domain=rowop.DOMAIN, **p.attrs)
         for i, p in enumerate(packed)]
graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "T", 256])],
    [helper.make_tensor_value_info(names[-1], TensorProto.FLOAT, None)],
    [numpy_helper.from_array(p.data, f"w{i}") for i, p in enumerate(packed)])
model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(rowop.DOMAIN, 1)])
so = ort.SessionOptions()
so.intra_op_num_threads = 2
rowop.register(so)
sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
for m in (64, 9, 128, 64):
    want = rows(m=m, k=256)
    for p in packed:
        want = rowop.reference(want, p)
    for _ in range(3):
        assert np.array_equal(sess.run(None, {"x": rows(m=m, k=256)[None]})[0][0], want), m
print("chain ok")
"""


@needs_op
@pytest.mark.parametrize("n_nodes", [2, 4])
def test_a_graph_of_mixed_block_sizes_keeps_the_heap(n_nodes):
    """A tiny GGUF's layers in ONNX Runtime: a blocks-of-16 qkv, then blocks-of-32 linears
    (the thread's row buffers, sized by block cells alone, would take the second node's writes past
    their end: free(): invalid size). In a child process: a corrupted heap fails this test, not the run."""
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(Path(__file__).parent), os.environ.get("PYTHONPATH")]))
    )
    r = subprocess.run(
        [sys.executable, "-c", CHAIN_SCRIPT, str(n_nodes)], capture_output=True, text=True, timeout=120, env=env
    )
    assert r.returncode == 0 and "chain ok" in r.stdout, (r.returncode, r.stdout[-2000:], r.stderr[-2000:])


def _session(p, path: str):
    from onnx import TensorProto, helper, numpy_helper

    node = helper.make_node(rowop.OP_TYPE, ["x", "w"], ["y"], domain=rowop.DOMAIN, **p.attrs)
    graph = helper.make_graph(
        [node],
        "rowop",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "T", p.attrs["K"]])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(p.data, "w")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(rowop.DOMAIN, 1)])
    return rowop_session(model, path)


@needs_op
@pytest.mark.parametrize("path", rowop.PATHS)
def test_op_rows_bitwise_alike_across_widths(path):
    if not rowop.cpu_runs(path):
        pytest.skip(f"this CPU does not run the {path} path")
    for spec in [(4, 32, "none", True, True), (8, 32, "uniform", False, True), (4, 16, "block", False, False)]:
        p = layout(*spec, n=72, k=128)
        sess = _session(p, path)
        x = rows(k=128)
        want = rowop.reference(x, p)
        wide = sess.run(None, {"x": x[None]})[0][0]
        assert np.array_equal(wide, want), f"{path} {spec}"
        for width in range(1, 17):
            for r0 in (0, 64 - width):
                got = sess.run(None, {"x": x[None, r0 : r0 + width]})[0][0]
                assert np.array_equal(got, want[r0 : r0 + width]), f"{path} {spec} width {width} at {r0}"


@needs_op
def test_a_refused_path_is_a_session_error(monkeypatch):
    import onnxruntime as ort

    monkeypatch.setenv(rowop.ISA_ENV, "sse9")
    assert "not a path" in rowop.unavailable()
    with pytest.raises(rowop.RowopUnavailable, match="sse9"):
        rowop.register(ort.SessionOptions())


@pytest.fixture(scope="module")
def rowop_engine(tiny_models, tmp_path_factory):
    from edgespec.export.target.exporter import ExportConfig, export

    out = tmp_path_factory.mktemp("rowop") / "e"
    opts = TINY_EXPORT | dict(precision="int4", int4_kernel="rowop", k=4)
    return export(ExportConfig(target=str(tiny_models["llama"]), out=str(out), eagle="none", medusa="none", **opts))


@needs_op
def test_folder_runs_the_op_for_every_linear(rowop_engine):
    import onnx

    from edgespec.engines.manifest import load_manifest

    m = load_manifest(rowop_engine)
    g = onnx.load(m.path(m.target.graph.file), load_external_data=False).graph
    ops = [n.op_type for n in g.node]
    assert "MatMulNBits" not in ops and ops.count(rowop.OP_TYPE) == 4 * m.target.n_layers + 1
    assert rowop.needs(m.target.weights)


@needs_op
def test_folder_rows_bitwise_alike(rowop_engine):
    from edgespec.engines.manifest import load_manifest

    assert_rows_bitwise_alike(load_manifest(rowop_engine), "rowop")


@needs_op
@pytest.mark.parametrize("drafter", ["ngram", "suffix"])
def test_speculative_output_is_plain_output(rowop_engine, drafter):
    from edgespec.runtime.config import RuntimeConfig
    from edgespec.runtime.generator import Generator

    want = Generator.load(rowop_engine, RuntimeConfig(drafter="none")).generate_ids(PROMPT, 40)
    g = Generator.load(rowop_engine, RuntimeConfig(drafter=drafter, k=4))
    assert [int(t) for c in g.generate_ids(PROMPT, 40) for t in c] == [int(t) for c in want for t in c]


@needs_op
@pytest.mark.parametrize("name", ["q4_1", "mixed"])
def test_gguf_blocks_kept_exactly_in_the_op(name, tmp_path):
    """A GGUF's blocks (the default model's Q4_1; every K-quant and legacy type) run in the op with
    the file's own values, decode rows equal verify rows, and speculative output is plain output."""
    pytest.importorskip("gguf")
    from helpers.gguf_rows import MIXED, STORED, export_manifest, ggufs_own_rows
    from tiny import GGUF_LINEARS, make_tiny_gguf

    from edgespec.engines.session import read_weight
    from edgespec.runtime.config import RuntimeConfig
    from edgespec.runtime.generator import Generator

    types = dict.fromkeys(GGUF_LINEARS, "Q4_1") if name == "q4_1" else MIXED
    src = make_tiny_gguf(tmp_path / f"{name}.gguf", types, tied="output" not in types)
    m = export_manifest(src, tmp_path / name, int4_kernel="rowop", draft="self:1")
    assert all(o.exact for o in m.target.weight_origins), m.target.weight_origins
    graph = m.path(m.target.graph.file)
    import onnx

    nodes = {n.name: n for n in onnx.load(graph, load_external_data=False).graph.node if n.op_type == rowop.OP_TYPE}
    for stored, kinds in STORED.items():
        node = nodes[f"l0.{stored}/{rowop.OP_TYPE}"]
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        data = np.asarray(read_weight(m, m.target, m.target.weights[f"l0.{stored}{rowop.WEIGHT_SUFFIX}"]))
        theirs = np.concatenate([ggufs_own_rows(src, k, 0, 4, 2) for k in kinds])
        assert np.array_equal(rowop.dequantized(rowop.unpack(data, attrs)), theirs), (name, stored)
    assert max(m.target.validation.values()) < 3.0
    assert_rows_bitwise_alike(m, name)
    g = Generator.load(m.folder, RuntimeConfig(drafter="none"))
    plain = [int(t) for c in g.generate_ids(PROMPT, 32) for t in c]
    for drafter in ("ngram", "draft"):
        g.set_drafter(drafter, k=3)
        assert [int(t) for c in g.generate_ids(PROMPT, 32) for t in c] == plain, drafter


def test_the_probe_never_offers_an_unavailable_op_and_says_why(monkeypatch, tmp_path):
    from edgespec.export.target.checks import probe
    from edgespec.export.target.exporter import ExportConfig
    from edgespec.export.target.spec import ExportError

    monkeypatch.setattr(rowop, "unavailable", lambda: "no C++ compiler (g++, c++, clang++ or $CXX)")
    cfg = ExportConfig(target="x", out=str(tmp_path / "e"), precision="auto")
    cands, why = probe.candidates(cfg)
    assert set(cands) == {"int4", "int8"} and "no C++ compiler" in why
    with pytest.raises(ExportError, match="no C\\+\\+ compiler"):
        ExportConfig(target="x", out=str(tmp_path / "e"), precision="int4", int4_kernel="rowop").check()
    assert set(probe.candidates(ExportConfig(target="x", int4_kernel="nbits"))[0]) == {"int4", "int8"}
    monkeypatch.setattr(rowop, "unavailable", lambda: "")
    assert probe.ROWOP in probe.candidates(cfg)[0]
    assert set(probe.candidates(ExportConfig(target="x", precision="auto", int4_kernel="rowop"))[0]) == {probe.ROWOP}


@needs_op
def test_a_graph_packed_before_sub_scales_runs_and_a_newer_layout_is_refused():
    """A graph exported before the `sub` attribute (records of layout 1: 4/8-bit codes, scales per
    block) runs as before; a manifest stating a layout past this edgespec's is one line."""
    import onnxruntime as ort
    from onnx import TensorProto, helper

    p = layout(8, 16, "uniform", False, False, n=40, k=96)
    old = rowop.pack(p.codes, p.scales, p.zero_points, None, 8, 16, rowop.pack_choices(p.scales, p.zero_points, None))
    attrs = {a: v for a, v in old.attrs.items() if a != "sub"}
    assert attrs["bits"] == 8
    node = helper.make_node(rowop.OP_TYPE, ["x", "w"], ["y"], domain=rowop.DOMAIN, **attrs)
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["M", 96])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["M", 40])],
        initializer=[helper.make_tensor("w", TensorProto.UINT8, old.data.shape, old.data.tobytes(), raw=True)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(rowop.DOMAIN, 1)])
    x = rows()
    got = rowop_session(model, rowop.cpu_path()).run(None, {"x": x})[0]
    assert np.array_equal(got, rowop.reference(x, p)) and np.array_equal(got, rowop.matmul(x, p, rowop.cpu_path()))
    with pytest.raises(rowop.RowopUnavailable, match="re-export") as e:
        rowop.register(ort.SessionOptions(), rowop.LAYOUT_VERSION + 1)
    assert "\n" not in str(e.value)
