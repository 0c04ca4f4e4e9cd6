"""The streaming export of a safetensors target: weights read one tensor at a time, written and
dropped, so the export's memory follows the largest tensor, not the model.

The graph writer is the one every export uses (graph.LlamaGraphWriter: same names, same arrays,
same graph); what changes is where its weights come from and go to. It reads a StreamedWeights
mapping (sources/safetensors.py: each tensor read from the checkpoint when asked for) instead of a state dict,
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

from collections.abc import Mapping
from pathlib import Path

import ml_dtypes  # noqa: F401  (numpy reads the index's dtype name "bfloat16": a bf16 embedding)
import numpy as np

from edgespec.export.target.arch import ArchSpec
from edgespec.export.target.graph.builder import GraphOptions
from edgespec.export.target.graph.store import CHUNK_BYTES, SpillStore, WeightStore
from edgespec.export.target.graph.writer import LlamaGraphWriter
from edgespec.export.target.quant.integer_linears import IntegerLinears
from edgespec.export.target.quant.linears import Layout, Linears, Part
from edgespec.export.target.quant.row_linears import RowLinears
from edgespec.export.target.sources.safetensors import LazyTensor
from edgespec.export.target.spec import ExportError


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
        self.float_linears: dict[str, list[str]] = {}  # float linears stored [in, out] -> their checkpoint tensors
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
        lin = self.linears
        bits = lin.bits(name)
        parts = self._parts(hf_names, w, bits)
        kept = [lin.keep(name, p) for p in parts]
        if isinstance(lin, RowLinears) and (bits or any(b is not None for b, _ in kept)):
            used = self._store_packed(name, w, tied, parts, kept)
        elif any(b is not None for b, _ in kept):
            used = self._store_kept(name, w, parts, kept)
        elif type(lin) in (Linears, RowLinears) and not bits:
            used = self._store_float(name, w, parts, kept, hf_names, tied)
        elif type(lin) in (Linears, IntegerLinears) and bits:
            used = self._store_requantized(name, w, tied, parts)
        else:  # linears of another kind: stored whole
            used = lin.store_linear(name, w, tied, parts=parts)
            _check_used(name, w, used, bits, self.dtype)
        if self.sink is not None:
            rows = 0
            for n in hf_names:
                k = self._ref_rows(n)
                self.reference[n] = np.asarray(used[rows : rows + k]).astype(np.float32)
                rows += k

    def _embedding_blocks(self, table: np.ndarray):
        """The embedding's blocks where the checkpoint has them (a GGUF's `part`: decoded, and kept
        only where they dequantize to `table` bitwise), else None."""
        part = getattr(self.checkpoint, "part", None)
        return None if part is None else part("model.embed_tokens.weight", len(table), table, True).blocks

    def _store_requantized(self, name: str, w: np.ndarray, tied: bool, parts) -> np.ndarray | None:
        """A re-quantized linear by row blocks: MatMulNBits codes, scales and zero points (rows
        appended), or the int8 precision's integer weights stored [K, N] (their rows are its
        columns) and scales [N]; each row block checked (_check_blocks, _check_integer)."""
        lin, bits = self.linears, self.linears.bits(name)
        if type(lin) is IntegerLinears:
            layout = {f"{name}.i8": 1, f"{name}.wscale": 0}

            def check(r0, r1, got, u):
                _check_integer(name, w[r0:r1], got, tuple(layout), u)
        else:
            layout = {f"{name}.q{bits}": 0, f"{name}.scales": 0, f"{name}.zp": 0}

            def check(r0, r1, got, u):
                _check_blocks(name, w[r0:r1], got, tuple(layout), bits, u, self.opts.int4_block_size)

        def store_block(r0: int, r1: int) -> np.ndarray:
            return lin.store_linear(name, w[r0:r1], tied, parts=parts)

        return self._spool_rows(name, w.shape, layout, store_block, check)

    def _parts(self, hf_names: list[str], w: np.ndarray, bits: int) -> tuple[Part, ...]:
        """The checkpoint weights among a linear's rows (linears.Part): their GGUF types and kept
        blocks where the checkpoint has a `part` (sources/gguf.GgufWeights), else floats (as
        graph.ModelWriter._linear gives a float checkpoint's)."""
        part = getattr(self.checkpoint, "part", None)
        if part is None:
            return tuple(Part(n, 0, "float") for n in hf_names)
        out, row = [], 0
        for n in hf_names:
            k = self._ref_rows(n) if len(hf_names) > 1 else len(w)
            out.append(part(n, k, w[row : row + k], bits != 0))
            row += k
        return tuple(out)

    def _step(self, n_in: int) -> int:
        """Rows per row block: about CHUNK_BYTES of float32 rows, a whole number of the row kernel's
        panels (its packed row blocks then concatenate to the whole matrix's bytes)."""
        from edgespec.engines.rowop import PANEL

        step = max(1, CHUNK_BYTES // (4 * n_in))
        return -(-step // PANEL) * PANEL

    def _spool_rows(self, name: str, shape, layout: dict[str, int | None], store_block, check) -> np.ndarray | None:
        """A linear stored row block by row block: store_block(r0, r1) stores rows r0:r1 into the
        linears' store (a fresh WeightStore per block) and returns the weights they multiply by;
        check(r0, r1, arrays, used) checks them. layout names each array and the axis its rows run
        along: 0, appended to the spool block by block; 1, filled into one array of the stored size
        (int8 [K, N]: a byte per weight; block minimums [K/bs, N]); None, the same for every block
        (the block-sum matrix), stored once. Every block records the same origins: the first
        block's stand. Returns the used rows, concatenated (only when a reference takes them)."""
        lin, store = self.linears, self.store
        n_rows = shape[0]
        used, shapes, whole = [], {}, {}
        try:
            for r0 in range(0, n_rows, self._step(shape[1])):
                r1 = min(n_rows, r0 + self._step(shape[1]))
                lin.store = WeightStore()
                mark = len(lin.origins)
                u = store_block(r0, r1)
                if r0:
                    del lin.origins[mark:]
                got = lin.store.arrays
                if set(got) != set(layout):
                    raise ExportError(f"{name}: the linears stored {sorted(got)} for a row block, not {sorted(layout)}")
                check(r0, r1, got, u)
                for n, axis in layout.items():
                    a = got[n]
                    if axis is None:
                        store.add(n, a)
                    elif axis == 0:
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
        for n, axis in layout.items():
            if axis == 0:
                store.finish(n, shapes[n])
            elif axis == 1:
                store.add(n, whole.pop(n))
        lin.shapes[name] = tuple(shape)
        return np.concatenate(used) if used else None

    def _store_kept(self, name: str, w: np.ndarray, parts, kept) -> np.ndarray | None:
        """A MatMulNBits linear some of whose parts keep the checkpoint's blocks (the others
        re-quantized beside them: Linears.kept_blocks), stored row block by row block, each block's
        arrays decoded back to the weights the graph multiplies by and checked against the rows
        read (kept parts: bitwise; re-quantized ones: within a step)."""
        lin = self.linears
        b = lin.kept_blocks(name, w, parts, kept)
        lin.layouts[name] = Layout(b.bits, b.block_size, b.mins is not None)
        layout = {f"{name}.q{b.bits}": 0, f"{name}.scales": 0, f"{name}.zp": 0}
        if b.mins is not None:
            layout |= {f"{name}.mins": 1, lin._sum_weight(w.shape[1], b.block_size): None}

        def store_block(r0: int, r1: int) -> np.ndarray:
            sub = b.rows(r0, r1)
            lin._store_blocks(name, sub)
            return sub.dequantized()

        def check(r0, r1, got, u):
            _check_blocks(name, w[r0:r1], got, tuple(layout)[:3], b.bits, u, b.block_size, got.get(f"{name}.mins"))

        return self._spool_rows(name, w.shape, layout, store_block, check)

    def _store_packed(self, name: str, w: np.ndarray, tied: bool, parts, kept) -> np.ndarray | None:
        """A row-kernel linear (linears.RowLinears: 4 or 8 bits, kept or re-quantized blocks)
        packed row block by row block: the blocks of every row block first (re-quantized ones by
        rows, kept ones sliced from the linear's), then the packing's choices for the whole matrix
        (rowop.pack_choices), then each row block packed with them and spooled: the bytes of the
        whole matrix packed at once, each row block read back (rowop.unpack) and checked."""
        from edgespec.engines import rowop

        lin, store = self.linears, self.store
        n_rows, n_in = w.shape
        step = self._step(n_in)
        used, total = [], 0
        keeps = any(b is not None for b, _ in kept)
        if keeps:
            b = lin.kept_blocks(name, w, parts, kept)
            lin.layouts[name] = Layout(b.bits, b.block_size, b.mins is not None)
            pieces = [b.rows(r0, r0 + step) for r0 in range(0, n_rows, step)]
        else:
            pieces = self._requantized_pieces(name, w, tied, parts, step, used)
        ch = _whole_choices(pieces)
        key = name + rowop.WEIGHT_SUFFIX
        for r0, piece in zip(range(0, n_rows, step), pieces, strict=True):
            packed = rowop.pack(
                piece.codes, piece.scales, piece.zero_points, piece.mins, piece.bits, piece.block_size, ch, piece.sub
            )
            back = rowop.unpack(packed.data, packed.attrs)
            same = all(
                (x is None and y is None) or np.array_equal(x, y)
                for x, y in zip(
                    (back.codes, back.scales, back.zero_points, back.mins),
                    (packed.codes, packed.scales, packed.zero_points, packed.mins),
                    strict=True,
                )
            )
            if not same:
                raise ExportError(f"{name}: rows {r0}.. do not read back from the row kernel's layout as packed")
            if keeps:
                u = piece.dequantized()
                _within_a_step(name, w[r0 : r0 + step], u, piece.scales, piece.block_size)
                if self.sink is not None:
                    used.append(u)
            store.append(key, packed.data)
            total += packed.data.nbytes
            attrs = packed.attrs
        store.finish(key, (total,))
        lin.attrs[name] = attrs | {"N": n_rows}
        lin.shapes[name] = w.shape
        return np.concatenate(used) if used else None

    def _requantized_pieces(self, name: str, w: np.ndarray, tied: bool, parts, step: int, used: list) -> list:
        """A linear re-quantized by the row kernel's linears row block by row block, each block's
        weights checked against the checkpoint rows (into `used` where a reference takes them): the
        blocks of every row block, not stored yet (RowLinears.deferred)."""
        lin = self.linears
        lin.deferred = []
        try:
            for r0 in range(0, len(w), step):
                mark = len(lin.origins)
                u = lin.store_linear(name, w[r0 : r0 + step], tied, parts=parts)
                if r0:
                    del lin.origins[mark:]
                _check_used(name, w[r0 : r0 + step], u, lin.bits(name), self.dtype)
                if self.sink is not None:
                    used.append(u)
            return lin.deferred
        finally:
            lin.deferred = None

    def _store_float(self, name: str, w: np.ndarray, parts, kept, hf_names: list[str], tied: bool) -> np.ndarray | None:
        """A float linear (fp32, fp16), stored [in, out] as Linears stores it, appended to the spool
        a block of its input columns at a time (each a block of the stored array's rows): no whole
        transposed copy. check_floats compares the file's bytes with the checkpoint afterwards. A
        tied LM head stores nothing (its Gemm reads the embedding, which check_floats compares)."""
        lin, store = self.linears, self.store
        lin.record(parts, kept, 0)
        lin.shapes[name] = w.shape
        if tied:
            lin.tied.add(name)
            return w.astype(self.dtype) if self.sink is not None else None
        n_out, n_in = w.shape
        step = max(1, CHUNK_BYTES // (4 * n_out))
        for k0 in range(0, n_in, step):
            store.append(name, np.ascontiguousarray(w[:, k0 : k0 + step].T).astype(self.dtype))
        store.finish(name, (n_in, n_out), self.dtype)
        self.float_linears[name] = hf_names
        return w.astype(self.dtype) if self.sink is not None else None


def _whole_choices(pieces: list):
    """The row kernel's packing choices (rowop.pack_choices) for the whole matrix whose row blocks'
    blocks are `pieces`: every row block then packs to the bytes of the whole matrix packed at once."""
    from edgespec.engines import rowop

    subs = [p.sub for p in pieces]
    return rowop.pack_choices(
        np.concatenate([p.scales for p in pieces]),
        np.concatenate([p.zero_points for p in pieces]),
        None if pieces[0].mins is None else np.concatenate([p.mins for p in pieces]),
        pieces[0].bits,
        pieces[0].block_size,
        max(int(p.codes.max(initial=0)) for p in pieces),
        None if any(x is None for x in subs) else rowop.SubScales.concat(subs),
    )


def _check_integer(name, w, got, names, used) -> None:
    """A row block's int8 weights [K, n] and scales [n] give the weights the linears report
    (bitwise) and lie within half a step of the checkpoint rows `w`."""
    q, scale = (got[n] for n in names)
    deq = q.T.astype(np.float32) * scale[:, None]  # [n, K]
    if not np.array_equal(deq, used):
        raise ExportError(f"{name}: its stored int8 rows do not decode to the weights the graph's linears report")
    _check_used(name, w, deq, 8, np.dtype(np.float32))


def _check_blocks(name, w, got, names, bits: int, used, block_size: int, mins=None) -> None:
    """A row block's stored codes, scales and zero points (and block minimums [K/bs, n], kept
    blocks') decode to the weights the linears report (`used`, bitwise) and lie within one
    quantization step of the checkpoint rows `w` (kept blocks: on them)."""
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
    deq = (q.astype(np.float32) - z[..., None]) * scales[..., None]  # [n, nb, bs]
    if mins is not None:  # as quant/blocks.Blocks.dequantized adds them
        deq = deq + mins.T[..., None]
    deq = deq.reshape(n, -1)  # [n, K]
    if not np.array_equal(deq, used):
        raise ExportError(f"{name}: its stored blocks do not decode to the weights the graph's linears report")
    _within_a_step(name, w, deq, scales, block_size)


def _within_a_step(name: str, w: np.ndarray, deq: np.ndarray, scales: np.ndarray, block_size: int) -> None:
    """Weights stored in blocks [n, K] lie within one quantization step |scale| of the checkpoint
    rows `w` (a GGUF's own blocks: on them; a GGUF's d may be negative)."""
    n, nb = scales.shape
    step = np.abs(scales)
    err = np.abs(deq - w).reshape(n, nb, block_size).max(axis=-1)  # [n, nb]
    if not np.all(err <= step * np.float32(1.0001) + np.float32(1e-30)):
        r, b = np.unravel_index(int(np.argmax(err - step * np.float32(1.0001))), err.shape)
        raise ExportError(
            f"{name}: row {r} block {b} is stored {err[r, b]:.3g} from the checkpoint's weights, more than one "
            f"quantization step ({step[r, b]:.3g}): the tensor written is not the one read"
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
