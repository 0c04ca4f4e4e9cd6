"""Where a graph writer's arrays go: in memory (WeightStore) or spilled to disk the moment they are
stored (SpillStore: a streamed export), and the one weights file per model they are written to,
shared by all its graphs (ONNX external data + a manifest index: write_weights)."""

from __future__ import annotations

import os
import zlib
from collections.abc import Iterable
from dataclasses import dataclass
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


class WeightStore:
    """Named numpy arrays shared by all graphs of one model (written once as external data)."""

    def __init__(self) -> None:
        self.arrays: dict[str, np.ndarray] = {}

    def add(self, name: str, arr: np.ndarray) -> str:
        if name not in self.arrays:  # a table computed at load (engines/rope.py) keeps its mark
            self.arrays[name] = arr if rope.rope_of(arr) is not None else np.ascontiguousarray(arr)
        return name


CHUNK_BYTES = 16 << 20  # row blocks, file reads and comparisons in pieces of this size (16 MB: glibc then
#                        reuses the freed heap instead of mapping fresh pages per block: 1B export sys time 20 -> 13 s)


def _read_exactly(fh, view: memoryview, file: Path) -> None:
    from edgespec.export.target.sources.safetensors import CheckpointError

    got = 0
    while got < len(view):
        n = fh.readinto(view[got:])
        if not n:
            raise CheckpointError(f"{file} ends inside a tensor (truncated file?)")
        got += n


@dataclass(frozen=True)
class SpilledArray:
    """An array the store wrote to its spool: what the graph writers read of a stored array (dtype,
    shape, nbytes), its pieces in the spool and their CRC-32; np.asarray reads it back."""

    dtype: np.dtype  # its numpy dtype
    shape: tuple[int, ...]  # its shape
    nbytes: int  # its size
    pieces: tuple[tuple[int, int], ...]  # (offset in the spool, bytes) in order; concatenated: the array
    crc: int  # CRC-32 of its bytes, as stored
    spool: Path  # the spool file

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        out = np.empty(self.shape, self.dtype)
        view, at = memoryview(out.reshape(-1).view(np.uint8)), 0
        with open(self.spool, "rb", buffering=0) as fh:
            for offset, n in self.pieces:
                fh.seek(offset)
                _read_exactly(fh, view[at : at + n], self.spool)
                at += n
        return out if dtype is None else out.astype(dtype)


class SpillStore(WeightStore):
    """A WeightStore whose arrays go to a spool file the moment they are stored (first store of a
    name wins, as in WeightStore); `arrays` then holds SpilledArray records, which is all a graph
    needs to point its initializers at them. `write` lays them out as weights.write_weights does
    (sorted by name, 64-byte aligned: the same bytes), copied file to file by the kernel."""

    def __init__(self, spool: Path) -> None:
        super().__init__()
        self.spool = spool
        self._fh = open(spool, "wb", buffering=0)  # noqa: SIM115 (open until write(): the store's lifetime);
        #                                           unbuffered: a stored array reads back at once (SpilledArray)
        self._end = 0  # bytes in the spool
        self._pending: dict[str, tuple[np.dtype, list, int]] = {}  # arrays being appended: dtype, spans, CRC

    def add(self, name: str, arr: np.ndarray) -> str:
        if name in self.arrays:
            return name
        if rope.rope_of(arr) is not None:  # computed at load: kept here (small), never written
            self.arrays[name] = arr
        else:
            arr = np.ascontiguousarray(arr)
            self.add_pieces(name, arr.dtype, arr.shape, [arr])
        return name

    def add_pieces(self, name: str, dtype: np.dtype, shape: tuple[int, ...], pieces: Iterable[np.ndarray]) -> str:
        """One array given as consecutive pieces of its bytes (row blocks of a [N, ...] array)."""
        if name in self.arrays:
            return name
        for p in pieces:
            self.append(name, p)
        self.finish(name, shape, dtype)
        return name

    def append(self, name: str, piece: np.ndarray) -> None:
        """The next piece of an array being stored (pieces of several arrays may interleave)."""
        piece = np.ascontiguousarray(piece)
        dtype, spans, crc = self._pending.get(name, (piece.dtype, [], 0))
        if piece.dtype != dtype:
            raise ValueError(f"{name}: a piece of dtype {piece.dtype}, the array's is {dtype}")
        b = memoryview(piece.reshape(-1).view(np.uint8))
        done = 0
        while done < len(b):  # a raw write may take part of the bytes
            done += self._fh.write(b[done:])
        spans.append((self._end, piece.nbytes))
        self._end += piece.nbytes
        self._pending[name] = (dtype, spans, zlib.crc32(b, crc))

    def finish(self, name: str, shape: tuple[int, ...], dtype: np.dtype | None = None) -> None:
        """The array whose pieces were appended is complete: its shape."""
        got, spans, crc = self._pending.pop(name, (dtype, [], 0))
        dtype = np.dtype(got if got is not None else dtype)
        total = sum(n for _, n in spans)
        if total != int(np.prod(shape, dtype=np.int64)) * dtype.itemsize:
            raise ValueError(f"{name}: pieces of {total} bytes for shape {tuple(shape)} {dtype}")
        self.arrays[name] = SpilledArray(dtype, tuple(int(s) for s in shape), total, tuple(spans), crc, self.spool)

    def write(self, path: Path) -> dict[str, dict]:
        """The weights file (weights.write_weights' layout and index), each array's bytes read back
        from it and checked against the CRC taken when it was stored; the spool is removed."""
        self._fh.close()
        index: dict[str, dict] = {}
        offset = 0
        with open(self.spool, "rb") as src, open(path, "wb", buffering=0) as dst:  # unbuffered: one file position
            for name in sorted(self.arrays):
                a = self.arrays[name]
                if rope.rope_of(a) is not None:
                    index[name] = computed_entry(a, path.parent)
                    continue
                pad = (-offset) % ALIGN
                dst.write(b"\0" * pad)
                offset += pad
                for at, n in a.pieces:
                    _copy_range(src.fileno(), dst.fileno(), at, n)
                index[name] = {"dtype": a.dtype.name, "shape": list(a.shape), "offset": offset, "nbytes": a.nbytes}
                offset += a.nbytes
        self.spool.unlink()
        self._check_written(path, index)
        return index

    def _check_written(self, path: Path, index: dict[str, dict]) -> None:
        buf = bytearray(min(CHUNK_BYTES, max((e["nbytes"] for e in index.values()), default=1)))
        with open(path, "rb", buffering=0) as fh:
            for name, e in index.items():
                if "rope" in e:  # computed at load: no bytes
                    continue
                fh.seek(e["offset"])
                crc, left = 0, e["nbytes"]
                while left:
                    n = fh.readinto(memoryview(buf)[: min(left, len(buf))])
                    if not n:
                        raise OSError(f"{path} ends inside {name}")
                    crc = zlib.crc32(memoryview(buf)[:n], crc)
                    left -= n
                if crc != self.arrays[name].crc:
                    raise OSError(f"{path}: {name}'s bytes read back differ from those stored (CRC-32)")


def _copy_range(src_fd: int, dst_fd: int, offset: int, n: int) -> None:
    """n bytes of src from offset appended to dst, in the kernel where it can (no user buffer)."""
    while n:
        try:
            done = os.copy_file_range(src_fd, dst_fd, min(n, 1 << 30), offset)
        except OSError:  # a filesystem without it: through a bounded buffer
            data = os.pread(src_fd, min(n, CHUNK_BYTES), offset)
            os.write(dst_fd, data)
            done = len(data)
        if not done:
            raise OSError(f"the spool ends at {offset} with {n} bytes still to copy")
        offset += done
        n -= done
