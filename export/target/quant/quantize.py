"""Weight-only quantization in ONNX Runtime's MatMulNBits layout: int4 (asymmetric, per block) and
int8 (symmetric, per block: GGUF's Q8_0)."""

from __future__ import annotations

import numpy as np


def _blocks(w_out_in: np.ndarray, block_size: int, what: str) -> np.ndarray:
    """[N, K] -> [N, K/bs, bs] float32 blocks along the input dimension."""
    w = np.asarray(w_out_in, np.float32)
    n_out, n_in = w.shape
    if n_in % block_size:
        raise ValueError(f"{what} needs the input dim ({n_in}) to be a multiple of block_size={block_size}")
    return w.reshape(n_out, n_in // block_size, block_size)


def quantize_int4(w_out_in: np.ndarray, block_size: int = 32) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Quantize a linear weight [N=out, K=in] for MatMulNBits (bits=4, with zero points).

    Per block of `block_size` input weights (range widened to include 0, so the zero point is a
    valid code): scale = (max - min) / 15, zp = round(-min / scale), q = clip(round(w / scale) + zp,
    0, 15). Asymmetric blocks matter here: the default model's weights come from a Q4_1 GGUF
    (asymmetric blocks of 32); a symmetric requantization of them lost enough to make the model
    loop on simple prompts. Returns (packed [N, K/bs, bs/2] uint8, low nibble first; scales
    [N, K/bs] float32; zero points [N * ceil((K/bs)/2)] uint8, two per byte, low nibble first;
    dequantized [N, K] float32 = the weights the kernel really multiplies by).
    """
    blocks = _blocks(w_out_in, block_size, "int4")  # [N, nb, bs]
    n_out, nb, _ = blocks.shape
    n_in = nb * block_size
    lo = np.minimum(blocks.min(axis=-1, keepdims=True), 0.0)
    hi = np.maximum(blocks.max(axis=-1, keepdims=True), 0.0)
    scales = (hi - lo) / 15.0
    scales[scales == 0] = 1.0  # an all-zero block
    zp = np.clip(np.rint(-lo / scales), 0, 15)  # [N, nb, 1]
    q = np.clip(np.rint(blocks / scales) + zp, 0, 15).astype(np.uint8)  # [N, nb, bs]
    packed = (q[..., 0::2] | (q[..., 1::2] << 4)).astype(np.uint8)  # [N, nb, bs/2]
    deq = ((q.astype(np.float32) - zp) * scales).reshape(n_out, n_in)
    zp_codes = zp[..., 0].astype(np.uint8)  # [N, nb]
    if nb % 2:
        zp_codes = np.concatenate([zp_codes, np.zeros((n_out, 1), np.uint8)], axis=1)
    zp_packed = (zp_codes[:, 0::2] | (zp_codes[:, 1::2] << 4)).astype(np.uint8).reshape(-1)
    return packed, scales[..., 0].astype(np.float32), zp_packed, deq


def quantize_int8(w_out_in: np.ndarray, block_size: int = 32) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Quantize a linear weight [N=out, K=in] for MatMulNBits with bits=8, symmetric per block:
    scale = max|w| / 127, q = round(w / scale) in [-127, 127], stored as q + 128 with zero point 128.
    This is GGUF's Q8_0 (blocks of 32, one scale each), so a Q8_0 tensor comes back unchanged.
    Returns (codes [N, K/bs, bs] uint8, scales [N, K/bs] float32, zero points [N * K/bs] uint8,
    dequantized [N, K] float32)."""
    blocks = _blocks(w_out_in, block_size, "int8")  # [N, nb, bs]
    scales = np.abs(blocks).max(axis=-1) / 127.0  # [N, nb]
    scales[scales == 0] = 1.0  # an all-zero block
    q = np.clip(np.rint(blocks / scales[..., None]), -127, 127)  # [N, nb, bs]
    deq = (q * scales[..., None]).reshape(len(blocks), -1).astype(np.float32)
    zp = np.full(scales.size, 128, np.uint8)
    return (q + 128).astype(np.uint8), scales.astype(np.float32), zp, deq
