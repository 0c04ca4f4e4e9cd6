"""Native TensorRT backend (TensorRT 10/11 Python API), same protocol as OrtModel.

Written to the documented API and tested here with a fake engine that runs the same ONNX graph
through ONNX Runtime on host memory (tests/test_trt_fake.py); it has NOT run on a GPU yet.

- One engine per model (`edgespec build-trt`), one optimization profile per phase width T
  (min = opt = max on T; the cache window S ranges over [kv_bucket, max_len]); one execution
  context per profile, all sharing the engine's weights.
- Device buffers allocated once: the KV cache kv[L, 2, max_len, Hkv*D], and per width the ids,
  positions, logits, new_kv and hidden outputs, every tensor address 256-byte aligned (TensorRT's
  rule; a call's int64 inputs share one block at aligned offsets, one upload). Every setter's
  result is checked. Tensor addresses are set once per context: the
  window past_key_l is always the first S rows of layer l's block, so only its shape changes with
  the bucket (set again only when the bucket changes).
- A call: copy ids/positions/past_len up (a few bytes), execute_async_v3 on one stream (replayed
  from a CUDA graph captured once per (width, window) pair: a bounded set at load, engines.base.load_calls,
  the rest at their first use), copy the n logits rows down (its graphs have no top-k output, so
  a greedy verify's argmax is read off them on the host).
- Commit: ONE strided device copy (cudaMemcpy2DAsync) writes the accepted rows of all 2L layer
  blocks at past_len.
"""

from __future__ import annotations

import numpy as np

from edgespec.engines.base import EngineError, fill_tree, load_calls, pick_width, window_slots
from edgespec.engines.device import CudaOps
from edgespec.engines.manifest import Manifest, ModelSpec

_NP = {"float32": np.float32, "float16": np.float16, "int64": np.int64}
ALIGN = 256  # bytes: TensorRT wants every tensor address at least this aligned (IExecutionContext.setTensorAddress)


def aligned(nbytes: int) -> int:
    """nbytes rounded up to a multiple of ALIGN."""
    return -(-nbytes // ALIGN) * ALIGN


def _ok(result, what: str) -> None:
    """A TensorRT setter's bool: False is an error naming the call (TensorRT logs the detail)."""
    if result is False:
        raise EngineError(f"TensorRT refused {what} (its log above says why)")


def load_trt_engine(manifest: Manifest, spec: ModelSpec, device_name: str):
    """Deserialize the model's engine after checking it was built for this TensorRT and GPU."""
    info = spec.tensorrt
    if info is None:
        raise EngineError(
            f"{manifest.folder}: no TensorRT engine for the {spec.role} model. "
            f"Hint: edgespec build-trt --engine {manifest.folder}"
        )
    try:
        import tensorrt as trt
    except ImportError as e:
        raise EngineError("the tensorrt backend needs the `tensorrt` Python package (NVIDIA's index)") from e
    if info.tensorrt_version != trt.__version__ or info.gpu != device_name:
        raise EngineError(
            f"{info.file} was built with TensorRT {info.tensorrt_version} for "
            f"{info.gpu}; this is TensorRT {trt.__version__} on {device_name}. TensorRT engines "
            f"are tied to both: rebuild with `edgespec build-trt --engine {manifest.folder}`"
        )
    runtime = trt.Runtime(trt.Logger(trt.Logger.WARNING))
    engine = runtime.deserialize_cuda_engine(manifest.path(info.file).read_bytes())
    if engine is None:
        raise EngineError(f"TensorRT could not deserialize {info.file}; rebuild it")
    return engine, dict(info.profiles)


class TrtModel:
    """A target or draft model run by TensorRT with device-resident buffers."""

    def __init__(self, manifest: Manifest, spec: ModelSpec, ops=None, engine=None, profiles=None) -> None:
        self.ops = ops or CudaOps()
        if engine is None:
            engine, profiles = load_trt_engine(manifest, spec, self.ops.device_name())
        self.manifest, self.spec, self.engine = manifest, spec, engine
        self.max_len, self.bucket = manifest.max_len, manifest.kv_bucket
        self.vocab_size, self.n_layers, self.hidden_size = spec.vocab_size, spec.n_layers, spec.hidden_size
        # the engines `edgespec build-trt` makes return logits and KV only: no hidden states (so no
        # head drafters on this backend)
        self.has_hidden = False
        self.top_k = 0  # nor a top-k output (argmax_rows reads the logits)
        self.widths = tuple(sorted(profiles))
        self.n_calls = 0
        dt = np.dtype(spec.kv_dtype)
        self.kv_row_bytes = spec.kv_width * dt.itemsize
        self.stream = self.ops.stream()
        # [L, 2, max_len, W], each (layer, K/V) block ALIGN-ed: its first rows are a past_* input
        self._block_bytes = aligned(self.max_len * self.kv_row_bytes)
        self.kv = self.ops.alloc(spec.n_layers * 2 * self._block_bytes)
        # the int64 inputs of a call in one block, each at an ALIGN-ed offset (one upload per call):
        # input_ids | positions | past_len | tree_mask [w, w] (a chain unless a tree call rewrites it)
        self.takes_tree = spec.takes_tree
        self._in_offsets = {w: self._input_offsets(w) for w in self.widths}
        self._host_in = {w: np.zeros(self._in_offsets[w]["end"], np.uint8) for w in self.widths}
        self._in_views = {w: self._views(w) for w in self.widths}
        self._chain = {w: np.tril(np.ones((w, w), np.int64)) for w in self.widths}
        for w in self.widths:
            if self.takes_tree:
                self._in_views[w]["tree_mask"][:] = self._chain[w]
        self._tree_dirty = dict.fromkeys(self.widths, False)
        self._logits = {w: np.zeros((w, spec.vocab_size), np.float32) for w in self.widths}
        self._argmax = np.zeros(max(self.widths), np.int64)
        self._slot_pos = np.minimum(np.arange(self.max_len + max(self.widths)), self.max_len - 1)
        self._bufs, self._ctx, self._ctx_slots = {}, {}, {}
        for w in self.widths:
            self._bufs[w] = {
                "in": self.ops.alloc(self._host_in[w].nbytes),
                "logits": self.ops.alloc(w * spec.vocab_size * 4),
                "new_kv": self.ops.alloc(spec.n_layers * 2 * w * self.kv_row_bytes),
                "hidden": self.ops.alloc(w * spec.hidden_size * dt.itemsize),
            }
            self._ctx[w] = self._context(w, profiles[w])
            self._ctx_slots[w] = 0
        self._last_width = 0
        self.cuda_graphs = self.ops.supports_graphs
        self._graphs: dict[tuple[int, int], object] = {}

    def _context(self, w: int, profile: int):
        """The execution context of width-w calls: its optimization profile, every tensor at its
        buffer's (ALIGN-ed) address, the inputs' shapes."""
        ctx = self.engine.create_execution_context()
        if ctx is None:
            raise EngineError(f"TensorRT could not create an execution context (width {w}): out of GPU memory?")
        _ok(ctx.set_optimization_profile_async(profile, self.stream), f"profile {profile} (width {w})")
        b = self._bufs[w]
        addresses = {name: b["in"].ptr + off for name, off in self._in_offsets[w].items() if name != "end"}
        addresses |= {name: b[name].ptr for name in ("logits", "new_kv", "hidden")}
        for layer in range(self.spec.n_layers):
            for j, kind in enumerate(("key", "value")):
                addresses[f"past_{kind}_{layer}"] = self._block_ptr(layer, j)
        for name, ptr in addresses.items():
            if ptr % ALIGN:
                raise EngineError(f"{name} at {ptr:#x} is not {ALIGN}-byte aligned (width {w})")
            _ok(ctx.set_tensor_address(name, ptr), f"the address of {name} (width {w})")
        shapes = {"input_ids": (1, w), "positions": (1, w), "past_len": (1,)}
        if self.takes_tree:
            shapes["tree_mask"] = (w, w)
        for name, shape in shapes.items():
            _ok(ctx.set_input_shape(name, shape), f"{name}'s shape {shape} (width {w})")
        return ctx

    def _input_offsets(self, w: int) -> dict[str, int]:
        """Byte offset of each int64 input of a width-w call in its block, ALIGN-ed ("end": the block's size)."""
        sizes = {"input_ids": 8 * w, "positions": 8 * w, "past_len": 8}
        if self.takes_tree:
            sizes["tree_mask"] = 8 * w * w
        offsets, at = {}, 0
        for name, n in sizes.items():
            offsets[name] = at
            at = aligned(at + n)
        return offsets | {"end": at}

    def _views(self, w: int) -> dict[str, np.ndarray]:
        """Each input's int64 view of the width-w host block."""
        off, block = self._in_offsets[w], self._host_in[w]
        n = {"input_ids": w, "positions": w, "past_len": 1, "tree_mask": w * w}
        views = {k: block[o : o + 8 * n[k]].view(np.int64) for k, o in off.items() if k != "end"}
        if "tree_mask" in views:
            views["tree_mask"] = views["tree_mask"].reshape(w, w)
        return views

    def _block_ptr(self, layer: int, j: int, row: int = 0) -> int:
        return self.kv.ptr + (layer * 2 + j) * self._block_bytes + row * self.kv_row_bytes

    def width_for(self, n_tokens: int) -> int:
        return pick_width(self.widths, n_tokens)

    def load_widths(self, widths) -> None:
        """Run each width once; on a GPU also each width's first windows (load_calls), capturing them."""
        widths = [w for w in dict.fromkeys(widths) if w in self.widths]
        calls = [(w, 0) for w in widths] + (load_calls(widths, self.bucket, self.max_len) if self.cuda_graphs else [])
        for w, past in calls:
            self.forward(np.zeros(w, np.int64), past, logits=False)

    def forward(
        self, token_ids: np.ndarray, past_len: int, parents: np.ndarray | None = None, logits: bool = True
    ) -> np.ndarray | None:
        """As OrtModel.forward (parents: a token tree, None: a chain). The logits always come back (no
        top-k output to read an argmax from); logits=False returns None all the same."""
        n = len(token_ids)
        w = pick_width(self.widths, n)
        assert past_len + n <= self.max_len, "context overflow (the generator checks this before)"
        v = self._in_views[w]
        v["input_ids"][:n] = token_ids
        v["input_ids"][n:] = token_ids[n - 1]
        v["positions"][:] = self._slot_pos[past_len : past_len + w]
        v["past_len"][0] = past_len
        if parents is not None:
            if not self.takes_tree:
                raise EngineError("this engine folder's graphs verify chains only; re-export it without --no-trees")
            fill_tree(v["tree_mask"], v["positions"], parents, n, past_len)
            self._tree_dirty[w] = True
        elif self._tree_dirty[w]:
            v["tree_mask"][:] = self._chain[w]
            self._tree_dirty[w] = False
        ctx = self._ctx[w]
        n_slots = window_slots(past_len, w, self.bucket, self.max_len)
        if self._ctx_slots[w] != n_slots:  # the bucket changed: new window shape, same addresses
            for layer in range(self.n_layers):
                for kind in ("key", "value"):
                    shape = (n_slots, self.spec.kv_width)
                    _ok(ctx.set_input_shape(f"past_{kind}_{layer}", shape), f"past_{kind}_{layer}'s shape {shape}")
            self._ctx_slots[w] = n_slots
        self.ops.h2d(self._bufs[w]["in"].ptr, self._host_in[w], self.stream)
        self._execute(w, n_slots)
        out = self._logits[w][:n]
        self.ops.d2h(out, self._bufs[w]["logits"].ptr, self.stream)  # only the n real rows
        self._last_width = w
        self.n_calls += 1
        return out if logits else None

    def argmax_rows(self, n: int) -> np.ndarray:
        """Each of the last forward's first n rows' argmax [n] (the first maximum), off the logits."""
        return np.argmax(self._logits[self._last_width][:n], axis=-1, out=self._argmax[:n])

    def close(self) -> None:
        """Free the device buffers (the KV cache, every width's inputs and outputs); contexts and the
        engine go with their references."""
        for buf in (self.kv, *(b for bufs in self._bufs.values() for b in bufs.values())):
            self.ops.free(buf)
        self._ctx.clear()
        self._graphs.clear()

    def _execute(self, w: int, n_slots: int) -> None:
        """Run the width-w context; on a GPU, replay a CUDA graph captured per (width, window):
        addresses never change, and the shapes are fixed within one (width, window) pair."""
        ctx = self._ctx[w]
        key = (w, n_slots)
        graph = self._graphs.get(key)
        if graph is not None:
            self.ops.replay(graph, self.stream)
            return
        if not ctx.execute_async_v3(self.stream):
            raise EngineError(f"TensorRT execute_async_v3 failed (width {w}, window {n_slots})")
        if self.cuda_graphs and key not in self._graphs:
            try:  # capture after one plain run (TensorRT may allocate on its first call)
                self._graphs[key] = self.ops.capture(
                    self.stream, lambda: _ok(ctx.execute_async_v3(self.stream), "a run")
                )
            except (EngineError, RuntimeError):  # a graph that cannot be captured just runs uncaptured
                self._graphs[key] = None

    def commit(self, past_len: int, n_rows: int, rows: np.ndarray | None = None) -> None:
        # new_kv [L, 2, T, W] -> kv [L, 2, max_len, W] at rows past_len..: 2L rows of n_rows*W each
        w = self._last_width
        if rows is not None:  # a tree's accepted path: one strided copy per row
            for i, r in enumerate(rows[:n_rows]):
                self.ops.copy2d(
                    dst_ptr=self._block_ptr(0, 0, past_len + i),
                    dst_pitch=self._block_bytes,
                    src_ptr=self._bufs[w]["new_kv"].ptr + int(r) * self.kv_row_bytes,
                    src_pitch=w * self.kv_row_bytes,
                    width=self.kv_row_bytes,
                    height=2 * self.n_layers,
                    stream=self.stream,
                )
            return
        self.ops.copy2d(
            dst_ptr=self._block_ptr(0, 0, past_len),
            dst_pitch=self._block_bytes,
            src_ptr=self._bufs[w]["new_kv"].ptr,
            src_pitch=w * self.kv_row_bytes,
            width=n_rows * self.kv_row_bytes,
            height=2 * self.n_layers,
            stream=self.stream,
        )

    def last_topk(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        raise EngineError(
            "native TensorRT engines have no top-k output (top_k is 0); the recycle table reads each row's "
            "argmax off the logits there"
        )

    def last_hidden(self, n: int) -> np.ndarray:
        raise EngineError(
            "native TensorRT engines return no hidden states (has_hidden is False); the head "
            "drafters need --provider tensorrt or cuda (ONNX Runtime)"
        )

    def last_hidden_aux(self, n: int) -> np.ndarray:
        raise EngineError(
            "native TensorRT engines return no aux features (hidden_aux); the drafters that read "
            "them need --provider tensorrt or cuda (ONNX Runtime)"
        )
