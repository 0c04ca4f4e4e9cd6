"""The row kernel's linears (--int4-kernel rowop: engines/rowop): 4/8-bit blocks x int8 rows,
packed in the kernel's layout."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from edgespec.export.target.quant.blocks import Blocks, from_int4
from edgespec.export.target.quant.linears import Linears

if TYPE_CHECKING:
    from edgespec.export.target.graph.builder import GraphBuilder, GraphOptions
    from edgespec.export.target.graph.store import WeightStore


class RowLinears(Linears):
    """int4 linears (8-bit where the layout has 8-bit blocks: the LM head, Q8_0 / Q5_x / Q6_K files)
    as edgespec's row kernel (engines/rowop: the op RowMatMul in its own domain, built on this
    machine): the blocks MatMulNBits would hold, kept or re-quantized alike, packed once at export
    in the kernel's layout, times activations quantized to int8 per row and per block with exact
    int32 sums. A block minimum is part of the kernel (no second matmul), and every factor of a
    row's result depends on that row alone: decode, verify and prefill rows agree by arithmetic,
    on every instruction-set path. Chosen by --int4-kernel rowop or by --precision auto's probe;
    GraphOptions.int4_kernel names it."""

    def __init__(self, opts: GraphOptions, dtype: np.dtype, store: WeightStore) -> None:
        super().__init__(opts, dtype, store)
        self.attrs: dict[str, dict] = {}  # name -> the op's attributes of each packed linear
        self.deferred: list[Blocks] | None = None  # a list: blocks are collected here instead of packed
        #                                            (the streaming export packs a linear's row blocks
        #                                            with the whole matrix's choices: graph/streaming.py)

    def _store_quantized(self, name: str, bits: int, codes, scales, zero_points) -> None:
        n, bs = len(scales), self.opts.int4_block_size
        if bits == 4:
            b = from_int4(codes, scales, zero_points, bs)
        else:  # quant.quantize_int8: codes + 128, zero point 128
            b = Blocks(codes.reshape(n, -1), scales, zero_points.reshape(n, -1), None, 8, bs, "int8")
        self._store_blocks(name, b)

    def _store_blocks(self, name: str, b: Blocks) -> None:
        from edgespec.engines import rowop

        if self.deferred is not None:
            self.deferred.append(b)
            return
        p = rowop.pack(b.codes, b.scales, b.zero_points, b.mins, b.bits, b.block_size, sub=b.sub)
        self.store.add(name + rowop.WEIGHT_SUFFIX, p.data)
        self.attrs[name] = p.attrs

    def kept_stored(self, b: Blocks) -> str:
        """As packed: the narrowest code width, a K-quant's sub-scale codes where kept as stored."""
        from edgespec.engines import rowop

        ch = rowop.pack_choices(b.scales, b.zero_points, b.mins, b.bits, b.block_size, int(b.codes.max()), b.sub)
        return _described(b, ch)

    def head_stored(self) -> str:
        a = self.attrs["lm_head"]
        return f"int{a['bits']} codes, packed for the row kernel"

    def head_rows_match(self, table: np.ndarray) -> bool:
        """The packed LM head's rows, as RowGather computes them (rowop.gather_reference), are
        bitwise the table's (compared in row blocks)."""
        from edgespec.engines import rowop

        key = "lm_head" + rowop.WEIGHT_SUFFIX
        if "lm_head" not in self.attrs or key not in self.store.arrays:
            return False
        p = rowop.unpack(np.asarray(self.store.arrays[key]), self.attrs["lm_head"])
        if p.codes.shape != table.shape:
            return False
        step = max(1, (1 << 24) // (4 * table.shape[1]))
        for r0 in range(0, len(table), step):
            ids = np.arange(r0, min(len(table), r0 + step))
            if not np.array_equal(rowop.gather_reference(ids, p), table[r0 : r0 + step]):
                return False
        return True

    def head_rows(self, b: GraphBuilder, ids: str, rank: int, name: str = "/embed", packed: str = "lm_head") -> str:
        """Rows of the packed linear `packed` (the LM head, or the embedding's own blocks) as floats."""
        from edgespec.engines import rowop

        w = b.weight(packed + rowop.WEIGHT_SUFFIX)
        return b.op(rowop.GATHER_TYPE, [ids, w], f"{name}/RowGather", domain=rowop.DOMAIN, **self.attrs[packed])

    def embed_rows(self, b: GraphBuilder, ids: str, rank: int, name: str = "/embed") -> str:
        if "embed" in self.attrs:  # the table's own blocks (store_embedding_blocks)
            return self.head_rows(b, ids, rank, name, "embed")
        return super().embed_rows(b, ids, rank, name)

    def reads_embedding_blocks(self) -> bool:
        return True

    def store_embedding_blocks(self, table: np.ndarray, b: Blocks) -> str:
        """The table's own blocks packed as a linear's ("embed.rowop", its attributes attrs["embed"])
        in row blocks with the whole table's packing choices (as graph/streaming.py packs a linear: the
        pieces concatenate to the whole's bytes), kept where every row RowGather reads
        (rowop.gather_reference of the packed bytes read back) is the table's, bitwise; else
        nothing is stored. Returns how they are stored ("" where not kept)."""
        from edgespec.engines import rowop
        from edgespec.export.target.graph.store import CHUNK_BYTES

        n, k = table.shape
        if b.codes.shape != (n, k) or b.block_size not in (16, 32):
            return ""
        ch = rowop.pack_choices(b.scales, b.zero_points, b.mins, b.bits, b.block_size, int(b.codes.max()), b.sub)
        step = -(-max(1, CHUNK_BYTES // (4 * k)) // rowop.PANEL) * rowop.PANEL  # whole panels
        pieces, attrs = [], {}
        for r0 in range(0, n, step):
            piece = b.rows(r0, r0 + step)
            p = rowop.pack(
                piece.codes, piece.scales, piece.zero_points, piece.mins, b.bits, b.block_size, ch, piece.sub
            )
            back = rowop.unpack(p.data, p.attrs)
            if not np.array_equal(rowop.gather_reference(np.arange(len(piece.codes)), back), table[r0 : r0 + step]):
                return ""
            pieces.append(p.data)
            attrs = p.attrs
        self.store.add("embed" + rowop.WEIGHT_SUFFIX, np.concatenate(pieces))
        self.attrs["embed"] = attrs | {"N": n}
        return _described(b, ch)

    def linear(self, b: GraphBuilder, x: str, name: str, stream_3d: bool = False) -> str:
        from edgespec.engines import rowop

        if name not in self.attrs:  # a float linear (an LM head left in fp32, a tied one)
            return super().linear(b, x, name, stream_3d)
        w = b.weight(name + rowop.WEIGHT_SUFFIX)
        return b.op(rowop.OP_TYPE, [x, w], f"{name}/{rowop.OP_TYPE}", domain=rowop.DOMAIN, **self.attrs[name])


def _described(b: Blocks, ch) -> str:
    """Kept blocks as the row kernel packs them with choices ch (rowop.PackChoices): an Origin's stored."""
    scales = " + sub-scale codes" if ch.sub else ""
    mins = " + block mins" if b.mins is not None else ""
    size = f", blocks of {b.block_size}" if b.block_size != 32 else ""
    return f"int{ch.bits} codes{scales}{mins}{size}"


def linears_class(flavour_linears: type[Linears], opts: GraphOptions) -> type[Linears]:
    """The Linears a graph writer uses: its flavour's, or the row kernel's for int4 linears where
    the options name it (GraphOptions.int4_kernel) and the flavour's are the MatMulNBits ones."""
    rowop = getattr(opts, "int4_kernel", "nbits") == "rowop" and opts.precision == "int4"
    return RowLinears if rowop and flavour_linears is Linears else flavour_linears
