"""A stand-in for a TensorRT engine: the same ONNX graph run by ONNX Runtime on host memory.

It honours the parts of the TensorRT API that TrtModel uses (execution contexts, optimization
profiles, tensor addresses, input shapes, execute_async_v3) and reads/writes the buffers at the
addresses it was given, so the backend's pointer arithmetic and strided commit are really tested.
"""

from __future__ import annotations

import ctypes

import numpy as np
import onnxruntime as ort


def _view(ptr: int, shape, dtype) -> np.ndarray:
    dtype = np.dtype(dtype)
    n = int(np.prod(shape)) * dtype.itemsize
    return np.frombuffer((ctypes.c_uint8 * n).from_address(ptr), dtype=dtype).reshape(shape)


class FakeContext:
    def __init__(self, engine: FakeTrtEngine) -> None:
        self.engine, self.addr, self.shape, self.profile = engine, {}, {}, None

    def set_optimization_profile_async(self, idx: int, stream) -> bool:
        self.profile = idx
        return True

    def set_tensor_address(self, name: str, ptr: int) -> bool:
        self.addr[name] = ptr
        return True

    def set_input_shape(self, name: str, shape) -> bool:
        self.shape[name] = tuple(shape)
        return True

    def execute_async_v3(self, stream) -> bool:
        e = self.engine
        w = self.shape["input_ids"][1]
        assert e.profiles[w] == self.profile, "context runs another width than its profile"
        feed = {
            "input_ids": _view(self.addr["input_ids"], (1, w), np.int64),
            "positions": _view(self.addr["positions"], (1, w), np.int64),
            "past_len": _view(self.addr["past_len"], (1,), np.int64),
        }
        if "tree_mask" in self.addr:
            feed["tree_mask"] = _view(self.addr["tree_mask"], (w, w), np.int64)
        for name in e.kv_inputs:
            feed[name] = _view(self.addr[name], self.shape[name], e.kv_dtype)
        logits, new_kv, hidden = e.session.run(["logits", "new_kv", "hidden"], feed)  # (a lean graph has more)
        for name, val in (("logits", logits), ("new_kv", new_kv), ("hidden", hidden)):
            _view(self.addr[name], val.shape, val.dtype)[...] = val
        e.n_exec += 1
        return True


class FakeTrtEngine:
    def __init__(self, onnx_path: str, spec) -> None:
        from edgespec.engines import rope

        so = ort.SessionOptions()
        self._tables = rope.add_computed(so, spec)  # built engines carry them (trt_build.computed_inline)
        self.session = ort.InferenceSession(onnx_path, so)
        self.profiles = {w: i for i, w in enumerate(spec.widths())}
        self.kv_inputs = [f"past_{k}_{i}" for i in range(spec.n_layers) for k in ("key", "value")]
        self.kv_dtype = np.dtype(spec.kv_dtype)
        self.n_exec = 0

    def create_execution_context(self) -> FakeContext:
        return FakeContext(self)
