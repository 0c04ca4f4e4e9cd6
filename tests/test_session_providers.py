"""GPU sessions asserted (engines/session.py): a session that asked for CUDA or TensorRT and runs
without it is a ProviderError naming the library that did not load, never a silent CPU run; CUDA and
cuDNN are preloaded once before the first GPU session. ONNX Runtime is stood in for (no GPU here)."""

import shutil
import subprocess

import onnxruntime as ort
import pytest

from edgespec.engines import session as es


class FakeSession:
    """An InferenceSession that ended up on `providers_got` (ONNX Runtime's silent fallback)."""

    providers_got = ["CPUExecutionProvider"]
    made: list = []

    def __init__(self, path, so, providers, **kw):
        FakeSession.made.append((providers, kw))

    def get_providers(self):
        return list(self.providers_got)

    def get_outputs(self):  # no declared shapes: nothing for the engine's output check to compare
        return []


@pytest.fixture
def fake_ort(monkeypatch, tmp_path):
    """onnxruntime with a GPU build's provider list, a counted preload_dlls, a stand-in session, and
    its capi folder at tmp_path/onnxruntime/capi (empty: a test puts provider libraries there)."""
    preloads = []
    capi = tmp_path / "onnxruntime" / "capi"
    capi.mkdir(parents=True)
    monkeypatch.setattr(ort, "__file__", str(capi.parent / "__init__.py"))
    monkeypatch.setattr(ort, "preload_dlls", lambda: preloads.append(1), raising=False)
    monkeypatch.setattr(ort, "InferenceSession", FakeSession)
    monkeypatch.setattr(es, "_PRELOADED", [])
    monkeypatch.setattr(FakeSession, "made", [])
    return capi, preloads


def _provider_library(capi, name: str, needs: str) -> None:
    """A shared library `name` in capi that links `needs`, absent at run time (as a provider library
    linking a CUDA library the machine lacks)."""
    if shutil.which("gcc") is None:
        pytest.skip("needs gcc to build a stand-in provider library")
    build = capi.parent.parent / "build"
    build.mkdir()
    (build / "dep.c").write_text("int dep(void) { return 1; }\n")
    (build / "p.c").write_text("int dep(void);\nint provider(void) { return dep(); }\n")
    stem = needs.split(".so")[0][3:]  # libcublasLt.so.13 -> cublasLt
    subprocess.run(
        ["gcc", "-shared", "-fPIC", f"-Wl,-soname,{needs}", "-o", f"lib{stem}.so", "dep.c"], cwd=build, check=True
    )
    subprocess.run(
        ["gcc", "-shared", "-fPIC", "-o", str(capi / name), "p.c", "-L.", f"-l{stem}"], cwd=build, check=True
    )
    shutil.rmtree(build)  # the library it needs is gone: dlopen names it


def test_cuda_session_on_the_cpu_is_an_error_naming_the_missing_library(fake_ort):
    capi, preloads = fake_ort
    _provider_library(capi, "libonnxruntime_providers_cuda.so", needs="libcublasLt.so.13")
    with pytest.raises(es.ProviderError, match=r"runs on CPUExecutionProvider, not CUDAExecutionProvider") as e:
        es.new_session(capi / "m.onnx", None, "cuda")
    assert "libcublasLt.so.13" in e.value.why and "onnxruntime-gpu" in str(e.value)
    providers, kw = FakeSession.made[0]
    assert providers[0] == "CUDAExecutionProvider" and kw == {"enable_fallback": 0}  # no print-and-retry on CPU
    es.new_session(capi / "m.onnx", None, "cpu")
    with pytest.raises(es.ProviderError):
        es.new_session(capi / "m.onnx", None, "cuda")
    assert preloads == [1]  # once per process, before the first GPU session


def test_tensorrt_session_that_runs_on_cuda_is_an_error(fake_ort, monkeypatch):
    """A TensorRT test must not pass while running on CUDA."""
    capi, _ = fake_ort
    monkeypatch.setattr(FakeSession, "providers_got", ["CUDAExecutionProvider", "CPUExecutionProvider"])
    with pytest.raises(es.ProviderError, match="not TensorrtExecutionProvider.*no onnxruntime_providers_tensorrt"):
        es.new_session(capi / "m.onnx", None, "tensorrt")
    assert es.new_session(capi / "m.onnx", None, "cuda").get_providers()[0] == "CUDAExecutionProvider"


def test_provider_failing_at_creation_names_its_library(fake_ort, monkeypatch):
    capi, _ = fake_ort
    _provider_library(capi, "libonnxruntime_providers_cuda.so", needs="libcudnn.so.9")

    def refuse(*a, **kw):
        raise RuntimeError("EP Error: CUDA failure 35")

    monkeypatch.setattr(ort, "InferenceSession", refuse)
    with pytest.raises(es.ProviderError, match=r"no session: .*libcudnn\.so\.9.*CUDA failure 35"):
        es.new_session(capi / "m.onnx", None, "cuda")


def test_the_engine_refuses_before_binding_anything(fake_ort, tiny_engine, monkeypatch):
    """OrtModel on --provider cuda whose session fell back: the error comes at the session, before a
    device buffer is bound into a CPU session."""
    from edgespec.engines.device import HostOps
    from edgespec.engines.manifest import load_manifest
    from edgespec.engines.ort import OrtModel
    from edgespec.runtime.drafters import registry

    registry()
    monkeypatch.setattr(ort, "get_available_providers", lambda: ["CUDAExecutionProvider", "CPUExecutionProvider"])
    m = load_manifest(tiny_engine)
    e = OrtModel(m, m.target, "cuda", device_ops=HostOps(), cuda_graph=False)
    with pytest.raises(es.ProviderError, match="not a GPU build"):
        e.load_widths([1])
    assert e._bindings == {}


def test_this_cpu_build_has_no_gpu_provider_library():
    assert "not a GPU build" in es.provider_library_error("cuda")


def test_tensorrt_ep_gets_one_profile_over_every_call_and_an_engine_cache(fake_ort, tiny_engine, monkeypatch):
    """Without a profile the TensorRT EP rebuilds its engine for every new (width, window) shape, and
    without a cache at every load: the options span T over the widths and S over the windows."""
    from edgespec.engines.device import HostOps
    from edgespec.engines.manifest import load_manifest
    from edgespec.engines.ort import OrtModel
    from edgespec.runtime.drafters import registry

    registry()
    m = load_manifest(tiny_engine)
    opts = es.tensorrt_options(m, m.target, m.max_len)
    lo, opt, hi = (
        dict(x.split(":") for x in opts[f"trt_profile_{k}_shapes"].split(",")) for k in ("min", "opt", "max")
    )
    assert (lo["input_ids"], opt["input_ids"], hi["input_ids"]) == ("1x1", "1x9", "1x16")  # widths 1..9, 16
    assert (lo["past_key_0"], hi["past_value_1"]) == ("32x32", "256x32")  # S: kv_bucket .. max_len, Hkv*D = 32
    assert set(lo) == set(hi) == set(opt) and "past_len" not in lo  # fixed shapes left to the graph
    assert opts["trt_engine_cache_path"] == str(tiny_engine / es.TRT_CACHE) == opts["trt_timing_cache_path"]
    monkeypatch.setattr(FakeSession, "providers_got", ["TensorrtExecutionProvider", "CPUExecutionProvider"])
    monkeypatch.setattr(ort, "get_available_providers", lambda: ["TensorrtExecutionProvider", "CPUExecutionProvider"])
    OrtModel(m, m.target, "tensorrt", device_ops=HostOps()).session()
    assert FakeSession.made[-1][0][0] == ("TensorrtExecutionProvider", opts)
