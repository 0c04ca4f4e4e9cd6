"""The streaming export of a safetensors target: weights read one tensor at a time, written and
dropped, so the export's memory follows the largest tensor, not the model.

The graph writer is the one every export uses (graph.LlamaGraphWriter: same names, same arrays,
same graph); what changes is where its weights come from and go to. It reads a StreamedWeights
mapping (tensors.py: each tensor read from the checkpoint when asked for) instead of a state dict,
stores into a SpillStore (each array on disk the moment it is stored, the weights file laid out
at the end exactly as weights.write_weights does), and quantizes a MatMulNBits linear in row
blocks (blocks run along a row's inputs, so a row block quantizes to the same bytes as inside the
whole matrix). The folder is byte for byte the one the transformers path writes from the same
checkpoint (tests/test_stream_export.py compares them).

Checks, none of which holds the model: each linear's stored blocks decode to the weights the
writer reports and lie within one quantization step of the checkpoint tensor (per row block, as
written); every float array taken from the checkpoint (embedding, norms, biases, fp32 linears) is
read back from the weights file and compared bitwise with the checkpoint; every array's bytes in
the weights file have the CRC-32 they had when stored. Validation against PyTorch runs on a
sampled model of its first layers (sampled.py).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path

import numpy as np

from edgespec.export.target.arch import ArchSpec
from edgespec.export.target.graph import GraphOptions, LlamaGraphWriter, WeightStore
from edgespec.export.target.linears import IntegerLinears, Linears, Part
from edgespec.export.target.spec import ExportError
from edgespec.export.target.tensors import (
    CHUNK_BYTES,
    DTYPES,
    CheckpointError,
    LazyTensor,
    SpillStore,
    StreamedWeights,
    read_index,
)

FAMILIES = ("llama", "mistral", "qwen2", "qwen3", "gemma3_text")  # model types whose checkpoints stream
IGNORED = ("rotary_emb.inv_freq",)  # checkpoint tensors transformers ignores too (recomputed buffers)


def why_not(cfg, src, shipping: dict, hf_cfg) -> str | None:
    """Why this export cannot stream its target (then it loads the model through transformers), or
    None when it can: a local safetensors folder of a streamed family, no drafter that ships
    models (they read the target's PyTorch model and its whole weights), not a quantized
    checkpoint, not --stream-weights off."""
    if getattr(cfg, "stream_weights", "auto") == "off":
        return "--stream-weights off"
    if src.kind != "hf":
        return f"a {'hub id' if src.kind == 'hub' else 'GGUF'} target (streamed from local safetensors only)"
    if shipping:
        return f"the drafters {', '.join(shipping)} read the target's PyTorch model"
    mt = getattr(hf_cfg, "model_type", None)
    if mt not in FAMILIES:
        return f"model_type {mt!r} is not streamed yet ({', '.join(FAMILIES)} are)"
    if getattr(hf_cfg, "quantization_config", None):
        return "a quantized checkpoint (quantization_config)"
    return None


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


class StreamingWriter(LlamaGraphWriter):
    """LlamaGraphWriter storing into a SpillStore, its MatMulNBits linears quantized in row blocks
    and checked as they are stored. reference: where the weights the graph computes with go
    (reference.IntoModel: into validation's PyTorch model); None: dropped, so the writer holds no
    weights after storing them."""

    def __init__(
        self, arch: ArchSpec, weights: Mapping, opts: GraphOptions, spool: Path, reference: dict | None = None
    ) -> None:
        self.spool = spool  # set before the writer prepares (LlamaGraphWriter.__init__ stores everything)
        self.sink = reference
        super().__init__(arch, weights, opts)

    def _prepare(self, w) -> None:
        self.store = self.linears.store = SpillStore(self.spool)
        if self.sink is not None:
            self.reference = self.sink
        super()._prepare(w)

    def write_weights(self, path: Path) -> dict[str, dict]:
        """The weights file (weights.write_weights' layout) and its index, every array CRC-checked."""
        return self.store.write(path)

    def _linear(self, name: str, w_out_in: np.ndarray, hf_names, tied: bool = False) -> None:
        hf_names = [hf_names] if isinstance(hf_names, str) else list(hf_names)
        w = np.asarray(w_out_in.read() if isinstance(w_out_in, LazyTensor) else w_out_in)  # [N, K]
        parts = tuple(Part(n, 0, "float") for n in hf_names)  # as graph.ModelWriter._linear for a float checkpoint
        lin = self.linears
        bits = lin.bits(name)
        if type(lin) is Linears and bits in (4, 8):  # MatMulNBits: codes, scales, zero points by rows
            layout = {f"{name}.q{bits}": 0, f"{name}.scales": 0, f"{name}.zp": 0}
        elif type(lin) is IntegerLinears:  # int8 weights stored [K, N] (their rows are its columns), scales [N]
            layout = {f"{name}.i8": 1, f"{name}.wscale": 0}
        else:
            layout = {}
        done, used = self._store_rows(name, w, tied, parts, layout, bits) if layout else (False, None)
        if not done:
            used = lin.store_linear(name, w, tied, parts=parts)
            _check_used(name, w, used, bits, self.dtype)
        if self.sink is not None:
            rows = 0
            for n in hf_names:
                k = self._ref_rows(n)
                self.reference[n] = np.asarray(used[rows : rows + k]).astype(np.float32)
                rows += k

    def _store_rows(
        self, name: str, w: np.ndarray, tied: bool, parts, layout: dict[str, int], bits: int
    ) -> tuple[bool, np.ndarray | None]:
        """A quantized linear stored row block by row block (the quantizers work per row or per
        block of a row, so a block's arrays are the whole matrix's rows): layout names each array
        and the axis its rows run along. Axis 0: appended to the spool block by block (peak: one
        block's temporaries); axis 1: filled into one array of the stored size (int8: a byte per
        weight). Each block is checked (_check_blocks, _check_used). (False, None) when the
        linears store other arrays (the caller then stores the linear whole)."""
        lin, store = self.linears, self.store
        if any(n in store.arrays for n in layout):
            return False, None
        n_rows, n_in = w.shape
        step = max(1, CHUNK_BYTES // (4 * n_in))
        n_origins, used, shapes, whole = len(lin.origins), [], {}, {}
        n_first = n_origins  # origins after the first block
        try:
            for r0 in range(0, n_rows, step):
                lin.store = WeightStore()
                u = lin.store_linear(name, w[r0 : r0 + step], tied, parts=parts)
                got = lin.store.arrays
                if set(got) != set(layout):
                    if r0 == 0:  # nothing written yet: store it whole
                        del lin.origins[n_origins:]
                        return False, None
                    raise ExportError(f"{name}: the linears stored {sorted(got)} for a row block, not {sorted(layout)}")
                if r0:  # every block records the same origins: the first block's stand
                    del lin.origins[n_first:]
                else:
                    n_first = len(lin.origins)
                if len(layout) == 3:
                    _check_blocks(name, w[r0 : r0 + step], got, tuple(layout), bits, u, self.opts.int4_block_size)
                else:
                    _check_integer(name, w[r0 : r0 + step], got, tuple(layout), u)
                for n, axis in layout.items():
                    a = got[n]
                    if axis == 0:
                        store.append(n, a)
                        shapes[n] = (shapes.get(n, (0,))[0] + a.shape[0], *a.shape[1:])
                    else:
                        if n not in whole:
                            whole[n] = np.empty((*a.shape[:1], n_rows, *a.shape[2:]), a.dtype)
                        whole[n][:, r0 : r0 + a.shape[1]] = a
                if self.sink is not None:
                    used.append(u)
        finally:
            lin.store = store
        for n in layout:
            if n in whole:
                store.add(n, whole.pop(n))
            else:
                store.finish(n, shapes[n])
        lin.shapes[name] = w.shape
        return True, np.concatenate(used) if used else None


def _check_integer(name, w, got, names, used) -> None:
    """A row block's int8 weights [K, n] and scales [n] give the weights the linears report
    (bitwise) and lie within half a step of the checkpoint rows `w`."""
    q, scale = (got[n] for n in names)
    deq = q.T.astype(np.float32) * scale[:, None]  # [n, K]
    if not np.array_equal(deq, used):
        raise ExportError(f"{name}: its stored int8 rows do not decode to the weights the graph's linears report")
    _check_used(name, w, deq, 8, np.dtype(np.float32))


def _check_blocks(name, w, got, names, bits: int, used, block_size: int) -> None:
    """A row block's stored codes, scales and zero points decode to the weights the linears report
    (`used`, bitwise) and lie within one quantization step of the checkpoint rows `w`."""
    codes, scales, zp = (got[n] for n in names)
    n, nb = scales.shape
    if bits == 4:
        q = np.empty(codes.shape[:-1] + (2 * codes.shape[-1],), np.uint8)  # [n, nb, bs]
        q[..., 0::2], q[..., 1::2] = codes & 15, codes >> 4
        zp2 = zp.reshape(n, -1)
        z = np.empty((n, 2 * zp2.shape[1]), np.uint8)
        z[:, 0::2], z[:, 1::2] = zp2 & 15, zp2 >> 4
        z = z[:, :nb]
    else:
        q, z = codes, zp.reshape(n, nb)
    deq = ((q.astype(np.float32) - z[..., None]) * scales[..., None]).reshape(n, -1)  # [n, K]
    if not np.array_equal(deq, used):
        raise ExportError(f"{name}: its stored blocks do not decode to the weights the graph's linears report")
    err = np.abs(deq - w).reshape(n, nb, block_size).max(axis=-1)  # [n, nb]
    if not np.all(err <= scales * np.float32(1.0001) + np.float32(1e-30)):
        r, b = np.unravel_index(int(np.argmax(err / scales)), err.shape)
        raise ExportError(
            f"{name}: row {r} block {b} is stored {err[r, b]:.3g} from the checkpoint's weights, more than one "
            f"quantization step ({scales[r, b]:.3g}): the tensor written is not the one read"
        )


def _check_used(name: str, w: np.ndarray, used: np.ndarray, bits: int, dtype: np.dtype) -> None:
    """A linear stored whole: the weights the graph computes with against the checkpoint's, within
    the storage's rounding: floats exactly the checkpoint's in the graph's dtype; 8 bits within
    half a step of max|row| / 127; 4 bits within one step of the row's range / 15 (a bound on
    every block's step)."""
    used = np.asarray(used, np.float32)
    if bits == 0:
        ok = np.array_equal(used, w.astype(dtype).astype(np.float32))
    elif bits == 8:
        ok = bool(np.all(np.abs(used - w) <= np.abs(w).max(axis=1, keepdims=True) / 127 * 0.5001 + 1e-30))
    else:
        span = np.maximum(w.max(axis=1, keepdims=True), 0) - np.minimum(w.min(axis=1, keepdims=True), 0)
        ok = bool(np.all(np.abs(used - w) <= span / 15 * 1.0001 + 1e-30))
    if not ok:
        raise ExportError(f"{name}: the weights stored are not the checkpoint's ({bits or dtype} bits)")


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

        def stored(x: np.ndarray, off=off) -> np.ndarray:  # the writer's sum and cast
            return (x + np.float32(off) if off else x).astype(f)

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
    if writer.opts.precision not in ("fp32", "fp16") or type(writer.linears) is not Linears:
        return
    a = writer.arch
    if not a.tie_word_embeddings:
        yield "lm_head", ["lm_head.weight"]
    for i in range(a.n_layers):
        p = f"model.layers.{i}."
        yield f"l{i}.qkv", [p + f"self_attn.{n}_proj.weight" for n in "qkv"]
        yield f"l{i}.o", [p + "self_attn.o_proj.weight"]
        yield f"l{i}.gate_up", [p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight"]
        yield f"l{i}.down", [p + "mlp.down_proj.weight"]
