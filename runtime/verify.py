"""Verification: which draft tokens the target keeps, greedy or lossless sampling.

Greedy: accept while draft[i] == argmax(p_i); then the target's own token (correction, or the
bonus token when every draft token was accepted). The output equals plain greedy decoding.

Sampling (Leviathan et al. 2023; Chen et al. 2023): draft token x_i ~ q_i is kept with
probability min(1, p_i(x) / q_i(x)); at the first rejection the replacement is drawn from
norm(max(0, p_i - q_i)), and if all are kept a bonus token is drawn from p_{m}. The accepted
sequence is then distributed exactly as the target's. Deterministic drafters (n-gram) have a
one-hot q, which makes the rule "keep x with probability p(x), else sample p with x zeroed".
p and q go through the same processing: repetition penalty (over the row's own context, draft
tokens before it included), temperature, top-k, top-p.

Typical acceptance (Medusa, Cai et al. 2024) is offered as an explicit LOSSY option: a draft token
is kept when p(x) >= min(eps, sqrt(eps) * exp(-H(p))), so plausible tokens pass even where
p(x) / q(x) would reject them; the output no longer follows the target's distribution.
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
    if cfg.typical_epsilon > 0:
        return accept_typical(draft, p, cfg.typical_epsilon, rng)
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


def accept_typical(draft: np.ndarray, p: np.ndarray, eps: float, rng: np.random.Generator) -> tuple[int, int]:
    """LOSSY (opt-in): keep x_i while p_i(x_i) >= min(eps, sqrt(eps) * exp(-H(p_i))); the token after
    the kept ones is drawn from the target's p."""
    for i, x in enumerate(draft):
        row = p[i]
        nz = row[row > 0]
        entropy = float(-(nz * np.log(nz)).sum())
        if row[x] < min(eps, np.sqrt(eps) * np.exp(-entropy)):
            return i, sample(row, rng)
    return len(draft), sample(p[len(draft)], rng)
