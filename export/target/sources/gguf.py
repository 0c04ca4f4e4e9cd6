"""A GGUF target read one tensor at a time, as transformers' GGUF loader would give each tensor: the
streaming export's GGUF source (graph/streaming.py writes the folder; this is where its weights come from).

What transformers' loader does (modeling_gguf_pytorch_utils.load_gguf_checkpoint, the path it takes
for every architecture of families.GGUF_STREAMED; its newer integrations/gguf path covers other ones), reproduced
per tensor and checked against it bitwise (tests/test_stream_export.py):
  - names: each Hugging Face parameter name without its .weight / .bias suffix, looked up in gguf's
    own tensor name map for the architecture (gguf.get_tensor_name_map), the suffix put back;
    tensors no parameter maps to are not read (llama 3's rope_freqs: IGNORED);
  - values: gguf.quants.dequantize of the tensor's bytes, float32 (F16 and BF16 widened exactly);
  - llama (a Mistral GGUF, which transformers reads as mistral, is not streamed): attn_q and attn_k
    rows un-permuted from llama.cpp's rotary layout, reshape(heads, rows / heads / 2, 2,
    K).swapaxes(1, 2), heads the header's attention.head_count (q) and attention.head_count_kv (k);
  - gemma3: every tensor named *norm.weight stored as 1 + w, loaded as (1 + w) - 1 in float32 (the
    writer adds the 1 back, in float32, as it does on the transformers path).
The config is transformers' own (AutoConfig with gguf_file: the one the loaded model would have).

Reads are plain reads of each tensor's bytes in row pieces (no memory map: mapped pages count in the
resident set), dequantized piece by piece into the float32 result. Quantized blocks are decoded per
tensor when its linear is stored (part: quant/blocks.decode on row pieces, the same rows moved), and
kept only where they dequantize to the float32 tensor bitwise, as sources/transformers.read_blocks decides on
the transformers path. A GGUF this reader does not understand (an architecture outside families.GGUF_STREAMED, a
tensor type outside TYPES, a tensor missing or of another shape) is a CheckpointError: the export
then loads it through transformers and says why.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from edgespec.engines.rowop import SubScales
from edgespec.export.target.arch import ArchSpec
from edgespec.export.target.families import GGUF_STREAMED
from edgespec.export.target.graph.store import CHUNK_BYTES, _read_exactly
from edgespec.export.target.quant.blocks import DECODERS, FLOATS, Blocks, decode
from edgespec.export.target.quant.linears import Part
from edgespec.export.target.sources.gguf_header import read_header
from edgespec.export.target.sources.safetensors import CheckpointError, ReadWeight, StreamedWeights

TYPES = FLOATS + tuple(DECODERS)  # tensor types read (dequantized with gguf.quants; blocks kept by quant/blocks.py)
IGNORED = ("rope_freqs.weight",)  # tensors transformers' loader maps to no parameter, left unread as it leaves them


@dataclass(frozen=True)
class GgufEntry:
    """Where one tensor's bytes are in a GGUF file, and what the loader does to its values."""

    file: Path  # the GGUF
    gguf_name: str  # its name in the file ("blk.0.attn_q.weight")
    type_name: str  # GGML type name ("Q4_1", "F32")
    shape: tuple[int, ...]  # Hugging Face order: [out, in] (a 1-D tensor: [n])
    start: int  # absolute byte offset of its data
    row_bytes: int  # bytes of one row (of the last dim)
    heads: int  # llama's q/k: the heads of llama.cpp's row permutation (undone); 0: rows as stored
    minus_one: bool  # gemma's norms: stored 1 + w, read as (1 + w) - 1


def gguf_names(gguf_arch: str, n_layers: int, hf_names) -> dict[str, str]:
    """HF parameter name -> GGUF tensor name, as transformers' get_gguf_hf_weights_map maps them:
    the name without its suffix through gguf's name map, the suffix put back (None: unmapped)."""
    import gguf

    arch = next(k for k, v in gguf.MODEL_ARCH_NAMES.items() if v == gguf_arch)
    name_map = gguf.get_tensor_name_map(arch, n_layers)
    out = {}
    for hf in hf_names:
        base, suffix = hf.rsplit(".", 1) if hf.endswith((".weight", ".bias")) else (hf, "")
        g = name_map.get_name(base)
        if g is not None:
            out[hf] = g + ("." + suffix if suffix else "")
    return out


def open_gguf(path: str | Path, arch: ArchSpec, hf_cfg, keep_blocks: bool) -> GgufWeights:
    """The target's tensors in a GGUF by HF name (the writer's StreamedWeights), checked against what
    the graphs read: a CheckpointError says why the file does not stream. keep_blocks: the int4
    precision keeps the file's quantized blocks where they map exactly (--gguf-blocks keep)."""
    from edgespec.export.target.sources.safetensors import expected_tensors

    h = read_header(path)
    mt = GGUF_STREAMED.get(h.architecture)
    if mt is None:
        raise CheckpointError(
            f"GGUF architecture {h.architecture!r} is not streamed yet ({', '.join(GGUF_STREAMED)} are)"
        )
    if getattr(hf_cfg, "model_type", None) != mt:
        raise CheckpointError(f"transformers reads this {h.architecture} GGUF as {hf_cfg.model_type!r}, not {mt!r}")
    want = expected_tensors(arch)
    names = gguf_names(h.architecture, arch.n_layers, want)
    table = {t.name: t for t in h.tensors}
    heads = _permuted_heads(h)
    entries = {}
    for hf, shape in want.items():
        t = table.get(names.get(hf, ""))
        if t is None:
            raise CheckpointError(f"the GGUF has no tensor for {hf} ({names.get(hf, 'no GGUF name')})")
        entries[hf] = _entry(path, h, t, shape, heads)
    read = {e.gguf_name for e in entries.values()}
    extra = [t.name for t in h.tensors if t.name not in read and t.name not in IGNORED]
    if extra:  # the loader would drop them: a file of another layout than the config says
        raise CheckpointError(f"the GGUF holds {len(extra)} tensors the graphs do not read ({', '.join(extra[:3])})")
    aliases = {"lm_head.weight": "model.embed_tokens.weight"} if arch.tie_word_embeddings else {}
    return GgufWeights(entries, aliases, keep_blocks)


def _permuted_heads(h) -> dict[str, int]:
    """GGUF name part -> heads its rows are permuted over (llama's q and k: the loader's processor
    reads the head counts from the header's config); {} for other architectures."""
    if h.architecture != "llama":
        return {}
    for key in ("attention.head_count", "attention.head_count_kv"):
        v = h.arch_value(key)
        if not isinstance(v, int) or v <= 0:
            raise CheckpointError(f"{h.architecture}.{key} is {v!r}: the q/k row order is not known")
    return {".attn_q.": h.arch_value("attention.head_count"), ".attn_k.": h.arch_value("attention.head_count_kv")}


def _entry(path, h, t, shape: tuple[int, ...], heads: dict[str, int]) -> GgufEntry:
    """Where tensor t of the GGUF (header h) is read from, checked: a type read, the shape the
    config implies, whole blocks per row, rows that un-permute over their heads."""
    import gguf

    try:
        type_name = gguf.GGMLQuantizationType(t.type_id).name
    except ValueError:
        type_name = f"type {t.type_id}"
    if type_name not in TYPES:
        raise CheckpointError(
            f"{t.name} is {type_name}, a type the streaming export does not read ({', '.join(TYPES)})"
        )
    if tuple(reversed(t.dims)) != shape:
        raise CheckpointError(f"{t.name} is {list(reversed(t.dims))}; the config implies {list(shape)}")
    per_block, type_size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[type_name]]
    if shape[-1] % per_block:
        raise CheckpointError(f"{t.name}: rows of {shape[-1]} do not fill {type_name} blocks of {per_block}")
    n_heads = next((n for key, n in heads.items() if key in t.name), 0)
    if n_heads and (len(shape) != 2 or shape[0] % (2 * n_heads)):
        raise CheckpointError(f"{t.name}: {shape} cannot be un-permuted over {n_heads} heads")
    return GgufEntry(
        file=Path(path),
        gguf_name=t.name,
        type_name=type_name,
        shape=shape,
        start=h.data_offset + t.offset,
        row_bytes=shape[-1] // per_block * type_size,
        heads=n_heads,
        minus_one=h.architecture == "gemma3" and "norm.weight" in t.name,
    )


class GgufWeights(StreamedWeights):
    """A GGUF's tensors by HF name, each read (dequantized as transformers' loader gives it) when
    asked for; `part` says what a linear keeps of each tensor's quantized blocks."""

    def __init__(self, entries: dict[str, GgufEntry], aliases: dict[str, str], keep_blocks: bool) -> None:
        super().__init__(entries, aliases)
        self.keep_blocks = keep_blocks  # int4 with --gguf-blocks keep: blocks kept where they map exactly

    def read(self, entry: GgufEntry, rows: np.ndarray | None = None) -> ReadWeight:
        return read_gguf(entry, rows)

    def part(self, hf_name: str, n_rows: int, w: np.ndarray, decode_blocks: bool, rows=None) -> Part:
        """The linears.Part of one tensor among a linear's rows: its GGUF type, and its blocks where
        they are kept (decoded only when decode_blocks: a quantized linear) or why not, as
        sources/transformers.read_blocks decides (their dequantization must be `w`, the float32 rows the
        writer holds, bitwise). rows: only these rows of the tensor (the sampled model's vocabulary)."""
        e = self.entries[self.source(hf_name)]
        t = e.type_name
        if t in FLOATS or len(e.shape) != 2:
            return Part(hf_name, n_rows, t)
        if not self.keep_blocks:
            return Part(hf_name, n_rows, t, None, "--gguf-blocks requantize")
        if t not in DECODERS:
            return Part(hf_name, n_rows, t, None, f"{t} has no exact MatMulNBits form")
        if not decode_blocks:  # a float linear: the blocks would not be asked for (Linears.keep)
            return Part(hf_name, n_rows, t)
        b = read_blocks(e, rows)
        step = max(1, CHUNK_BYTES // (4 * e.shape[1]))
        for r0 in range(0, n_rows, step):
            if not np.array_equal(b.rows(r0, r0 + step).dequantized(), w[r0 : r0 + step]):
                why = "its blocks do not dequantize to the loaded weight (name or row order mapping)"
                return Part(hf_name, n_rows, t, None, why)
        return Part(hf_name, n_rows, t, b)


def _row_order(e: GgufEntry, rows: np.ndarray | None) -> np.ndarray:
    """The file rows that give the loaded tensor's rows `rows` (all when None), in that order."""
    n = e.shape[0] if len(e.shape) == 2 else 1
    order = np.arange(n, dtype=np.int64)
    if e.heads:  # transformers: w.reshape(heads, dim, 2, K).swapaxes(2, 1).reshape(w.shape)
        order = order.reshape(e.heads, n // e.heads // 2, 2).swapaxes(2, 1).reshape(-1)
    return order if rows is None else order[np.asarray(rows, np.int64)]


def _raw_rows(fh, e: GgufEntry, file_rows: np.ndarray) -> np.ndarray:
    """These rows' bytes [len(file_rows), row_bytes] uint8, runs of consecutive rows read at once."""
    out = np.empty((len(file_rows), e.row_bytes), np.uint8)
    cut = np.flatnonzero(np.diff(file_rows) != 1) + 1
    at = 0
    for run in np.split(file_rows, cut):
        if len(run):
            fh.seek(e.start + int(run[0]) * e.row_bytes)
            _read_exactly(fh, memoryview(out[at : at + len(run)].reshape(-1)), e.file)
            at += len(run)
    return out


def read_gguf(e: GgufEntry, rows: np.ndarray | None = None) -> ReadWeight:
    """One tensor (or those rows) as transformers' GGUF loader gives it, float32, dequantized in row
    pieces of about CHUNK_BYTES (gguf dequantizes block by block: a piece is the whole's rows)."""
    import gguf

    if len(e.shape) == 1 and rows is not None:  # elements of a 1-D tensor (a norm): read whole
        return read_gguf(e)[np.asarray(rows, np.int64)].view(ReadWeight)
    qtype = gguf.GGMLQuantizationType[e.type_name]
    order = _row_order(e, rows)
    k = e.shape[-1]
    out = np.empty((len(order), k), np.float32)
    step = max(1, CHUNK_BYTES // (4 * k))
    with open(e.file, "rb", buffering=0) as fh:
        for i in range(0, len(order), step):
            raw = _raw_rows(fh, e, order[i : i + step])
            out[i : i + len(raw)] = gguf.quants.dequantize(raw, qtype)
    if e.minus_one:  # transformers' Gemma processor: weights - 1, in float32
        np.subtract(out, np.float32(1), out=out)
    out = out.reshape(e.shape if rows is None else (len(order), *e.shape[1:])).view(ReadWeight)
    out.flags.writeable = False
    return out


def read_blocks(e: GgufEntry, rows: np.ndarray | None = None) -> Blocks:
    """A quantized 2-D tensor's blocks (quant/blocks.Blocks) in the loaded tensor's row order,
    decoded in row pieces (a GGUF block lies within a row: a piece decodes to the whole's rows)."""
    order = _row_order(e, rows)
    step = max(1, CHUNK_BYTES // max(1, e.row_bytes))
    with open(e.file, "rb", buffering=0) as fh:
        first = decode(_raw_rows(fh, e, order[:step]), e.type_name)
        n, k, nb = len(order), e.shape[1], first.scales.shape[1]
        codes, scales = np.empty((n, k), np.uint8), np.empty((n, nb), np.float32)
        zp = np.empty((n, nb), np.uint8)
        mins = None if first.mins is None else np.empty((n, nb), np.float32)
        subs = []  # a K-quant's sub-scale codes, per piece
        for i in range(0, n, step):
            b = first if i == 0 else decode(_raw_rows(fh, e, order[i : i + step]), e.type_name)
            codes[i : i + len(b.codes)], scales[i : i + len(b.codes)] = b.codes, b.scales
            zp[i : i + len(b.codes)] = b.zero_points
            if mins is not None:
                mins[i : i + len(b.codes)] = b.mins
            subs.append(b.sub)
    sub = None if any(s is None for s in subs) else SubScales.concat(subs)
    return Blocks(codes, scales, zp, mins, first.bits, first.block_size, e.type_name, sub)
