"""ONNX Runtime backend: one model's phase graphs, one copy of its weights, one KV buffer.

- Weights: the model's weights file is memory-mapped once and handed to the session as
  initializers (SessionOptions.add_initializer); one graph per model serves every phase width, so
  there is one session, and the kernels' prepacked weights exist once (Python has no shared
  prepacked-weights container, so one session per phase would hold one packed copy each).
- KV: `kv[L, 2, max_len, Hkv*D]` allocated at load. A call binds `kv[l, j, :S]` (contiguous: the
  cache is sequence-major) for the context bucket S >= past_len, so attention reads S rows, not
  max_len. Outputs are bound to preallocated buffers; nothing is allocated per token.
- IOBinding objects are built once per (width, bucket) and reused.
- --host-prologue folders: the per-call masks and slot indices are built here (engines/prologue.py);
  on the CUDA provider such a folder's calls are captured as CUDA graphs, one per (width, window)
  (engines/cuda_graph.py), unless cuda_graph=False.
"""

from __future__ import annotations

import base64
import os
import warnings
from pathlib import Path

import numpy as np
import onnxruntime as ort

from edgespec.engines import cuda_graph as cg
from edgespec.engines.base import EngineError, fill_tree, pick_width, window_slots
from edgespec.engines.manifest import FUSED_PREFIX, HeadsSpec, Manifest, ModelSpec
from edgespec.engines.prologue import HostPrologue, cache_slots, host_window_slots, takes_host_prologue

PROVIDERS = {
    "cpu": ["CPUExecutionProvider"],
    "cuda": ["CUDAExecutionProvider", "CPUExecutionProvider"],
    "tensorrt": ["TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"],
}

_WEIGHTS_CACHE: dict[str, np.memmap] = {}
_SHARED_POOL = 0  # intra-op threads of the process-wide pool every session runs on (0: a pool per session)
_N_SESSIONS = 0  # sessions made in this process (a pool can only be shared before the first)


def _physical_cores() -> int:
    try:
        import psutil

        return psutil.cpu_count(logical=False) or os.cpu_count() or 1
    except ImportError:
        return os.cpu_count() or 1


def share_thread_pool(threads: int | None = None) -> int:
    """Run every ONNX Runtime session of this process on one intra-op thread pool; returns its size.

    With a pool per session, a drafter's call (EAGLE head, Medusa heads, draft model) right after
    the target's must wake its own threads while the target's still spin on the same cores; on one
    pool the threads are awake (measured in docs/results/head-cost.md). ONNX Runtime makes this
    process-wide: call it before the first session (the CLI does for generate / bench / chat /
    serve / demo / tune); afterwards every session of the process, also ones made outside
    edgespec, must set `SessionOptions.use_per_session_threads = False`."""
    global _SHARED_POOL
    n = threads or _physical_cores()
    if _SHARED_POOL:
        if n != _SHARED_POOL:
            raise EngineError(f"this process already shares a pool of {_SHARED_POOL} threads; cannot make it {n}")
        return n
    if _N_SESSIONS:
        raise EngineError(f"share_thread_pool() must run before the first session; {_N_SESSIONS} exist already. "
                          "Hint: call it right after importing edgespec")
    ort.set_global_thread_pool_sizes(n, 1)
    _SHARED_POOL = n
    return n


def _map_weights(path: Path) -> np.memmap:
    key = str(path.resolve())
    if key not in _WEIGHTS_CACHE:  # one mapping per file per process, whichever model asks
        _WEIGHTS_CACHE[key] = np.memmap(path, dtype=np.uint8, mode="r")
    return _WEIGHTS_CACHE[key]


class WeightsFileError(EngineError):
    """A weights file shorter than the tensors the manifest lists in it."""

    def __init__(self, why: str, hint: str) -> None:
        super().__init__(f"{why}. Hint: {hint}")
        self.why = why  # what is wrong, without the hint (callers that add their own)


def _weight_bytes(manifest: Manifest, spec, w) -> np.ndarray:
    """The bytes of one weight (or d2t) entry in its mapped file; a file too short for the entries
    the manifest lists is named with its size and the size they need."""
    rel = w.file or spec.weights_file
    path = manifest.path(rel)
    size = path.stat().st_size
    if w.offset + w.nbytes > size:
        entries = list(spec.weights.values()) + ([spec.d2t] if spec.d2t is not None else [])
        need = max(e.offset + e.nbytes for e in entries if (e.file or spec.weights_file) == rel)
        raise WeightsFileError(f"weights file {path} is {size} bytes, but the manifest's {spec.role} tensors "
                               f"need {need} (truncated or replaced?)",
                               f"re-export the folder (edgespec export --out {manifest.folder} --force)")
    return _map_weights(path)[w.offset: w.offset + w.nbytes]


def weight_array(manifest: Manifest, spec, w) -> np.ndarray:
    """Weight entry w of a model's spec as an array (mapped from its file, read-only)."""
    return _weight_bytes(manifest, spec, w).view(np.dtype(w.dtype)).reshape(w.shape)


def _check_provider(provider: str) -> None:
    if provider not in PROVIDERS:
        raise EngineError(f"provider {provider!r} unknown; choose one of {', '.join(PROVIDERS)}")
    missing = [p for p in PROVIDERS[provider][:1] if p not in ort.get_available_providers()]
    if missing:
        raise EngineError(f"provider {provider!r} needs {missing[0]}, which this onnxruntime build "
                          f"lacks (has {ort.get_available_providers()}). Hint: pip install onnxruntime-gpu")


def _session_options(manifest: Manifest, spec, threads: int | None, prepack: bool = True):
    """(SessionOptions with the model's mapped weights as initializers, those OrtValues: keep them
    alive as long as the session)."""
    initializers = {}
    for name, w in spec.weights.items():
        arr = _weight_bytes(manifest, spec, w).view(np.dtype(w.dtype)).reshape(w.shape)
        initializers[name] = ort.OrtValue.ortvalue_from_numpy(arr)
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    if _SHARED_POOL:  # every session on the process's one pool (share_thread_pool)
        so.use_per_session_threads = False
    else:
        so.intra_op_num_threads = threads or _physical_cores()
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


def _new_session(path: Path, so: ort.SessionOptions, provider: str, cuda_graph: bool = False) -> ort.InferenceSession:
    global _N_SESSIONS
    _N_SESSIONS += 1
    providers = PROVIDERS[provider]
    if cuda_graph:  # the CUDA EP captures each gpu_graph_id's first runs and replays them afterwards
        providers = [(providers[0], dict(cg.PROVIDER_OPTIONS))] + providers[1:]
    try:
        return ort.InferenceSession(str(path), so, providers=providers)
    except Exception as e:  # ORT raises its own exception types; re-raise with context
        raise EngineError(f"could not load {path}: {e}. Hint: re-export the folder with this "
                          "edgespec/onnxruntime") from e


def _commit_host(kv: np.ndarray, new: np.ndarray, past_len: int, n_rows: int, rows: np.ndarray | None) -> None:
    """new [L, 2, w, W] rows into kv [L, 2, S_max, W] at past_len: the first n_rows, or rows[:n_rows]
    in order (a tree's accepted path), row by row (no temporary)."""
    if rows is None:
        kv[:, :, past_len:past_len + n_rows] = new[:, :, :n_rows]
        return
    for i, r in enumerate(rows[:n_rows]):
        kv[:, :, past_len + i] = new[:, :, r]


def model_session(model_bytes: bytes) -> ort.InferenceSession:
    """A CPU session for a small in-memory model (export-time probes), on the shared pool if set."""
    global _N_SESSIONS
    so = ort.SessionOptions()
    so.log_severity_level = 3
    if _SHARED_POOL:
        so.use_per_session_threads = False
    _N_SESSIONS += 1
    return ort.InferenceSession(model_bytes, so, providers=PROVIDERS["cpu"])


class OrtProjection:
    """y = x @ w [K, N] on ONNX Runtime's threads. A numpy matmul would run on OpenBLAS's own
    thread pool, whose threads keep spinning after the call and take the cores from the target's
    next call (an EAGLE-3 head's fc made every verify ~2x slower on the 2-core CPU)."""

    # the ONNX model y = MatMul(x [R, K], w [K, N]) (opset 17, ir 8), serialized: the runtime does not
    # depend on the onnx package; tests/test_eagle3.py rebuilds it with onnx.helper and compares
    MODEL = base64.b64decode("CAgSCGVkZ2VzcGVjOmQKEQoBeAoBdxIBeSIGTWF0TXVsEgpwcm9qZWN0aW9uWhUKAXgSEAoOCAES"
                             "CgoDEgFSCgMSAUtaFQoBdxIQCg4IARIKCgMSAUsKAxIBTmIVCgF5EhAKDggBEgoKAxIBUgoDEgFOQgQKABAR")

    def __init__(self, w: np.ndarray) -> None:
        self.w = np.ascontiguousarray(w, np.float32)  # [K, N]
        self._session = model_session(self.MODEL)
        self._binding = self._session.io_binding()
        self._binding.bind_input("w", "cpu", 0, np.float32, self.w.shape, self.w.ctypes.data)

    def __call__(self, x: np.ndarray, out: np.ndarray) -> None:
        """out[:] = x @ w, x [R, K] and out [R, N] C-contiguous float32 (rows of preallocated buffers)."""
        if not len(x):
            return
        b = self._binding
        b.bind_input("x", "cpu", 0, np.float32, x.shape, x.ctypes.data)
        b.bind_output("y", "cpu", 0, np.float32, out.shape, out.ctypes.data)
        self._session.run_with_iobinding(b)


def _read_d2t(manifest: Manifest, spec) -> np.ndarray:
    return _weight_bytes(manifest, spec, spec.d2t).view(np.int64).copy()


class OrtModel:
    """A target or draft model of an engine folder, run through ONNX Runtime.

    kv: use this KV buffer [L, 2, >= max_len, Hkv*D] instead of allocating one (the fused target+EAGLE
    graph shares the plain target's, so switching between them keeps the cached prefix; a
    --host-prologue target's has kv_slots > max_len).
    head: the EAGLE head engine whose KV the fused graph (spec `eagle_fused`) reads and whose rows
    `commit` writes next to the target's; `last_head()` gives the head's draft of the last
    committed row.
    cuda_graph: capture calls as CUDA graphs (cuda provider, --host-prologue folders); None: where
    both hold.
    device_ops: the device-memory calls of a GPU provider (None: engines.device.CudaOps); HostOps with
    the cpu provider runs the device code paths, CUDA-graph bindings included, on host memory (tests)."""

    def __init__(self, manifest: Manifest, spec: ModelSpec, provider: str = "cpu",
                 threads: int | None = None, prepack: bool = True, kv: np.ndarray | None = None,
                 head: OrtModel | None = None, cuda_graph: bool | None = None, device_ops=None) -> None:
        _check_provider(provider)
        self.manifest, self.spec, self.provider = manifest, spec, provider
        self.max_len = manifest.max_len
        self.bucket = manifest.kv_bucket
        self.vocab_size = spec.vocab_size
        self.widths = tuple(spec.widths())
        self.n_layers = spec.n_layers
        self.hidden_size = spec.hidden_size
        self.d2t = None  # an EAGLE head's draft id -> target id map [Vd]
        if spec.d2t is not None:
            self.d2t = _read_d2t(manifest, spec)
        self.fc_t = None  # a head's projection of the target's aux features, transposed [n*H, H] (mapped;
        #                   set by the drafter that loads the head): the head's features input is made with it
        dtype = np.dtype(spec.kv_dtype)
        # a --host-prologue graph: masks and indices built here; its window always holds every new row,
        # padding included, so the cache has room past max_len
        host = takes_host_prologue(spec.graph)
        self.kv_slots = cache_slots(self.max_len, self.widths, self.bucket) if host else self.max_len
        shape = (spec.n_layers, 2, self.kv_slots, spec.kv_width)  # [L, 2, S_max, Hkv*D]
        if kv is not None and (kv.shape[:2] + kv.shape[3:] != shape[:2] + shape[3:] or kv.shape[2] < self.kv_slots
                               or kv.dtype != dtype):
            raise EngineError(f"shared KV buffer {kv.shape} {kv.dtype} does not fit {spec.role} ({shape} {dtype})")
        if kv is not None:
            self.kv_slots = kv.shape[2]  # a fused graph on a --host-prologue target's buffer (more slots)
        self.kv = np.zeros(shape, dtype) if kv is None else kv
        self.prologue = HostPrologue(spec.graph, self.widths, self.kv_slots) if host else None
        self.head = head
        self.has_hidden = True  # hidden [1, T, H] is an output of every graph edgespec writes
        self.fused_head = head is not None  # forward takes head_next; last_head() gives the head's draft
        if head is not None:
            if head.device is not None or provider != "cpu":
                raise EngineError("the fused target+EAGLE graph runs on the CPU provider only (host KV)")
            self._head_ids = {w: np.zeros((1, w), np.int64) for w in self.widths}  # given next tokens
            self._head_given = np.zeros(1, np.int64)  # rows that take them (the rest: the target's argmax)
            self._head_logits = {w: np.zeros((1, w, head.vocab_size), np.float32) for w in self.widths}
            self._head_new_kv = {w: np.zeros((1, 2, w, head.spec.kv_width), head.kv.dtype) for w in self.widths}
            self._head_hidden = {w: np.zeros((1, w, head.hidden_size), head.kv.dtype) for w in self.widths}
            self.head_row = 0  # the head row of the last committed target row (its draft of the next token)
        self._ids = {w: np.zeros((1, w), np.int64) for w in self.widths}
        self._pos = {w: np.zeros((1, w), np.int64) for w in self.widths}
        self._past = np.zeros(1, np.int64)
        # position of every slot, clipped so padding rows past max_len stay inside the rope table
        self._slot_pos = np.minimum(np.arange(self.max_len + max(self.widths)), self.max_len - 1)
        self._logits = {w: np.zeros((1, w, spec.vocab_size), np.float32) for w in self.widths}
        self._new_kv = {w: np.zeros((spec.n_layers, 2, w, spec.kv_width), dtype) for w in self.widths}
        self._hidden = {w: np.zeros((1, w, spec.hidden_size), dtype) for w in self.widths}
        # EAGLE-3 features (exported with --eagle3-features): low/mid/high residual streams [1, T, n*H]
        aux = spec.aux_width
        self._hidden_aux = {w: np.zeros((1, w, aux), dtype) for w in self.widths} if aux else None
        # an EAGLE head also takes features [1, T, H] (the target's hidden states or its own)
        takes_features = spec.takes_features
        # token trees: tree_mask [T, T] (1: column node is the row node or one of its ancestors);
        # a chain is lower-triangular, rewritten only after a tree call
        self.takes_tree = spec.takes_tree
        self._chain = {w: np.tril(np.ones((w, w), np.int64)) for w in self.widths}
        self._tree = {w: self._chain[w].copy() for w in self.widths}
        self._tree_dirty = dict.fromkeys(self.widths, False)
        self._features = {w: np.zeros((1, w, spec.hidden_size), dtype) for w in self.widths} if takes_features else None
        # On a GPU provider the cache and the K/V outputs live on the device (cuda-python buffers):
        # no host round trip of the cache; only ids in and logits out cross the bus.
        self.device = None
        self._mem = "cpu" if provider == "cpu" else "cuda"  # where device buffers are bound (HostOps: the host)
        if provider != "cpu" or device_ops is not None:
            from edgespec.engines.device import CudaOps

            self.device = device_ops or CudaOps()
            self.kv = None
            self._row_bytes = spec.kv_width * dtype.itemsize
            self._kv_dev = self.device.alloc(spec.n_layers * 2 * self.kv_slots * self._row_bytes)
            self._new_kv_dev = {w: self.device.alloc(spec.n_layers * 2 * w * self._row_bytes) for w in self.widths}
        gpu = provider == "cuda" or (provider == "cpu" and device_ops is not None)
        if cuda_graph and (not gpu or self.prologue is None):
            raise EngineError(f"CUDA graphs need the cuda provider and a folder exported with --host-prologue (got "
                              f"provider {provider!r}, {spec.role} graph {'with' if host else 'without'} it). Hint: "
                              "re-export with --host-prologue, or run with --no-cuda-graph")
        self.cuda_graph = self.prologue is not None and (cuda_graph or (cuda_graph is None and provider == "cuda"))
        self.cuda_graph = bool(gpu and self.cuda_graph)
        self._cuda_graph_asked = bool(cuda_graph)  # explicitly: a session that cannot capture is an error
        self._graph_bufs = (cg.GraphBuffers(self.device, spec.graph, self.widths, self.kv_slots)
                            if self.cuda_graph else None)
        self._run_options: dict[tuple[int, int], ort.RunOptions] = {}  # per (width, window): its gpu_graph_id
        self._session: ort.InferenceSession | None = None
        self._bindings: dict[tuple[int, int], ort.IOBinding] = {}
        self._last_width = 0
        self.n_calls = 0  # forward calls so far (stats)
        self._session_options, self._initializers = _session_options(manifest, spec, threads, prepack)

    # ---- sessions --------------------------------------------------------------------------------
    def session(self, width: int | None = None) -> ort.InferenceSession:
        """The model's one session (every phase width runs through it)."""
        if self._session is None:
            path = self.manifest.path(self.spec.graph.file)
            capture = self.cuda_graph and self.provider == "cuda"
            try:
                self._session = _new_session(path, self._session_options, self.provider, capture)
            except EngineError as e:
                if not capture or self._cuda_graph_asked:
                    raise
                # ORT refuses capture when a node falls back to the CPU EP (a kernel the CUDA EP lacks):
                # run without it rather than not at all
                warnings.warn(f"{path}: no CUDA graph capture ({e}); running without it", RuntimeWarning,
                              stacklevel=2)
                self.cuda_graph = False
                self._session = _new_session(path, self._session_options, self.provider)
        return self._session

    def load_widths(self, widths) -> None:
        """Load the session and run each width once, so a first real call pays for nothing."""
        for w in widths:
            if w in self.widths:
                self.forward(np.zeros(w, np.int64), 0)

    def width_for(self, n_tokens: int) -> int:
        return pick_width(self.widths, n_tokens)

    def _host_arrays(self, width: int, n_slots: int) -> dict[str, np.ndarray]:
        """The host arrays of a --host-prologue call's plain inputs and outputs (by graph name)."""
        arrays = {"input_ids": self._ids[width], "positions": self._pos[width], "past_len": self._past,
                  "tree_mask": self._tree[width], "logits": self._logits[width], "hidden": self._hidden[width]}
        if self._hidden_aux is not None:
            arrays["hidden_aux"] = self._hidden_aux[width]
        return arrays | self.prologue.views(width, n_slots)

    def _graph_binding(self, width: int, n_slots: int) -> ort.IOBinding:
        """A captured call's binding: every tensor at an address fixed per (width, window)."""
        b = self.session(width).io_binding()
        arrays = self._host_arrays(width, n_slots)
        for p in cg.binding_plan(self.spec.graph, width, n_slots):
            bind = b.bind_output if p.output else b.bind_input
            if p.where == cg.HOST:
                bind(p.name, "cpu", 0, np.dtype(p.dtype), p.shape, arrays[p.name].ctypes.data)
                continue
            if p.where == cg.RESIDENT and p.output:  # new_kv
                ptr = self._new_kv_dev[width].ptr
            elif p.where == cg.RESIDENT:  # past_{kind}_{layer}: the window of the device cache
                kind, layer = p.name.split("_")[1:]
                j = 0 if kind == "key" else 1
                ptr = self._kv_dev.ptr + (int(layer) * 2 + j) * self.kv_slots * self._row_bytes
            else:
                ptr = self._graph_bufs.ptr(p.name, width)
            bind(p.name, self._mem, 0, np.dtype(p.dtype), p.shape, ptr)
        ro = ort.RunOptions()
        ro.add_run_config_entry(cg.RUN_GRAPH_ID, str(self._graph_bufs.graph_id(width, n_slots)))
        self._run_options[width, n_slots] = ro
        return b

    def _binding(self, width: int, n_slots: int) -> ort.IOBinding:
        key = (width, n_slots)
        self.session(width)  # made first: it decides whether capture is on
        if key not in self._bindings and self.cuda_graph:
            self._bindings[key] = self._graph_binding(width, n_slots)
        if key not in self._bindings:
            b = self.session(width).io_binding()
            inputs = [("input_ids", self._ids[width]), ("positions", self._pos[width]), ("past_len", self._past)]
            if self.prologue is not None:
                inputs += list(self.prologue.views(width, n_slots).items())
            if self._features is not None:
                inputs.append(("features", self._features[width]))
            if self.takes_tree:
                inputs.append(("tree_mask", self._tree[width]))
            p = FUSED_PREFIX
            if self.head is not None:  # the head's part of a fused graph: its inputs, its KV window
                inputs += [(p + "input_ids", self._head_ids[width]), (p + "n_given", self._head_given),
                           (p + "past_key_0", self.head.kv[0, 0, :n_slots]),
                           (p + "past_value_0", self.head.kv[0, 1, :n_slots])]
            for name, arr in inputs:
                b.bind_input(name, "cpu", 0, arr.dtype, arr.shape, arr.ctypes.data)
            kv_dtype = np.dtype(self.spec.kv_dtype)
            for layer in range(self.n_layers):
                for j, kind in enumerate(("key", "value")):
                    if self.device is None:
                        view = self.kv[layer, j, :n_slots]
                        b.bind_input(f"past_{kind}_{layer}", "cpu", 0, kv_dtype, view.shape, view.ctypes.data)
                    else:
                        ptr = self._kv_dev.ptr + (layer * 2 + j) * self.kv_slots * self._row_bytes
                        b.bind_input(f"past_{kind}_{layer}", self._mem, 0, kv_dtype, (n_slots, self.spec.kv_width),
                                     ptr)
            outputs = [("logits", self._logits[width]), ("hidden", self._hidden[width])]
            if self._hidden_aux is not None:
                outputs.append(("hidden_aux", self._hidden_aux[width]))
            if self.head is not None:
                outputs += [(p + "logits", self._head_logits[width]), (p + "new_kv", self._head_new_kv[width]),
                            (p + "hidden", self._head_hidden[width])]
            if self.device is None:
                outputs.append(("new_kv", self._new_kv[width]))
            else:
                b.bind_output("new_kv", self._mem, 0, kv_dtype, self._new_kv[width].shape,
                              self._new_kv_dev[width].ptr)
            for name, arr in outputs:
                b.bind_output(name, "cpu", 0, arr.dtype, arr.shape, arr.ctypes.data)
            self._bindings[key] = b
        return self._bindings[key]

    # ---- the two calls of the protocol ------------------------------------------------------------
    def forward(self, token_ids: np.ndarray, past_len: int, features: np.ndarray | None = None,
                parents: np.ndarray | None = None, head_next: np.ndarray | None = None) -> np.ndarray:
        """features [n, H]: an EAGLE head's feature input (rows past n repeat the last one).
        parents [n]: a token tree (parents[0] = -1, parents[i] < i): node i sits at position
        past_len + depth(i) and sees only its ancestors; None is the chain 0 <- 1 <- ... <- n-1.
        head_next [<= n]: a fused graph's head tokens for the first rows (the tokens that follow
        them, known in a prefill); the other rows take the target's argmax (verify)."""
        n = len(token_ids)
        width = pick_width(self.widths, n)
        assert past_len + n <= self.max_len, "context overflow (the generator checks this before)"
        ids, pos = self._ids[width], self._pos[width]
        ids[0, :n] = token_ids
        ids[0, n:] = token_ids[n - 1]  # padding rows: computed, never committed or read
        pos[0, :] = self._slot_pos[past_len:past_len + width]
        if parents is not None:
            if not self.takes_tree:
                raise EngineError("this engine folder's graphs verify chains only; re-export it without --no-trees")
            fill_tree(self._tree[width], pos[0], parents, n, past_len)
            self._tree_dirty[width] = True
        elif self._tree_dirty[width]:
            self._tree[width][:] = self._chain[width]
            self._tree_dirty[width] = False
        if features is not None:
            feats = self._features[width]
            feats[0, :n] = features
            feats[0, n:] = features[n - 1]
        if self.head is not None:
            given = 0 if head_next is None else len(head_next)
            if given:
                self._head_ids[width][0, :given] = head_next
            self._head_given[0] = given
        self._past[0] = past_len
        # the window must hold the new rows too (the graph places them at their slots)
        if self.prologue is None:
            n_slots = window_slots(past_len, width, self.bucket, self.max_len)
        else:
            n_slots = host_window_slots(past_len, width, self.bucket)
            self.prologue.fill(width, n_slots, past_len, pos[0], self._tree[width])
        binding = self._binding(width, n_slots)
        if self.cuda_graph:
            plan = cg.binding_plan(self.spec.graph, width, n_slots)
            arrays = self._host_arrays(width, n_slots)
            self._graph_bufs.copy_in(plan, arrays, width)
            self.session(width).run_with_iobinding(binding, self._run_options[width, n_slots])
            binding.synchronize_outputs()
            self._graph_bufs.copy_out(plan, arrays, width)
        else:
            self.session(width).run_with_iobinding(binding)
        self._last_width = width
        self.n_calls += 1
        return self._logits[width][0, :n]

    def commit(self, past_len: int, n_rows: int, rows: np.ndarray | None = None) -> None:
        """Write K/V rows of the last forward into the cache at past_len: its first n_rows, or the
        given rows in order (a tree's accepted path, compacted into consecutive slots)."""
        w = self._last_width
        if self.head is not None:  # the head's rows ride along: its KV is aligned with the target's
            _commit_host(self.head.kv, self._head_new_kv[w], past_len, n_rows, rows)
            self.head_row = int(rows[n_rows - 1]) if rows is not None else n_rows - 1
        if self.device is None:
            _commit_host(self.kv, self._new_kv[w], past_len, n_rows, rows)
            return
        if rows is not None:
            rb = self._row_bytes
            for i, r in enumerate(rows[:n_rows]):
                self.device.copy2d(self._kv_dev.ptr + (past_len + i) * rb, self.kv_slots * rb,
                                   self._new_kv_dev[w].ptr + int(r) * rb, w * rb, rb, 2 * self.n_layers)
            self.device.sync()
            return
        # one strided device copy: 2L row blocks of n_rows rows, into [L, 2, max_len, W] at past_len
        rb = self._row_bytes
        self.device.copy2d(self._kv_dev.ptr + past_len * rb, self.kv_slots * rb, self._new_kv_dev[w].ptr, w * rb,
                           n_rows * rb, 2 * self.n_layers)
        self.device.sync()

    def last_hidden_aux(self, n: int) -> np.ndarray:
        """EAGLE-3 low/mid/high features [n, 3H] of the last forward (folders exported with
        --eagle3-features)."""
        if self._hidden_aux is None:
            raise EngineError("this folder's target has no hidden_aux output; export it with --eagle3-features")
        return self._hidden_aux[self._last_width][0, :n]

    def last_hidden(self, n: int) -> np.ndarray:
        """Final-norm hidden states [n, H] of the last forward (for drafters that need them)."""
        return self._hidden[self._last_width][0, :n]

    def last_head(self) -> tuple[np.ndarray, np.ndarray]:
        """A fused graph's head output at the last committed row: (logits [Vd] drafting the token
        after that row's next one, predicted feature [H]); views, valid until the next call."""
        w, r = self._last_width, self.head_row
        return self._head_logits[w][0, r], self._head_hidden[w][0, r]

    def last_head_logits(self, n: int) -> np.ndarray:
        """A fused graph's head logits [n, Vd] of the last forward."""
        return self._head_logits[self._last_width][0, :n]


class OrtHeads:
    """Medusa heads of an engine folder: one call maps the last verified feature [H] to every
    head's logits [K, Vd] (no KV, no sequence). Inputs and outputs are bound once."""

    def __init__(self, manifest: Manifest, spec: HeadsSpec, provider: str = "cpu", threads: int | None = None) -> None:
        _check_provider(provider)
        self.manifest, self.spec, self.provider = manifest, spec, provider
        self.n_heads, self.hidden_size = spec.n_heads, spec.hidden_size
        self.d2t = _read_d2t(manifest, spec)
        dtype = np.dtype(np.float16 if spec.precision == "fp16" else np.float32)
        self._feat = np.zeros((1, spec.hidden_size), dtype)  # [1, H]
        self._logits = np.zeros((spec.n_heads, spec.vocab_size), np.float32)  # [K, Vd]
        self._session_options, self._initializers = _session_options(manifest, spec, threads)
        self._session: ort.InferenceSession | None = None
        self._binding: ort.IOBinding | None = None
        self.n_calls = 0  # calls so far (stats)

    def load(self) -> None:
        """Create the session and bind its buffers (the first call would otherwise pay for it)."""
        if self._session is not None:
            return
        self._session = _new_session(self.manifest.path(self.spec.file), self._session_options, self.provider)
        b = self._session.io_binding()
        b.bind_input("features", "cpu", 0, self._feat.dtype, self._feat.shape, self._feat.ctypes.data)
        b.bind_output("logits", "cpu", 0, self._logits.dtype, self._logits.shape, self._logits.ctypes.data)
        self._binding = b
        self.forward(self._feat[0])

    def forward(self, feature: np.ndarray) -> np.ndarray:
        """feature [H] -> logits [K, Vd] (a view, valid until the next call)."""
        if self._session is None:
            self.load()
        self._feat[0] = feature
        self._session.run_with_iobinding(self._binding)
        self.n_calls += 1
        return self._logits
