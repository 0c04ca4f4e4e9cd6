"""y = x @ w on ONNX Runtime's threads (`OrtProjection`): a drafter's small projection between engine
calls, without a thread pool of its own."""

from __future__ import annotations

import base64

import numpy as np

from edgespec.engines.session import model_session


class OrtProjection:
    """y = x @ w [K, N] on ONNX Runtime's threads. A numpy matmul would run on OpenBLAS's own
    thread pool, whose threads keep spinning after the call and take the cores from the target's
    next call (a head's input projection made every verify ~2x slower on the 2-core CPU)."""

    # the ONNX model y = MatMul(x [R, K], w [K, N]) (opset 17, ir 8), serialized: the runtime does not
    # depend on the onnx package; a test rebuilds it with onnx.helper and compares
    MODEL = base64.b64decode(
        "CAgSCGVkZ2VzcGVjOmQKEQoBeAoBdxIBeSIGTWF0TXVsEgpwcm9qZWN0aW9uWhUKAXgSEAoOCAES"
        "CgoDEgFSCgMSAUtaFQoBdxIQCg4IARIKCgMSAUsKAxIBTmIVCgF5EhAKDggBEgoKAxIBUgoDEgFOQgQKABAR"
    )

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
