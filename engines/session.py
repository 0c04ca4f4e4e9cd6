"""ONNX Runtime sessions and mapped weights, shared by every ONNX Runtime engine of a folder.

- Weights: a weights file is memory-mapped once per process and its tensors are handed to a
  session as initializers (SessionOptions.add_initializer), so one graph per model serves every
  phase width and the kernels' prepacked weights exist once.
- Threads: a pool per session by default; `share_thread_pool()` puts every session of the process
  on one pool (it must run before the first session: ONNX Runtime makes it process-wide).
- Providers: cpu / cuda / tensorrt, each with its fallbacks; an engine checks its provider before
  it allocates anything, so a missing onnxruntime-gpu is one error with a hint. A GPU session is
  asserted to run on the provider it asked for: ONNX Runtime lists the CUDA and TensorRT providers
  even where their libraries cannot load and then runs on the CPU with only a log line (GPU buffers
  bound into such a session would be read as host memory); here that is a ProviderError naming the
  library the dynamic loader could not open.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import threading
from pathlib import Path

import numpy as np
import onnxruntime as ort

from edgespec.engines import cuda_graph as cg
from edgespec.engines import rope, rowop
from edgespec.engines.base import EngineError
from edgespec.engines.manifest import Manifest

PROVIDERS = {
    "cpu": ["CPUExecutionProvider"],
    "cuda": ["CUDAExecutionProvider", "CPUExecutionProvider"],
    "tensorrt": ["TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"],
}
BF16 = "bfloat16"  # a weight dtype numpy lacks (an embedding stored bf16: export/target/quant/linears.py)
ONNX_BFLOAT16 = 16  # onnx.TensorProto.BFLOAT16 (onnx is export's dependency, not the engines')

# ONNX Runtime's own library of each GPU provider (lib*.so / *.dll beside its Python module); it links
# CUDA, cuBLAS (cuDNN at run time) or TensorRT, so loading it names what is missing
PROVIDER_LIBRARY = {"cuda": "onnxruntime_providers_cuda", "tensorrt": "onnxruntime_providers_tensorrt"}
PROVIDER_HINT = {
    "cuda": "install the onnxruntime-gpu build for this CUDA with its libraries (pip install "
    "'onnxruntime-gpu[cuda,cudnn]'; 1.31 is a CUDA 13 build) or put CUDA and cuDNN on LD_LIBRARY_PATH; "
    "or run --provider cpu",
    "tensorrt": "install TensorRT's libraries for this onnxruntime-gpu build (libnvinfer on LD_LIBRARY_PATH), "
    "or run --provider cuda",
}

TRT_CACHE = "trt_cache"  # folder beside the graphs where the TensorRT EP keeps its engines and timing cache

_WEIGHTS_CACHE: dict[str, np.ndarray] = {}  # resolved path -> its mapping's bytes (one per file per process)
_MAPS: dict[str, mmap.mmap] = {}  # resolved path -> the mapping itself (for madvise)
_SHARED_POOL = 0  # intra-op threads of the process-wide pool every session runs on (0: a pool per session)
_N_SESSIONS = 0  # sessions made in this process (a pool can only be shared before the first)


def physical_cores() -> int:
    try:
        import psutil

        return psutil.cpu_count(logical=False) or os.cpu_count() or 1
    except ImportError:
        return os.cpu_count() or 1


def share_thread_pool(threads: int | None = None) -> int:
    """Run every ONNX Runtime session of this process on one intra-op thread pool; returns its size.

    With a pool per session, a drafter's call (a head, multi-token heads, a draft model) right
    after the target's must wake its own threads while the target's still spin on the same cores;
    on one pool the threads are awake (measured in docs/results/head-cost.md). ONNX Runtime makes
    this process-wide: call it before the first session (the CLI does for generate / bench / chat /
    serve / demo / tune); afterwards every session of the process, also ones made outside
    edgespec, must set `SessionOptions.use_per_session_threads = False`."""
    global _SHARED_POOL
    n = threads or physical_cores()
    if _SHARED_POOL:
        if n != _SHARED_POOL:
            raise EngineError(f"this process already shares a pool of {_SHARED_POOL} threads; cannot make it {n}")
        return n
    if _N_SESSIONS:
        raise EngineError(
            f"share_thread_pool() must run before the first session; {_N_SESSIONS} exist already. "
            "Hint: call it right after importing edgespec"
        )
    ort.set_global_thread_pool_sizes(n, 1)
    _SHARED_POOL = n
    return n


def map_weights(path: Path) -> np.ndarray:
    """The process's one read-only mapping of a weights file, whichever model asks (uint8, read-only)."""
    key = str(path.resolve())
    if key not in _WEIGHTS_CACHE:
        with open(path, "rb") as f:  # (the mapping outlives the descriptor)
            _MAPS[key] = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        _WEIGHTS_CACHE[key] = np.frombuffer(_MAPS[key], np.uint8)
    return _WEIGHTS_CACHE[key]


def mapped_bytes() -> int:
    """Bytes of the weights files this process maps (each file once)."""
    return sum(len(m) for m in _MAPS.values())


def drop_mapped_pages(path: Path) -> None:
    """Take a weights file's pages out of this process's resident set (MADV_DONTNEED). They stay in
    the page cache: a tensor a kernel reads as stored faults its pages back at its next read, while
    one a kernel read once to prepack (MatMulNBits' and MLAS's packed copies) stays out, so the
    resident set holds each weight once. The mapping is shared and read-only: no data changes."""
    mm = _MAPS.get(str(path.resolve()))
    if mm is not None and hasattr(mm, "madvise") and hasattr(mmap, "MADV_DONTNEED"):  # (Linux, macOS)
        mm.madvise(mmap.MADV_DONTNEED)


class PageDropper:
    """`with PageDropper(paths):` drops the files' resident pages every `every` seconds while the block
    runs and once at its end: a session that prepacks reads each weight once while it is made, so
    without it the peak holds the mapped file and the packed copies at once. (ONNX Runtime releases
    the GIL while it makes a session.)"""

    def __init__(self, paths, every: float = 0.2) -> None:
        self.paths, self.every = list(paths), every  # the weights files; seconds between drops
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="edgespec-page-dropper", daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            for p in self.paths:
                drop_mapped_pages(p)

    def __enter__(self) -> PageDropper:
        if self.paths:
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        for p in self.paths:
            drop_mapped_pages(p)


class WeightsFileError(EngineError):
    """A weights file shorter than the tensors the manifest lists in it."""

    def __init__(self, why: str, hint: str) -> None:
        super().__init__(f"{why}. Hint: {hint}")
        self.why = why  # what is wrong, without the hint (callers that add their own)


def weight_bytes(manifest: Manifest, spec, w) -> np.ndarray:
    """The bytes of one weight (or d2t) entry in its mapped file; a file too short for the entries
    the manifest lists is named with its size and the size they need."""
    rel = w.file or spec.weights_file
    path = manifest.path(rel)
    size = path.stat().st_size
    if w.offset + w.nbytes > size:
        entries = list(spec.weights.values()) + ([spec.d2t] if spec.d2t is not None else [])
        need = max(e.offset + e.nbytes for e in entries if (e.file or spec.weights_file) == rel)
        raise WeightsFileError(
            f"weights file {path} is {size} bytes, but the manifest's {spec.role} tensors "
            f"need {need} (truncated or replaced?)",
            f"re-export the folder (edgespec export --out {manifest.folder} --force)",
        )
    return map_weights(path)[w.offset : w.offset + w.nbytes]


def read_weight(manifest: Manifest, spec, w) -> np.ndarray:
    """One weight entry as a read-only array of its dtype and shape (a view of the mapping; a rotary
    table computed here: engines/rope.py). A bfloat16 one needs ml_dtypes (onnx's dependency,
    export's); the sessions read it without."""
    if w.rope is not None:
        name = next((n for n, x in spec.weights.items() if x is w), "rope")
        return rope.checked_table(f"{spec.role}/{name}", w.rope, tuple(w.shape), w.dtype)
    if w.dtype == BF16:
        try:
            import ml_dtypes
        except ImportError as e:
            raise EngineError(f"a {w.dtype} weight read as an array needs ml_dtypes (pip install ml_dtypes)") from e
        return weight_bytes(manifest, spec, w).view(ml_dtypes.bfloat16).reshape(w.shape)
    return weight_bytes(manifest, spec, w).view(np.dtype(w.dtype)).reshape(w.shape)


def weight_value(manifest: Manifest, spec, w) -> ort.OrtValue:
    """One weight entry as an OrtValue on the mapping (no copy); a bfloat16 one (a dtype numpy lacks)
    as its bits, uint16, typed BFLOAT16 for ONNX Runtime."""
    if w.dtype == BF16 and w.rope is None:
        bits = weight_bytes(manifest, spec, w).view(np.uint16).reshape(w.shape)
        return ort.OrtValue.ortvalue_from_numpy_with_onnx_type(bits, ONNX_BFLOAT16)
    return ort.OrtValue.ortvalue_from_numpy(read_weight(manifest, spec, w))


def read_d2t(manifest: Manifest, spec) -> np.ndarray:
    """A drafter's draft id -> target id map [Vd] (a copy: int64, writable)."""
    return weight_bytes(manifest, spec, spec.d2t).view(np.int64).copy()


def check_provider(provider: str) -> None:
    if provider not in PROVIDERS:
        raise EngineError(f"provider {provider!r} unknown; choose one of {', '.join(PROVIDERS)}")
    missing = [p for p in PROVIDERS[provider][:1] if p not in ort.get_available_providers()]
    if missing:
        raise EngineError(
            f"provider {provider!r} needs {missing[0]}, which this onnxruntime build "
            f"lacks (has {ort.get_available_providers()}). Hint: pip install onnxruntime-gpu"
        )


class ProviderError(EngineError):
    """A session that asked for a GPU provider runs without it (on the CPU, or on CUDA instead of TensorRT)."""

    def __init__(self, provider: str, got: list[str], why: str) -> None:
        runs = f"the session runs on {', '.join(got)}, not {PROVIDERS[provider][0]}" if got else "no session"
        super().__init__(f"provider {provider!r}: {runs}: {why}. Hint: {PROVIDER_HINT[provider]}")
        self.provider, self.got, self.why = provider, got, why  # what was asked, what the session has, why


_PRELOADED: list[str] = []  # preload_gpu_libraries' outcome in this process ("" : done, else its error)


def preload_gpu_libraries() -> str:
    """onnxruntime.preload_dlls() once per process, before the first GPU session: it loads CUDA and
    cuDNN from the nvidia-* wheels (onnxruntime-gpu[cuda,cudnn], or torch's), which the dynamic loader
    would not find on its own. "" when done (or the build has no such call: the libraries must then
    be on the loader's path), else its error, kept for the ProviderError that would follow."""
    if not _PRELOADED:
        try:
            if hasattr(ort, "preload_dlls"):  # onnxruntime >= 1.21
                ort.preload_dlls()
            _PRELOADED.append("")
        except (OSError, RuntimeError) as e:  # a missing folder or library: the session will say more
            _PRELOADED.append(f"onnxruntime.preload_dlls() failed: {e}")
    return _PRELOADED[0]


def provider_library_error(provider: str) -> str | None:
    """Why ONNX Runtime's library of a GPU provider does not load in this process: the dynamic loader's
    message, which names the CUDA / cuDNN / TensorRT library it could not open. None when it loads."""
    capi = Path(ort.__file__).parent / "capi"
    name = PROVIDER_LIBRARY[provider]
    found = sorted(capi.glob(f"lib{name}.so*")) + sorted(capi.glob(f"{name}.dll"))
    if not found:
        return f"this onnxruntime ({ort.__version__}, {capi}) has no {name} library: not a GPU build"
    try:
        for shared in sorted(capi.glob("*onnxruntime_providers_shared.*")):  # what the provider links against
            ctypes.CDLL(str(shared), mode=ctypes.RTLD_GLOBAL)
        ctypes.CDLL(str(found[0]))
    except OSError as e:
        return f"{found[0].name} does not load: {e}"
    return None


def check_session_provider(session: ort.InferenceSession, provider: str) -> None:
    """The session really runs on the provider it asked for (a GPU one), else a ProviderError with why."""
    want = PROVIDERS[provider][0]
    got = list(session.get_providers())
    if provider == "cpu" or want in got:
        return
    why = provider_library_error(provider) or (_PRELOADED[0] if _PRELOADED else "")
    raise ProviderError(provider, got, why or "ONNX Runtime left it out (its log above says why)")


def session_options(manifest: Manifest, spec, threads: int | None, prepack: bool = True, verifies: bool = False):
    """(SessionOptions with the model's mapped weights as initializers, those OrtValues: keep them
    alive as long as the session). verifies: the session runs the target's calls in its place (the
    fused target+EAGLE graph), so its pool spins as the target's does."""
    initializers = {}
    for name, w in spec.weights.items():
        initializers[name] = weight_value(manifest, spec, w)
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    if _SHARED_POOL:  # every session on the process's one pool (share_thread_pool)
        so.use_per_session_threads = False
    else:
        so.intra_op_num_threads = threads or physical_cores()
        so.inter_op_num_threads = 1
    so.log_severity_level = 3
    if rowop.needs(spec.weights):  # linears written for edgespec's row kernel (--int4-kernel rowop)
        rowop.register(so, getattr(spec, "rowop_layout", 0))
    if not prepack:
        so.add_session_config_entry("session.disable_prepacking", "1")
    if spec.role != "target" and not verifies and not _SHARED_POOL:
        # A drafter alternates with the target; a spinning draft pool steals the cores the
        # target needs next (docs/results/head-cost.md).
        # The target keeps spinning: plain decoding is ~12% faster with it, and so does a graph that
        # verifies in its place (the fused target+EAGLE graph without it: T = 1 7.3 ms against the
        # target's 5.3, its target linears 31% slower). (A shared pool has one set of threads,
        # spinning for whichever session runs next.)
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    for name, value in initializers.items():
        so.add_initializer(name, value)
    return so, initializers


def tensorrt_options(manifest: Manifest, spec, max_window: int) -> dict[str, str]:
    """The TensorRT EP's options for a model: one optimization profile spanning every call it gets
    (T over the graph's widths, optimized at the widest verify; the cache window S from kv_bucket to
    max_window), so no new shape rebuilds the engine; and its engines and timing cache kept in the
    folder (TRT_CACHE), so the next load deserializes instead of building (minutes on a Jetson).
    A folder that cannot be written to gets the profile only."""
    g = spec.graph
    t_min, t_max = min(g.widths), max(g.widths)
    t_opt = max(g.phases.get("verify", (t_max,)))
    s_min, s_max = manifest.kv_bucket, max_window
    s_opt = min(s_max, max(s_min, 4 * manifest.kv_bucket))

    def shapes(t: int, s: int) -> str:  # "name:1x5,past_key_0:256x64,...": the inputs whose shape varies
        return ",".join(
            f"{name}:{'x'.join(map(str, ts.shape_at(t, s)))}"
            for ts in g.inputs
            for name in ts.names()
            if ts.shape_at(t_min, s_min) != ts.shape_at(t_max, s_max)
        )

    opts = {
        "trt_profile_min_shapes": shapes(t_min, s_min),
        "trt_profile_opt_shapes": shapes(t_opt, s_opt),
        "trt_profile_max_shapes": shapes(t_max, s_max),
    }
    cache = manifest.path(TRT_CACHE)
    try:
        cache.mkdir(exist_ok=True)
    except OSError:  # a read-only folder: TensorRT builds at every load, but runs
        return opts
    return opts | {
        "trt_engine_cache_enable": "1",
        "trt_engine_cache_path": str(cache),
        "trt_timing_cache_enable": "1",
        "trt_timing_cache_path": str(cache),
    }


def weights_files(manifest: Manifest, spec) -> list[Path]:
    """The weights files a model's initializers are mapped from."""
    return sorted({manifest.path(w.file or spec.weights_file) for w in spec.weights.values() if w.rope is None})


def new_session(
    path: Path,
    so: ort.SessionOptions,
    provider: str,
    cuda_graph: bool = False,
    trt_options: dict | None = None,
    weights: list[Path] = (),
) -> ort.InferenceSession:
    """A session of the graph at path on the provider (cuda_graph: the CUDA EP captures and replays;
    trt_options: the TensorRT EP's, tensorrt_options; weights: the mapped files its initializers come
    from, whose pages are dropped as it is made: PageDropper)."""
    global _N_SESSIONS
    _N_SESSIONS += 1
    providers = PROVIDERS[provider]
    if cuda_graph:  # the CUDA EP captures each gpu_graph_id's first runs and replays them afterwards
        providers = [(providers[0], dict(cg.PROVIDER_OPTIONS))] + providers[1:]
    if provider == "tensorrt" and trt_options:
        providers = [(providers[0], dict(trt_options))] + providers[1:]
    if provider != "cpu":
        preload_gpu_libraries()
    try:  # enable_fallback=0: an execution provider that fails at session creation raises (it would
        # print and retry on the CPU)
        with PageDropper(weights):
            session = ort.InferenceSession(str(path), so, providers=providers, enable_fallback=0)
    except Exception as e:  # ORT raises its own exception types; re-raise with context
        why = provider_library_error(provider) if provider != "cpu" else None
        if why:
            raise ProviderError(provider, [], f"{why} ({e})") from e
        raise EngineError(
            f"could not load {path}: {e}. Hint: re-export the folder with this edgespec/onnxruntime"
        ) from e
    check_session_provider(session, provider)
    return session


def model_session(model_bytes: bytes) -> ort.InferenceSession:
    """A CPU session for a small in-memory model (export-time probes), on the shared pool if set."""
    global _N_SESSIONS
    so = ort.SessionOptions()
    so.log_severity_level = 3
    if _SHARED_POOL:
        so.use_per_session_threads = False
    _N_SESSIONS += 1
    return ort.InferenceSession(model_bytes, so, providers=PROVIDERS["cpu"])
