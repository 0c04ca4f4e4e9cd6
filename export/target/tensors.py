"""Tensors one at a time: a safetensors checkpoint read tensor by tensor into float32 (no
transformers model, no mapping of the whole file), and a weight store that spills every array to
disk as it is stored, so the export's memory follows the largest tensor, not the model.

Reads use plain `readinto` on the file, not mmap: mapped pages count in a process's resident set
until unmapped, so an mmap'd 16 GB checkpoint read through would show a 16 GB peak RSS.
"""

from __future__ import annotations

import json
import os
import struct
import weakref
import zlib
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from edgespec.engines import rope
from edgespec.export.target.graph import WeightStore
from edgespec.export.target.weights import ALIGN, computed_entry

CHUNK_BYTES = 16 << 20  # row blocks, file reads and comparisons in pieces of this size (16 MB: glibc then
#                        reuses the freed heap instead of mapping fresh pages per block: 1B export sys time 20 -> 13 s)
DTYPES = {"F32": np.float32, "F16": np.float16, "BF16": np.uint16}  # safetensors dtype -> the bytes' numpy type


class CheckpointError(ValueError):
    """A checkpoint the streaming export does not read (the exporter then loads it the old way)."""


@dataclass(frozen=True)
class TensorEntry:
    """Where one tensor's bytes are in a safetensors file."""

    file: Path  # the shard holding it
    dtype: str  # safetensors dtype name ("BF16", "F16", "F32", ...)
    shape: tuple[int, ...]  # its shape
    start: int  # absolute byte offset of its data in the file
    nbytes: int  # its size in bytes


def read_index(folder: Path) -> dict[str, TensorEntry]:
    """name -> TensorEntry of every tensor of an HF folder's safetensors (model.safetensors, or the
    shards model.safetensors.index.json names); a CheckpointError when there are none."""
    index = folder / "model.safetensors.index.json"
    if index.exists():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        files = [folder / s for s in shards]
    elif (folder / "model.safetensors").exists():
        files = [folder / "model.safetensors"]
    else:
        raise CheckpointError(f"{folder} holds no model.safetensors (nor its index)")
    entries: dict[str, TensorEntry] = {}
    for f in files:
        with open(f, "rb") as fh:
            (n,) = struct.unpack("<Q", fh.read(8))
            header = json.loads(fh.read(n))
        for name, e in header.items():
            if name == "__metadata__":
                continue
            begin, end = e["data_offsets"]
            entries[name] = TensorEntry(f, e["dtype"], tuple(e["shape"]), 8 + n + begin, end - begin)
    return entries


class ReadWeight(np.ndarray):
    """A float32 tensor as read from the checkpoint, read-only. `astype(float32)` returns it
    without the copy: the graph writer copies each weight that way before storing it (a no-op in
    meaning), and on the embedding table that copy alone would double the export's peak."""

    def astype(self, dtype, order="K", casting="unsafe", subok=True, copy=True):
        if np.dtype(dtype) == self.dtype and order == "K":
            return self
        return super().astype(dtype, order=order, casting=casting, subok=subok, copy=copy)


def read_tensor(e: TensorEntry, rows: np.ndarray | None = None) -> ReadWeight:
    """One tensor as float32 (BF16 and F16 widened exactly: bf16 is the top half of a float32),
    converted piece by piece: peak memory is the float32 result plus one piece. rows: only these
    rows (sorted, of the first axis; contiguous runs read at once)."""
    if e.dtype not in DTYPES:
        raise CheckpointError(f"tensor dtype {e.dtype} is not read by the streaming export (F32, F16, BF16)")
    src_type = np.dtype(DTYPES[e.dtype])
    if int(np.prod(e.shape, dtype=np.int64)) * src_type.itemsize != e.nbytes:
        raise CheckpointError(f"{e.file}: a tensor of shape {e.shape} {e.dtype} holds {e.nbytes} bytes")
    row = int(np.prod(e.shape[1:], dtype=np.int64)) if e.shape else 1
    if rows is None:
        out = np.empty(e.shape, np.float32)
        runs = [(0, e.shape[0] if e.shape else 1)]
    else:
        rows = np.asarray(rows, np.int64)
        out = np.empty((len(rows), *e.shape[1:]), np.float32)
        cut = np.flatnonzero(np.diff(rows) != 1) + 1  # runs of consecutive rows
        runs = [(int(r[0]), int(r[-1]) + 1) for r in np.split(rows, cut) if len(r)]
    flat, at = out.reshape(-1), 0
    with open(e.file, "rb", buffering=0) as fh:
        for r0, r1 in runs:
            n = (r1 - r0) * row
            fh.seek(e.start + r0 * row * src_type.itemsize)
            _read_converted(fh, e, src_type, flat[at : at + n])
            at += n
    out = out.view(ReadWeight)
    out.flags.writeable = False
    return out


def _read_converted(fh, e: TensorEntry, src_type: np.dtype, flat: np.ndarray) -> None:
    """len(flat) values of the file's type from fh's position into float32 `flat`."""
    n = len(flat)
    if e.dtype == "F32":
        _read_exactly(fh, memoryview(flat.view(np.uint8)), e.file)
        return
    step = max(1, CHUNK_BYTES // 4)
    buf = np.empty(min(step, n), src_type)
    for i in range(0, n, step):
        piece = buf[: min(step, n - i)]
        _read_exactly(fh, memoryview(piece.view(np.uint8)), e.file)
        if e.dtype == "BF16":
            np.left_shift(piece, 16, out=flat[i : i + len(piece)].view(np.uint32), dtype=np.uint32)
        else:
            flat[i : i + len(piece)] = piece


def _read_exactly(fh, view: memoryview, file: Path) -> None:
    got = 0
    while got < len(view):
        n = fh.readinto(view[got:])
        if not n:
            raise CheckpointError(f"{file} ends inside a tensor (truncated file?)")
        got += n


class StreamedWeights(Mapping):
    """The target's weights by Hugging Face state-dict name, each read from the checkpoint when
    asked for and not kept: what the graph writer takes in place of a state dict. A tensor still
    held by its caller is handed out again instead of read twice (the writer asks for the
    embedding table twice when the LM head is tied to it). aliases: name -> the checkpoint tensor
    it reads (a tied LM head -> the embedding)."""

    def __init__(self, entries: dict[str, TensorEntry], aliases: dict[str, str] | None = None) -> None:
        self.entries = entries
        self.aliases = aliases or {}
        self.reads = 0  # tensors read from disk (the tests count them)
        self._alive: weakref.WeakValueDictionary = weakref.WeakValueDictionary()

    def source(self, name: str) -> str:
        """The checkpoint tensor a name reads."""
        return self.aliases.get(name, name)

    def __getitem__(self, name: str) -> ReadWeight:
        src = self.source(name)
        if src not in self.entries:
            raise KeyError(name)
        arr = self._alive.get(src)
        if arr is None:
            arr = self.read(self.entries[src])
            self.reads += 1
            self._alive[src] = arr
        return arr

    def get(self, name: str, default=None):
        """The tensor unread (a LazyTensor), or default. The graph writer asks for the LM head this
        way and keeps it in a local through every layer; unread, it holds nothing meanwhile
        (StreamingWriter reads it when it stores the linear)."""
        return LazyTensor(self, name) if name in self else default

    def rows(self, name: str, rows: np.ndarray) -> ReadWeight:
        """Rows of a tensor (sorted indices of its first axis), reading only those."""
        return self.read(self.entries[self.source(name)], rows)

    def read(self, entry, rows: np.ndarray | None = None) -> ReadWeight:
        """One checkpoint tensor (or those rows of it) as float32: a safetensors entry here, a GGUF
        one in gguf_stream.GgufWeights."""
        return read_tensor(entry, rows)

    def __iter__(self) -> Iterator[str]:
        return iter(list(self.entries) + [a for a in self.aliases if a not in self.entries])

    def __len__(self) -> int:
        return len(set(self.entries) | set(self.aliases))

    def __contains__(self, name) -> bool:
        return self.source(name) in self.entries


@dataclass(frozen=True)
class LazyTensor:
    """A checkpoint tensor not read yet (StreamedWeights.get)."""

    weights: StreamedWeights  # where it is read from
    name: str  # its state-dict name

    def read(self) -> ReadWeight:
        return self.weights[self.name]


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
