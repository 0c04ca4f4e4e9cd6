"""Tensors one at a time: a safetensors checkpoint read tensor by tensor into float32 (no
transformers model, no mapping of the whole file), so the export's memory follows the largest
tensor, not the model (the store that spills every array to disk as it is stored: graph/store.py),
and checked against what the graph writer reads (open_weights).

Reads use plain `readinto` on the file, not mmap: mapped pages count in a process's resident set
until unmapped, so an mmap'd 16 GB checkpoint read through would show a 16 GB peak RSS.
"""

from __future__ import annotations

import json
import struct
import weakref
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from edgespec.export.target.arch import ArchSpec
from edgespec.export.target.graph.store import CHUNK_BYTES, _read_exactly

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
        one in sources/gguf.GgufWeights."""
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


IGNORED = ("rotary_emb.inv_freq",)  # checkpoint tensors transformers ignores too (recomputed buffers)


def expected_tensors(arch: ArchSpec) -> dict[str, tuple[int, ...]]:
    """The checkpoint tensors (state-dict names and shapes) the writer reads for this architecture."""
    a = arch
    h, q, kv, inter = a.hidden_size, a.n_heads * a.head_dim, a.n_kv_heads * a.head_dim, a.intermediate_size
    out = {"model.embed_tokens.weight": (a.vocab_size, h), "model.norm.weight": (h,)}
    if not a.tie_word_embeddings:
        out["lm_head.weight"] = (a.vocab_size, h)
    for i in range(a.n_layers):
        p = f"model.layers.{i}."
        norms = ["input_layernorm", "post_attention_layernorm"]
        if a.sandwich_norms:
            norms += ["pre_feedforward_layernorm", "post_feedforward_layernorm"]
        out |= {p + n + ".weight": (h,) for n in norms}
        out |= {
            p + "self_attn.q_proj.weight": (q, h),
            p + "self_attn.k_proj.weight": (kv, h),
            p + "self_attn.v_proj.weight": (kv, h),
            p + "self_attn.o_proj.weight": (h, q),
            p + "mlp.gate_proj.weight": (inter, h),
            p + "mlp.up_proj.weight": (inter, h),
            p + "mlp.down_proj.weight": (h, inter),
        }
        if a.qkv_bias:
            out |= {p + f"self_attn.{n}_proj.bias": (r,) for n, r in (("q", q), ("k", kv), ("v", kv))}
        if a.qk_norm:
            out |= {p + "self_attn.q_norm.weight": (a.head_dim,), p + "self_attn.k_norm.weight": (a.head_dim,)}
    return out


def open_weights(folder: Path, arch: ArchSpec) -> StreamedWeights:
    """The target's tensors, checked against what the writer reads (names, shapes, float dtypes):
    a CheckpointError says why the checkpoint does not stream (the exporter then loads it the old
    way, which reports what transformers makes of it)."""
    entries = read_index(Path(folder))
    want = expected_tensors(arch)
    missing = [n for n in want if n not in entries]
    if missing:
        raise CheckpointError(f"the checkpoint lacks {len(missing)} tensors the graphs read ({', '.join(missing[:3])})")
    extra = [n for n in entries if n not in want and not n.endswith(IGNORED)]
    if extra:  # a tied head beside its embedding, a vision tower, ...: transformers decides what they mean
        raise CheckpointError(
            f"the checkpoint holds {len(extra)} tensors the graphs do not read ({', '.join(extra[:3])})"
        )
    for name, shape in want.items():
        e = entries[name]
        if e.shape != shape or e.dtype not in DTYPES:
            raise CheckpointError(f"{name} is {e.dtype} {list(e.shape)}; the config implies a float {list(shape)}")
    aliases = {"lm_head.weight": "model.embed_tokens.weight"} if arch.tie_word_embeddings else {}
    return StreamedWeights({n: entries[n] for n in want}, aliases)
