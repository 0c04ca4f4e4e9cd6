"""The device hot path, on host memory (engines/device.py HostOps counts what would cross the bus):
a greedy verify call brings back its rows' argmax ids, not their [T, V] logits; CUDA graphs are
captured at load for a bounded set of (width, window) calls; Generator.close frees the device
memory. Greedy output through the device code path is plain greedy output."""

import numpy as np
import pytest

pytest.importorskip("torch")

from edgespec.engines.base import EngineError, load_calls  # noqa: E402
from edgespec.engines.device import HostOps  # noqa: E402
from edgespec.engines.manifest import load_manifest  # noqa: E402
from edgespec.engines.ort import OrtModel  # noqa: E402
from edgespec.runtime.config import RuntimeConfig  # noqa: E402
from edgespec.runtime.generator import Generator  # noqa: E402
from edgespec.runtime.tree import TreeConfig  # noqa: E402

TOPK_BYTES = 8 * 8  # one row's top-k ids (int64)


@pytest.fixture(scope="module")
def folder(tiny_models, tmp_path_factory):
    """A tiny fp32 --host-prologue folder (CUDA graphs) with a self:1 draft and an EAGLE head."""
    from tiny import tiny_eagle_head

    import edgespec.export.target.exporter as ex
    from edgespec.export.target.exporter import ExportConfig, export

    root = tmp_path_factory.mktemp("device_traffic")
    head_dir, _, _ = tiny_eagle_head(tiny_models["llama"], root / "head", draft_vocab=48, noise=0.01)
    probe, ex.probe_portable_ops = ex.probe_portable_ops, lambda: ()  # every fused op (the probe costs CPU)
    try:
        return export(
            ExportConfig(
                target=str(tiny_models["llama"]),
                out=str(root / "fp32"),
                max_len=128,
                k=4,
                prefill_chunk=16,
                kv_bucket=32,
                precision="fp32",
                trees=True,
                progress=False,
                host_prologue=True,
                draft="self:1",
                eagle=str(head_dir),
                validate=False,
            )
        )
    finally:
        ex.probe_portable_ops = probe


def _prefilled(m, **kw):
    e = OrtModel(m, m.target, **kw)
    e.forward(np.arange(16) + 3, 0)
    e.commit(0, 16)
    return e


@pytest.mark.parametrize("cuda_graph", [True, False])
def test_greedy_verify_call_moves_ids_not_logits(folder, cuda_graph):
    """A verify call of n tokens asked for no logits: its rows' argmax comes back as the top-k output's
    ids (captured: one download of w x 8 ids; uncaptured: ORT binds the top-k on the host, so the
    device ops move nothing), one upload and one sync before the run, none after; the same argmax as
    the logits'. Asked for them, the n rows of logits come back (n x V floats), once."""
    m = load_manifest(folder)
    V = m.target.vocab_size
    ops = HostOps()
    e, ref = _prefilled(m, device_ops=ops, cuda_graph=cuda_graph), _prefilled(m)
    assert e.cuda_graph == cuda_graph
    for n in (5, 3, 1):
        ids = np.arange(n) + 7
        e.forward(ids, 16, logits=False)  # warm: the binding
        ops.reset_counts()
        assert e.forward(ids, 16, logits=False) is None
        got = e.argmax_rows(n).copy()
        w = e.width_for(n)
        want = ref.forward(ids, 16)
        assert np.array_equal(got, want.argmax(-1))
        if cuda_graph:  # the staged inputs up in one block, the ids back
            assert (ops.h2d_calls, ops.d2h_calls, ops.d2h_bytes, ops.syncs) == (1, 1, w * TOPK_BYTES, 2)
        else:
            assert (ops.h2d_calls, ops.d2h_calls, ops.syncs) == (0, 0, 0)
        assert ops.d2h_bytes < n * V * 4  # O(T): no logits row crossed
        assert np.array_equal(e.last_topk(n)[0], ref.last_topk(n)[0])  # probabilities too, when read
        ops.reset_counts()
        assert np.array_equal(e.forward(ids, 16), want)  # asked for: the n real rows, once
        e.argmax_rows(n)
        assert ops.d2h_bytes == n * V * 4 + (w * TOPK_BYTES if cuda_graph else 0)
        # a commit's copies are enqueued: the next call's sync waits for them (no sync of its own)
        ops.reset_counts()
        e.commit(16, n)
        ref.commit(16, n)
        assert ops.syncs == 0
        e.forward(ids, 16 + n, logits=False)
        ref.forward(ids, 16 + n)
        assert ops.syncs == 1 and np.array_equal(e.argmax_rows(n), ref.argmax_rows(n))


def _device_target(monkeypatch, ops, cuda_graph=True):
    """Generator.load's engines on the device code path (HostOps): every make_engine model."""
    from edgespec.engines.prologue import takes_host_prologue
    from edgespec.runtime import backends

    def on_device(manifest, spec, provider, threads, cuda_graph_=None):
        capture = cuda_graph and takes_host_prologue(spec.graph)
        return OrtModel(manifest, spec, "cpu", threads, cuda_graph=capture, device_ops=ops)

    monkeypatch.setattr(backends, "make_engine", on_device)


def _prompts():
    rng = np.random.default_rng(6)
    return [rng.integers(3, 60, 5), np.array([5, 6, 7, 5, 6, 7, 5, 6]), rng.integers(3, 60, 20)]


def _run(g, p, n=40):
    return np.concatenate([x.copy() for x in g.generate_ids(p, n)])


@pytest.mark.parametrize(
    "drafter,tree", [("none", None), ("ngram", None), ("ngram", (5, 3, 2, 2)), ("eagle", None), ("eagle", (5, 3, 2, 2))]
)
def test_greedy_through_the_device_path_is_plain_and_reads_no_logits(folder, monkeypatch, drafter, tree):
    """Generator.load on the device code path (captured calls, HostOps): greedy output identical to
    plain decoding on the host engine; no verify step brings back a logits row (only the prefill
    does, for the first token); a step's downloads are the top-k ids and the hidden states (kept
    for the folder's EAGLE head whatever the drafter: runtime.state.TargetRows)."""
    plain_g = Generator.load(folder, RuntimeConfig(drafter="none", adaptive=False))
    plain = [_run(plain_g, p) for p in _prompts()]
    ops = HostOps()
    _device_target(monkeypatch, ops)
    cfg = RuntimeConfig(
        drafter=drafter,
        k=4,
        adaptive=False,
        fuse_head=False,
        eagle_min_confidence=0.0,
        tree=TreeConfig(*tree) if tree else TreeConfig(),
    )
    g = Generator.load(folder, cfg)
    tgt = g.target
    assert tgt.device is ops and tgt.cuda_graph
    reads = []
    read_back = tgt._graph_bufs.read_back
    tgt._graph_bufs.read_back = lambda name: (reads.append(name), read_back(name))[1]
    H = tgt.hidden_size  # the hidden states come back for the drafters that read them (TargetRows)
    for p, ref in zip(_prompts(), plain, strict=True):
        out, steps = [], 0
        for chunk in g.generate_ids(p, 40):
            out += [int(t) for t in chunk]
            if steps:  # a verify step (the first chunk is the prefill's token)
                assert set(reads) <= {"topk_ids", "hidden"} and "topk_ids" in reads, reads
                assert ops.d2h_bytes <= 5 * (TOPK_BYTES + H * 4), ops.traffic()  # O(T): widths up to 5
            reads.clear()
            ops.reset_counts()
            steps += 1
        assert np.array_equal(out, ref), (drafter, tree, p)
    assert g.last_stats.n_drafted > 0 or drafter in ("none", "ngram")


def test_sampling_and_the_tap_still_read_the_logits(folder, monkeypatch):
    """A sampled call (and a generator with a tap) asks the verify call for its logits."""
    from edgespec.runtime.sampling import SamplingConfig

    ops = HostOps()
    _device_target(monkeypatch, ops)
    g = Generator.load(folder, RuntimeConfig(drafter="ngram", k=4, adaptive=False))
    calls = []
    fwd = g.target.forward
    g.target.forward = lambda *a, **kw: (calls.append(kw.get("logits", True)), fwd(*a, **kw))[1]
    p = np.array([5, 6, 7, 5, 6, 7, 5, 6])
    list(g.generate_ids(p, 20, sampling=SamplingConfig(temperature=0.8, seed=1)))
    assert calls and all(calls)
    calls.clear()
    _run(g, p, 20)
    assert calls and not any(calls[1:])  # greedy verify steps: no logits (the prefill reads its own)
    calls.clear()
    g.tap = lambda *a: None
    _run(g, p, 20)
    assert calls and all(calls)


def test_cuda_graphs_are_captured_at_load(folder, monkeypatch):
    """Generator.load captures every (width, window) of load_calls (the widths it loads, their first
    windows up to the budget); generating within those windows captures nothing new, and its
    output is plain greedy output (replays of the captured calls)."""
    plain_g = Generator.load(folder, RuntimeConfig(drafter="none", adaptive=False))
    ops = HostOps()
    _device_target(monkeypatch, ops)
    g = Generator.load(folder, RuntimeConfig(drafter="ngram", k=4, adaptive=False))
    tgt = g.target
    m = g.manifest
    widths = [w for w in dict.fromkeys([1, m.prefill_chunk, 2, 3, 4, 5]) if w in tgt.widths]
    want = {(w, past + w) for w, past in load_calls(widths, m.kv_bucket, m.max_len)}
    assert set(tgt.captured_at_load) == want and want <= set(tgt._graph_bufs._ids)
    assert {s for _, s in want} == {32, 64, 96, 128}  # every window of this 128-slot folder: within the budget
    n_graphs = len(tgt._graph_bufs._ids)
    for p in _prompts():
        assert np.array_equal(_run(g, p), _run(plain_g, p))
    assert len(tgt._graph_bufs._ids) == n_graphs  # nothing captured during generation


def test_load_calls_are_bounded():
    calls = load_calls([1, 2, 3, 4, 5, 64], bucket=64, max_len=4096, budget=64)
    per_width = 64 // 6
    assert len(calls) == 6 * per_width
    assert all(past >= 0 and past + w <= 4096 and (past + w) % 64 == 0 for w, past in calls)
    assert {past + w for w, past in calls} == {64 * i for i in range(1, per_width + 1)}
    assert load_calls([1], bucket=32, max_len=64) == [(1, 31), (1, 63)]  # not past max_len


def test_close_frees_the_device_memory(folder, monkeypatch):
    """`with Generator.load(...) as g:` frees every device buffer (KV caches, CUDA-graph buffers, the
    logits left on the device) of every engine on leaving; a closed engine refuses to run."""
    ops = HostOps()
    _device_target(monkeypatch, ops)
    with Generator.load(folder, RuntimeConfig(drafter="draft", k=4, adaptive=False)) as g:
        _run(g, np.array([5, 6, 7, 5, 6, 7, 5, 6]), 20)
        assert ops.allocs > 0 and ops.live_bytes > 0 and g.engines.models["draft"].device is ops
    assert ops.frees == ops.allocs and ops.live_bytes == 0
    with pytest.raises(EngineError, match="after close"):
        g.target.forward(np.arange(3), 0)
    g.close()  # twice: nothing
    assert ops.frees == ops.allocs


def test_close_on_the_fake_engine():
    from edgespec.engines.fake import FakeModel, random_table
    from edgespec.runtime.backends import Engines

    engines = Engines(FakeModel(random_table(32)), {"draft": FakeModel(random_table(32, 1))})
    with Generator(None, engines, RuntimeConfig(drafter="none")) as g:
        assert not g.engines.target.closed
    assert g.engines.target.closed and g.engines.models["draft"].closed
