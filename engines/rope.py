"""Rotary position tables, computed where they are used instead of stored in a folder.

A table is cos or sin of position x frequency, [n_pos, D] (rotate_half layout: the frequency
halves duplicated) or its first half [n_pos, D/2] (the fused RotaryEmbedding's cache). Stored, a
model's own context (131,072 positions for Llama 3.x) costs more bytes than some of its layers;
computed, it costs nothing on disk and ~0.1 s at load. The export records a table's parameters in
the manifest (RopeTable, on its WeightSpec) and the CRC-32 of the bytes it validated with; the
engines compute the same bytes with the same NumPy arithmetic (float64, one cast) and hand them to
ONNX Runtime as the initializer. The graph's initializer points at COMPUTED_FILE, a note in the
folder holding none of the bytes, so a reader that is not the engines (onnx.load with external
data, TensorRT's parser) fails loudly instead of reading garbage.
"""

from __future__ import annotations

import functools
import math
import sys
import zlib
from dataclasses import dataclass

import numpy as np

from edgespec.engines.serial import Serial

COMPUTED_FILE = "computed_at_load.txt"  # what a computed initializer's external data names
COMPUTED_NOTE = (
    "The initializers whose external data names this file (rope_cos*, rope_sin*) are computed at load\n"
    "by edgespec.engines.rope from manifest.json's parameters; this file holds none of their bytes.\n"
)
ROPE_TYPES = ("default", "linear", "llama3")  # the scalings the tables compute


@dataclass(frozen=True)
class RopeTable(Serial):
    part: str  # "cos" or "sin"
    dim: int  # the rotated width D (the head dim)
    half: bool  # only the first D/2 columns (the fused RotaryEmbedding's cache), else [n_pos, D]
    theta: float  # the frequency base
    rope_type: str  # "default" | "linear" | "llama3"
    params: dict  # the scaling's numbers (factor, low_freq_factor, ...), as the checkpoint's config names them
    crc: int  # CRC-32 of the bytes the export wrote the graph with (a different libm would show here)


def inv_freq(dim: int, theta: float, rope_type: str, params: dict) -> np.ndarray:
    """The D/2 rotation frequencies (float64), with the checkpoint's scaling."""
    freq = 1.0 / (theta ** (np.arange(0, dim, 2, dtype=np.float64) / dim))
    if rope_type == "linear":
        freq = freq / params["factor"]
    elif rope_type == "llama3":
        factor, lo, hi = params["factor"], params["low_freq_factor"], params["high_freq_factor"]
        old_len = params["original_max_position_embeddings"]
        wavelen = 2 * math.pi / freq
        scaled = np.where(wavelen > old_len / lo, freq / factor, freq)
        smooth = (old_len / wavelen - lo) / (hi - lo)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = (wavelen >= old_len / hi) & (wavelen <= old_len / lo)
        freq = np.where(medium, smoothed, scaled)
    elif rope_type != "default":
        raise ValueError(f"rope type {rope_type!r} is not one of {', '.join(ROPE_TYPES)}")
    return freq


def tables(n_pos: int, dim: int, theta: float, rope_type: str, params: dict) -> tuple[np.ndarray, np.ndarray]:
    """cos, sin [n_pos, D] float32 in HF's rotate_half layout (halves duplicated)."""
    return tuple(_full(_half(part, n_pos, dim, theta, rope_type, params)) for part in ("cos", "sin"))


def _half(part: str, n_pos: int, dim: int, theta: float, rope_type: str, params: dict) -> np.ndarray:
    """cos or sin of position x frequency [n_pos, D/2] float32 (the halves of a full table are the same
    angles, so one half is computed)."""
    angles = np.outer(np.arange(n_pos, dtype=np.float64), inv_freq(dim, theta, rope_type, params))  # [n_pos, D/2]
    return (np.cos(angles) if part == "cos" else np.sin(angles)).astype(np.float32)


def _full(half: np.ndarray) -> np.ndarray:
    return np.concatenate([half, half], axis=-1)


def table(t: RopeTable, n_pos: int, dtype: str) -> np.ndarray:
    """The table a RopeTable describes, [n_pos, D or D/2] of dtype (read-only: cached per load)."""
    return _table(t.part, t.dim, t.half, t.theta, t.rope_type, tuple(sorted(t.params.items())), n_pos, dtype)


@functools.lru_cache(maxsize=16)
def _table(part, dim, half, theta, rope_type, params, n_pos, dtype) -> np.ndarray:
    out = _half(part, n_pos, dim, theta, rope_type, dict(params))
    out = (out if half else _full(out)).astype(np.dtype(dtype))
    out.flags.writeable = False
    return out


def crc(arr: np.ndarray) -> int:
    return zlib.crc32(memoryview(np.ascontiguousarray(arr).reshape(-1).view(np.uint8)))


_WARNED: set[str] = set()


def checked_table(name: str, t: RopeTable, shape: tuple[int, ...], dtype: str) -> np.ndarray:
    """table() for a weight entry, its bytes compared with the export's: a machine whose libm rounds
    a cosine differently computes other bytes (said once per table; every call of this process still
    reads the same table, so decode, verify and prefill stay bitwise alike)."""
    out = table(t, shape[0], dtype)
    if out.shape != tuple(shape):
        raise ValueError(f"rope table {name}: computed {list(out.shape)}, the manifest says {list(shape)}")
    if crc(out) != t.crc and name not in _WARNED:
        _WARNED.add(name)
        print(
            f"edgespec: the rotary table {name} computed here differs from the export's (CRC-32 "
            f"{crc(out):08x} vs {t.crc:08x}: this machine's cosine rounds differently); logits may differ "
            "from the export's validation in the last bits",
            file=sys.stderr,
        )
    return out


class ComputedTable(np.ndarray):
    """An export-side array the folder does not store: a rope table with the parameters that compute
    it (`rope`). The graph writers read it as any array; the weights writers record it instead of
    writing it."""

    rope: RopeTable | None  # None: an array derived from one (a slice, a cast): stored as usual

    def __array_finalize__(self, obj) -> None:
        self.rope = None


def rope_of(arr) -> RopeTable | None:
    """The parameters of a computed table (None: an array to store)."""
    return getattr(arr, "rope", None) if isinstance(arr, ComputedTable) else None


def computed(arr: np.ndarray, part: str, dim: int, half: bool, theta, rope_type, params) -> ComputedTable:
    """arr (the table as the graph reads it) marked as computed at load."""
    arr = np.ascontiguousarray(arr)
    out = arr.view(ComputedTable)
    out.rope = RopeTable(part, dim, half, float(theta), rope_type, dict(params), crc(arr))
    assert np.array_equal(table(out.rope, arr.shape[0], arr.dtype.name), arr), "rope tables: export != engines"
    return out


def add_computed(so, spec) -> list:
    """Add a model's computed tables to ONNX Runtime SessionOptions `so` (what a plain session of a
    folder's graph needs besides its weights file); the OrtValues returned must outlive the session."""
    import onnxruntime as ort

    values = []
    for name, w in spec.weights.items():
        if w.rope is not None:
            values.append(ort.OrtValue.ortvalue_from_numpy(checked_table(name, w.rope, tuple(w.shape), w.dtype)))
            so.add_initializer(name, values[-1])
    return values
