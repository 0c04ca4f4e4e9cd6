"""The row kernel's weight layout in NumPy: `pack()` writes a linear's blocks in the kernel's records
(panels of 16 outputs, one record per block; matmul.h's Layout), `unpack()` reads them back, and
`reference()` / `gather_reference()` compute the ops' results with the same float32 operations in the
same order (the tests compare the library's bitwise)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

PANEL = 16  # outputs per panel (matmul.h kPanel)
SUPER = 256  # inputs per super-block of sub-scale records (matmul.h Layout::kSuper: GGUF's K-quants)
ATTRS = ("K", "N", "bits", "block_size", "zero_point", "mins", "f16", "sub")  # the op's attributes, in order
DEFAULTS = {"sub": 0}  # attributes a folder exported before them lacks (the op reads these then)
LAYOUT_VERSION = 2  # the records this edgespec writes: 1 = 4/8-bit codes, fp16/fp32 scales per block;
#                     2 adds 5/6-bit codes and K-quant sub-scale codes (the op still reads 1's records)


@dataclass(frozen=True)
class SubScales:
    """A K-quant's block scales and minimums as GGUF stores them: per block of the linear
    d = D * sc and m = -(Dmin * mn) in fp32 (exact: an fp16 times an integer of at most 8 bits),
    D and Dmin fp16 per super-block of 256 inputs."""

    d: np.ndarray  # [N, K / 256] float32, every one an fp16: the super-block scales D
    sc: np.ndarray  # [N, K / block_size] int8: the sub-scale codes (Q4_K/Q5_K 0..63, Q6_K signed)
    dmin: np.ndarray | None  # [N, K / 256] float32 fp16 values: Dmin; None without minimums
    mn: np.ndarray | None  # [N, K / block_size] int8 (0..63): the sub-minimum codes; None without minimums

    def scales(self) -> np.ndarray:
        """[N, K / bs] float32 d = D * sc, as the kernel computes it."""
        r = self.sc.shape[1] // self.d.shape[1]
        return np.repeat(self.d.astype(np.float32), r, axis=1) * self.sc.astype(np.float32)

    def mins(self) -> np.ndarray | None:
        """[N, K / bs] float32 m = -(Dmin * mn), as the kernel computes it; None without minimums."""
        if self.mn is None or self.dmin is None:
            return None
        r = self.mn.shape[1] // self.dmin.shape[1]
        return -(np.repeat(self.dmin.astype(np.float32), r, axis=1) * self.mn.astype(np.float32))

    def fields(self) -> tuple:
        return (self.d, self.sc, self.dmin, self.mn)

    def rows(self, r0: int, r1: int) -> SubScales:
        return SubScales(*(None if a is None else a[r0:r1] for a in self.fields()))

    def taken(self, index) -> SubScales:
        """Rows in another order (index: a row permutation)."""
        return SubScales(*(None if a is None else np.ascontiguousarray(a[index]) for a in self.fields()))

    @staticmethod
    def concat(parts: list[SubScales]) -> SubScales | None:
        """Row-wise concatenation; None where the parts differ in minimums or block size."""
        if len({p.mn is None for p in parts}) > 1 or len({p.sc.shape[1] for p in parts}) > 1:
            return None
        cols = zip(*(p.fields() for p in parts), strict=True)
        return SubScales(*(None if c[0] is None else np.concatenate(c) for c in cols))


@dataclass(frozen=True)
class Packed:
    """One linear in the kernel's layout, and the values the kernel multiplies by (the reference's)."""

    data: np.ndarray  # [panels * blocks * record] uint8: the op's weight input
    attrs: dict  # the op's attributes (ATTRS)
    codes: np.ndarray  # [N, K] uint8 codes
    scales: np.ndarray  # [N, K / bs] float32 d
    zero_points: np.ndarray  # [N, K / bs] int32 z (0 where none)
    mins: np.ndarray | None  # [N, K / bs] float32 m, or None
    sub: SubScales | None = None  # the sub-scale codes d and m were computed from (attrs sub 1), else None


@dataclass(frozen=True)
class PackChoices:
    """What pack decides from the whole matrix's scales, zero points, minimums and codes."""

    fold: bool  # zero points folded into the minimums (m - d z, exact in fp32 for every block)
    zero_point: int  # the zero point every block shares after folding (the op's attribute); -1: per output
    f16: bool  # scales and minimums stored as fp16 (every one exactly an fp16)
    bits: int = 0  # the records' code width (4, 5, 6, 8: the narrowest the codes fit); 0: pack's bits
    sub: bool = False  # scales and minimums stored as their sub-scale codes (SubScales reproduce them)


def _narrowest(bits: int, codes_max: int | None, block_size: int, zp: int) -> int:
    """The record width for codes < 2**bits whose largest is codes_max (5 only in blocks of 32)."""
    if codes_max is None or bits == 4:
        return bits
    for w in (4, 5, 6):
        if w < bits and codes_max < 1 << w and zp < 1 << w and (w != 5 or block_size == 32):
            return w
    return bits


def _sub_fits(sub: SubScales, d: np.ndarray, z: np.ndarray, m: np.ndarray | None) -> bool:
    """The sub-scale codes reproduce the blocks' d and (folded) m, with no per-block zero point."""
    n, nb = d.shape
    if sub.sc.shape != (n, nb) or sub.d.shape[0] != n or nb % max(1, sub.d.shape[1]) or not sub.d.shape[1]:
        return False
    if (sub.mn is None) != (m is None) or not (z == z.flat[0]).all():
        return False
    halves = [a for a in (sub.d, sub.dmin) if a is not None]
    if not all(np.array_equal(a.astype(np.float16).astype(np.float32), a) for a in halves):
        return False
    if not np.array_equal(sub.scales(), d):
        return False
    return m is None or np.array_equal(sub.mins(), m)


def pack_choices(
    scales: np.ndarray,
    zero_points: np.ndarray | None,
    mins: np.ndarray | None,
    bits: int = 0,
    block_size: int = 32,
    codes_max: int | None = None,
    sub: SubScales | None = None,
) -> PackChoices:
    """pack's decisions for blocks d (scales [N, nb]), z (zero points) and m (minimums, or None);
    with bits (the blocks' width) and codes_max (their largest code) the narrowest record width,
    with sub (the K-quant's own codes) whether they are stored instead of d and m."""
    d = np.asarray(scales, np.float32)
    z = np.zeros(d.shape, np.int32) if zero_points is None else np.asarray(zero_points, np.int32).reshape(d.shape)
    m = None if mins is None else np.asarray(mins, np.float32).reshape(d.shape)
    fold = False
    if m is not None and z.any():
        folded = m.astype(np.float64) - d.astype(np.float64) * z
        if np.array_equal(folded.astype(np.float32).astype(np.float64), folded):
            m, z, fold = folded.astype(np.float32), np.zeros_like(z), True
    zp = 0 if not z.any() else (int(z.flat[0]) if (z == z.flat[0]).all() else -1)
    f16 = all(np.array_equal(a.astype(np.float16).astype(np.float32), a) for a in (d, m) if a is not None)
    k = d.shape[1] * block_size
    use_sub = sub is not None and bits > 0 and k % SUPER == 0 and zp >= 0 and _sub_fits(sub, d, z, m)
    width = _narrowest(bits, codes_max, block_size, zp) if bits else 0
    return PackChoices(fold, zp, f16, width, use_sub)


def _code_bytes(codes: np.ndarray, bits: int, p: int, nb: int, g: int) -> np.ndarray:
    """Codes [P, nb, g, 64] (byte 4n + j of group g) -> the records' code bytes [P, nb, bs * 16 * bits / 8]."""
    if bits == 8:
        return codes.reshape(p, nb, -1)
    low = codes & 0x0F
    parts = [(low[:, :, : g // 2] | (low[:, :, g // 2 :] << 4)).reshape(p, nb, -1)]  # chunk i: group i, i + g/2
    high = codes >> 4
    if bits == 6:  # chunk c, bits 2i..2i+1: group c + i g/4
        h = high.reshape(p, nb, 4, g // 4, 64)
        parts.append((h[:, :, 0] | (h[:, :, 1] << 2) | (h[:, :, 2] << 4) | (h[:, :, 3] << 6)).reshape(p, nb, -1))
    elif bits == 5:  # bit i: group i (blocks of 32)
        acc = np.zeros((p, nb, 64), np.uint8)
        for i in range(8):
            acc |= high[:, :, i] << i
        parts.append(acc)
    return np.concatenate(parts, axis=-1)


def _codes_of(c: np.ndarray, bits: int, p: int, nb: int, g: int) -> np.ndarray:
    """_code_bytes' inverse: [P, nb, code bytes] -> [P, nb, g, 64]."""
    if bits == 8:
        return c.reshape(p, nb, g, 64)
    low = c[..., : g * 32].reshape(p, nb, g // 2, 64)
    codes = np.concatenate([low & 0x0F, low >> 4], axis=2)
    if bits == 6:
        h = c[..., g * 32 :].reshape(p, nb, 1, g // 4, 64)
        codes = codes | ((np.concatenate([(h >> (2 * i)) & 3 for i in range(4)], axis=2).reshape(p, nb, g, 64)) << 4)
    elif bits == 5:
        h = c[..., g * 32 :].reshape(p, nb, 1, 64)
        codes = codes | (np.concatenate([(h >> i) & 1 for i in range(8)], axis=2) << 4)
    return codes


def _panels(a: np.ndarray, p: int) -> np.ndarray:
    """[N, cols] -> [P, cols, 16]: per output the columns of its panel's lane (rows past N zero)."""
    n, cols = a.shape
    pad = p * PANEL - n
    a = np.concatenate([a, np.zeros((pad, cols), a.dtype)]) if pad else a
    return a.reshape(p, PANEL, cols).transpose(0, 2, 1)


def _stored(a: np.ndarray, dtype, p: int) -> np.ndarray:
    """[N, cols] values as `dtype` in panels, as the records' bytes [P, cols, 16 * itemsize]."""
    return np.ascontiguousarray(_panels(a.astype(dtype), p)).view(np.uint8)


def _panel_codes(codes: np.ndarray, p: int, nb: int, g: int) -> np.ndarray:
    """Codes [N, K] -> [P, nb, g, 64]: byte 4n + j of group g of each block (rows past N zero)."""
    n, k = codes.shape
    pad = p * PANEL - n
    c = np.concatenate([codes, np.zeros((pad, k), np.uint8)]) if pad else codes
    return c.reshape(p, PANEL, nb, g, 4).transpose(0, 2, 3, 1, 4).reshape(p, nb, g, 64)


def _sub_records(code_bytes: np.ndarray, sub: SubScales, p: int, k: int) -> np.ndarray:
    """The packed bytes with sub-scale codes: per super-block its fp16 D [, Dmin] header, then its
    records (codes, sc [, mn])."""
    parts = [code_bytes] + [_stored(a, np.int8, p) for a in (sub.sc, sub.mn) if a is not None]
    recs = np.concatenate(parts, axis=-1).reshape(p, k // SUPER, -1)  # a super-block's records
    head = [_stored(a, np.float16, p) for a in (sub.d, sub.dmin) if a is not None]
    return np.ascontiguousarray(np.concatenate([*head, recs], axis=-1)).reshape(-1)


def _block_records(code_bytes, d, m, z, zp: int, f16: bool, p: int) -> np.ndarray:
    """The packed bytes, one record per block: codes, scales d [, minimums m] (fp16 or fp32)
    [, zero points z (zp -1: one per block and output)]."""
    parts = [code_bytes] + [_stored(a, np.float16 if f16 else np.float32, p) for a in (d, m) if a is not None]
    if zp < 0:
        parts.append(_stored(z, np.uint8, p))
    return np.ascontiguousarray(np.concatenate(parts, axis=-1)).reshape(-1)


def pack(
    codes: np.ndarray,
    scales: np.ndarray,
    zero_points: np.ndarray | None,
    mins: np.ndarray | None,
    bits: int,
    block_size: int,
    choices: PackChoices | None = None,
    sub: SubScales | None = None,
) -> Packed:
    """w[n, k] = d (code - z) (+ m) per block of block_size inputs, in the kernel's layout.

    The zero point becomes an attribute where every block shares it (GGUF's Q4_0 8, Q8_0 128: one
    integer per row and block instead of one per output); with block minimums it is folded into
    them (m - d z) where that is exact in fp32, as GGUF's own Q4_1 minimums are, which saves the
    per-output zero points. Scales and minimums are stored as fp16 where every one is exactly an
    fp16 (GGUF's own are), a sixth less to stream at 4 bits. Codes are stored in the narrowest of
    4, 5, 6 and 8 bits they fit (Q5_x: 5, Q6_K: 6), and a K-quant's scales and minimums as its own
    sub-scale codes under fp16 super-block scales (sub, where they reproduce d and m exactly).
    choices: those decisions taken for the whole matrix (pack_choices) when these rows are a row
    block of it (a multiple of PANEL rows, but the last): the blocks then concatenate to the whole
    matrix's bytes."""
    codes = np.asarray(codes, np.uint8)
    n, k = codes.shape
    nb = k // block_size
    if k % block_size or block_size not in (16, 32) or bits not in (4, 8):
        raise ValueError(f"rowop.pack: K={k}, block_size={block_size}, bits={bits} (16 or 32; 4 or 8)")
    if codes.max(initial=0) >= 1 << bits:
        raise ValueError(f"rowop.pack: codes above {bits} bits")
    d = np.asarray(scales, np.float32).reshape(n, nb)
    z = np.zeros((n, nb), np.int32) if zero_points is None else np.asarray(zero_points, np.int32).reshape(n, nb)
    m = None if mins is None else np.asarray(mins, np.float32).reshape(n, nb)
    ch = choices or pack_choices(d, z, m, bits, block_size, int(codes.max(initial=0)), sub)
    if ch.fold and m is not None:
        m, z = (m.astype(np.float64) - d.astype(np.float64) * z).astype(np.float32), np.zeros_like(z)
    zp, f16, width = ch.zero_point, ch.f16, ch.bits or bits
    if codes.max(initial=0) >= 1 << width:
        raise ValueError(f"rowop.pack: codes above the chosen {width} bits")
    use_sub = ch.sub and sub is not None
    if ch.sub and not use_sub:
        raise ValueError("rowop.pack: the choices store sub-scale codes, and none were given")
    p, g = -(-n // PANEL), block_size // 4
    code_bytes = _code_bytes(_panel_codes(codes, p, nb, g), width, p, nb, g)
    if use_sub:
        d, m, z = sub.scales(), sub.mins(), np.full((n, nb), zp, np.int32)  # pack_choices checked: d and m alike
        data = _sub_records(code_bytes, sub, p, k)
    else:
        data = _block_records(code_bytes, d, m, z, zp, f16, p)
    attrs = dict(K=k, N=n, bits=width, block_size=block_size, zero_point=zp, mins=int(m is not None), f16=int(f16))
    attrs["sub"] = int(use_sub)
    return Packed(data, attrs, codes, d, z, m, sub if use_sub else None)


def unpack(data: np.ndarray, attrs: dict) -> Packed:
    """A packed linear read back (pack's inverse: the folder's weights, checked by the tests)."""
    k, n, bits, bs = attrs["K"], attrs["N"], attrs["bits"], attrs["block_size"]
    nb, g, p = k // bs, bs // 4, -(-n // PANEL)
    f16, has_mins, zp, sub = bool(attrs["f16"]), bool(attrs["mins"]), attrs["zero_point"], bool(attrs.get("sub", 0))
    code_bytes, scale_bytes = bs * PANEL * bits // 8, PANEL * (2 if f16 else 4)

    def per_output(a: np.ndarray) -> np.ndarray:  # [P, cols, 16] -> [N, cols]
        return a.transpose(0, 2, 1).reshape(p * PANEL, a.shape[1])[:n]

    raw = np.asarray(data, np.uint8)
    if sub:
        nh = 1 + has_mins
        sup = raw.reshape(p, k // SUPER, -1)
        head = sup[..., : nh * 2 * PANEL]
        rec = sup[..., nh * 2 * PANEL :].reshape(p, nb, -1)

        def field(a: np.ndarray, at: int, size: int, dtype) -> np.ndarray:
            return per_output(np.ascontiguousarray(a[..., at : at + size]).view(dtype))

        halves = [field(head, 2 * PANEL * i, 2 * PANEL, np.float16) for i in range(nh)]
        codes8 = [field(rec, code_bytes + PANEL * i, PANEL, np.int8) for i in range(nh)]
        s = SubScales(halves[0].astype(np.float32), codes8[0], halves[1].astype(np.float32) if has_mins else None,
                      codes8[1] if has_mins else None)  # fmt: skip
        scales, mins, z = s.scales(), s.mins(), np.full((n, nb), zp, np.int32)
    else:
        rec = raw.reshape(p, nb, -1)
        at = code_bytes
        scale_type = np.float16 if f16 else np.float32
        fields = []
        for _ in range(1 + has_mins):
            fields.append(per_output(np.ascontiguousarray(rec[..., at : at + scale_bytes]).view(scale_type)))
            at += scale_bytes
        z = per_output(rec[..., at : at + PANEL]).astype(np.int32) if zp < 0 else np.full((n, nb), zp, np.int32)
        scales, mins, s = fields[0].astype(np.float32), fields[1].astype(np.float32) if has_mins else None, None
    c = _codes_of(rec[..., :code_bytes], bits, p, nb, g)
    codes = c.reshape(p, nb, g, PANEL, 4).transpose(0, 3, 1, 2, 4).reshape(p * PANEL, k)[:n]
    return Packed(raw, dict(attrs), codes, scales, z, mins, s)


def dequantized(p: Packed) -> np.ndarray:
    """[N, K] float32: the weights the kernel multiplies by, d (code - z) (+ m) rounded once."""
    n, k = p.codes.shape
    bs = p.attrs["block_size"]
    q = p.codes.reshape(n, -1, bs).astype(np.float64) - p.zero_points[..., None]
    w = q * p.scales[..., None].astype(np.float64)
    if p.mins is not None:
        w = w + p.mins[..., None]
    return w.astype(np.float32).reshape(n, k)


def reference(x: np.ndarray, p: Packed) -> np.ndarray:
    """The op's result in NumPy, the same float32 operations in the same order (matmul.h)."""
    x = np.asarray(x, np.float32)
    k, n, bs = p.attrs["K"], p.attrs["N"], p.attrs["block_size"]
    nb = k // bs
    rows = x.reshape(-1, nb, bs)  # [M, nb, bs]
    a = np.abs(rows).max(axis=-1)  # [M, nb]
    inv = np.divide(np.float32(127), a, out=np.zeros_like(a), where=a > 0)
    s = a / np.float32(127)
    xq = np.clip(np.rint(rows * inv[..., None]), -127, 127).astype(np.int64)
    xsum = xq.sum(axis=-1)  # [M, nb]
    codes = p.codes.astype(np.int64).reshape(n, nb, bs)
    dot = np.einsum("mbk,nbk->mbn", xq, codes) - xsum[..., None] * p.zero_points.T[None]  # [M, nb, N]
    f = dot.astype(np.float32) * p.scales.T[None]
    if p.mins is not None:
        f = f + p.mins.T[None] * xsum.astype(np.float32)[..., None]
    f = f * s[..., None]
    acc = np.zeros((len(rows), n), np.float32)
    for b in range(nb):
        acc = acc + f[:, b]
    return acc.reshape(*x.shape[:-1], n)


def gather_reference(ids: np.ndarray, p: Packed) -> np.ndarray:
    """RowGather in NumPy: rows `ids` of the packed linear as floats [..., K], d (code - z) (+ m) in
    float32, one rounding per operation (as gguf_blocks.Blocks.dequantized computes a GGUF's rows)."""
    ids = np.asarray(ids, np.int64)
    n, k = p.codes.shape
    bs = p.attrs["block_size"]
    q = p.codes[ids].reshape(*ids.shape, k // bs, bs).astype(np.int32) - p.zero_points[ids][..., None]
    w = q.astype(np.float32) * p.scales[ids][..., None]
    if p.mins is not None:
        w = w + p.mins[ids][..., None]
    return w.reshape(*ids.shape, k)
