"""edgespec's exact attention op, RowAttention (engines/rowop/attention.h has the arithmetic): a call's
query rows against the cache window and the call's new keys, each row's float32 operations fixed by
the positions of its keys alone, so its bits do not depend on the call's width, the other rows, tree
against chain, or the instruction-set path.

- `reference()`: the same semantics in float64 (NumPy), for tolerance checks, of a `Call` (the op's
  inputs and attributes);
- `run()`: the library's op on one thread with a named path, without ONNX Runtime (tests, benches);
  with a float16 cache (past_key / past_value of dtype float16) the op's half-cache form: the window
  read as fp16 and the call's new keys and values rounded to fp16 first, so its result is the float
  op's over those rounded values (`round_half`), bit for bit;
- `round_half()`: the op's fp32 -> fp16 rounding (round to nearest even, numpy's astype).
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

import numpy as np

from edgespec.engines.rowop.build import RowopUnavailable
from edgespec.engines.rowop.native import load

OP_TYPE = "RowAttention"  # in rowop.DOMAIN, beside RowMatMul
QKV_OP_TYPE = "RowQkvAttention"  # the same over a packed qkv row, split and rotated (RoPE) in the op
SWIGLU_OP_TYPE = "RowSwiGLU"  # the gated MLP's (g / (1 + exp(-g))) * u over the packed gate/up row


def new_keys(t_len: int, tree_mask: np.ndarray | None) -> list[list[int]]:
    """Each row's new keys in logical order: its ancestors by depth (ties by index), then itself; a
    chain (no mask): 0..t."""
    if tree_mask is None:
        return [list(range(t + 1)) for t in range(t_len)]
    m = np.asarray(tree_mask).reshape(t_len, t_len) != 0
    depth = [int(m[c].sum() - m[c, c]) for c in range(t_len)]
    out = []
    for t in range(t_len):
        out.append(sorted((c for c in range(t_len) if c != t and m[t, c]), key=lambda c: (depth[c], c)) + [t])
    return out


def rotate(x: np.ndarray, cos: np.ndarray, sin: np.ndarray, head_dim: int) -> np.ndarray:
    """RowQkvAttention's rotation of rows x [T, heads*D] by cos/sin rows [T, D/2], in its float32
    operations: y = x cos - rot(x) sin per element (halves, no fused multiply-add)."""
    x = np.asarray(x, np.float32).reshape(len(x), -1, head_dim)
    half = head_dim // 2
    a, b = x[..., :half], x[..., half:]
    c, s = np.asarray(cos, np.float32)[:, None], np.asarray(sin, np.float32)[:, None]
    return np.concatenate([a * c - b * s, b * c + a * s], axis=-1).reshape(len(x), -1)


@dataclass(frozen=True)
class Call:
    """One call of the op: its new rows, the cache window it reads and the heads' shape (the arguments
    of reference() and run(), in this order)."""

    q: np.ndarray  # [T, Hq*D] the new rows' queries
    k: np.ndarray  # [T, Hkv*D] their keys
    v: np.ndarray  # [T, Hkv*D] their values
    past_key: np.ndarray  # [S, Hkv*D] the window's keys (float32, or float16: the half-cache form)
    past_value: np.ndarray  # [S, Hkv*D] its values
    past_len: int  # cached positions [0, past_len) of the window
    n_heads: int  # query heads Hq
    kv_heads: int  # kv heads Hkv
    head_dim: int  # D
    scale: float  # scores are q k * scale
    window: int = 0  # 0: none; else a row at position p sees positions > p - window
    tree_mask: np.ndarray | None = None  # [T, T], 1 where column node c is row node t or an ancestor; None: a chain


def reference(*args, **kwargs) -> np.ndarray:
    """[T, Hq*D] float64 of the call Call(*args, **kwargs): row t, head h sees the cached positions
    [lo, past_len) and its new keys at past_len + i (lo = 0, or its position - window + 1),
    softmax(q k * scale) v."""
    c = Call(*args, **kwargs)
    d, past_len = c.head_dim, c.past_len
    q = np.asarray(c.q, np.float64).reshape(-1, c.n_heads, d)
    t_len = len(q)
    k = np.asarray(c.k, np.float64).reshape(t_len, c.kv_heads, d)
    v = np.asarray(c.v, np.float64).reshape(t_len, c.kv_heads, d)
    kc = np.asarray(c.past_key, np.float64).reshape(-1, c.kv_heads, d)[:past_len]
    vc = np.asarray(c.past_value, np.float64).reshape(-1, c.kv_heads, d)[:past_len]
    out = np.zeros((t_len, c.n_heads, d))
    g = c.n_heads // c.kv_heads
    for t, keys in enumerate(new_keys(t_len, c.tree_mask)):
        pos = past_len + len(keys) - 1
        lo = max(0, pos - c.window + 1) if c.window else 0
        kk = np.concatenate([kc, k[keys]])[lo:]  # [n, Hkv, D] positions lo .. pos
        vv = np.concatenate([vc, v[keys]])[lo:]
        for h in range(c.n_heads):
            s = kk[:, h // g] @ q[t, h] * c.scale
            p = np.exp(s - s.max())
            out[t, h] = p @ vv[:, h // g] / p.sum()
    return out.reshape(t_len, c.n_heads * d)


def run(path: str, *args, rows_per_task: int = 0, **kwargs) -> np.ndarray:
    """[T, Hq*D] float32: the op on one thread with the named path (rowop.PATHS) for the call
    Call(*args, **kwargs), in tasks of rows_per_task query rows of a kv head (0: the op's choice). A
    float16 past_key / past_value: the half-cache form."""
    c = Call(*args, **kwargs)
    half = np.asarray(c.past_key).dtype == np.float16
    cache = np.float16 if half else np.float32
    f = [np.ascontiguousarray(a, np.float32) for a in (c.q, c.k, c.v)]
    f += [np.ascontiguousarray(a, cache) for a in (c.past_key, c.past_value)]
    t_len = f[0].size // (c.n_heads * c.head_dim)
    s = f[3].size // (c.kv_heads * c.head_dim)
    mask = None if c.tree_mask is None else np.ascontiguousarray(c.tree_mask, np.int64).reshape(t_len, t_len)
    out = np.empty((t_len, c.n_heads * c.head_dim), np.float32)
    dims = np.array([t_len, c.n_heads, c.kv_heads, c.head_dim, s, c.past_len, c.window], np.int64)
    fn = load().edgespec_rowop_attention
    fn.argtypes = [ctypes.c_char_p, ctypes.c_void_p, ctypes.c_float] + [ctypes.c_void_p] * 6
    fn.argtypes += [ctypes.c_int64, ctypes.c_void_p, ctypes.c_int]
    ptrs = [a.ctypes.data for a in f] + [None if mask is None else mask.ctypes.data]
    if fn(path.encode(), dims.ctypes.data, c.scale, *ptrs, rows_per_task, out.ctypes.data, int(half)):
        raise RowopUnavailable(f"rowop path {path!r} does not run on this CPU (or bad shapes)")
    return out


def round_half(x: np.ndarray) -> np.ndarray:
    """x (float32) rounded to float16 as the op rounds a half cache's new rows (the library's code)."""
    x = np.ascontiguousarray(x, np.float32)
    out = np.empty(x.shape, np.float16)
    fn = load().edgespec_rowop_round_half
    fn.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p]
    fn(x.ctypes.data, x.size, out.ctypes.data)
    return out
