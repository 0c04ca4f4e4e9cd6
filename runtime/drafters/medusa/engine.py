"""ONNX Runtime engine of Medusa heads: K heads on the target's last verified feature.

One call maps the feature [H] to every head's logits [K, Vd] (no KV, no sequence), so the
session's input and output are bound once, at load, to preallocated buffers.
"""

from __future__ import annotations

import numpy as np
import onnxruntime as ort

from edgespec.engines import session as es
from edgespec.engines.manifest import HeadsSpec, Manifest


class OrtHeads:
    """Medusa heads of an engine folder: one call maps the last verified feature [H] to every
    head's logits [K, Vd] (no KV, no sequence). Inputs and outputs are bound once."""

    def __init__(self, manifest: Manifest, spec: HeadsSpec, provider: str = "cpu", threads: int | None = None) -> None:
        es.check_provider(provider)
        self.manifest, self.spec, self.provider = manifest, spec, provider
        self.n_heads, self.hidden_size = spec.n_heads, spec.hidden_size
        self.vocab_size = spec.vocab_size  # draft vocabulary Vd
        self.d2t = es.read_d2t(manifest, spec)
        dtype = np.dtype(np.float16 if spec.precision == "fp16" else np.float32)
        self._feat = np.zeros((1, spec.hidden_size), dtype)  # [1, H]
        self._logits = np.zeros((spec.n_heads, spec.vocab_size), np.float32)  # [K, Vd]
        self._session_options, self._initializers = es.session_options(manifest, spec, threads)
        self._session: ort.InferenceSession | None = None
        self._binding: ort.IOBinding | None = None
        self.n_calls = 0  # calls so far (stats)

    def load(self) -> None:
        """Create the session and bind its buffers (the first call would otherwise pay for it)."""
        if self._session is not None:
            return
        self._session = es.new_session(self.manifest.path(self.spec.file), self._session_options, self.provider)
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
