"""Verification: which draft tokens the target keeps, greedy or lossless sampling.

Greedy: accept while draft[i] == argmax(p_i); then the target's own token (correction, or the
bonus token when every draft token was accepted). The output equals plain greedy decoding.

Sampling (Leviathan et al. 2023; Chen et al. 2023): draft token x_i ~ q_i is kept with
probability min(1, p_i(x) / q_i(x)); at the first rejection the replacement is drawn from
norm(max(0, p_i - q_i)), and if all are kept a bonus token is drawn from p_{m}. The accepted
sequence is then distributed exactly as the target's. Deterministic drafters (n-gram) have a
one-hot q, which makes the rule "keep x with probability p(x), else sample p with x zeroed".
p and q go through the same temperature / top-k / top-p processing.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class SamplingConfig:
    temperature: float = 0.0  # 0 = greedy (argmax); >0 divides logits before softmax
    top_k: int = 0  # keep the k most likely tokens (0 = off)
    top_p: float = 1.0  # keep the smallest set with this much probability mass (1 = off)
    seed: int | None = None  # RNG seed: same seed, same output

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0

    def check(self) -> None:
        if self.temperature < 0 or self.top_k < 0 or not 0 < self.top_p <= 1:
            raise ValueError(f"bad sampling settings {self}: need temperature >= 0, top_k >= 0, 0 < top_p <= 1")


def probs(logits: np.ndarray, cfg: SamplingConfig) -> np.ndarray:
    """Processed distribution(s) [..., V] from logits [..., V] (float64 for exact ratios)."""
    x = logits.astype(np.float64) / cfg.temperature
    if cfg.top_k and cfg.top_k < x.shape[-1]:
        kth = np.partition(x, -cfg.top_k, axis=-1)[..., -cfg.top_k, None]
        x = np.where(x < kth, -np.inf, x)
    x -= x.max(axis=-1, keepdims=True)
    p = np.exp(x)
    p /= p.sum(axis=-1, keepdims=True)
    if cfg.top_p < 1.0:
        order = np.argsort(-p, axis=-1)
        sorted_p = np.take_along_axis(p, order, axis=-1)
        keep_sorted = np.cumsum(sorted_p, axis=-1) - sorted_p < cfg.top_p  # always keeps the first
        keep = np.zeros_like(keep_sorted)
        np.put_along_axis(keep, order, keep_sorted, axis=-1)
        p = np.where(keep, p, 0.0)
        p /= p.sum(axis=-1, keepdims=True)
    return p


def sample(p: np.ndarray, rng: np.random.Generator) -> int:
    """One draw from p [V] by inverse CDF (one uniform, no allocation beyond the cumsum)."""
    c = np.cumsum(p)
    return int(min(np.searchsorted(c, rng.random() * c[-1], side="right"), len(p) - 1))


def accept_greedy(draft: np.ndarray, tgt_logits: np.ndarray) -> tuple[int, int]:
    """(n accepted, next token): draft [m], tgt_logits [m+1, V]."""
    tgt_ids = tgt_logits.argmax(axis=-1)  # [m+1]
    n = 0
    while n < len(draft) and draft[n] == tgt_ids[n]:
        n += 1
    return n, int(tgt_ids[n])


def accept_sampled(draft: np.ndarray, dft_probs: np.ndarray | None, tgt_logits: np.ndarray,
                   cfg: SamplingConfig, rng: np.random.Generator) -> tuple[int, int]:
    """(n accepted, next token) by rejection sampling; dft_probs [m, V] or None (one-hot q)."""
    p = probs(tgt_logits, cfg)  # [m+1, V]
    for i, x in enumerate(draft):
        q_x = 1.0 if dft_probs is None else dft_probs[i, x]
        if q_x > 0 and rng.random() * q_x < p[i, x]:  # u < p(x)/q(x), without dividing
            continue
        if dft_probs is None:  # one-hot q: max(0, p - onehot(x)) is p with x zeroed
            residual = p[i].copy()
            residual[x] = 0.0
        else:
            residual = p[i] - dft_probs[i]
        np.maximum(residual, 0.0, out=residual)
        if residual.sum() <= 0.0:  # p == q exactly: any draw from p is right
            residual = p[i]
        return i, sample(residual, rng)
    return len(draft), sample(p[len(draft)], rng)
