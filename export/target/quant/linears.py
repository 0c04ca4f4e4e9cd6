"""How a graph stores and multiplies its linear layers: the one op choice every model shares.

`Linears` is the strategy a layer flavour (layer_ops.LayerOps) holds: it turns a weight [out, in]
into the arrays of the model's weights file when the writer prepares it (`store`), and writes the
op that multiplies by them (`linear`). Precision decides the op: float MatMul on the transposed
weight, the embedding table itself for a tied LM head (Gemm transB), or ONNX Runtime's
MatMulNBits on 4- or 8-bit blocks. Another linear (integer weights and activations, say) is a
subclass a flavour names as its LINEARS; the model declarations do not change.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import ml_dtypes
import numpy as np
from onnx import TensorProto

from edgespec.export.target.quant.blocks import Blocks, concat, from_int4
from edgespec.export.target.quant.quantize import quantize_int4, quantize_int8

if TYPE_CHECKING:
    from edgespec.export.target.graph.builder import GraphBuilder, GraphOptions
    from edgespec.export.target.graph.store import WeightStore


@dataclass(frozen=True)
class Part:
    """One checkpoint weight among the rows of a stored linear (q, k and v of a packed qkv)."""

    hf_name: str  # the model's parameter name
    rows: int  # its output rows
    source: str  # the checkpoint's type: a GGUF type ("Q4_1", "F16"), or "float" (an HF checkpoint)
    blocks: Blocks | None = None  # its quantized blocks where they map exactly (quant/blocks.py); None: a float
    why: str = ""  # a quantized weight without blocks: why (GgufWeights.not_kept)


@dataclass(frozen=True)
class Origin:
    """What a stored linear keeps of one checkpoint weight (the export's report and the manifest)."""

    hf_name: str  # the model's parameter name
    source: str  # the checkpoint's type (Part.source)
    stored: str  # what the graph multiplies by: "int4 codes + block mins", "int8 codes", "int4 (re-quantized)", ...
    exact: bool  # the graph multiplies by the checkpoint's values exactly (its blocks kept, or fp32)
    why: str = ""  # a quantized weight re-quantized: why its blocks were not kept


@dataclass(frozen=True)
class Layout:
    """The MatMulNBits layout of a linear stored from kept blocks (quant/blocks.Blocks)."""

    bits: int  # 4 or 8
    block_size: int  # inputs per block (32; 16 for K-quant sub-blocks)
    mins: bool  # a block-minimum term: + (block sums of x) @ mins, a second matmul 1/block_size the size


class Linears:
    """Float or MatMulNBits linears of one model, stored in its WeightStore."""

    def __init__(self, opts: GraphOptions, dtype: np.dtype, store: WeightStore) -> None:
        self.opts = opts
        self.dtype = dtype
        self.store = store
        self.shapes: dict[str, tuple[int, int]] = {}  # name -> (n_out, n_in) of each stored linear
        self.tied: set[str] = set()  # linears computed on the embedding table (a tied LM head)
        self.layouts: dict[str, Layout] = {}  # linears stored from a checkpoint's own blocks
        self.origins: list[Origin] = []  # per checkpoint weight of every stored linear, in order
        self.embed_from_head = False  # the embedding's rows are read from the tied LM head's stored blocks
        #                               (store_embedding found them bitwise the table's): no "embed" array
        self.embed_dtype: np.dtype | None = None  # "embed" stored in this dtype, cast to the graph's at lookup
        #                                           (fp16, else bf16, where every value is one); None: the graph's
        self.f16: set[str] = set()  # kept-block arrays ("<linear>.scales", "<linear>.mins") stored as fp16
        #                             (every value exactly one: a GGUF's own d, m) and cast to fp32 in the graph

    def bits(self, name: str) -> int:
        """Weight bits of a linear layer in MatMulNBits, 0 = float. int4 precision: 4 for every
        layer; the LM head (it decides every token; on SmolLM2-135M an int4 one made greedy output
        loop) 8 bits — decode streams it whole every token (in fp32 it was 113 of the default
        model's 180 MB per step) and the default GGUF stores it as Q8_0 anyway — unless
        int4_lm_head (4) or not int8_lm_head (float). 8 bits only with int8 activations: ORT's
        8-bit kernel with fp32 activations was 100x slower here. A checkpoint's own blocks kept
        (keep) store their own width."""
        if self.opts.precision != "int4":
            return 0
        if name != "lm_head" or self.opts.int4_lm_head:
            return 4
        return 8 if self.opts.int8_lm_head and self.opts.int4_accuracy_level == 4 else 0

    def keep(self, name: str, part: Part) -> tuple[Blocks | None, str]:
        """(the part's blocks if the graph keeps them, else None; why not). Kept: whatever their
        width, where the linear is a MatMulNBits one; 8-bit blocks need int8 activations (the
        8-bit kernel with fp32 ones was 100x slower), and an LM head asked for in int4 gets int4."""
        b = part.blocks
        if b is None or not self.bits(name):
            return None, part.why if self.bits(name) else ""
        if b.bits == 8 and self.opts.int4_accuracy_level != 4:
            return None, "8-bit blocks need --int4-accuracy-level 4"
        if b.bits == 8 and name == "lm_head" and self.opts.int4_lm_head:
            return None, "--int4-lm-head"
        return b, ""

    def store_linear(
        self, name: str, w_out_in: np.ndarray, tied: bool = False, parts: tuple[Part, ...] = ()
    ) -> np.ndarray:
        """Store one linear layer [out, in]; returns the weights the graph really multiplies by
        (int4: dequantized), [out, in]. tied: the layer is the embedding table (stored as "embed").
        parts: the checkpoint weights its rows hold, in order; where a part's quantized blocks can
        be kept (keep) the layer stores them exactly and re-quantizes only the other parts."""
        self.shapes[name] = w_out_in.shape
        parts = parts or (Part(name, w_out_in.shape[0], "float"),)
        bits = self.bits(name)
        kept = [self.keep(name, p) for p in parts]
        if any(b is not None for b, _ in kept):
            return self._store_kept(name, w_out_in, parts, kept)
        self.record(parts, kept, bits)
        if bits:
            codes, scales, zero_points, used = (quantize_int8 if bits == 8 else quantize_int4)(
                w_out_in, self.opts.int4_block_size
            )
            self._store_quantized(name, bits, codes, scales, zero_points)
            return used
        if tied:
            self.tied.add(name)
            return w_out_in.astype(self.dtype)  # Gemm(transB=1) on the embedding table itself
        self.store.add(name, np.ascontiguousarray(w_out_in.T).astype(self.dtype))  # [in, out]
        return w_out_in.astype(self.dtype)

    def store_embedding(
        self, table: np.ndarray, tied: bool, blocks: Callable[[np.ndarray], Blocks | None] | None = None
    ) -> Origin:
        """Store the embedding table [V, H] as compactly as is exact, and say how (its Origin, also
        recorded): read from the tied LM head's stored blocks where those dequantize bitwise to it
        (nothing stored: the head's bytes serve both), else from the checkpoint's own blocks of the
        table (blocks(table): read when asked for; None where the checkpoint has none) where the linears
        can read their rows bitwise (store_embedding_blocks: the row kernel's), else "embed" in fp16
        where every value is an fp16 (a GGUF's F16 table), else in bf16 where every value is a bf16
        (an HF checkpoint's BF16 table: Llama 3.2, Gemma 3) — either cast to fp32 at lookup,
        exactly — else in the graph's dtype."""
        src = next((o.source for o in self.origins if o.hf_name == "lm_head.weight"), "float") if tied else "float"
        if tied and "lm_head" not in self.tied and self.head_rows_match(table):
            self.embed_from_head = True
            origin = Origin(EMBED, src, f"the tied LM head's {self.head_stored()} (rows read at lookup)", True)
        elif (
            blocks is not None
            and self.reads_embedding_blocks()
            and (own := blocks(table)) is not None
            and (stored := self.store_embedding_blocks(table, own))
        ):
            origin = Origin(EMBED, own.source, f"{stored} (rows read at lookup)", True)
        elif self.dtype == np.float32 and (narrow := _narrowest(table)) is not None:
            self.embed_dtype, stored = narrow
            self.store.add("embed", table.astype(self.embed_dtype))
            origin = Origin(EMBED, src, stored, True)
        else:
            self.store.add("embed", table.astype(self.dtype))
            origin = Origin(EMBED, src, self.dtype.name.replace("float", "fp"), self.dtype == np.float32)
        self.origins.append(origin)
        return origin

    def reads_embedding_blocks(self) -> bool:
        """The lookup can read rows of the checkpoint's own blocks of the table: not MatMulNBits
        linears (their blocks have no row gather but the 8-bit head's; such a table stays floats)."""
        return False

    def store_embedding_blocks(self, table: np.ndarray, b: Blocks) -> str:
        """Store the table as its checkpoint's blocks `b` where the lookup's rows are bitwise the
        table's; returns how they are stored ("" where they are not)."""
        return ""

    def head_stored(self) -> str:
        """How the LM head is stored (the embedding's Origin when it reads the head)."""
        layout = self.layouts.get("lm_head")
        return f"int{layout.bits if layout else self.bits('lm_head')} codes"

    def head_rows_match(self, table: np.ndarray) -> bool:
        """The LM head is stored as 8-bit MatMulNBits blocks without minimums whose rows, computed as
        embed_rows computes them ((code - zero point) * scale in fp32), are bitwise the table's."""
        layout = self.layouts.get("lm_head") or Layout(self.bits("lm_head"), self.opts.int4_block_size, False)
        if layout.bits != 8 or layout.mins or "lm_head.q8" not in self.store.arrays:
            return False
        codes = np.asarray(self.store.arrays["lm_head.q8"])  # [N, nb, bs]
        n, nb, bs = codes.shape
        if (n, nb * bs) != table.shape:
            return False
        scales = np.asarray(self.store.arrays["lm_head.scales"]).reshape(n, nb).astype(np.float32)
        zp = np.asarray(self.store.arrays["lm_head.zp"]).reshape(n, nb).astype(np.float32)
        step = max(1, (1 << 24) // (4 * nb * bs))
        for r0 in range(0, n, step):
            rows = (codes[r0 : r0 + step].astype(np.float32) - zp[r0 : r0 + step, :, None]) * scales[
                r0 : r0 + step, :, None
            ]
            if not np.array_equal(rows.reshape(len(rows), -1), table[r0 : r0 + step]):
                return False
        return True

    def embed_rows(self, b: GraphBuilder, ids: str, rank: int, name: str = "/embed") -> str:
        """The embedding rows of the token ids `ids` (a tensor of `rank` dims) -> [*ids, H] in the
        graph's dtype: a Gather of "embed" (cast where stored narrower), or of the tied LM head's
        blocks (head_rows)."""
        if self.embed_from_head:
            return self.head_rows(b, ids, rank, name)
        x = b.op("Gather", [b.weight("embed"), ids], f"{name}/Gather", axis=0)
        if self.embed_dtype is not None:
            x = b.op("Cast", [x], f"{name}/Cast", to=_ONNX[self.dtype])
        return x

    def head_rows(self, b: GraphBuilder, ids: str, rank: int, name: str = "/embed") -> str:
        """Rows of the 8-bit MatMulNBits LM head as floats: (code - zero point) * scale, gathered by id."""
        n, k = self.shapes["lm_head"]
        layout = self.layouts.get("lm_head") or Layout(8, self.opts.int4_block_size, False)
        nb = k // layout.block_size
        per_block = b.const("embed_blocks_shape", np.array([n, nb, 1], np.int64))
        codes = b.op("Gather", [b.weight("lm_head.q8"), ids], f"{name}/codes", axis=0)  # [*ids, nb, bs] u8
        zp = b.op("Reshape", [b.weight("lm_head.zp"), per_block], f"{name}/zp_blocks")
        zp = b.op("Cast", [b.op("Gather", [zp, ids], f"{name}/zp", axis=0)], f"{name}/zp_f", to=TensorProto.FLOAT)
        zp = b.op("Neg", [zp], f"{name}/minus_zp")  # c - z as c + (-z): the same bits, and no Sub
        sc = b.op("Reshape", [self.scales_input(b, "lm_head", gather=True), per_block], f"{name}/scale_blocks")
        sc = b.op("Gather", [sc, ids], f"{name}/scales", axis=0)
        if "lm_head.scales" in self.f16:
            sc = b.op("Cast", [sc], f"{name}/scales_f", to=TensorProto.FLOAT)
        q = b.op("Add", [b.op("Cast", [codes], f"{name}/codes_f", to=TensorProto.FLOAT), zp], f"{name}/centred")
        rows = b.op("Mul", [q, sc], f"{name}/rows")  # [*ids, nb, bs]
        return b.op(
            "Reshape",
            [rows, b.const(f"embed_rows_shape{rank}", np.array([0] * rank + [k], np.int64))],
            f"{name}/Reshape",
        )

    def scales_input(self, b: GraphBuilder, name: str, what: str = "scales", gather: bool = False) -> str:
        """A kept linear's scales (or mins) as the graph reads them: fp32 (cast once from their fp16
        storage: ONNX Runtime folds the Cast of an initializer at load). gather: as stored (a
        Gather of a few rows casts only those)."""
        w = b.weight(f"{name}.{what}")
        if gather or f"{name}.{what}" not in self.f16:
            return w
        return b.op("Cast", [w], f"{name}/{what}_f32", to=TensorProto.FLOAT)

    def record(self, parts: tuple[Part, ...], kept, bits: int) -> None:
        """The origins of a linear none of whose parts' blocks are kept: re-quantized to `bits`, or
        floats in the graph's dtype (bits 0)."""
        stored = f"int{bits} (re-quantized)" if bits else self.dtype.name.replace("float", "fp")
        exact = not bits and self.dtype == np.float32  # fp32 holds any checkpoint's values (dequantized) exactly
        self.origins += [
            Origin(p.hf_name, p.source, stored, exact, why) for p, (_, why) in zip(parts, kept, strict=True)
        ]

    def _store_kept(self, name: str, w: np.ndarray, parts, kept) -> np.ndarray:
        """A linear whose parts' blocks are kept (the others re-quantized to int4 beside them)."""
        b = self.kept_blocks(name, w, parts, kept)
        self._store_blocks(name, b)
        self.layouts[name] = Layout(b.bits, b.block_size, b.mins is not None)
        return b.dequantized()

    def kept_blocks(self, name: str, w: np.ndarray, parts, kept) -> Blocks:
        """The blocks of a linear some of whose parts' blocks are kept: theirs, and the other parts
        re-quantized to int4, concatenated (concat); each part's origin recorded."""
        bs = self.opts.int4_block_size
        if sum(p.rows for p in parts) != len(w):
            raise ValueError(f"{name}: its parts hold {sum(p.rows for p in parts)} rows, the weight {len(w)}")
        blocks, row, kept_at = [], 0, []
        for p, (b, why) in zip(parts, kept, strict=True):
            if b is None:
                b = from_int4(*quantize_int4(w[row : row + p.rows], bs)[:3], bs)
                self.origins.append(Origin(p.hf_name, p.source, "int4 (re-quantized)", False, why))
            else:
                kept_at.append(len(self.origins))
                self.origins.append(Origin(p.hf_name, p.source, "", True))
            blocks.append(b)
            row += p.rows
        out = concat(blocks)
        for i in kept_at:  # what the stored linear keeps of them (its layout: the parts' widest)
            self.origins[i] = replace(self.origins[i], stored=self.kept_stored(out))
        if self.dtype == np.float32:  # exactly fp16 (a GGUF's own d and m): stored so, cast in the graph
            for what, a in (("scales", out.scales), ("mins", out.mins)):
                if a is not None and _exactly(a, np.float16):
                    self.f16.add(f"{name}.{what}")
        return out

    def kept_stored(self, b: Blocks) -> str:
        """How a linear of kept blocks is stored (its Origin): "int4 codes + block mins", ..."""
        mins = " + block mins" if b.mins is not None else ""
        size = f", blocks of {b.block_size}" if b.block_size != 32 else ""
        return f"int{b.bits} codes{mins}{size}"

    def _store_quantized(self, name: str, bits: int, codes, scales, zero_points) -> None:
        """A linear re-quantized by quant.quantize_int4 / quantize_int8 (their MatMulNBits layout)."""
        self.store.add(f"{name}.q{bits}", codes)
        self.store.add(name + ".scales", scales)
        self.store.add(name + ".zp", zero_points)

    def _store_blocks(self, name: str, b: Blocks) -> None:
        """A linear of kept blocks: MatMulNBits' arrays, and the block-minimum matmul's where it has them."""
        codes, zero_points = b.packed()

        def stored(what: str, a: np.ndarray) -> np.ndarray:
            return a.astype(np.float16) if f"{name}.{what}" in self.f16 else a

        self.store.add(f"{name}.q{b.bits}", codes)
        self.store.add(name + ".scales", stored("scales", b.scales))
        self.store.add(name + ".zp", zero_points)
        if b.mins is not None:
            self.store.add(name + ".mins", stored("mins", np.ascontiguousarray(b.mins.T)))  # [K/bs, N]
            n_in = b.codes.shape[1]
            ones = np.kron(np.eye(n_in // b.block_size, dtype=np.float32), np.ones((b.block_size, 1), np.float32))
            self.store.add(self._sum_weight(n_in, b.block_size), ones)  # [K, K/bs]: x @ it = block sums

    @staticmethod
    def _sum_weight(n_in: int, block_size: int) -> str:
        return f"block_sums_{n_in}x{block_size}"

    def linear(self, b: GraphBuilder, x: str, name: str, stream_3d: bool = False) -> str:
        """x [.., in] times the stored layer `name` -> [.., out]. stream_3d: x is [1, T, in] (Gemm
        takes 2-D rows)."""
        n_out, n_in = self.shapes[name]
        layout = self.layouts.get(name) or Layout(self.bits(name), self.opts.int4_block_size, False)
        if layout.bits:
            y = b.op(
                "MatMulNBits",
                [x, b.weight(f"{name}.q{layout.bits}"), self.scales_input(b, name), b.weight(name + ".zp")],
                name + "/MatMulNBits",
                domain="com.microsoft",
                K=n_in,
                N=n_out,
                bits=layout.bits,
                block_size=layout.block_size,
                accuracy_level=self.opts.int4_accuracy_level,
            )
            if not layout.mins:
                return y
            # + m * (sum of the block's inputs): the block sums once per input, then [.., K/bs] @ [K/bs, N].
            # Both MatMuls have a constant B, which ORT prepacks: a row's bits do not depend on the call's
            # rows (the rule), and the Add is elementwise.
            key = ("block_sums", x, layout.block_size)  # once per input of this graph
            if key not in b.memo:
                ones = b.weight(self._sum_weight(n_in, layout.block_size))
                b.memo[key] = b.op("MatMul", [x, ones], f"{name}/block_sums")
            mins = b.op("MatMul", [b.memo[key], self.scales_input(b, name, "mins")], f"{name}/block_mins")
            return b.op("Add", [y, mins], f"{name}/plus_mins")
        if name in self.tied:
            if stream_3d:
                x = b.op("Reshape", [x, b.const("shape_hidden_rows", np.array([-1, n_in], np.int64))], f"{name}/rows")
            table = b.weight("embed")
            if self.embed_dtype is not None:  # stored fp16 / bf16: the Gemm reads it cast (folded at load)
                table = b.op("Cast", [table], "/embed/table_f32", to=_ONNX[self.dtype])
            return b.op("Gemm", [x, table], f"{name}/Gemm", transB=1)
        return b.op("MatMul", [x, b.weight(name)], name + "/MatMul")


EMBED = "model.embed_tokens.weight"  # the embedding table's parameter name (its Origin)
_ONNX = {np.dtype(np.float32): TensorProto.FLOAT, np.dtype(np.float16): TensorProto.FLOAT16}
_ONNX[np.dtype(ml_dtypes.bfloat16)] = TensorProto.BFLOAT16
# the dtypes an fp32 graph's embedding is stored in where every value is exactly one, tried in turn
# (a table exact in both stays fp16: an F16 checkpoint's); each is cast to fp32 at lookup, exactly
NARROW_EMBED = (
    (np.dtype(np.float16), "fp16 (every value exactly an fp16; fp32 at lookup)"),
    (np.dtype(ml_dtypes.bfloat16), "bf16 (every value exactly a bf16; fp32 at lookup)"),
)


def _narrowest(table: np.ndarray) -> tuple[np.dtype, str] | None:
    """(dtype, Origin.stored) of the first of NARROW_EMBED holding every value of the fp32 table exactly."""
    return next(((d, stored) for d, stored in NARROW_EMBED if _exactly(table, d)), None)


def _exactly(a: np.ndarray, dtype) -> bool:
    """Every value of the float32 array `a` is exactly one of `dtype` (compared in row blocks)."""
    a = np.asarray(a)
    flat = a.reshape(len(a), -1) if a.ndim > 1 else a.reshape(1, -1)
    step = max(1, (1 << 24) // max(1, 4 * flat.shape[1]))
    with np.errstate(over="ignore"):
        return all(
            np.array_equal(flat[r : r + step].astype(dtype).astype(np.float32), flat[r : r + step], equal_nan=True)
            for r in range(0, len(flat), step)
        )
