"""ONNX Runtime CUDA graph capture for --host-prologue folders: where each tensor of a call lives.

A captured CUDA graph replays the kernels of its first run on the same addresses; ONNX Runtime
skips everything else on replay (no feed copies, no shape inference). So a call binds every tensor
at an address fixed per (width, window): host values are packed into one device block before the
run (one upload, one sync), and every output stays on the device until it is asked for: the
logits' real rows when a caller reads them (a greedy verify reads only the top-k ids: T x 8 ids
back, not T x V floats), the hidden states when a drafter reads them. Each (width, window) gets its
own `gpu_graph_id`, so each shape is captured once and replayed afterwards; the engine captures a
bounded set of them at load (engines.base.load_calls) and the rest at their first use. The plan is
plain data, testable without a GPU; GraphBuffers binds and runs a call by it (HostOps runs the same
code on host memory in tests).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnxruntime as ort

from edgespec.engines.base import EngineError
from edgespec.engines.device import DeviceBuffer, DeviceKV
from edgespec.engines.manifest import GraphSpec

COPY_IN = "copy_in"  # a device buffer written from the host array before each run
RESIDENT = "resident"  # lives on the device already: the KV cache window, the new K/V rows
HOST = "host"  # bound in host memory: ORT reads it on the CPU (its value is fixed per width) or not at all
COPY_OUT = "copy_out"  # a device buffer read back into the host array after each run
# inputs a host-prologue graph reads on the host or not at all; binding them on the device would
# make ORT copy them back at run start, inside the capture
HOST_SIDE = {
    "two_rows_pads": "Pad's pads (fixed per width)",
    "n_rows": "Slice's end (fixed per width)",
    "past_len": "unused: the host built the masks",
    "tree_mask": "unused: the host built the masks",
}
# COPY_OUT outputs read back only when asked for: a greedy verify reads the top-k ids alone, most
# drafters never read the hidden states
LAZY = ("logits", "hidden", "hidden_aux", "topk_ids", "topk_probs")
ALIGN = 256  # bytes between staged inputs in their shared block (cudaMalloc's alignment)
PROVIDER_OPTIONS = {"enable_cuda_graph": "1"}  # CUDAExecutionProvider option that turns capture on
RUN_GRAPH_ID = "gpu_graph_id"  # RunOptions config key: which captured graph a run records or replays


@dataclass(frozen=True)
class Placement:
    name: str  # graph input or output
    shape: tuple[int, ...]  # at this (width, window)
    dtype: str  # numpy dtype name
    where: str  # COPY_IN, RESIDENT, HOST or COPY_OUT
    output: bool  # an output (else an input)

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape)) * np.dtype(self.dtype).itemsize


def wanted(asked: bool | None, provider: str, device_ops: bool, host_prologue: bool, role: str) -> bool:
    """Whether a model's calls are captured: asked (True / False / None: where possible) on the cuda
    provider (or the cpu provider with device_ops: the device code paths on host memory) for a
    --host-prologue graph. Asked where that does not hold: an EngineError with the way out."""
    gpu = provider == "cuda" or (provider == "cpu" and device_ops)
    if asked and (not gpu or not host_prologue):
        raise EngineError(
            f"CUDA graphs need the cuda provider and a folder exported with --host-prologue (got "
            f"provider {provider!r}, {role} graph {'with' if host_prologue else 'without'} it). Hint: "
            "re-export with --host-prologue, or run with --no-cuda-graph"
        )
    return bool(gpu and host_prologue and (asked or (asked is None and provider == "cuda")))


def binding_plan(graph: GraphSpec, width: int, window: int) -> list[Placement]:
    """Every input and output of a (width, window) call with where it is bound."""
    out = []
    for t in graph.inputs:
        for name in t.names():
            where = RESIDENT if t.layers else HOST if name in HOST_SIDE else COPY_IN
            out.append(Placement(name, t.shape_at(width, window), t.dtype, where, False))
    for t in graph.outputs:
        for name in t.names():
            out.append(
                Placement(name, t.shape_at(width, window), t.dtype, RESIDENT if name == "new_kv" else COPY_OUT, True)
            )
    return out


class GraphBuffers:
    """Device buffers of one model's captured calls, sized for the widest window, so a (width, window)
    call always binds the same addresses: a width's staged inputs share one block (one upload per
    call), each output has its own buffer; graph ids handed out once per (width, window)."""

    def __init__(self, ops, graph: GraphSpec, widths, max_window: int) -> None:
        self.ops = ops  # engines.device CudaOps (HostOps in tests)
        self.graph = graph
        self._bufs: dict[tuple[str, int], DeviceBuffer] = {}  # COPY_OUT buffers by (name, width)
        # per width: the staged inputs' device block (sized for the widest window) and its host twin
        self._in: dict[int, tuple[DeviceBuffer, np.ndarray]] = {}
        self._layouts: dict[tuple[int, int], tuple[dict[str, int], int]] = {}  # _layout's, by (width, window)
        for w in widths:
            for p in binding_plan(graph, w, max_window):
                if p.where == COPY_OUT:
                    self._bufs[p.name, w] = ops.alloc(p.nbytes)
            end = self._layout(w, max_window)[1]
            self._in[w] = (ops.alloc(end), np.zeros(end, np.uint8))
        self._unread: dict[str, tuple[np.ndarray, int]] = {}  # LAZY outputs of the last run not read back yet
        self._ids: dict[tuple[int, int], int] = {}
        self._run_options: dict[tuple[int, int], ort.RunOptions] = {}  # per (width, window): its gpu_graph_id

    def _layout(self, width: int, window: int) -> tuple[dict[str, int], int]:
        """(each staged input's offset in the width's block, the bytes used) for a (width, window) call:
        packed at that window's sizes, so a call uploads what it feeds and no room kept for wider
        windows (its addresses are fixed per (width, window), which is all its captured graph needs)."""
        if (width, window) not in self._layouts:
            offsets, end = {}, 0
            for p in binding_plan(self.graph, width, window):
                if p.where == COPY_IN:
                    offsets[p.name] = end
                    end += -(-p.nbytes // ALIGN) * ALIGN
            self._layouts[width, window] = (offsets, max(end, 1))
        return self._layouts[width, window]

    def ptr(self, name: str, width: int, window: int) -> int:
        """A staged tensor's device address in a (width, window) call."""
        offsets = self._layout(width, window)[0]
        return self._in[width][0].ptr + offsets[name] if name in offsets else self._bufs[name, width].ptr

    def graph_id(self, width: int, window: int) -> int:
        """The gpu_graph_id of a (width, window) call: 1, 2, ... in first-use order (0 is ORT's default
        graph, -1 means do not capture)."""
        return self._ids.setdefault((width, window), len(self._ids) + 1)

    def copy_in(self, plan: list[Placement], arrays: dict[str, np.ndarray], width: int, window: int) -> None:
        """A call's staged inputs in one upload: each packed into the width's host block at its offset,
        the block copied up, one sync (ORT runs on its own stream: the inputs must have landed)."""
        block, host = self._in[width]
        offsets, end = self._layout(width, window)
        for p in plan:
            if p.where == COPY_IN:
                a, at = arrays[p.name], offsets[p.name]
                host[at : at + a.nbytes] = np.ascontiguousarray(a).reshape(-1).view(np.uint8)
        self.ops.h2d(block.ptr, host[:end])
        self.ops.sync()

    def copy_out(
        self, plan: list[Placement], arrays: dict[str, np.ndarray], width: int, n_rows: int | None = None
    ) -> None:
        """After a run: the outputs stay on the device until read_back asks for them (the logits' first
        n_rows rows only: the real tokens'; padding rows are never read)."""
        self._unread = {}
        for p in plan:
            if p.where != COPY_OUT:
                continue
            dst = arrays[p.name][0, :n_rows] if p.name == "logits" and n_rows is not None else arrays[p.name]
            if p.name in LAZY:
                self._unread[p.name] = (dst, self._bufs[p.name, width].ptr)
            else:
                self.ops.d2h(dst, self._bufs[p.name, width].ptr)

    def read_back(self, name: str) -> None:
        """An output of the last run into its host array, the first time it is asked for."""
        if name in self._unread:
            dst, ptr = self._unread.pop(name)
            self.ops.d2h(dst, ptr)

    def free(self) -> None:
        """Release every device buffer (the outputs' and the staged inputs' blocks)."""
        for buf in (*self._bufs.values(), *(block for block, _ in self._in.values())):
            self.ops.free(buf)
        self._unread = {}

    def bind(
        self, b: ort.IOBinding, width: int, window: int, arrays: dict[str, np.ndarray], kv: DeviceKV, mem: str
    ) -> None:
        """Bind every tensor of a (width, window) call at its fixed address: host arrays (by graph
        name) where the plan says HOST, the device cache `kv` where RESIDENT, the staging buffers
        otherwise; mem: the ORT device name of device buffers."""
        for p in binding_plan(self.graph, width, window):
            bind = b.bind_output if p.output else b.bind_input
            if p.where == HOST:
                bind(p.name, "cpu", 0, np.dtype(p.dtype), p.shape, arrays[p.name].ctypes.data)
                continue
            if p.where == RESIDENT and p.output:  # new_kv
                ptr = kv.new_kv[width].ptr
            elif p.where == RESIDENT:  # past_{kind}_{layer}: the window of the device cache
                kind, layer = p.name.split("_")[1:]
                ptr = kv.window_ptr(int(layer), 0 if kind == "key" else 1)
            else:
                ptr = self.ptr(p.name, width, window)
            bind(p.name, mem, 0, np.dtype(p.dtype), p.shape, ptr)
        ro = ort.RunOptions()
        ro.add_run_config_entry(RUN_GRAPH_ID, str(self.graph_id(width, window)))
        self._run_options[width, window] = ro

    def run(
        self,
        session: ort.InferenceSession,
        b: ort.IOBinding,
        width: int,
        window: int,
        arrays: dict[str, np.ndarray],
        n_rows: int | None = None,
    ) -> None:
        """One captured call: stage the inputs (their sync also waits for the commits enqueued before on
        the same stream), run (record or replay) its graph id; the outputs stay on the device (the
        logits' first n_rows rows are what read_back("logits") brings back)."""
        plan = binding_plan(self.graph, width, window)
        self.copy_in(plan, arrays, width, window)
        session.run_with_iobinding(b, self._run_options[width, window])
        b.synchronize_outputs()
        self.copy_out(plan, arrays, width, n_rows)
