"""Every backend serves every drafter a folder ships, or `Generator.load` refuses that drafter with
a one-line error that says what to use: one test per (backend, drafter) pair.

cpu runs for real; trt (native TensorRT) runs its real backend code on a stand-in engine that
executes the same ONNX graph with ONNX Runtime on host memory (tests/fake_trt.py); the ONNX
Runtime GPU providers need onnxruntime-gpu and a GPU (skipped here)."""

import numpy as np
import onnxruntime as ort
import pytest
from fake_trt import FakeTrtEngine
from tiny import tiny_dflash, tiny_eagle3_head, tiny_eagle_head, tiny_medusa_heads

from edgespec.engines import session
from edgespec.engines.device import HostOps
from edgespec.runtime.config import RuntimeConfig
from edgespec.runtime.config import RuntimeConfig as _Cfg
from edgespec.runtime.drafters import names, spec_of
from edgespec.runtime.generator import Generator

DRAFTERS = names()
FEATURE_DRAFTERS = tuple(
    d
    for d in DRAFTERS
    if spec_of(d).needs_features(_Cfg()) or any(spec_of(n).reads_aux for n in spec_of(d).needs(_Cfg()))
)

PROMPT = np.array([5, 9, 5, 9, 12, 30, 5, 9, 5, 9, 12, 41, 7])
GPU_EP = {"cuda": "CUDAExecutionProvider", "tensorrt": "TensorrtExecutionProvider"}


@pytest.fixture(scope="module")
def full_engine(tiny_models, tmp_path_factory):
    """A folder that ships every drafter but eagle3: a self:1 draft, an EAGLE head and Medusa heads."""
    from edgespec.export.target.exporter import ExportConfig, export

    root = tmp_path_factory.mktemp("full")
    head_dir, _, _ = tiny_eagle_head(tiny_models["llama"], root / "head", draft_vocab=48, noise=0.01)
    heads_dir, _, _ = tiny_medusa_heads(tiny_models["llama"], root / "heads", n_heads=4, n_layers=1)
    return export(
        ExportConfig(
            target=str(tiny_models["llama"]),
            draft="self:1",
            eagle=str(head_dir),
            medusa=str(heads_dir),
            out=str(root / "engine"),
            max_len=256,
            k=4,
            prefill_chunk=16,
            kv_bucket=32,
            precision="fp32",
            trees=True,
            progress=False,
        )
    )


@pytest.fixture(scope="module")
def eagle3_engine(tiny_models, tmp_path_factory):
    """A folder with an EAGLE-3 head and a DFlash drafter: its target outputs hidden_aux, which
    native TensorRT engines do not bind, so they have their own folder (on trt the drafters are
    refused before any model runs)."""
    from edgespec.export.target.exporter import ExportConfig, export

    root = tmp_path_factory.mktemp("e3")
    head_dir, _, _ = tiny_eagle3_head(tiny_models["llama"], root / "head3")
    dflash_dir = tiny_dflash(tiny_models["llama"], root / "dflash")
    return export(
        ExportConfig(
            target=str(tiny_models["llama"]),
            eagle="none",
            medusa="none",
            eagle3=str(head_dir),
            dflash=str(dflash_dir),
            out=str(root / "engine"),
            max_len=256,
            k=4,
            prefill_chunk=16,
            kv_bucket=32,
            precision="fp32",
            trees=True,
            progress=False,
        )
    )


def _fake_trt(monkeypatch) -> None:
    """provider "trt" builds TrtModel on the stand-in engine (no tensorrt package, no GPU here)."""
    from edgespec.engines.trt import TrtModel
    from edgespec.runtime import backends

    real = backends.make_engine

    def make_engine(manifest, spec, provider, threads, cuda_graph=None):
        if provider != "trt":
            return real(manifest, spec, provider, threads, cuda_graph)
        eng = FakeTrtEngine(str(manifest.path(spec.graph.file)), spec)
        return TrtModel(manifest, spec, ops=HostOps(), engine=eng, profiles=eng.profiles)

    monkeypatch.setattr(backends, "make_engine", make_engine)


def _ids(g: Generator) -> list[int]:
    return [int(t) for chunk in g.generate_ids(PROMPT, 40) for t in chunk]


@pytest.mark.parametrize("drafter", DRAFTERS)
@pytest.mark.parametrize(
    "provider",
    ["cpu", "trt", pytest.param("cuda", marks=pytest.mark.gpu), pytest.param("tensorrt", marks=pytest.mark.gpu)],
)
def test_backend_serves_or_refuses_each_drafter(full_engine, request, monkeypatch, provider, drafter):
    if provider in GPU_EP and GPU_EP[provider] not in ort.get_available_providers():
        pytest.skip(f"{provider} needs onnxruntime-gpu and an NVIDIA GPU")
    if provider in GPU_EP and session.provider_library_error(provider):  # listed, but its libraries do not load
        pytest.skip(f"{provider}: {session.provider_library_error(provider)}")
    if provider == "trt":
        _fake_trt(monkeypatch)
    cfg = RuntimeConfig(
        provider=provider, drafter=drafter, k=4, adaptive=False, eagle_min_confidence=0.0, medusa_min_confidence=0.0
    )
    if provider == "trt" and drafter in FEATURE_DRAFTERS:
        with pytest.raises(ValueError, match=rf"drafter '{drafter}' cannot run on provider 'trt'.*Hint: use "):
            Generator.load(full_engine, cfg)
        return
    aux_drafter = drafter in ("eagle3", "dflash")
    g = Generator.load(request.getfixturevalue("eagle3_engine") if aux_drafter else full_engine, cfg)
    assert g.drafter.name == drafter
    out = _ids(g)
    g.set_drafter("none")
    assert out == _ids(g), f"{provider} + {drafter}: greedy output differs from plain decoding"
    if drafter != "none":
        assert g.last_stats.n_output == len(out)
