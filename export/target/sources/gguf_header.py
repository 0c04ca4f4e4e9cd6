"""A GGUF file's metadata and tensor table, read without its tensors or its vocabulary.

Why not gguf.GGUFReader: it makes one numpy view per element of every array, so the 262k-token
vocabulary of Gemma 3 270M takes 7.6 s to open (SmolLM2's 2.2 s, AMD EPYC), and the export opens
the header before anything else to refuse what it cannot build in seconds. Here long arrays are
skipped and only their length kept (string arrays by walking their lengths: ~0.2 s for 262k).
The layout read is GGUF v2/v3 (github.com/ggml-org/ggml docs/gguf.md).
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path

# value type id -> struct format of one scalar (8: string, 9: array, read apart)
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
SMALL_ARRAY = 64  # arrays up to this many elements are read whole (per-layer head counts, rope sections)


class GgufHeaderError(ValueError):
    """A file that is not a GGUF this reader understands (the message names the file and the offset)."""


@dataclass(frozen=True)
class LongArray:
    """An array of more than SMALL_ARRAY elements, left unread."""

    length: int  # elements (a vocabulary: its size)
    type_id: int  # GGUF value type of the elements (8: strings)


@dataclass(frozen=True)
class TensorInfo:
    """One entry of the tensor table."""

    name: str  # GGUF tensor name ("blk.0.attn_q.weight")
    dims: tuple[int, ...]  # GGUF order: dims[0] is the row length (a linear's input width)
    type_id: int  # GGML type (gguf.GGMLQuantizationType value)
    offset: int  # bytes from the start of the data section


@dataclass(frozen=True)
class GgufHeader:
    path: str  # the file
    version: int  # GGUF version (2 or 3)
    fields: dict  # key -> scalar, str, list (short arrays) or LongArray
    tensors: tuple[TensorInfo, ...]  # in file order
    data_offset: int  # where the tensor data starts (aligned)

    def get(self, key: str, default=None):
        return self.fields.get(key, default)

    @property
    def architecture(self) -> str:
        return str(self.fields.get("general.architecture", ""))

    def arch_value(self, suffix: str, default=None):
        """`{architecture}.{suffix}` ("block_count", "attention.head_count", ...)."""
        return self.fields.get(f"{self.architecture}.{suffix}", default)


class _Cursor:
    def __init__(self, buf, path: str) -> None:
        self.buf, self.pos, self.path = buf, 0, path

    def take(self, fmt: str):
        try:
            (value,) = struct.unpack_from(fmt, self.buf, self.pos)
        except struct.error as e:
            raise GgufHeaderError(f"{self.path}: truncated GGUF header at byte {self.pos} ({e})") from None
        self.pos += struct.calcsize(fmt)
        return value

    def string(self) -> str:
        n = self.take("<Q")
        if self.pos + n > len(self.buf):
            raise GgufHeaderError(f"{self.path}: a string of {n} bytes at byte {self.pos} runs past the file's end")
        s = bytes(self.buf[self.pos : self.pos + n]).decode("utf-8", errors="replace")
        self.pos += n
        return s

    def value(self, type_id: int):
        if type_id in _SCALARS:
            return self.take(_SCALARS[type_id])
        if type_id == 8:
            return self.string()
        if type_id != 9:
            raise GgufHeaderError(f"{self.path}: unknown GGUF value type {type_id} at byte {self.pos}")
        elem, n = self.take("<I"), self.take("<Q")
        if n <= SMALL_ARRAY:
            return [self.value(elem) for _ in range(n)]
        if elem in _SCALARS:
            self.pos += n * struct.calcsize(_SCALARS[elem])
        elif elem == 8:
            for _ in range(n):
                length = self.take("<Q")  # read before pos is updated (`pos += take()` would add to the old pos)
                self.pos += length
        else:
            raise GgufHeaderError(f"{self.path}: an array of type {elem} ({n} elements) cannot be skipped")
        return LongArray(n, elem)


def read_header(path: str | Path) -> GgufHeader:
    """The metadata and tensor table of a GGUF file (the tensor bytes and long arrays unread)."""
    path = str(path)
    with open(path, "rb") as f:
        try:
            buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except ValueError as e:  # an empty file
            raise GgufHeaderError(f"{path}: not a GGUF file ({e})") from None
    with buf:
        c = _Cursor(buf, path)
        if bytes(buf[:4]) != b"GGUF":
            raise GgufHeaderError(f"{path} does not start with the GGUF magic bytes")
        c.pos = 4
        version = c.take("<I")
        if version not in (2, 3):
            raise GgufHeaderError(f"{path}: GGUF version {version} (this reader knows 2 and 3)")
        n_tensors, n_fields = c.take("<Q"), c.take("<Q")
        fields = {}
        for _ in range(n_fields):
            key = c.string()
            fields[key] = c.value(c.take("<I"))
        tensors = []
        for _ in range(n_tensors):
            name = c.string()
            dims = tuple(c.take("<Q") for _ in range(c.take("<I")))
            tensors.append(TensorInfo(name, dims, c.take("<I"), c.take("<Q")))
        align = int(fields.get("general.alignment", 32))
        data_offset = c.pos + (-c.pos) % align
    return GgufHeader(path, version, fields, tuple(tensors), data_offset)
