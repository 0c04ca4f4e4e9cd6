"""Sampling settings and the primitives drafters and verification share: the repetition penalty,
the processed distribution (temperature, top-k, top-p) and one draw from it. p (target) and q
(draft) always go through the same processing, which is what keeps rejection sampling exact.
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
    repetition_penalty: float = 1.0  # > 1 discourages tokens already in the context (CTRL rule:
    #                                  positive logits divided by it, negative ones multiplied); 1 = off
    typical_epsilon: float = 0.0  # > 0: LOSSY typical acceptance with this threshold (Medusa uses 0.09)

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0

    def check(self) -> None:
        if self.temperature < 0 or self.top_k < 0 or not 0 < self.top_p <= 1:
            raise ValueError(f"bad sampling settings {self}: need temperature >= 0, top_k >= 0, 0 < top_p <= 1")
        if self.repetition_penalty <= 0 or not 0 <= self.typical_epsilon < 1:
            raise ValueError(f"bad sampling settings {self}: need repetition_penalty > 0 and "
                             "0 <= typical_epsilon < 1")


def penalize(logits: np.ndarray, tokens: np.ndarray, n: int, penalty: float) -> np.ndarray:
    """Repetition penalty on verify rows: row i [m+1, V] predicts tokens[n + i] and its context is
    tokens[:n + i] (the pending token and the drafts before it included). Returns a new array."""
    out = logits.copy()
    seen = np.zeros(out.shape[-1], bool)
    seen[tokens[:n]] = True
    for i in range(len(out)):
        if i:
            seen[tokens[n + i - 1]] = True
        ids = np.flatnonzero(seen)
        row = out[i, ids]
        out[i, ids] = np.where(row > 0, row / penalty, row * penalty)
    return out


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


