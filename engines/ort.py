"""ONNX Runtime backend: one model's phase graphs, one copy of its weights, one KV buffer.

- Weights: the model's weights file is memory-mapped once and handed to the session as
  initializers (engines/session.py); one graph per model serves every phase width, so there is
  one session, and the kernels' prepacked weights exist once (Python has no shared
  prepacked-weights container, so one session per phase would hold one packed copy each).
- KV: `kv[L, 2, max_len, Hkv*D]` allocated at load, for the context chosen then (the manifest's max_len
  as engines/context.py sets it) in the cache dtype chosen then (fp16 where the graph reads a half
  cache: the call's new rows come out fp32 and are rounded as they are committed, as the graph rounds
  them itself). A call binds `kv[l, j, :S]` (contiguous: the cache is sequence-major) for the context
  bucket S >= past_len, so attention reads S rows, not max_len, and an empty window to the cache
  inputs of the other dtype. Outputs are bound to preallocated buffers; nothing is allocated per token.
- IOBinding objects are built once per (width, bucket) and reused.
- Optional parts, each where it lives: the cache in device memory on a GPU provider
  (engines/device.py DeviceKV), CUDA graph capture (engines/cuda_graph.py), the aux features output
  `hidden_aux` and the top-k outputs `topk_ids` / `topk_probs` (buffers here; `last_topk` gives views
  of them: the recycle drafter's table reads them without a copy). A subclass whose graph has more
  inputs and outputs (a drafter's verifying engine over a graph with the target in it) names them in
  `_extra_io`.
- --host-prologue folders: the per-call masks and slot indices are built here (engines/prologue.py);
  on the CUDA provider such a folder's calls are captured as CUDA graphs, one per (width, window),
  unless cuda_graph=False: `load_widths` captures a bounded set of them (engines.base.load_calls),
  the rest are captured at their first use.
- On a device (a GPU provider, or HostOps), a call's logits stay in device memory until read
  (`forward(logits=True)`, or `argmax_rows` on a graph without top-k): a greedy verify reads its rows'
  argmax from the top-k output, T x 8 ids back instead of T x V floats. `close` frees the device
  memory and the session.
"""

from __future__ import annotations

import warnings

import numpy as np
import onnxruntime as ort

from edgespec.engines import cuda_graph as cg
from edgespec.engines import session as es
from edgespec.engines.base import EngineError, commit_host, fill_tree, load_calls, pick_width, window_slots
from edgespec.engines.context import cache_dtype, cache_inputs
from edgespec.engines.device import CudaOps, DeviceKV
from edgespec.engines.manifest import Manifest, ModelSpec
from edgespec.engines.manifest_checks import check_graph_outputs
from edgespec.engines.prologue import HostPrologue, cache_slots, host_window_slots, takes_host_prologue
from edgespec.engines.session import PROVIDERS, WeightsFileError, model_session, share_thread_pool

__all__ = ["PROVIDERS", "OrtModel", "WeightsFileError", "model_session", "share_thread_pool"]

PREFAULT_SLOTS = 4096  # cache slots mapped at load (engines/context.py DEFAULT_CONTEXT); later ones on first write


class OrtModel:
    """A target, draft or head model of an engine folder, run through ONNX Runtime.

    kv: use this KV buffer [L, 2, >= max_len, Hkv*D] instead of allocating one (a drafter's
    verifying engine over a graph with the target in it shares the plain target's, so switching
    between them keeps the cached prefix; a --host-prologue target's has kv_slots > max_len).
    cuda_graph: capture calls as CUDA graphs (cuda provider, --host-prologue folders); None: where
    both hold.
    device_ops: the device-memory calls of a GPU provider (None: engines.device.CudaOps); HostOps with
    the cpu provider runs the device code paths, CUDA-graph bindings included, on host memory (tests)."""

    verifies = False  # runs the target's calls in its place (a subclass: the fused target+EAGLE graph)

    def __init__(
        self,
        manifest: Manifest,
        spec: ModelSpec,
        provider: str = "cpu",
        threads: int | None = None,
        prepack: bool = True,
        kv: np.ndarray | None = None,
        cuda_graph: bool | None = None,
        device_ops=None,
    ) -> None:
        es.check_provider(provider)
        self.manifest, self.spec, self.provider = manifest, spec, provider
        self.max_len, self.bucket = manifest.max_len, manifest.kv_bucket
        self.vocab_size, self.n_layers, self.hidden_size = spec.vocab_size, spec.n_layers, spec.hidden_size
        self.widths = tuple(spec.widths())
        # an EAGLE head's draft id -> target id map [Vd]
        self.d2t = None if spec.d2t is None else es.read_d2t(manifest, spec)
        self.fc_t = None  # a head's projection of the target's aux features, transposed [n*H, H] (mapped;
        #                   set by the drafter that loads the head): the head's features input is made with it
        dtype = np.dtype(spec.kv_dtype)  # the graph's activations (new_kv, hidden)
        # a --host-prologue graph: masks and indices built here; its window always holds every new row,
        # padding included, so the cache has room past max_len
        host = takes_host_prologue(spec.graph)
        shape = self._choose_cache(kv, host, provider == "cpu" and device_ops is None)
        self.prologue = HostPrologue(spec.graph, self.widths, self.kv_slots, spec.arch.sliding_window) if host else None
        self.has_hidden = True  # hidden [1, T, H] is an output of every graph edgespec writes
        self.takes_tree = spec.takes_tree
        self._make_buffers(spec, dtype)
        self._place_cache(shape, self.cache_dtype, kv, device_ops)
        self.cuda_graph = cg.wanted(cuda_graph, provider, device_ops is not None, host, spec.role)
        self._cuda_graph_asked = bool(cuda_graph)  # explicitly: a session that cannot capture is an error
        self._graph_bufs = (
            cg.GraphBuffers(self.device, spec.graph, self.widths, self.kv_slots) if self.cuda_graph else None
        )
        self._session: ort.InferenceSession | None = None
        self._bindings: dict[tuple[int, int], ort.IOBinding] = {}
        self._last_width = self._last_n = 0  # the last call's width and real rows
        self._logits_unread = False  # the last call's logits are still on the device only
        self.captured_at_load: list[tuple[int, int]] = []  # (width, window) calls load_widths captured
        self.closed = False
        self.n_calls = 0  # forward calls so far (stats)
        self._session_options, self._initializers = es.session_options(
            manifest, spec, threads, prepack, verifies=self.verifies
        )
        self._files = es.weights_files(manifest, spec)  # the files its initializers map (PageDropper)

    def _choose_cache(self, kv: np.ndarray | None, host_prologue: bool, host_memory: bool) -> tuple[int, ...]:
        """The cache's slots and dtype (host memory: the one chosen at load; a device: the graph's), the
        inputs a call binds to it and those it binds an empty window to; kv, a shared buffer, checked.
        Returns the cache's shape [L, 2, S_max, Hkv*D]."""
        spec = self.spec
        cache = np.dtype(cache_dtype(self.manifest, spec) if host_memory else spec.kv_dtype)
        self.kv_slots = cache_slots(self.max_len, self.widths, self.bucket) if host_prologue else self.max_len
        shape = (spec.n_layers, 2, self.kv_slots, spec.kv_width)
        if kv is not None and (
            kv.shape[:2] + kv.shape[3:] != shape[:2] + shape[3:] or kv.shape[2] < self.kv_slots or kv.dtype != cache
        ):
            raise EngineError(f"shared KV buffer {kv.shape} {kv.dtype} does not fit {spec.role} ({shape} {cache})")
        if kv is not None:
            self.kv_slots = kv.shape[2]  # a verifying engine on a --host-prologue target's buffer (more slots)
        self.cache_dtype = cache
        self._cache_inputs, self._empty_inputs = cache_inputs(spec, cache)
        return shape

    def _make_buffers(self, spec: ModelSpec, dtype: np.dtype) -> None:
        """The host buffers of every width's inputs and outputs (allocated once, bound by address)."""
        self._ids = {w: np.zeros((1, w), np.int64) for w in self.widths}
        self._pos = {w: np.zeros((1, w), np.int64) for w in self.widths}
        self._past = np.zeros(1, np.int64)
        # position of every slot, clipped so padding rows past max_len stay inside the rope table
        self._slot_pos = np.minimum(np.arange(self.max_len + max(self.widths)), self.max_len - 1)
        self._logits = {w: np.zeros((1, w, spec.vocab_size), np.float32) for w in self.widths}
        self._argmax = np.zeros(max(self.widths), np.int64)  # argmax_rows of a graph without top-k
        self._new_kv = {w: np.zeros((spec.n_layers, 2, w, spec.kv_width), dtype) for w in self.widths}
        self._hidden = {w: np.zeros((1, w, spec.hidden_size), dtype) for w in self.widths}
        # aux features (targets exported with them): low/mid/high residual streams [1, T, n_aux*H]
        aux = spec.aux_width
        self._hidden_aux = {w: np.zeros((1, w, aux), dtype) for w in self.widths} if aux else None
        # each row's top_k next tokens and their probabilities (graphs that output them: spec.top_k)
        k = self.top_k = spec.top_k
        self._topk_ids = {w: np.zeros((1, w, k), np.int64) for w in self.widths} if k else None
        self._topk_probs = {w: np.zeros((1, w, k), np.float32) for w in self.widths} if k else None
        # token trees (takes_tree): tree_mask [T, T] (1: column node is the row node or one of its ancestors);
        # a chain is lower-triangular, rewritten only after a tree call
        self._chain = {w: np.tril(np.ones((w, w), np.int64)) for w in self.widths}
        self._tree = {w: self._chain[w].copy() for w in self.widths}
        self._tree_dirty = dict.fromkeys(self.widths, False)
        # a head also takes features [1, T, H] (the target's hidden states or its own)
        self._features = (
            {w: np.zeros((1, w, spec.hidden_size), dtype) for w in self.widths} if spec.takes_features else None
        )

    def _place_cache(self, shape: tuple[int, ...], dtype: np.dtype, kv: np.ndarray | None, device_ops) -> None:
        """The cache [L, 2, S_max, Hkv*D]: on the host (kv, or a new buffer), or on a GPU provider (or
        with device_ops) in device memory with the K/V outputs (DeviceKV): no host round trip of
        the cache; only ids in and logits out cross the bus."""
        self.device = None  # the device ops (engines.device), None: host memory
        self._mem = "cpu" if self.provider == "cpu" else "cuda"  # where device buffers are bound (HostOps: the host)
        self._dkv: DeviceKV | None = None
        self._dev_logits: dict = {}  # width -> device buffer an uncaptured call leaves its logits in
        if self.provider != "cpu" or device_ops is not None:
            self.device = device_ops or CudaOps()
            self._dkv = DeviceKV(self.device, self.n_layers, self.kv_slots, shape[3] * dtype.itemsize, self.widths)
            self.kv = None
        else:
            self.kv = np.zeros(shape, dtype) if kv is None else kv
            if kv is None:  # the first PREFAULT_SLOTS slots written once here: np.zeros maps its pages at
                # their first write, so the process's first commit paid ~0.2 s of faults (default folder;
                # fill: 6 ms); the rest of a long context's cache stays unmapped until the text reaches it
                # (a 131k-token 1B cache: 4.3 GB, 11.6 s to fill at load)
                self.kv[:, :, :PREFAULT_SLOTS].fill(0)

    # ---- sessions --------------------------------------------------------------------------------
    def session(self, width: int | None = None) -> ort.InferenceSession:
        """The model's one session (every phase width runs through it)."""
        if self.closed:
            raise EngineError(f"{self.spec.role} engine of {self.manifest.folder} used after close()")
        if self._session is None:
            path = self.manifest.path(self.spec.graph.file)
            capture = self.cuda_graph and self.provider == "cuda"
            trt = es.tensorrt_options(self.manifest, self.spec, self.kv_slots) if self.provider == "tensorrt" else None
            try:
                self._session = es.new_session(path, self._session_options, self.provider, capture, trt, self._files)
            except EngineError as e:
                if not capture or self._cuda_graph_asked or isinstance(e, es.ProviderError):
                    raise
                # ORT refuses capture when a node falls back to the CPU EP (a kernel the CUDA EP lacks):
                # run without it rather than not at all
                warnings.warn(f"{path}: no CUDA graph capture ({e}); running without it", RuntimeWarning, stacklevel=2)
                self.cuda_graph = False
                self._session = es.new_session(
                    path, self._session_options, self.provider, trt_options=trt, weights=self._files
                )
            check_graph_outputs(self.manifest, self.spec, self._session)
        return self._session

    def load_widths(self, widths) -> None:
        """Load the session and run each width once, so a first real call pays for nothing; with CUDA
        graphs, also each width's first windows (load_calls: a bounded set), which captures them."""
        widths = [w for w in dict.fromkeys(widths) if w in self.widths]
        for w in widths:
            self.forward(np.zeros(w, np.int64), 0, logits=False)
        if not self.cuda_graph:  # (also when the session could not capture: it turned it off)
            return
        for w, past in load_calls(widths, self.bucket, self.max_len):
            key = (w, host_window_slots(past, w, self.bucket))
            if key not in self._bindings:  # (the first loop captured each width's first window)
                self.forward(np.zeros(w, np.int64), past, logits=False)
            self.captured_at_load.append(key)

    def width_for(self, n_tokens: int) -> int:
        return pick_width(self.widths, n_tokens)

    def _host_arrays(self, width: int, n_slots: int) -> dict[str, np.ndarray]:
        """The host arrays of a --host-prologue call's plain inputs and outputs (by graph name)."""
        arrays = {
            "input_ids": self._ids[width],
            "positions": self._pos[width],
            "past_len": self._past,
            "tree_mask": self._tree[width],
            "logits": self._logits[width],
            "hidden": self._hidden[width],
        }
        if self._hidden_aux is not None:
            arrays["hidden_aux"] = self._hidden_aux[width]
        if self.top_k:
            arrays["topk_ids"], arrays["topk_probs"] = self._topk_ids[width], self._topk_probs[width]
        return arrays | self.prologue.views(width, n_slots)

    def _binding(self, width: int, n_slots: int) -> ort.IOBinding:
        key = (width, n_slots)
        self.session(width)  # made first: it decides whether capture is on
        if key not in self._bindings and self.cuda_graph:  # every tensor at an address fixed per (width, window)
            b = self.session(width).io_binding()
            self._graph_bufs.bind(b, width, n_slots, self._host_arrays(width, n_slots), self._dkv, self._mem)
            self._bindings[key] = b
        if key not in self._bindings:
            self._bindings[key] = self._plain_binding(width, n_slots)
        return self._bindings[key]

    def _extra_io(self, width: int, n_slots: int) -> tuple[list, list]:
        """(inputs, outputs) as (graph name, host array) pairs that a subclass's graph adds to a
        (width, window) call, bound with the rest (none here)."""
        return [], []

    def _plain_binding(self, width: int, n_slots: int) -> ort.IOBinding:
        b = self.session(width).io_binding()
        extra_in, extra_out = self._extra_io(width, n_slots)
        inputs = [("input_ids", self._ids[width]), ("positions", self._pos[width]), ("past_len", self._past)]
        if self.prologue is not None:
            inputs += list(self.prologue.views(width, n_slots).items())
        if self._features is not None:
            inputs.append(("features", self._features[width]))
        if self.takes_tree:
            inputs.append(("tree_mask", self._tree[width]))
        inputs += extra_in
        for name, arr in inputs:
            b.bind_input(name, "cpu", 0, arr.dtype, arr.shape, arr.ctypes.data)
        kv_dtype = np.dtype(self.spec.kv_dtype)
        (cache_name, cache), empty = self._cache_inputs[0], (0, self.spec.kv_width)
        for layer in range(self.n_layers):
            for j, kind in enumerate(("key", "value")):
                for name, dt, buf in self._empty_inputs:  # the other dtype's inputs: an empty window
                    b.bind_input(name.format(kind=kind, layer=layer), "cpu", 0, dt, empty, buf.ctypes.data)
                if self._dkv is None:
                    view, name = self.kv[layer, j, :n_slots], cache_name.format(kind=kind, layer=layer)
                    b.bind_input(name, "cpu", 0, cache, view.shape, view.ctypes.data)
                else:
                    b.bind_input(
                        f"past_{kind}_{layer}",
                        self._mem,
                        0,
                        kv_dtype,
                        (n_slots, self.spec.kv_width),
                        self._dkv.window_ptr(layer, j),
                    )
        outputs = [("hidden", self._hidden[width])]
        if self._dkv is None:
            outputs.append(("logits", self._logits[width]))
        else:  # left on the device until read (_logits_back)
            if width not in self._dev_logits:
                self._dev_logits[width] = self.device.alloc(self._logits[width].nbytes)
            shape = self._logits[width].shape
            b.bind_output("logits", self._mem, 0, np.float32, shape, self._dev_logits[width].ptr)
        if self._hidden_aux is not None:
            outputs.append(("hidden_aux", self._hidden_aux[width]))
        if self.top_k:
            outputs += [("topk_ids", self._topk_ids[width]), ("topk_probs", self._topk_probs[width])]
        outputs += extra_out
        if self._dkv is None:
            outputs.append(("new_kv", self._new_kv[width]))
        else:
            b.bind_output("new_kv", self._mem, 0, kv_dtype, self._new_kv[width].shape, self._dkv.new_kv[width].ptr)
        for name, arr in outputs:
            b.bind_output(name, "cpu", 0, arr.dtype, arr.shape, arr.ctypes.data)
        return b

    # ---- the two calls of the protocol ------------------------------------------------------------
    def forward(
        self, token_ids: np.ndarray, past_len: int, features=None, parents=None, logits: bool = True
    ) -> np.ndarray | None:
        """features [n, H]: a head's feature input (rows past n repeat the last one).
        parents [n]: a token tree (parents[0] = -1, parents[i] < i): node i sits at position
        past_len + depth(i) and sees only its ancestors; None is the chain 0 <- 1 <- ... <- n-1.
        logits=False: returns None, and on a device the logits stay there (argmax_rows, last_topk
        read the rows)."""
        n = len(token_ids)
        width = pick_width(self.widths, n)
        assert past_len + n <= self.max_len, "context overflow (the generator checks this before)"
        ids, pos = self._ids[width], self._pos[width]
        ids[0, :n] = token_ids
        ids[0, n:] = token_ids[n - 1]  # padding rows: computed, never committed or read
        pos[0, :] = self._slot_pos[past_len : past_len + width]
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
        self._past[0] = past_len
        # the window must hold the new rows too (the graph places them at their slots)
        if self.prologue is None:
            n_slots = window_slots(past_len, width, self.bucket, self.max_len)
        else:
            n_slots = host_window_slots(past_len, width, self.bucket)
            self.prologue.fill(width, n_slots, past_len, pos[0], self._tree[width])
        binding = self._binding(width, n_slots)
        if self.cuda_graph:  # (its staged upload's sync waits for the commits enqueued before)
            self._graph_bufs.run(self.session(width), binding, width, n_slots, self._host_arrays(width, n_slots), n)
            self._dkv.pending = False
        else:
            if self._dkv is not None:
                self._dkv.wait()
            self.session(width).run_with_iobinding(binding)
        self._last_width, self._last_n = width, n
        self._logits_unread = self._dkv is not None
        self.n_calls += 1
        return self._logits_back(n) if logits else None

    def _logits_back(self, n: int) -> np.ndarray:
        """The last call's logits [n, V] in the host buffer; on a device, brought back (those n rows
        only) the first time they are asked for."""
        out = self._logits[self._last_width][0, :n]
        if self._logits_unread:
            if n > self._last_n:
                raise EngineError(f"{n} logits rows asked for; the last call had {self._last_n}")
            self._logits_unread = False
            w = self._last_width
            if self.cuda_graph:  # copy_out registered the call's real rows
                self._graph_bufs.read_back("logits")
            else:
                self.device.d2h(self._logits[w][0, : self._last_n], self._dev_logits[w].ptr)
        return out

    def argmax_rows(self, n: int) -> np.ndarray:
        """Each of the last forward's first n rows' argmax [n] int64 (the first maximum, as numpy's): the
        top-k output's first ids (on a device only those cross: n x top_k ids, not n x V logits), or
        read off the logits on a graph without one (a view, valid until the next call)."""
        if self.top_k:
            if self._graph_bufs is not None:
                self._graph_bufs.read_back("topk_ids")
            return self._topk_ids[self._last_width][0, :n, 0]
        return np.argmax(self._logits_back(n), axis=-1, out=self._argmax[:n])

    def close(self) -> None:
        """Free the device memory (the KV cache, the CUDA-graph buffers, the logits left on the device)
        and the session; the engine cannot run after (an EngineError says so). Safe to call twice."""
        self.closed = True
        self._bindings.clear()
        self._session = None
        if self.device is not None:
            if self._dkv is not None:
                self._dkv.free()
            if self._graph_bufs is not None:
                self._graph_bufs.free()
            for buf in self._dev_logits.values():
                self.device.free(buf)
            self._dev_logits.clear()

    def commit(self, past_len: int, n_rows: int, rows: np.ndarray | None = None) -> None:
        """Write K/V rows of the last forward into the cache at past_len: its first n_rows, or the
        given rows in order (a tree's accepted path, compacted into consecutive slots)."""
        w = self._last_width
        if self._dkv is None:
            commit_host(self.kv, self._new_kv[w], past_len, n_rows, rows)
        else:
            self._dkv.commit(w, past_len, n_rows, rows)

    # ---- outputs of the last forward --------------------------------------------------------------
    def last_hidden_aux(self, n: int) -> np.ndarray:
        """Aux features [n, n_aux*H] of the last forward: the residual streams entering a few
        low/mid/high layers (targets exported with them)."""
        if self._hidden_aux is None:
            raise EngineError(
                "this folder's target has no hidden_aux output (aux features); re-export it with "
                "the drafter that reads them"
            )
        if self._graph_bufs is not None:  # a captured call leaves it on the device until asked for
            self._graph_bufs.read_back("hidden_aux")
        return self._hidden_aux[self._last_width][0, :n]

    def last_topk(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        """(ids [n, top_k] int64, probabilities [n, top_k] float32) of the last forward's first n rows:
        each row's most likely next tokens, best first, as the graph computed them (views, valid until
        the next call). Graphs without them (top_k 0) raise EngineError."""
        if not self.top_k:
            raise EngineError("this folder's target graph has no top-k output; re-export it")
        if self._graph_bufs is not None:  # a captured call leaves them on the device until asked for
            self._graph_bufs.read_back("topk_ids")
            self._graph_bufs.read_back("topk_probs")
        w = self._last_width
        return self._topk_ids[w][0, :n], self._topk_probs[w][0, :n]

    def last_hidden(self, n: int) -> np.ndarray:
        """Final-norm hidden states [n, H] of the last forward (for drafters that need them)."""
        if self._graph_bufs is not None:
            self._graph_bufs.read_back("hidden")
        return self._hidden[self._last_width][0, :n]
