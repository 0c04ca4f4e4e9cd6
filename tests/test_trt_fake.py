"""The native TensorRT backend's logic (buffers, addresses, window shapes, strided commit) on a
fake engine that runs the same ONNX graph through ONNX Runtime on host memory."""

import numpy as np
import pytest
from fake_trt import FakeTrtEngine

from edgespec.engines.base import EngineError
from edgespec.engines.device import HostOps
from edgespec.engines.manifest import TrtInfo, load_manifest
from edgespec.engines.trt import TrtModel, load_trt_engine
from edgespec.runtime.backends import Engines
from edgespec.runtime.config import RuntimeConfig
from edgespec.runtime.generator import Generator
from edgespec.runtime.text import TextCodec

PROMPT = "hello hello world, hello world again and again; hello"


@pytest.fixture(scope="module")
def trt_target(tiny_engine):
    m = load_manifest(tiny_engine)
    eng = FakeTrtEngine(str(tiny_engine / m.target.graph.file), m.target)
    return m, TrtModel(m, m.target, ops=HostOps(), engine=eng, profiles=eng.profiles)


def test_trt_backend_logits_match_ort(trt_target, tiny_engine):
    from edgespec.engines.ort import OrtModel

    m, trt = trt_target
    ref = OrtModel(m, m.target)
    toks = np.arange(40, 90)
    for past, w in ((0, 16), (16, 9), (25, 1), (26, 5)):
        a = trt.forward(toks[past : past + w], past).copy()
        b = ref.forward(toks[past : past + w], past)
        assert np.array_equal(a, b), (past, w)
        trt.commit(past, w)
        ref.commit(past, w)
    kv_host = trt.kv.host.view(np.float32).reshape(ref.kv.shape)
    assert np.array_equal(kv_host[:, :, :31], ref.kv[:, :, :31])  # the strided commit wrote every layer


def test_trt_backend_greedy_speculation_identical(trt_target, tiny_engine):
    m, trt = trt_target
    codec = TextCodec(m)
    g = Generator(m, Engines(trt), RuntimeConfig(drafter="none"), codec=codec)
    ref = [int(t) for c in g.generate_ids(codec.encode(PROMPT), 60) for t in c]
    for k in (1, 4, 8):
        g.set_drafter("ngram", k)
        assert [int(t) for c in g.generate_ids(codec.encode(PROMPT), 60) for t in c] == ref


def test_trt_backend_trees_match_ort_and_stay_identical(trt_target, tiny_engine):
    """Tree inputs (tree_mask, per-node positions) and the per-row compaction commit."""
    from edgespec.engines.ort import OrtModel
    from edgespec.runtime.tree import TreeConfig

    m, trt = trt_target
    ref = OrtModel(m, m.target)
    toks = np.arange(40, 70)
    parents = np.array([-1, 0, 0, 1, 1, 2])
    for e in (trt, ref):
        e.forward(toks[:16], 0)
        e.commit(0, 16)
    a = trt.forward(toks[16:22], 16, parents=parents).copy()
    assert np.array_equal(a, ref.forward(toks[16:22], 16, parents=parents))
    trt.commit(16, 3, rows=np.array([0, 2, 5]))
    ref.commit(16, 3, rows=np.array([0, 2, 5]))
    kv_host = trt.kv.host.view(np.float32).reshape(ref.kv.shape)
    assert np.array_equal(kv_host[:, :, :19], ref.kv[:, :, :19])
    codec = TextCodec(m)
    g = Generator(m, Engines(trt), RuntimeConfig(drafter="none"), codec=codec)
    plain = [int(t) for c in g.generate_ids(codec.encode(PROMPT), 60) for t in c]
    t = Generator(m, Engines(trt), RuntimeConfig(drafter="ngram", k=8, tree=TreeConfig(9, 8, 1, 1)), codec=codec)
    assert [int(x) for c in t.generate_ids(codec.encode(PROMPT), 60) for x in c] == plain
    assert t.last_stats.n_drafted > 0


def test_engine_built_elsewhere_is_refused(tiny_engine, monkeypatch):
    import dataclasses
    import sys
    import types

    m = load_manifest(tiny_engine)
    with pytest.raises(EngineError, match="build-trt"):
        load_trt_engine(m, m.target, "GPU X")
    built = TrtInfo(file="target.engine", tensorrt_version="10.0.0", gpu="GPU A", profiles={1: 0})
    m = dataclasses.replace(m, target=dataclasses.replace(m.target, tensorrt=built))
    monkeypatch.setitem(sys.modules, "tensorrt", types.SimpleNamespace(__version__="10.9.0"))
    with pytest.raises(EngineError, match=r"built with TensorRT 10\.0\.0 for GPU A; this is TensorRT 10\.9\.0"):
        load_trt_engine(m, m.target, "GPU B")


def test_every_tensor_address_is_256_byte_aligned(trt_target):
    """TensorRT's rule for set_tensor_address; the inputs share one block at aligned offsets."""
    m, trt = trt_target
    for w, ctx in trt._ctx.items():
        bad = {name: hex(ptr) for name, ptr in ctx.addr.items() if ptr % 256}
        assert not bad, (w, bad)
        assert {"input_ids", "positions", "past_len", "logits", "new_kv", "hidden"} <= set(ctx.addr)


def test_a_refused_setter_is_an_error(tiny_engine, monkeypatch):
    import fake_trt

    m = load_manifest(tiny_engine)
    eng = FakeTrtEngine(str(tiny_engine / m.target.graph.file), m.target)
    monkeypatch.setattr(fake_trt.FakeContext, "set_input_shape", lambda self, name, shape: name != "positions")
    with pytest.raises(EngineError, match=r"TensorRT refused positions's shape \(1, 1\) \(width 1\)"):
        TrtModel(m, m.target, ops=HostOps(), engine=eng, profiles=eng.profiles)
