"""Random quantized blocks and activation rows for the row kernel's tests."""

import numpy as np

from edgespec.engines import rowop


def layout(bits, bs, zp, mins, f16, n=40, k=96, seed=0):
    """Random blocks of one layout: zp "none" | "uniform" | "block"; f16: scales exactly fp16;
    bits 5 and 6: 8-bit blocks whose codes fit them (pack stores them in the narrower records)."""
    rng = np.random.default_rng(seed)
    nb = k // bs
    codes = rng.integers(0, 1 << bits, (n, k), dtype=np.uint8)
    d = (rng.random((n, nb), np.float32) * 0.02 + 1e-3).astype(np.float32)
    if f16:
        d = d.astype(np.float16).astype(np.float32)
    z = {"none": None, "uniform": np.full((n, nb), 1 << (bits - 1), np.uint8)}.get(zp)
    if zp == "block":
        z = rng.integers(0, 1 << bits, (n, nb), dtype=np.uint8)
    m = None
    if mins:
        m = (rng.standard_normal((n, nb)) * 0.05).astype(np.float32)
        m = m.astype(np.float16).astype(np.float32) if f16 else m
    p = rowop.pack(codes, d, z, m, 4 if bits == 4 else 8, bs)
    assert p.attrs["bits"] == bits or (bits == 5 and bs == 16 and p.attrs["bits"] == 6)  # 5 bits: blocks of 32
    return p


# Layouts in the order a GGUF model's linears meet them on one thread (every RowMatMul shares the
# thread's buffers for the quantized rows): 8-bit blocks of 16 (Q6_K, the widest of a Q4_1 q/k and
# Q6_K v qkv) at K=256, then blocks of 32 with as many cells per row and twice the bytes (K=512).
CHAIN = [((8, 16, "none", False, True), 256, 512), ((4, 32, "none", True, True), 512, 256)]
CHAIN += [((8, 16, "block", True, False), 256, 512), ((8, 32, "uniform", False, True), 512, 24)]


def rows(m=64, k=96, seed=1):
    """Activation rows with the edge cases: an all-zero row, an all-zero block, a wide row."""
    x = np.random.default_rng(seed).standard_normal((m, k)).astype(np.float32)
    x[3] = 0.0  # an all-zero row: scale 0
    x[5, :16] = 0.0  # an all-zero block
    x[7] *= 1e4  # a wide one
    return x
