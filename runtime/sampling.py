"""Sampling settings and the primitives drafters and verification share: the repetition penalty,
the processed distribution (temperature, top-k, top-p) and one draw from it. p (target) and q
(draft) always go through the same processing, which is what keeps rejection sampling exact.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass, field

import numpy as np

# temperatures below this decode greedily, the limit they approach: dividing logits by 5e-324 overflows
# every row to +-inf (noise), and at 1e-5 a logit gap of 1e-3 already gives odds of e^-100
GREEDY_BELOW = 1e-5


@dataclass(frozen=True)
class SamplingConfig:
    """A generation's sampling settings; a field with a "help" is a flag of `edgespec generate` with
    that default (edgespec/cli_fields.py)."""

    temperature: float = field(  # 0 (or below GREEDY_BELOW) = greedy (argmax); else divides logits before softmax
        default=0.0, metadata={"help": f"0 = greedy (default; so is anything below {GREEDY_BELOW:g})"}
    )
    top_k: int = field(  # keep the k most likely tokens (0 = off)
        default=0, metadata={"help": "keep the k most likely tokens (default 0 = off)"}
    )
    top_p: float = field(  # keep the smallest set with this much probability mass (1 = off)
        default=1.0, metadata={"help": "keep the smallest set of tokens with this much probability (default 1 = off)"}
    )
    seed: int | None = field(  # RNG seed: same seed and request, same output, whatever the drafter (KeyedDraws)
        default=None,
        metadata={
            "help": "sampling seed: the same seed and request, the same output, whatever the drafter or what it "
            "remembers (default: a fresh one)"
        },
    )
    repetition_penalty: float = field(  # > 1 discourages tokens already in the context (CTRL rule:
        #                                 positive logits divided by it, negative ones multiplied); 1 = off
        default=1.0,
        metadata={"help": "> 1 discourages repeating context tokens (same rule for draft and target; default 1 = off)"},
    )
    typical_epsilon: float = field(  # > 0: LOSSY typical acceptance with this threshold (0.09 in its paper)
        default=0.0,
        metadata={
            "help": "LOSSY typical acceptance with this threshold, e.g. 0.09; sampling only. "
            "Default 0: exact rejection sampling (output follows the target's distribution)"
        },
    )
    masked: bool = False  # a grammar masks the target's logits (constrain.py): what follows a row need not
    #                       be its argmax (set by the generator for its drafter)

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_BELOW

    @property
    def keyed(self) -> bool:
        """Are this call's draws keyed by position (KeyedDraws)? Seeded exact sampling: yes."""
        return not self.greedy and self.seed is not None and not self.typical_epsilon

    def check(self) -> None:
        """Refuse settings that would sample garbage silently (nan compares False everywhere)."""
        for name in ("temperature", "top_p", "repetition_penalty", "typical_epsilon"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise ValueError(f"{name}={value!r}: must be a finite number")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int):
            raise ValueError(f"top_k={self.top_k!r}: must be an integer (0 = off)")
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, (int, np.integer))):
            raise ValueError(f"seed={self.seed!r}: must be a whole number >= 0")
        if self.seed is not None and self.seed < 0:
            raise ValueError(f"seed={self.seed}: must be >= 0")
        if self.temperature < 0:
            raise ValueError(f"temperature={self.temperature}: must be >= 0 (0 = greedy)")
        if self.top_k < 0:
            raise ValueError(f"top_k={self.top_k}: must be >= 0 (0 = off)")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p={self.top_p}: must be in (0, 1] (1 = off)")
        if self.repetition_penalty <= 0:
            raise ValueError(f"repetition_penalty={self.repetition_penalty}: must be > 0 (1 = off)")
        if not 0 <= self.typical_epsilon < 1:
            raise ValueError(f"typical_epsilon={self.typical_epsilon}: must be in [0, 1) (0 = exact sampling)")


def check_max_new_tokens(n) -> None:
    """max_new_tokens must be a whole number >= 1 (0 or less used to generate one token anyway)."""
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
        raise ValueError(f"max_new_tokens={n!r}: must be an integer >= 1")


def penalize(logits: np.ndarray, tokens: np.ndarray, n: int, penalty: float) -> np.ndarray:
    """Repetition penalty on verify rows: row i [m+1, V] predicts tokens[n + i] and its context is
    tokens[:n + i] (the pending token and the drafts before it included). Returns a new float64
    array (in float32 a logit near its range would overflow to +-inf, and a row of -inf has no
    distribution)."""
    out = logits.astype(np.float64)
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
    mx = x.max(axis=-1, keepdims=True)
    if np.isposinf(mx).any():  # an overflowed logit (e.g. a huge one over a penalty < 1): it takes the mass
        x = np.where(np.isposinf(mx), np.where(np.isposinf(x), 0.0, -np.inf), x)
        mx = np.where(np.isposinf(mx), 0.0, mx)
    x -= mx
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


FLOAT32_MAX = float(np.finfo(np.float32).max)
BLOCK = 256  # tokens per block of a draw: a row's block sums, then one block's running sum, not a 49k cumsum


_GOLDEN = np.uint64(0x9E3779B97F4A7C15)  # SplitMix64's stream increment (2^64 / golden ratio)
_MIX1, _MIX2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)  # its finalizer's constants
_S30, _S27, _S31, _S11 = (np.uint64(s) for s in (30, 27, 31, 11))


def _splitmix(z: np.ndarray) -> np.ndarray:
    """SplitMix64's finalizer over uint64 z, in place (multiplication wraps mod 2^64): a bijection
    that scatters consecutive inputs over all 64 bits."""
    z ^= z >> _S30
    z *= _MIX1
    z ^= z >> _S27
    z *= _MIX2
    z ^= z >> _S31
    return z


class KeyedDraws:
    """A seeded call's draws, keyed by sequence position (in place of a np.random.Generator): the token
    at position j is argmax_x w_j(x) / E_j(x), w_j the row's processed weights and E_j(x) iid Exp(1)
    keyed by (seed, j, x) alone (the exponential race, Gumbel-max's twin: an exact draw from w_j's
    distribution). Verification keeps a draft iff it is that token, so the output follows from the
    seed, the request and the target only, never from the drafter, its memory, k, trees or timing,
    and a seeded speculative call equals the seeded plain one token for token. A drafter with a
    distribution q draws its draft for position j with the same clocks (`pick`, `pick_among`): the
    draft is then an exact draw from q that agrees with the target's token wherever q is close to p
    (a coupled draw: kept about as often as rejection sampling keeps a draft from q), and a
    deterministic draft is kept with probability p(x), as rejection sampling keeps it.

    The race runs in two rounds over blocks of BLOCK tokens, so a draw reads one block's clocks, not
    one per vocabulary entry (49k exponentials cost 0.4 ms a position on a Zen 4 core, the two rounds
    0.07 ms): block b's clock E_j(b) / W_j(b) (W the block's weight) picks the block, then its tokens
    race on their own clocks.
    The first finisher of all tokens is in block b with chance W(b) / W and is token x of it with
    chance w(x) / W(b) (a race's winner is independent of when it finishes), so the draw stays exact.
    Clocks are Exp(1) from a counter-based hash of (seed, position, index), nothing kept between draws."""

    def __init__(self, seed: int) -> None:
        self.seed = int(seed)
        self.base = 0  # the position a verify call's row 0 (and draft 0) stands for (set by the loop: seq.n)
        self.rng = np.random.default_rng(seed)  # for anything else that draws (never the output)
        self._key = _splitmix(np.array([self.seed & 0xFFFFFFFFFFFFFFFF], np.uint64) + _GOLDEN)  # [1]
        self._pos = np.zeros(1, np.uint64)  # scratch: a position's stream key
        self._idx = np.zeros(0, np.uint64)  # [V + nb] clock indices: token ids, then vocab + block
        self._z = np.zeros(0, np.uint64)  # scratch: the hash of each clock drawn
        self._e = np.zeros(0)  # scratch: the clocks (float64 Exp(1))
        self._starts = np.zeros(0, np.intp)  # [nb] each block's first token
        self._blocks = np.zeros(0)  # [nb] scratch: a row's block sums when the caller has none
        self._score = np.zeros(0)  # scratch: weight / clock
        self._in_ids, self._in_blk = None, np.zeros(0, np.int64)  # pick_in's last ids and their blocks

    def random(self) -> float:
        return self.rng.random()

    def clocks(self, offset: int, idx: np.ndarray) -> np.ndarray:
        """Exp(1) clocks [len(idx)] of position base + offset at indices idx (uint64: a token id, or
        vocab + b for block b), from (seed, position, index) alone; a view of scratch, valid until
        the next call."""
        n = len(idx)
        if len(self._z) < n:
            self._z, self._e, self._score = np.zeros(n, np.uint64), np.zeros(n), np.zeros(n)
        key = self._pos
        key[0] = self.base + offset
        key *= _GOLDEN
        key ^= self._key
        _splitmix(key)  # the position's stream
        z = self._z[:n]
        np.add(idx, np.uint64(1), out=z)
        z *= _GOLDEN
        z += key  # SplitMix64's state idx + 1 steps into the position's stream
        _splitmix(z)
        z >>= _S11  # 53 random bits: u = (z + 0.5) / 2^53 in (0, 1), so E = -log(u) > 0 and finite
        e = self._e[:n]
        np.add(z, 0.5, out=e)
        e *= 2.0**-53
        np.log(e, out=e)
        np.negative(e, out=e)
        return e

    def _race(self, w: np.ndarray, e: np.ndarray) -> int:
        """argmax of w / e (w >= 0, e > 0), w's first maximum: the race's first finisher."""
        score = self._score[: len(w)]
        np.divide(w, e, out=score)
        return int(score.argmax())

    def _indices(self, vocab: int) -> np.ndarray:
        """[vocab + nb] the clock indices of a vocabulary (made once per vocabulary size)."""
        nb = -(-vocab // BLOCK)
        if len(self._idx) != vocab + nb:
            self._idx = np.arange(vocab + nb, dtype=np.uint64)
            self._starts, self._blocks = np.arange(0, vocab, BLOCK), np.zeros(nb)
        return self._idx

    def pick(self, w: np.ndarray, offset: int = 0, blocks: np.ndarray | None = None) -> int:
        """The token at position base + offset from weights w [V] >= 0 (unnormalised; 0: never).
        blocks [nb]: w's sums over blocks of BLOCK tokens, if the caller has them (RowDist)."""
        vocab = len(w)
        idx = self._indices(vocab)
        if blocks is None:
            blocks = np.add.reduceat(w, self._starts, dtype=np.float64, out=self._blocks)
        b = self._race(blocks, self.clocks(offset, idx[vocab:]))
        lo, hi = b * BLOCK, min((b + 1) * BLOCK, vocab)
        return lo + self._race(w[lo:hi], self.clocks(offset, idx[lo:hi]))

    def pick_in(self, ids: np.ndarray, w: np.ndarray, offset: int, vocab: int) -> int:
        """pick() of weights w [n] >= 0 on distinct token ids [n] of a vocabulary of `vocab` tokens (a
        head's draft vocabulary and its d2t map), the other tokens' weight 0: the same two rounds as on
        the dense row (block sums by bincount), so the draft is coupled with the target's draw."""
        if self._in_ids is not ids:  # (d2t is fixed per head: its blocks are found once)
            self._in_ids, self._in_blk = ids, ids // BLOCK
        blk = self._in_blk
        idx = self._indices(vocab)
        mass = np.bincount(blk, weights=w, minlength=len(self._blocks))  # [nb]
        b = self._race(mass, self.clocks(offset, idx[vocab:]))
        mine = np.flatnonzero(blk == b)
        x = ids[mine]
        return int(x[self._race(w[mine], self.clocks(offset, x.astype(np.uint64)))])

    def pick_among(self, ids: list[int], ws: list[float], offset: int = 0, vocab: int = 0) -> int:
        """pick_in() of a few candidates: weights ws >= 0 on token ids (-1: none; a recycled row's
        candidates); where no candidate has weight, the first one."""
        kept = [(x, w) for x, w in zip(ids, ws, strict=True) if x >= 0 and w > 0.0]
        if not kept:
            return next(x for x in ids if x >= 0)
        xs, wx = zip(*kept, strict=True)
        return self.pick_in(np.array(xs, np.int64), np.array(wx), offset, vocab)


def sample(p: np.ndarray, rng: np.random.Generator | KeyedDraws, offset: int = 0) -> int:
    """One draw from p [V] (unnormalised weights >= 0 will do) by inverse CDF over blocks of BLOCK
    tokens: one uniform, the block sums' running sum, then one block's (no 49k-wide cumsum). A
    KeyedDraws rng: its draw for position base + offset (a drafter passes its draft's index)."""
    if isinstance(rng, KeyedDraws):
        return rng.pick(p, offset)
    blocks = np.add.reduceat(p, np.arange(0, len(p), BLOCK))
    return _draw(p, np.cumsum(blocks, dtype=np.float64), rng.random())


def _draw(w: np.ndarray, cum: np.ndarray, u: float) -> int:
    """The token of weights w [V] at fraction u in [0, 1) of their total, cum [nb] the running sum of
    w's block sums. A token with zero weight is never drawn, even where rounding puts u * total past
    the last block's or token's running sum (the last one with weight is taken then)."""
    v = u * cum[-1]
    b = int(np.searchsorted(cum, v, side="right"))
    if b >= len(cum):
        b = int(np.searchsorted(cum, cum[-1]))
    lo = b * BLOCK
    seg = np.cumsum(w[lo : lo + BLOCK], dtype=np.float64)  # [<= BLOCK]
    i = int(np.searchsorted(seg, v - (cum[b - 1] if b else 0.0), side="right"))
    if i >= len(seg):
        i = int(np.searchsorted(seg, seg[-1]))
    return lo + i


class RowDist:
    """One row's processed distribution as the verify walk and a plain draw read it: unnormalised
    float32 weights w = exp((logits - max) / temperature), their block sums and total, written into
    buffers that live as long as the workspace (no allocation per token). Rows are loaded one at a
    time, as the walk reaches them: a rejected draft's row is the last one processed. Settings with
    top-k / top-p, or a row with an infinite logit, go through probs() (float64) first."""

    def __init__(self, vocab: int) -> None:
        self.w = np.zeros(vocab, np.float32)  # [V] the loaded row's weights (zeroed tokens: removed)
        self.starts = np.arange(0, vocab, BLOCK)  # [nb] first token of each block
        self.blocks = np.zeros(len(self.starts), np.float32)  # [nb] each block's sum of w
        self.cum = np.zeros(len(self.starts))  # [nb] their running sum (float64); cum[-1] the total
        self.total = 0.0  # sum of w: p(x) = w[x] / total (the walk tests u * total < w[x])

    def load(self, logits: np.ndarray, cfg: SamplingConfig) -> RowDist:
        """The distribution of one row of logits [V] (float32 from an engine, float64 once penalised)."""
        w, scale = self.w, 1.0 / cfg.temperature
        mx = logits.max()
        if cfg.top_k or cfg.top_p < 1.0 or not np.isfinite(mx) or scale > FLOAT32_MAX:
            np.copyto(w, probs(logits, cfg), casting="same_kind")
        else:  # one pass per operation, in place: the row's shift, scale and exp
            with np.errstate(over="ignore"):  # a logit ~1e38 below the max: -inf, weight 0
                np.subtract(logits, mx, out=w, casting="same_kind")
                np.multiply(w, np.float32(scale), out=w)
            np.exp(w, out=w)
        np.add.reduceat(w, self.starts, out=self.blocks)
        np.cumsum(self.blocks, dtype=np.float64, out=self.cum)
        self.total = float(self.cum[-1])
        return self

    def remove(self, x: int) -> None:
        """Zero token x's weight (a rejected candidate): what is left is p with x's mass taken out,
        renormalised implicitly by the smaller total. Its block is summed again, not decremented, so a
        block whose tokens are all removed is exactly 0."""
        if self.w[x] == 0.0:
            return
        self.w[x] = 0.0
        b = x // BLOCK
        self.blocks[b] = self.w[b * BLOCK : (b + 1) * BLOCK].sum()
        np.cumsum(self.blocks, dtype=np.float64, out=self.cum)
        self.total = float(self.cum[-1])

    def subtract(self, ids: list[int], qs: list[float]) -> None:
        """w := max(0, w - q * total) over q's tokens ids (-1: none), q a distribution: what is left is
        the residual max(0, p - q) of a rejected draft drawn from q, scaled by the old total. The blocks
        touched are summed again."""
        w, total, touched = self.w, self.total, set()
        for x, q in zip(ids, qs, strict=True):
            if x >= 0 and q > 0.0:
                w[x] = max(0.0, float(w[x]) - q * total)
                touched.add(x // BLOCK)
        for b in touched:
            self.blocks[b] = w[b * BLOCK : (b + 1) * BLOCK].sum()
        np.cumsum(self.blocks, dtype=np.float64, out=self.cum)
        self.total = float(self.cum[-1])

    def draw(self, rng: np.random.Generator) -> int:
        """One token from what is loaded (total must be > 0)."""
        return _draw(self.w, self.cum, rng.random())


_LOCAL = threading.local()


def row_dist(vocab: int) -> RowDist:
    """This thread's RowDist for a vocabulary size (made once, then reused: one row at a time)."""
    cache = _LOCAL.__dict__.setdefault("dists", {})
    d = cache.get(vocab)
    if d is None:
        d = cache[vocab] = RowDist(vocab)
    return d
