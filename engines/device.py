"""Device memory for GPU backends, behind a few calls the backends need.

CudaOps uses NVIDIA's `cuda-python` (cuda.bindings.runtime): the official, thin binding of the
CUDA runtime API — no framework, no kernels of its own, pip-installable, which is all a backend
that only allocates, copies and launches TensorRT needs (cupy would bring a whole array library,
torch is banned from the runtime). HostOps implements the same calls on host memory so the GPU
backends' logic (addresses, shapes, the strided KV commit) runs and is tested on any machine.
DeviceKV is a model's KV cache in device memory for the ONNX Runtime engine on a GPU provider.
"""

from __future__ import annotations

import ctypes

import numpy as np


class DeviceBuffer:
    """A block of device memory: a base pointer plus its size (and a host mirror for HostOps)."""

    def __init__(self, ptr: int, nbytes: int, host: np.ndarray | None = None) -> None:
        self.ptr, self.nbytes, self.host = ptr, nbytes, host


class Counts:
    """What crossed the bus and what is held, counted by both device ops (a few integer adds per
    copy): tests check a call's traffic and that memory is freed; tools/device_check.py reports it."""

    def __init__(self) -> None:
        self.reset_counts()
        self.allocs = self.frees = 0  # buffers allocated / freed so far
        self.live_bytes = 0  # bytes allocated and not freed

    def reset_counts(self) -> None:
        """Zero the traffic counters (allocations keep theirs)."""
        self.h2d_calls = self.d2h_calls = self.syncs = 0  # uploads, downloads, host waits for a stream
        self.h2d_bytes = self.d2h_bytes = 0

    def traffic(self) -> dict[str, int]:
        """The traffic counters since the last reset_counts."""
        keys = ("h2d_calls", "h2d_bytes", "d2h_calls", "d2h_bytes", "syncs")
        return {k: getattr(self, k) for k in keys}


class HostOps(Counts):
    """Device calls on host memory (tests and CPU fallback); pointers are real host addresses."""

    name = "host"

    def alloc(self, nbytes: int) -> DeviceBuffer:
        """Zeroed host memory at a 256-byte aligned address, as cudaMalloc gives (TensorRT needs it)."""
        raw = np.zeros(nbytes + 256, np.uint8)
        arr = raw[-raw.ctypes.data % 256 :][:nbytes]  # a view: keeps raw alive
        self.allocs, self.live_bytes = self.allocs + 1, self.live_bytes + nbytes
        return DeviceBuffer(arr.ctypes.data, nbytes, arr)

    def free(self, buf: DeviceBuffer) -> None:
        """Release buf (a second free of the same buffer does nothing)."""
        if buf.ptr:
            self.frees, self.live_bytes = self.frees + 1, self.live_bytes - buf.nbytes
            buf.ptr, buf.host = 0, None

    def h2d(self, dst_ptr: int, src: np.ndarray, stream=None) -> None:
        self.h2d_calls, self.h2d_bytes = self.h2d_calls + 1, self.h2d_bytes + src.nbytes
        ctypes.memmove(dst_ptr, src.ctypes.data, src.nbytes)

    def d2h(self, dst: np.ndarray, src_ptr: int, stream=None) -> None:
        self.d2h_calls, self.d2h_bytes = self.d2h_calls + 1, self.d2h_bytes + dst.nbytes
        self.syncs += 1  # CudaOps.d2h waits for its copy
        ctypes.memmove(dst.ctypes.data, src_ptr, dst.nbytes)

    def copy2d(
        self, dst_ptr: int, dst_pitch: int, src_ptr: int, src_pitch: int, width: int, height: int, stream=None
    ) -> None:
        for r in range(height):
            ctypes.memmove(dst_ptr + r * dst_pitch, src_ptr + r * src_pitch, width)

    def stream(self):
        return None

    def sync(self, stream=None) -> None:
        self.syncs += 1

    supports_graphs = False

    def device_name(self) -> str:
        return "host"


class CudaOps(Counts):
    """The same calls through the CUDA runtime (cuda-python)."""

    name = "cuda"

    def __init__(self, device: int = 0) -> None:
        super().__init__()
        try:
            from cuda.bindings import runtime as cudart
        except ImportError:  # older cuda-python layout
            from cuda import cudart  # type: ignore[no-redef]
        self.rt = cudart
        self._check(cudart.cudaSetDevice(device))
        self.device = device

    def _check(self, res):
        err = res[0] if isinstance(res, tuple) else res
        if int(err) != 0:
            raise RuntimeError(f"CUDA error {err}")
        return res[1] if isinstance(res, tuple) and len(res) == 2 else res

    def alloc(self, nbytes: int) -> DeviceBuffer:
        ptr = self._check(self.rt.cudaMalloc(nbytes))
        self._check(self.rt.cudaMemset(ptr, 0, nbytes))
        self.allocs, self.live_bytes = self.allocs + 1, self.live_bytes + nbytes
        return DeviceBuffer(int(ptr), nbytes)

    def free(self, buf: DeviceBuffer) -> None:
        """cudaFree buf (a second free of the same buffer does nothing)."""
        if buf.ptr:
            self._check(self.rt.cudaFree(buf.ptr))
            self.frees, self.live_bytes = self.frees + 1, self.live_bytes - buf.nbytes
            buf.ptr = 0

    def h2d(self, dst_ptr: int, src: np.ndarray, stream=None) -> None:
        self.h2d_calls, self.h2d_bytes = self.h2d_calls + 1, self.h2d_bytes + src.nbytes
        kind = self.rt.cudaMemcpyKind.cudaMemcpyHostToDevice
        self._check(self.rt.cudaMemcpyAsync(dst_ptr, src.ctypes.data, src.nbytes, kind, stream or 0))

    def d2h(self, dst: np.ndarray, src_ptr: int, stream=None) -> None:
        self.d2h_calls, self.d2h_bytes = self.d2h_calls + 1, self.d2h_bytes + dst.nbytes
        kind = self.rt.cudaMemcpyKind.cudaMemcpyDeviceToHost
        self._check(self.rt.cudaMemcpyAsync(dst.ctypes.data, src_ptr, dst.nbytes, kind, stream or 0))
        self.sync(stream)

    def copy2d(
        self, dst_ptr: int, dst_pitch: int, src_ptr: int, src_pitch: int, width: int, height: int, stream=None
    ) -> None:
        kind = self.rt.cudaMemcpyKind.cudaMemcpyDeviceToDevice
        self._check(self.rt.cudaMemcpy2DAsync(dst_ptr, dst_pitch, src_ptr, src_pitch, width, height, kind, stream or 0))

    def stream(self):
        return self._check(self.rt.cudaStreamCreate())

    def sync(self, stream=None) -> None:
        self.syncs += 1
        self._check(self.rt.cudaStreamSynchronize(stream or 0))

    supports_graphs = True

    def capture(self, stream, launch) -> object:
        """Record what `launch()` enqueues on `stream` into an instantiated CUDA graph."""
        mode = self.rt.cudaStreamCaptureMode.cudaStreamCaptureModeThreadLocal
        self._check(self.rt.cudaStreamBeginCapture(stream, mode))
        try:
            launch()
        finally:
            graph = self._check(self.rt.cudaStreamEndCapture(stream))
        return self._check(self.rt.cudaGraphInstantiate(graph, 0))

    def replay(self, graph_exec, stream) -> None:
        self._check(self.rt.cudaGraphLaunch(graph_exec, stream))

    def device_name(self) -> str:
        props = self._check(self.rt.cudaGetDeviceProperties(self.device))
        name = props.name
        return (name.decode() if isinstance(name, bytes) else str(name)).strip("\x00")


class DeviceKV:
    """A model's KV cache [L, 2, slots, W] and its new K/V rows [L, 2, w, W] per width, in device
    memory: a call binds the cache window and new_kv by address, so only ids in and logits out
    cross the bus; commit copies the accepted rows on the device. A commit's copies are only
    enqueued: the next call waits for them (`wait`, or the sync after its staged upload, on the same
    stream), so a step costs no sync of its own for them."""

    def __init__(self, ops, n_layers: int, slots: int, row_bytes: int, widths) -> None:
        self.ops = ops  # CudaOps (HostOps in tests)
        self.n_layers, self.slots, self.row_bytes = n_layers, slots, row_bytes  # row: one K or V row, Hkv*D
        self.kv = ops.alloc(n_layers * 2 * slots * row_bytes)
        self.new_kv = {w: ops.alloc(n_layers * 2 * w * row_bytes) for w in widths}
        self.pending = False  # commit copies enqueued and not waited for yet

    def window_ptr(self, layer: int, j: int) -> int:
        """Address of the cache block of layer `layer`, j = 0 keys / 1 values (a window is its first rows)."""
        return self.kv.ptr + (layer * 2 + j) * self.slots * self.row_bytes

    def commit(self, width: int, past_len: int, n_rows: int, rows: np.ndarray | None) -> None:
        """Enqueue the last width-`width` call's first n_rows rows (or rows[:n_rows], a tree's path) into
        the cache at past_len (on the default stream: the next call waits for them)."""
        rb, src = self.row_bytes, self.new_kv[width].ptr
        self.pending = True
        if rows is not None:
            for i, r in enumerate(rows[:n_rows]):
                self.ops.copy2d(
                    self.kv.ptr + (past_len + i) * rb,
                    self.slots * rb,
                    src + int(r) * rb,
                    width * rb,
                    rb,
                    2 * self.n_layers,
                )
            return
        # one strided device copy: 2L row blocks of n_rows rows, into [L, 2, slots, W] at past_len
        self.ops.copy2d(self.kv.ptr + past_len * rb, self.slots * rb, src, width * rb, n_rows * rb, 2 * self.n_layers)

    def wait(self) -> None:
        """Return when the enqueued commits are done (before a call whose run does not sync first)."""
        if self.pending:
            self.ops.sync()
            self.pending = False

    def free(self) -> None:
        """Release the cache and the new-row buffers."""
        for buf in (self.kv, *self.new_kv.values()):
            self.ops.free(buf)
