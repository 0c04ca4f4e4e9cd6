"""ONNX Runtime sessions and mapped weights, shared by every ONNX Runtime engine of a folder.

- Weights: a weights file is memory-mapped once per process and its tensors are handed to a
  session as initializers (SessionOptions.add_initializer), so one graph per model serves every
  phase width and the kernels' prepacked weights exist once.
- Threads: a pool per session by default; `share_thread_pool()` puts every session of the process
  on one pool (it must run before the first session: ONNX Runtime makes it process-wide).
- Providers: cpu / cuda / tensorrt, each with its fallbacks; an engine checks its provider before
  it allocates anything, so a missing onnxruntime-gpu is one error with a hint.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import onnxruntime as ort

from edgespec.engines import cuda_graph as cg
from edgespec.engines.base import EngineError
from edgespec.engines.manifest import Manifest

PROVIDERS = {
    "cpu": ["CPUExecutionProvider"],
    "cuda": ["CUDAExecutionProvider", "CPUExecutionProvider"],
    "tensorrt": ["TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"],
}

_WEIGHTS_CACHE: dict[str, np.memmap] = {}  # resolved path -> its mapping (one per file per process)
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


def map_weights(path: Path) -> np.memmap:
    """The process's one read-only mapping of a weights file, whichever model asks."""
    key = str(path.resolve())
    if key not in _WEIGHTS_CACHE:
        _WEIGHTS_CACHE[key] = np.memmap(path, dtype=np.uint8, mode="r")
    return _WEIGHTS_CACHE[key]


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
    """One weight entry as a read-only array of its dtype and shape (a view of the mapping)."""
    return weight_bytes(manifest, spec, w).view(np.dtype(w.dtype)).reshape(w.shape)


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


def session_options(manifest: Manifest, spec, threads: int | None, prepack: bool = True):
    """(SessionOptions with the model's mapped weights as initializers, those OrtValues: keep them
    alive as long as the session)."""
    initializers = {}
    for name, w in spec.weights.items():
        initializers[name] = ort.OrtValue.ortvalue_from_numpy(read_weight(manifest, spec, w))
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    if _SHARED_POOL:  # every session on the process's one pool (share_thread_pool)
        so.use_per_session_threads = False
    else:
        so.intra_op_num_threads = threads or physical_cores()
        so.inter_op_num_threads = 1
    so.log_severity_level = 3
    if not prepack:
        so.add_session_config_entry("session.disable_prepacking", "1")
    if spec.role != "target" and not _SHARED_POOL:
        # A drafter alternates with the target; a spinning draft pool steals the cores the
        # target needs next (docs/results/head-cost.md).
        # The target keeps spinning: plain decoding is ~12% faster with it. (A shared pool
        # has one set of threads, spinning for whichever session runs next.)
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    for name, value in initializers.items():
        so.add_initializer(name, value)
    return so, initializers


def new_session(path: Path, so: ort.SessionOptions, provider: str, cuda_graph: bool = False) -> ort.InferenceSession:
    """A session of the graph at path on the provider (cuda_graph: the CUDA EP captures and replays)."""
    global _N_SESSIONS
    _N_SESSIONS += 1
    providers = PROVIDERS[provider]
    if cuda_graph:  # the CUDA EP captures each gpu_graph_id's first runs and replays them afterwards
        providers = [(providers[0], dict(cg.PROVIDER_OPTIONS))] + providers[1:]
    try:
        return ort.InferenceSession(str(path), so, providers=providers)
    except Exception as e:  # ORT raises its own exception types; re-raise with context
        raise EngineError(
            f"could not load {path}: {e}. Hint: re-export the folder with this edgespec/onnxruntime"
        ) from e


def model_session(model_bytes: bytes) -> ort.InferenceSession:
    """A CPU session for a small in-memory model (export-time probes), on the shared pool if set."""
    global _N_SESSIONS
    so = ort.SessionOptions()
    so.log_severity_level = 3
    if _SHARED_POOL:
        so.use_per_session_threads = False
    _N_SESSIONS += 1
    return ort.InferenceSession(model_bytes, so, providers=PROVIDERS["cpu"])
