"""A GGUF's quantized blocks, kept exactly in ONNX Runtime's MatMulNBits layout.

MatMulNBits computes, per block of `block_size` inputs, (code - zero_point) * scale. GGUF's formats
fit that exactly (checked against gguf's own dequantization, bit for bit):
  Q4_0 d * (q - 8)              4-bit codes, zero point 8
  Q8_0 d * q, q in [-127, 127]  8-bit codes q + 128, zero point 128
  Q5_0 d * (q - 16)             8-bit codes (5 bits used), zero point 16
  Q6_K (d * sc) * (q - 32)      8-bit codes, zero point 32, blocks of 16 (its sub-blocks)
  Q3_K (d * sc) * q, q in -4..3 4-bit codes q + 4, zero point 4, blocks of 16
and the formats with a block minimum, w = d * q + m (Q4_1, Q5_1; Q4_K, Q5_K and Q2_K as
(d * sc) * q - dmin * m), as codes with zero point 0 and scale d plus the minimum term: the layer
adds m * (the sum of the block's inputs), a second matmul 1/32 the size (linears.Linears writes it).
An integer zero point keeps ONNX Runtime's prepacked CPU kernel; a float one (-m / d) would also be
exact but loses it.

Why keep them: dequantizing a Q4_1 file to fp32 and refitting edgespec's own int4 blocks changes
99.7% of the default model's blocks, and its top-1 agreement with the fp32 export fell to 0.70
where llama.cpp running the same file agrees on 0.96 (docs/results/gguf-exact.md).

The blocks are read from the file (a memory map: no gguf.GGUFReader, which opens large
vocabularies slowly), named and row-permuted as transformers' GGUF loader names and permutes the
weights it dequantizes (llama's q/k rows), and kept only where their dequantization equals the
loaded model's weight bitwise: a mapping error can only cost exactness, never correctness.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from edgespec.engines.rowop import SubScales

QK_K = 256  # weights per K-quant super-block


@dataclass(frozen=True)
class Blocks:
    """One linear weight [N=out, K=in] as MatMulNBits blocks: w = (codes - zero_points) * scales
    (+ mins), per block of block_size inputs."""

    codes: np.ndarray  # [N, K] uint8, one unsigned code per weight (< 2**bits)
    scales: np.ndarray  # [N, K / block_size] float32
    zero_points: np.ndarray  # [N, K / block_size] uint8
    mins: np.ndarray | None  # [N, K / block_size] float32 added to every weight of the block; None: 0
    bits: int  # 4 or 8: the MatMulNBits width the codes fit in
    block_size: int  # inputs per block: 32, or 16 for the K-quants' 16-wide sub-blocks
    source: str  # the GGUF type the blocks came from ("Q4_1"; "Q5_0+Q8_0" for concatenated rows)
    sub: SubScales | None = None  # a K-quant's own sub-scale codes (scales = D sc, mins = -(Dmin mn)), else None

    def dequantized(self) -> np.ndarray:
        """[N, K] float32, computed as gguf computes it (so the bits are its bits)."""
        n, k = self.codes.shape
        q = self.codes.reshape(n, -1, self.block_size).astype(np.float32) - self.zero_points[..., None]
        w = q * self.scales[..., None]
        if self.mins is not None:
            w = w + self.mins[..., None]
        return w.reshape(n, k)

    def rows(self, r0: int, r1: int) -> Blocks:
        """Rows r0:r1 (views): a row block of the linear, every block intact (blocks run along a row)."""
        return replace(
            self,
            codes=self.codes[r0:r1],
            scales=self.scales[r0:r1],
            zero_points=self.zero_points[r0:r1],
            mins=None if self.mins is None else self.mins[r0:r1],
            sub=None if self.sub is None else self.sub.rows(r0, r1),
        )

    def with_block_size(self, block_size: int) -> Blocks:
        """The same weights in smaller blocks (each block's scale, zero point and min repeated)."""
        if block_size == self.block_size:
            return self
        r = self.block_size // block_size

        def rep(a):
            return None if a is None else np.repeat(a, r, axis=1)

        return replace(
            self,
            scales=rep(self.scales),
            zero_points=rep(self.zero_points),
            mins=rep(self.mins),
            block_size=block_size,
            sub=None,
        )

    def packed(self) -> tuple[np.ndarray, np.ndarray]:
        """(codes, zero points) as MatMulNBits reads them: 4 bits: [N, nb, bs/2] two codes a byte,
        low nibble first, zero points two a byte per row (padded to an even count); 8 bits:
        [N, nb, bs] and [N * nb]."""
        n, k = self.codes.shape
        nb = k // self.block_size
        codes = self.codes.reshape(n, nb, self.block_size)
        if self.bits == 8:
            return codes, self.zero_points.reshape(-1).copy()
        zp = self.zero_points
        if nb % 2:
            zp = np.concatenate([zp, np.zeros((n, 1), np.uint8)], axis=1)
        return (
            (codes[..., 0::2] | (codes[..., 1::2] << 4)).astype(np.uint8),
            (zp[:, 0::2] | (zp[:, 1::2] << 4)).astype(np.uint8).reshape(-1),
        )


def from_int4(codes_packed: np.ndarray, scales: np.ndarray, zp_packed: np.ndarray, block_size: int) -> Blocks:
    """Blocks of quant.quantize_int4's output (edgespec's own asymmetric int4: a re-quantized part
    of a linear whose other parts are kept)."""
    n, nb, _ = codes_packed.shape
    codes = np.stack([codes_packed & 0x0F, codes_packed >> 4], axis=-1).reshape(n, nb * block_size)
    zp = zp_packed.reshape(n, -1)
    zp = np.stack([zp & 0x0F, zp >> 4], axis=-1).reshape(n, -1)[:, :nb]
    return Blocks(codes, scales.astype(np.float32), zp.astype(np.uint8), None, 4, block_size, "int4")


def concat(parts: list[Blocks]) -> Blocks:
    """Row-wise concatenation (q, k, v into one qkv linear) in the widest layout of the parts: the
    most bits, the smallest blocks, mins where any part has them (0 for the others)."""
    if len(parts) == 1:
        return parts[0]
    bits = max(p.bits for p in parts)
    bs = min(p.block_size for p in parts)
    parts = [p.with_block_size(bs) for p in parts]
    any_mins = any(p.mins is not None for p in parts)
    subs = [p.sub for p in parts]
    return Blocks(
        codes=np.concatenate([p.codes for p in parts]),
        scales=np.concatenate([p.scales for p in parts]),
        zero_points=np.concatenate([p.zero_points for p in parts]),
        mins=np.concatenate([p.mins if p.mins is not None else np.zeros_like(p.scales) for p in parts])
        if any_mins
        else None,
        bits=bits,
        block_size=bs,
        source="+".join(dict.fromkeys(p.source for p in parts)),
        sub=None if any(x is None for x in subs) else SubScales.concat(subs),
    )


# ---- decoding each GGUF type: raw blocks [n, type_size] uint8 -> (codes, scales, zero points, mins) -----
def _f16(b: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(b).view(np.float16).astype(np.float32)


def _nibbles(qs: np.ndarray, group: int) -> np.ndarray:
    """[n, bytes] -> codes: per `group` bytes, their low nibbles then their high nibbles (ggml's order)."""
    n = len(qs)
    q = qs.reshape(n, -1, 1, group) >> np.array([0, 4], np.uint8).reshape(1, 1, 2, 1)
    return (q & 0x0F).reshape(n, -1)


def _bits_of(words: np.ndarray, n_bits: int) -> np.ndarray:
    """[n, 4] uint8 (one little-endian uint32 per block) -> its n_bits low bits as 0/1 [n, n_bits]."""
    qh = np.ascontiguousarray(words).view(np.uint32).reshape(-1, 1)
    return ((qh >> np.arange(n_bits, dtype=np.uint32)) & 1).astype(np.uint8)


def _scale_min_k4(scales: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K/Q5_K's 12 bytes of 6-bit sub-block scales and mins -> ([n, 8], [n, 8]) (gguf's unpacking)."""
    n = len(scales)
    d, m, m_d = np.split(scales.reshape(n, 3, 4), 3, axis=-2)
    sc = np.concatenate([d & 0x3F, (m_d & 0x0F) | ((d >> 2) & 0x30)], axis=-1).reshape(n, 8)
    mn = np.concatenate([m & 0x3F, (m_d >> 4) | ((m >> 2) & 0x30)], axis=-1).reshape(n, 8)
    return sc, mn


def _q4_0(b):
    d = _f16(b[:, :2])
    return _nibbles(b[:, 2:], 16), d, 8, None, 4, 32


def _q4_1(b):
    d, m = _f16(b[:, :2]), _f16(b[:, 2:4])
    return _nibbles(b[:, 4:], 16), d, 0, m, 4, 32


def _q5_0(b):
    d = _f16(b[:, :2])
    return _nibbles(b[:, 6:], 16) | (_bits_of(b[:, 2:6], 32) << 4), d, 16, None, 8, 32


def _q5_1(b):
    d, m = _f16(b[:, :2]), _f16(b[:, 2:4])
    return _nibbles(b[:, 8:], 16) | (_bits_of(b[:, 4:8], 32) << 4), d, 0, m, 8, 32


def _q8_0(b):
    d = _f16(b[:, :2])
    return (b[:, 2:].view(np.int8).astype(np.int16) + 128).astype(np.uint8), d, 128, None, 8, 32


def _k_scales(b):
    d, dmin = _f16(b[:, :2]), _f16(b[:, 2:4])
    sc, mn = _scale_min_k4(b[:, 4:16])
    return d * sc.astype(np.float32), -(dmin * mn.astype(np.float32))  # [n, 8] each


def _q4_k(b):
    scale, mins = _k_scales(b)
    return _nibbles(b[:, 16:], 32), scale, 0, mins, 4, 32


def _q5_k(b):
    scale, mins = _k_scales(b)
    n = len(b)
    qh = b[:, 16:48].reshape(n, 1, 1, 32) >> np.arange(8, dtype=np.uint8).reshape(1, 1, 8, 1)
    high = (qh & 1).reshape(n, -1)  # sub-block j takes bit j of each of the 32 bytes
    return _nibbles(b[:, 48:], 32) | (high << 4), scale, 0, mins, 8, 32


def _q6_k(b):
    n = len(b)
    ql = _nibbles(b[:, :128], 64)
    qh = b[:, 128:192].reshape(n, -1, 1, 32) >> np.array([0, 2, 4, 6], np.uint8).reshape(1, 1, 4, 1)
    codes = ql | ((qh & 3).reshape(n, -1) << 4)  # 0..63
    sc = b[:, 192:208].view(np.int8).astype(np.float32)
    return codes, _f16(b[:, 208:210]) * sc, 32, None, 8, 16


def _q3_k(b):
    n = len(b)
    hmask, qs, scales, d = b[:, :32], b[:, 32:96], b[:, 96:108], _f16(b[:, 108:110])
    lo = (scales[:, :8].reshape(n, 1, 8) >> np.array([0, 4], np.uint8).reshape(1, 2, 1)).reshape(n, 16)
    hi = (scales[:, 8:].reshape(n, 1, 4) >> np.array([0, 2, 4, 6], np.uint8).reshape(1, 4, 1)).reshape(n, 16)
    sc = ((lo & 0x0F) | ((hi & 3) << 4)).astype(np.int8) - np.int8(32)
    ql = (qs.reshape(n, -1, 1, 32) >> np.array([0, 2, 4, 6], np.uint8).reshape(1, 1, 4, 1)).reshape(n, -1) & 3
    qh = (hmask.reshape(n, 1, 1, 32) >> np.arange(8, dtype=np.uint8).reshape(1, 1, 8, 1)).reshape(n, -1) & 1
    return ql + (qh << 2), d * sc.astype(np.float32), 4, None, 4, 16  # q = ql - 4 (1 - h): codes q + 4


def _q2_k(b):
    n = len(b)
    scales, qs, d, dmin = b[:, :16], b[:, 16:80], _f16(b[:, 80:82]), _f16(b[:, 82:84])
    q = (qs.reshape(n, -1, 1, 32) >> np.array([0, 2, 4, 6], np.uint8).reshape(1, 1, 4, 1)).reshape(n, -1) & 3
    dl = d * (scales & 0x0F).astype(np.float32)
    ml = dmin * (scales >> 4).astype(np.float32)
    return q, dl, 0, -ml, 4, 16


DECODERS = {  # GGUF type name -> (decoder, weights per GGUF block)
    "Q4_0": (_q4_0, 32),
    "Q4_1": (_q4_1, 32),
    "Q5_0": (_q5_0, 32),
    "Q5_1": (_q5_1, 32),
    "Q8_0": (_q8_0, 32),
    "Q2_K": (_q2_k, QK_K),
    "Q3_K": (_q3_k, QK_K),
    "Q4_K": (_q4_k, QK_K),
    "Q5_K": (_q5_k, QK_K),
    "Q6_K": (_q6_k, QK_K),
}
FLOATS = ("F32", "F16", "BF16")  # kept as today: fp32, or re-quantized by --precision


def decode(raw: np.ndarray, type_name: str) -> Blocks:
    """A GGUF tensor's raw bytes [rows, bytes per row] of a type in DECODERS -> its Blocks."""
    fn, per_block = DECODERS[type_name]
    rows = raw.shape[0]
    import gguf

    type_size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[type_name]][1]
    flat = np.ascontiguousarray(raw).reshape(-1, type_size)
    codes, scales, zp, mins, bits, bs = fn(flat)
    k = flat.shape[0] // rows * per_block
    scales = scales.astype(np.float32).reshape(rows, -1)
    zero_points = np.full(scales.shape, zp, np.uint8)
    if mins is not None:
        zero_points, mins = _centered(scales, mins.astype(np.float32).reshape(rows, -1), 2**bits - 1)
    sub = _sub_scales(flat, type_name, rows)
    return Blocks(codes.astype(np.uint8).reshape(rows, k), scales, zero_points, mins, bits, bs, type_name, sub)


def _sub_scales(b: np.ndarray, type_name: str, rows: int) -> SubScales | None:
    """A K-quant's super-block scales and sub-scale codes (the row kernel keeps them as stored)."""
    if type_name in ("Q4_K", "Q5_K"):
        sc, mn = _scale_min_k4(b[:, 4:16])
        d, dmin = _f16(b[:, :2]), _f16(b[:, 2:4])
        return SubScales(d.reshape(rows, -1), sc.astype(np.int8).reshape(rows, -1), dmin.reshape(rows, -1),
                         mn.astype(np.int8).reshape(rows, -1))  # fmt: skip
    if type_name == "Q6_K":
        sc = np.ascontiguousarray(b[:, 192:208]).view(np.int8)
        return SubScales(_f16(b[:, 208:210]).reshape(rows, -1), sc.reshape(rows, -1), None, None)
    return None


def _centered(scales: np.ndarray, mins: np.ndarray, top: int) -> tuple[np.ndarray, np.ndarray]:
    """d * q + m as d * (q - z) + (m + z * d), z the integer nearest -m / d: the same weights, with
    the codes centred on the block's zero and a residual min |m + z d| <= d / 2.

    Why: MatMulNBits with int8 activations (accuracy level 4) multiplies the rounded activations by
    (q - z) * d, so their rounding error scales with those values: with z = 0 (all codes >= 0) the
    default model's logits moved 4.0 from PyTorch's (its own int4 blocks: 1.3); centred they move
    as little as its own blocks do, and the residual min term sees exact activations.
    A block keeps z = 0 (r = m) where m + z d is not a float32 (rare: then d * (q - z) + r would
    round differently from gguf's d * q + m); otherwise both are one rounding of the same real."""
    with np.errstate(divide="ignore", invalid="ignore"):
        z = np.where(scales != 0, np.clip(np.rint(-mins / scales), 0, top), 0)
    r64 = mins.astype(np.float64) + z * scales.astype(np.float64)  # exact: fp16-sized operands
    exact = r64.astype(np.float32).astype(np.float64) == r64
    z = np.where(exact, z, 0)
    return z.astype(np.uint8), np.where(exact, r64, mins).astype(np.float32)


# ---- the file's tensors, named as the loaded model names them -------------------------------------
@dataclass(frozen=True)
class GgufWeights:
    """What a GGUF's linear weights can keep, by the loaded HF model's parameter names."""

    blocks: dict[str, Blocks]  # HF name -> its blocks, for tensors whose dequantization is the loaded weight
    types: dict[str, str]  # HF name -> GGUF type of every tensor the file maps to the model ("Q4_1", "F32")
    not_kept: dict[str, str]  # HF name -> why a quantized tensor's blocks are not kept


class CheckpointWeights(dict):
    """A model's float32 weights by HF name (what graph writers take), carrying the quantized
    blocks its checkpoint holds for some of them: every writer built on these weights (the target,
    a self:N draft sharing the target's weights file) keeps the same blocks."""

    def __init__(self, arrays: dict[str, np.ndarray], quantized: GgufWeights | None = None) -> None:
        super().__init__(arrays)
        self.quantized = quantized  # None: a float checkpoint (or blocks not wanted: --precision other than int4)
