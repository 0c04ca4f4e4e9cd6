"""One weights file per model, shared by all its graphs (ONNX external data + a manifest index)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from edgespec.engines import rope
from edgespec.engines.serial import to_json

ALIGN = 64  # bytes; every tensor starts aligned so the runtime can map it in place


def write_weights(arrays: dict[str, np.ndarray], path: Path) -> dict[str, dict]:
    """Write arrays back to back; return the index {name: {dtype, shape, offset, nbytes}} (dtype:
    numpy's name, "bfloat16" for ml_dtypes' bf16: the manifest's, engines/manifest.py DTYPES)."""
    index: dict[str, dict] = {}
    offset = 0
    with open(path, "wb") as f:
        for name in sorted(arrays):
            if rope.rope_of(arrays[name]) is not None:
                index[name] = computed_entry(arrays[name], path.parent)
                continue
            arr = np.ascontiguousarray(arrays[name])
            pad = (-offset) % ALIGN
            f.write(b"\0" * pad)
            offset += pad
            f.write(arr.tobytes())
            index[name] = {"dtype": arr.dtype.name, "shape": list(arr.shape), "offset": offset, "nbytes": arr.nbytes}
            offset += arr.nbytes
    return index


def computed_entry(arr: np.ndarray, folder: Path) -> dict:
    """The index entry of an array the engines compute at load (engines/rope.py): its dtype, shape and
    parameters, no bytes; its initializer names rope.COMPUTED_FILE, written here (its note)."""
    note = folder / rope.COMPUTED_FILE
    if not note.is_file():
        note.write_text(rope.COMPUTED_NOTE)
    return {
        "dtype": arr.dtype.name,
        "shape": list(arr.shape),
        "offset": 0,
        "nbytes": arr.nbytes,
        "file": rope.COMPUTED_FILE,
        "rope": to_json(rope.rope_of(arr)),
    }
