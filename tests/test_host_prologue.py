"""--host-prologue: the lean graph's per-call masks and indices come in as inputs the engine builds
(engines/prologue.py), so the graph has no host-side shape arithmetic (ONNX Runtime CUDA graphs can
capture it). The logits must be the bits of the in-graph prologue's, call by call."""

import collections

import numpy as np
import pytest

pytest.importorskip("torch")

from helpers.rows import MAX_LEN, assert_same_logits_over_calls, call_schedule  # noqa: E402
from tiny import assert_rows_bitwise_alike  # noqa: E402

from edgespec.engines.base import EngineError  # noqa: E402
from edgespec.engines.manifest import load_manifest  # noqa: E402
from edgespec.engines.ort import OrtModel  # noqa: E402
from edgespec.export.target.exporter import ExportConfig, ExportError, export  # noqa: E402

SHAPE_OPS = {
    "Shape",
    "Range",
    "CumSum",
    "Tile",
    "Less",
    "LessOrEqual",
    "GreaterOrEqual",
    "Min",
    "Max",
    "Sub",
    "Squeeze",
    "And",
    "Cast",
}  # what the in-graph prologue computes its masks and indices with


@pytest.fixture(scope="module")
def folders(tiny_models, tmp_path_factory):
    """{(precision, host_prologue): folder}: fp32 with a self:1 draft and an EAGLE head, int4 with the
    two-row matmuls on (their pads and row count are prologue inputs too)."""
    from tiny import tiny_eagle_head

    import edgespec.export.target.exporter as ex

    root = tmp_path_factory.mktemp("host_prologue")
    head_dir, _, _ = tiny_eagle_head(tiny_models["llama"], root / "head", draft_vocab=48, noise=0.01)
    probe, ex.probe_portable_ops = ex.probe_portable_ops, lambda: ()  # every fused op (the probe costs CPU)
    out = {}
    try:
        for precision, extra in (
            ("fp32", dict(draft="self:1", eagle=str(head_dir))),
            ("int4", dict(two_row_matmuls="on")),
        ):
            for host in (False, True):
                out[precision, host] = export(
                    ExportConfig(
                        target=str(tiny_models["llama"]),
                        out=str(root / f"{precision}-{int(host)}"),
                        max_len=MAX_LEN,
                        k=4,
                        prefill_chunk=16,
                        kv_bucket=32,
                        precision=precision,
                        trees=True,
                        progress=False,
                        host_prologue=host,
                        **extra,
                    )
                )
    finally:
        ex.probe_portable_ops = probe
    return out


def _ops(folder, file="target.onnx") -> collections.Counter:
    import onnx

    return collections.Counter(n.op_type for n in onnx.load(str(folder / file), load_external_data=False).graph.node)


@pytest.mark.parametrize("precision", ["fp32", "int4"])
def test_logits_bitwise_those_of_the_in_graph_prologue(folders, precision):
    m0, m1 = load_manifest(folders[precision, False]), load_manifest(folders[precision, True])
    roles = ("target", "draft") if "draft" in m1.models() else ("target",)
    for role in roles:
        plain, host = OrtModel(m0, m0.models()[role]), OrtModel(m1, m1.models()[role])
        assert host.prologue is not None and plain.prologue is None
        assert host.kv_slots > host.max_len == plain.kv_slots
        assert_same_logits_over_calls(plain, host, role)


@pytest.mark.parametrize("cuda_graph", [True, False])
def test_device_paths_on_host_memory(folders, cuda_graph):
    """The GPU code paths (device KV, and with cuda_graph every tensor staged at fixed addresses and
    bound per (width, window) with its gpu_graph_id) run on host memory through HostOps: same bits."""
    from edgespec.engines.device import HostOps

    m0, m1 = load_manifest(folders["int4", False]), load_manifest(folders["int4", True])
    plain, dev = OrtModel(m0, m0.target), OrtModel(m1, m1.target, device_ops=HostOps(), cuda_graph=cuda_graph)
    assert dev.cuda_graph == cuda_graph and dev.kv is None
    for past, ids, parents, commit in call_schedule():
        want = plain.forward(ids, past, parents=parents).copy()
        got = dev.forward(ids, past, parents=parents)
        assert np.array_equal(got, want), (past, len(ids), parents)
        if commit:
            plain.commit(past, len(ids))
            dev.commit(past, len(ids))
    if cuda_graph:  # one captured graph per (width, window) the calls used
        assert len({dev._graph_bufs.graph_id(w, s) for w, s in dev._bindings}) == len(dev._bindings) > 5


@pytest.mark.parametrize("precision", ["fp32", "int4"])
def test_rows_bitwise_alike_across_phases(folders, precision):
    assert_rows_bitwise_alike(load_manifest(folders[precision, True]), precision)


def test_graph_has_no_shape_arithmetic(folders):
    for precision in ("fp32", "int4"):
        host, plain = _ops(folders[precision, True]), _ops(folders[precision, False])
        assert not SHAPE_OPS & set(host), (precision, SHAPE_OPS & set(host))
        assert {"Shape", "Range", "CumSum"} <= set(plain)
        assert sum(plain.values()) > sum(host.values())
    assert not SHAPE_OPS & set(_ops(folders["fp32", True], "draft.onnx"))
    for file in ("eagle.onnx", "target_eagle.onnx"):  # the head and the fused graph keep their prologue
        assert "Range" in _ops(folders["fp32", True], file), file


def test_manifest_declares_the_inputs_in_graph_order(folders):
    import onnx

    m = load_manifest(folders["int4", True])
    g = onnx.load(str(folders["int4", True] / "target.onnx"), load_external_data=False).graph
    assert [i.name for i in g.input] == list(m.target.graph.input_names())
    names = m.target.graph.input_names()
    for name in ("mask_past", "mask_new", "score_cols", "to_node", "value_slots", "two_rows_pads", "n_rows"):
        assert name in names, name
    assert "mask_past" not in load_manifest(folders["int4", False]).target.graph.input_names()
    fp32 = load_manifest(folders["fp32", True])
    assert "two_rows_pads" not in fp32.target.graph.input_names()
    for spec in (fp32.models().get("eagle"), fp32.models().get("eagle_fused")):
        assert "mask_past" not in spec.graph.input_names(), spec.role


@pytest.mark.parametrize(
    "drafter,tree,fuse_head",
    [
        ("ngram", None, False),
        ("ngram", (5, 3, 2, 2), False),
        ("draft", None, False),
        ("eagle", None, False),
        ("eagle", None, True),
        ("eagle", (5, 3, 2, 2), False),
        ("eagle", (5, 3, 2, 2), True),
    ],
)
def test_greedy_speculative_equals_plain(folders, drafter, tree, fuse_head):
    from edgespec.runtime.config import RuntimeConfig
    from edgespec.runtime.generator import Generator
    from edgespec.runtime.tree import TreeConfig

    folder = folders["fp32", True]
    rng = np.random.default_rng(6)
    prompts = [rng.integers(3, 60, n) for n in (5, 40)] + [np.array([5, 6, 7, 5, 6, 7, 5, 6])]
    plain_g = Generator.load(folders["fp32", False], RuntimeConfig(drafter="none", k=1, adaptive=False))
    plain = [np.concatenate([x.copy() for x in plain_g.generate_ids(p, 40)]) for p in prompts]
    cfg = RuntimeConfig(
        drafter=drafter,
        k=4,
        adaptive=False,
        eagle_min_confidence=0.0,
        fuse_head=fuse_head,
        tree=TreeConfig(*tree) if tree else TreeConfig(),
    )
    g = Generator.load(folder, cfg)
    if fuse_head:  # the fused graph (in-graph prologue) on the host-prologue target's larger KV buffer
        assert g.engines.get("eagle").fused.kv is g.engines.target.kv and g.engines.target.prologue is not None
    for p, ref in zip(prompts, plain, strict=True):
        out = np.concatenate([x.copy() for x in g.generate_ids(p, 40)])
        assert np.array_equal(out, ref), (drafter, tree, p)
    assert g.last_stats.n_drafted > 0 or drafter == "ngram"


def test_export_refuses_portable_graphs():
    for kw in (dict(precision="fp16"), dict(graph="portable")):
        with pytest.raises(ExportError, match="--host-prologue"):
            ExportConfig(host_prologue=True, **kw).check()


def test_cuda_graph_needs_cuda_and_the_host_prologue(folders):
    m = load_manifest(folders["fp32", True])
    with pytest.raises(EngineError, match="--host-prologue|cuda provider"):
        OrtModel(m, m.target, cuda_graph=True)
    assert not OrtModel(m, m.target).cuda_graph  # cpu: off


def test_cuda_graph_binding_plan(folders):
    """Where each tensor of a captured call lives, and the staged copies, on host memory (HostOps)."""
    from edgespec.engines import cuda_graph as cg
    from edgespec.engines.device import HostOps

    m = load_manifest(folders["int4", True])
    graph = m.target.graph
    plan = cg.binding_plan(graph, 4, 64)
    where = {p.name: p.where for p in plan}
    assert where["input_ids"] == where["mask_new"] == where["to_node"] == cg.COPY_IN
    assert where["two_rows_pads"] == where["n_rows"] == where["past_len"] == where["tree_mask"] == cg.HOST
    assert where["past_key_0"] == where["past_value_1"] == where["new_kv"] == cg.RESIDENT
    assert where["logits"] == where["hidden"] == cg.COPY_OUT
    shapes = {p.name: p.shape for p in plan}
    assert shapes["mask_new"] == (4, 4, 4) and shapes["to_node"] == (4, 4, 64) and shapes["mask_past"] == (1, 64)
    assert len(plan) == len(graph.input_names()) + len(graph.output_names())

    e = OrtModel(m, m.target)
    bufs = cg.GraphBuffers(HostOps(), graph, e.widths, e.kv_slots)
    ptrs = {
        (p.name, w, s): bufs.ptr(p.name, w, s)
        for w in e.widths
        for s in (32, 64)
        for p in cg.binding_plan(graph, w, s)
        if p.where in (cg.COPY_IN, cg.COPY_OUT)
    }
    assert all(bufs.ptr(n, w, s) == ptr for (n, w, s), ptr in ptrs.items())  # fixed per (width, window)
    for s in (32, 64):
        assert len({p for (_, _, s2), p in ptrs.items() if s2 == s}) == len(ptrs) // 2  # none shared in a call
    ids = {bufs.graph_id(w, s) for w in (1, 4) for s in (32, 64)}
    assert ids == {1, 2, 3, 4} and bufs.graph_id(1, 32) == 1
    # a call's staged inputs land in the buffers and its outputs come back
    e.forward(np.arange(3), 10)
    plan = cg.binding_plan(graph, 4, 32)
    arrays = e._host_arrays(4, 32)
    bufs.copy_in(plan, arrays, 4, 32)
    block = bufs._in[4][0]
    at = bufs.ptr("score_cols", 4, 32) - block.ptr
    staged = block.host[at : at + arrays["score_cols"].nbytes].view(np.int64)
    assert np.array_equal(staged, arrays["score_cols"].ravel())
    staged_names = [p.name for p in plan if p.where == cg.COPY_IN]
    assert all((bufs.ptr(n, 4, 32) - block.ptr) % 256 == 0 for n in staged_names)  # one block, aligned slots
    want = arrays["logits"].copy()
    arrays["logits"][:] = 0
    bufs._bufs["logits", 4].host[: want.nbytes] = want.ravel().view(np.uint8)
    bufs.copy_out(plan, arrays, 4)
    assert np.array_equal(arrays["logits"], want)


class CountingOps:
    """HostOps that count what crosses the bus: uploads, downloads (bytes) and syncs."""

    def __init__(self):
        from edgespec.engines.device import HostOps

        self.host, self.supports_graphs, self.name = HostOps(), False, "counting"
        self.reset()

    def reset(self):
        self.up, self.down, self.up_bytes, self.down_bytes, self.syncs = 0, 0, 0, 0, 0

    def alloc(self, nbytes):
        return self.host.alloc(nbytes)

    def h2d(self, dst_ptr, src, stream=None):
        self.up, self.up_bytes = self.up + 1, self.up_bytes + src.nbytes
        self.host.h2d(dst_ptr, src)

    def d2h(self, dst, src_ptr, stream=None):
        self.down, self.down_bytes = self.down + 1, self.down_bytes + dst.nbytes
        self.syncs += 1  # CudaOps.d2h waits for the copy
        self.host.d2h(dst, src_ptr)

    def copy2d(self, *a, **kw):
        self.host.copy2d(*a, **kw)

    def sync(self, stream=None):
        self.syncs += 1


def test_captured_verify_call_traffic(folders):
    """Per captured verify call of n tokens: one upload (every staged input in one block), one sync
    before the run, and n logits rows back: no padding rows, no hidden states unless a drafter asks
    (then once). A call asked for its logits (this one) brings back n x V floats; a greedy verify asks
    for none and reads the top-k ids (tests/test_device_traffic.py)."""
    from edgespec.engines import cuda_graph as cg
    from edgespec.engines.prologue import host_window_slots

    m = load_manifest(folders["fp32", True])
    ops = CountingOps()
    e, ref = OrtModel(m, m.target, device_ops=ops, cuda_graph=True), OrtModel(m, m.target)
    for x in (e, ref):
        x.forward(np.arange(16), 0)
        x.commit(0, 16)
    for n in (5, 3, 1):
        e.forward(np.arange(n) + 7, 16)  # warm: the session, the binding
        ops.reset()
        logits = e.forward(np.arange(n) + 7, 16)
        w = e.width_for(n)
        assert (ops.up, ops.down) == (1, 1), (n, vars(ops))
        assert ops.down_bytes == n * m.target.vocab_size * 4 == logits.nbytes
        staged = cg.binding_plan(m.target.graph, w, host_window_slots(16, w, m.kv_bucket))
        # the inputs the host builds (each slot rounded to 256 bytes), nothing more; its masks are
        # O(T^2 S): 7.5 KB at T=5 on this tiny folder
        assert ops.up_bytes == sum(-(-p.nbytes // 256) * 256 for p in staged if p.where == cg.COPY_IN)
        assert ops.syncs == 2  # the inputs landed; the download done
        assert np.array_equal(logits, ref.forward(np.arange(n) + 7, 16))
        assert np.array_equal(e.last_hidden(n), ref.last_hidden(n))  # read back when asked, once
        e.last_hidden(n)
        assert ops.down == 2 and ops.down_bytes == logits.nbytes + w * m.target.hidden_size * 4
