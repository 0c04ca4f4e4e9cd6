"""A streamed target's weights file read back: every float array taken straight from the checkpoint
(embedding, norms, biases, float linears) compared bitwise with the checkpoint tensor."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np

from edgespec.export.target.arch import ArchSpec
from edgespec.export.target.graph.store import CHUNK_BYTES
from edgespec.export.target.graph.streaming import StreamingWriter
from edgespec.export.target.sources.safetensors import StreamedWeights
from edgespec.export.target.spec import ExportError


def float_sources(arch: ArchSpec) -> dict[str, tuple[list[str], float]]:
    """Store name -> (the checkpoint tensors it is, concatenated; the offset added) of the float
    arrays the writer takes straight from the checkpoint (graph.LlamaGraphWriter._prepare)."""
    a, off = arch, arch.norm_weight_offset
    out = {"embed": (["model.embed_tokens.weight"], 0.0), "final_norm": (["model.norm.weight"], off)}
    for i in range(a.n_layers):
        p = f"model.layers.{i}."
        out[f"l{i}.ln1"] = ([p + "input_layernorm.weight"], off)
        if a.sandwich_norms:
            out[f"l{i}.ln2"] = ([p + "pre_feedforward_layernorm.weight"], off)
            out[f"l{i}.post_attn"] = ([p + "post_attention_layernorm.weight"], off)
            out[f"l{i}.post_mlp"] = ([p + "post_feedforward_layernorm.weight"], off)
        else:
            out[f"l{i}.ln2"] = ([p + "post_attention_layernorm.weight"], off)
        if a.qk_norm:
            out[f"l{i}.q_norm"] = ([p + "self_attn.q_norm.weight"], off)
            out[f"l{i}.k_norm"] = ([p + "self_attn.k_norm.weight"], off)
        if a.qkv_bias:
            out[f"l{i}.qkv_b"] = ([p + f"self_attn.{n}_proj.bias" for n in "qkv"], 0.0)
    return out


def check_floats(writer: StreamingWriter, weights: StreamedWeights, path: Path, index: dict[str, dict]) -> int:
    """Every float array taken straight from the checkpoint, read back from the weights file and
    compared bitwise with the checkpoint tensor (+ the norm offset, in the graph's dtype); fp32 and
    fp16 linears too (stored transposed). Returns how many arrays were compared."""
    f = writer.dtype
    checks = {k: (v[0], v[1], False) for k, v in float_sources(writer.arch).items()}
    for name, parts in _float_linears(writer):
        checks[name] = (parts, 0.0, True)
    n = 0
    for name, (sources, off, transposed) in checks.items():
        if name == "embed" and name not in index:  # read from packed blocks (checked bitwise as stored)
            continue
        # the writer's sum and cast (the embedding in fp16 / bf16 where every value is one: Linears.store_embedding)
        cast = np.dtype(index[name]["dtype"]) if name == "embed" else f

        def stored(x: np.ndarray, off=off, cast=cast) -> np.ndarray:
            return (x + np.float32(off) if off else x).astype(cast)

        if len(sources) == 1 and not transposed:  # rows read as compared: the embedding is never whole
            src = sources[0]
            ok = _file_equals(path, index[name], lambda r0, r1, s=src: stored(weights.rows(s, np.arange(r0, r1))))
        else:
            want = stored(np.concatenate([weights[s] for s in sources]) if len(sources) > 1 else weights[sources[0]])
            want = want.T if transposed else want  # [in, out] as stored: compared as a view, not copied
            ok = _file_equals(path, index[name], lambda r0, r1, w=want: w[r0:r1])
        if not ok:
            raise ExportError(f"{name}: the bytes written to {path.name} are not the checkpoint's {sources}")
        n += 1
    return n


def _file_equals(path: Path, e: dict, want_rows) -> bool:
    """The array the index entry e points at in `path` equals the rows want_rows(r0, r1) gives,
    compared in row blocks of about CHUNK_BYTES."""
    shape, dtype = tuple(e["shape"]), np.dtype(e["dtype"])
    row = int(np.prod(shape[1:], dtype=np.int64))
    step = max(1, CHUNK_BYTES // max(1, row * dtype.itemsize))
    for r0 in range(0, shape[0], step):
        r1 = min(shape[0], r0 + step)
        got = np.fromfile(path, dtype, (r1 - r0) * row, offset=e["offset"] + r0 * row * dtype.itemsize)
        want = want_rows(r0, r1)
        if want.dtype != dtype or want.shape != (r1 - r0, *shape[1:]):
            return False
        if not np.array_equal(got.reshape(want.shape), want):
            return False
    return True


def _float_linears(writer: StreamingWriter) -> Iterator[tuple[str, list[str]]]:
    """(store name, checkpoint tensors) of the linears stored as floats [in, out]: fp32 / fp16."""
    yield from writer.float_linears.items()
