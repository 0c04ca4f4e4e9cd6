"""One weights file per model, shared by all its graphs (ONNX external data + a manifest index)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

ALIGN = 64  # bytes; every tensor starts aligned so the runtime can map it in place


def write_weights(arrays: dict[str, np.ndarray], path: Path) -> dict[str, dict]:
    """Write arrays back to back; return the index {name: {dtype, shape, offset, nbytes}} (dtype:
    numpy's name, "bfloat16" for ml_dtypes' bf16: the manifest's, engines/manifest.py DTYPES)."""
    index: dict[str, dict] = {}
    offset = 0
    with open(path, "wb") as f:
        for name in sorted(arrays):
            arr = np.ascontiguousarray(arrays[name])
            pad = (-offset) % ALIGN
            f.write(b"\0" * pad)
            offset += pad
            f.write(arr.tobytes())
            index[name] = {"dtype": arr.dtype.name, "shape": list(arr.shape), "offset": offset, "nbytes": arr.nbytes}
            offset += arr.nbytes
    return index
