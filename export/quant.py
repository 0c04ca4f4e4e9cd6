"""Weight-only int4 quantization in ONNX Runtime's MatMulNBits layout (symmetric, per block)."""

from __future__ import annotations

import numpy as np


def quantize_int4(w_out_in: np.ndarray, block_size: int = 32) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Quantize a linear weight [N=out, K=in] for MatMulNBits (bits=4, no zero points).

    Per block of `block_size` input weights: scale = w_extreme / -8 (the signed value of largest
    magnitude lands exactly on -8), q = clip(round(w / scale), -8, 7) + 8, two 4-bit codes a byte,
    low nibble first. Returns (packed [N, K/bs, bs/2] uint8, scales [N, K/bs] float32,
    dequantized [N, K] float32: the weights the kernel really multiplies by).
    """
    w = np.asarray(w_out_in, np.float32)
    n_out, n_in = w.shape
    if n_in % block_size:
        raise ValueError(f"int4 needs the input dim ({n_in}) to be a multiple of block_size={block_size}")
    blocks = w.reshape(n_out, n_in // block_size, block_size)  # [N, nb, bs]
    idx = np.abs(blocks).argmax(axis=-1)[..., None]
    extreme = np.take_along_axis(blocks, idx, axis=-1)  # [N, nb, 1], signed
    scales = extreme / -8.0
    scales[scales == 0] = 1.0  # an all-zero block: any scale gives q = 8 -> 0
    q = np.clip(np.rint(blocks / scales), -8, 7).astype(np.int8) + 8  # [N, nb, bs] in 0..15
    q = q.astype(np.uint8)
    packed = (q[..., 0::2] | (q[..., 1::2] << 4)).astype(np.uint8)  # [N, nb, bs/2]
    deq = ((q.astype(np.float32) - 8.0) * scales).reshape(n_out, n_in)
    return packed, scales[..., 0].astype(np.float32), deq
