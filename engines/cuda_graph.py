"""ONNX Runtime CUDA graph capture for --host-prologue folders: where each tensor of a call lives.

A captured CUDA graph replays the kernels of its first run on the same addresses; ONNX Runtime
skips everything else on replay (no feed copies, no shape inference). So a call binds every tensor
at an address fixed per (width, window): host values are copied into device buffers before the
run and results copied back after it, and each (width, window) gets its own `gpu_graph_id`, so each
shape is captured once and replayed afterwards. The plan is plain data, testable without a GPU;
GraphBuffers binds and runs a call by it (HostOps runs the same code on host memory in tests).
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
    """Device buffers of one model's captured calls: one per staged tensor and width, sized for the
    widest window, so a (width, window) call always binds the same addresses; graph ids handed out
    once per (width, window)."""

    def __init__(self, ops, graph: GraphSpec, widths, max_window: int) -> None:
        self.ops = ops  # engines.device CudaOps (HostOps in tests)
        self.graph = graph
        self._bufs: dict[tuple[str, int], DeviceBuffer] = {}
        for w in widths:
            for p in binding_plan(graph, w, max_window):
                if p.where in (COPY_IN, COPY_OUT):
                    self._bufs[p.name, w] = ops.alloc(p.nbytes)
        self._ids: dict[tuple[int, int], int] = {}
        self._run_options: dict[tuple[int, int], ort.RunOptions] = {}  # per (width, window): its gpu_graph_id

    def ptr(self, name: str, width: int) -> int:
        return self._bufs[name, width].ptr

    def graph_id(self, width: int, window: int) -> int:
        """The gpu_graph_id of a (width, window) call: 1, 2, ... in first-use order (0 is ORT's default
        graph, -1 means do not capture)."""
        return self._ids.setdefault((width, window), len(self._ids) + 1)

    def copy_in(self, plan: list[Placement], arrays: dict[str, np.ndarray], width: int) -> None:
        for p in plan:
            if p.where == COPY_IN:
                self.ops.h2d(self.ptr(p.name, width), arrays[p.name])
        self.ops.sync()  # ORT runs on its own stream: the inputs must have landed

    def copy_out(self, plan: list[Placement], arrays: dict[str, np.ndarray], width: int) -> None:
        for p in plan:
            if p.where == COPY_OUT:
                self.ops.d2h(arrays[p.name], self.ptr(p.name, width))

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
                ptr = self.ptr(p.name, width)
            bind(p.name, mem, 0, np.dtype(p.dtype), p.shape, ptr)
        ro = ort.RunOptions()
        ro.add_run_config_entry(RUN_GRAPH_ID, str(self.graph_id(width, window)))
        self._run_options[width, window] = ro

    def run(
        self, session: ort.InferenceSession, b: ort.IOBinding, width: int, window: int, arrays: dict[str, np.ndarray]
    ) -> None:
        """One captured call: stage the inputs, run (record or replay) its graph id, read the outputs back."""
        plan = binding_plan(self.graph, width, window)
        self.copy_in(plan, arrays, width)
        session.run_with_iobinding(b, self._run_options[width, window])
        b.synchronize_outputs()
        self.copy_out(plan, arrays, width)
