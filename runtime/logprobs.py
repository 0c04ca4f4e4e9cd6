"""Log-probabilities of the emitted tokens (OpenAI's logprobs / top_logprobs), read from the rows the
verify calls already computed: no extra model call, and the same values plain decoding gives.

`TokenLogprobs` wraps a call's output constraint (constraint.py): the loop hands it every row it
accepts from (the prompt's last row for the first token, then each verify call's rows), so it sees
the logits before a grammar masks them in place, and it records, per emitted token, its log-
probability and the `top` most likely tokens there. Which distribution:

  greedy     the target's own: log_softmax of the row (its log-sum-exp summed in float64)
  sampling   the one the token is drawn from, as OpenAI defines it: after the repetition penalty,
             temperature, top-k and top-p (sampling.probs); a token they cut has log(0), written
             as -9999.0 (OpenAI's floor)

A grammar's mask is not applied: these are the model's probabilities, so a token the grammar forced
can be unlikely. A row's values depend only on the row's logits, so plain decoding and every drafter
give the same bits wherever the target computes the same row bits for a token (CPU fp32 and the
export's two-row matmuls: decode rows equal verify rows, prefill.decode_rows_match_verify_rows).
"""

from __future__ import annotations

import numpy as np

from edgespec.runtime.constraint import OutputConstraint
from edgespec.runtime.sampling import SamplingConfig, penalize, probs

MAX_TOP = 8  # top_logprobs at most (the graphs' top-k; OpenAI takes up to 20, llama.cpp any)
FLOOR = -9999.0  # a log-probability of 0 (a token the sampling settings cut), as OpenAI writes it


class TokenLogprobs:
    """An output constraint that records the log-probabilities of the tokens `inner` chooses.
    Everything but first / accept / needs_logits is inner's (its counters, its shaping)."""

    def __init__(self, inner: OutputConstraint, top: int) -> None:
        self.inner, self.top = inner, top
        self.copies = type(inner).accept is not OutputConstraint.accept  # a grammar masks the rows in place
        self.ids: list[int] = []  # each chosen token, in order (a step may choose more than the loop emits)
        self.logprobs: list[float] = []  # its log-probability
        self.top_ids: list[list[int]] = []  # the `top` most likely tokens at its row, most likely first
        self.top_logprobs: list[list[float]] = []  # their log-probabilities

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def needs_logits(self, sampling: SamplingConfig) -> bool:
        return True  # the rows' logits are what this reads

    def first(self, logits: np.ndarray, sampling: SamplingConfig, rng) -> int:
        row = np.array(logits[None], copy=True)  # (already penalised by the prefill)
        tok = self.inner.first(logits, sampling, rng)
        self._record(row, [tok], sampling)
        return tok

    def accept(self, prop, tgt_logits: np.ndarray, seq, sampling: SamplingConfig, rng) -> tuple[int, int]:
        rows_in = tgt_logits.copy() if self.copies else tgt_logits
        n_acc, nxt = self.inner.accept(prop, tgt_logits, seq, sampling, rng)
        picked = prop.rows()
        rows = rows_in[: n_acc + 1] if picked is None else rows_in[picked[: n_acc + 1]]
        if sampling.repetition_penalty != 1.0:  # row i's context: tokens[:n + i], the kept tokens in place
            rows = penalize(rows, seq.tokens, seq.n, sampling.repetition_penalty)
        self._record(rows, [*seq.tokens[seq.n : seq.n + n_acc].tolist(), nxt], sampling)
        return n_acc, nxt

    def _record(self, rows: np.ndarray, toks: list[int], sampling: SamplingConfig) -> None:
        """The log-probabilities of toks[i] at rows[i] [n, V], and each row's top ones. Greedy reads
        each row in two passes (its blocks' maxima, the exp-sum in the row's own precision summed in
        float64): only the tokens shown get a value, not the whole vocabulary."""
        top = self.top
        for i, t in enumerate(toks):
            row = rows[i]
            if not sampling.greedy:  # the processed distribution's logs (float64)
                with np.errstate(divide="ignore"):
                    row = np.log(probs(row, sampling))
            peaks = np.maximum.reduceat(row, _starts(len(row)))  # [V / BLOCK] each block's max
            mx = peaks.max()
            lse = float(mx) + float(np.log(np.exp(row - mx).sum(dtype=np.float64))) if sampling.greedy else 0.0
            self.ids.append(int(t))
            self.logprobs.append(_finite(float(row[t]) - lse))
            best = _top(row, peaks, top)
            self.top_ids.append(best.tolist())
            self.top_logprobs.append([_finite(float(row[j]) - lse) for j in best])


BLOCK = 256  # tokens per block: the top k lie in the k blocks with the largest maxima


def _starts(vocab: int) -> np.ndarray:
    return np.arange(0, vocab, BLOCK)


def _top(row: np.ndarray, peaks: np.ndarray, k: int) -> np.ndarray:
    """The k largest entries' ids of row [V], largest first, ties by id. A block holding one of them
    has a maximum at least the k-th largest value, so they lie in the blocks whose maxima reach the
    k-th largest maximum: the partition runs over those (about k * BLOCK entries), not the vocabulary."""
    if not k:
        return np.zeros(0, np.int64)
    kb = min(k, len(peaks))
    blocks = np.flatnonzero(peaks >= np.partition(peaks, len(peaks) - kb)[len(peaks) - kb])
    ids = (blocks[:, None] * BLOCK + np.arange(BLOCK)).ravel()  # ascending
    ids = ids[ids < len(row)]
    vals = row[ids]
    k = min(k, len(ids))
    kth = np.partition(vals, len(vals) - k)[len(vals) - k]
    above, tied = ids[vals > kth], ids[vals == kth]
    best = np.concatenate([above, tied[: k - len(above)]])  # ties: the lowest ids
    return best[np.lexsort((best, -row[best]))]  # most likely first, ties by id


def _finite(v) -> float:
    return float(v) if np.isfinite(v) else FLOOR
