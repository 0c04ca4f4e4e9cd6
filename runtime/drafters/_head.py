"""What the head drafters share: picking a token from a head's logits over its draft vocabulary
(greedy, or sampled with its q), the confidence that cuts a chain, and growing trees from such
logits.

They draft from the target's final-norm hidden state of every position (`tgt_features` [slots, H],
the generator's runtime.state.TargetRows), current after prefill and every verify whatever the
drafter, so a drafter switch finds it ready.
"""

from __future__ import annotations

import numpy as np

from edgespec.runtime.drafters.base import Drafter, DrafterPlugin, Option, penalized
from edgespec.runtime.sampling import KeyedDraws, probs, sample
from edgespec.runtime.state import SeqState

# chain cut-off on the head's path probability (the product of its confidences so far): a verify
# row costs a good part of a decode on a CPU, so rows unlikely to be kept do not pay
MIN_CONFIDENCE = 0.25

MIN_CONFIDENCE_OPTION = Option(
    "eagle_min_confidence",
    float,
    None,
    "eagle/hybrid (and the other chain-cutting head drafters): stop a draft "
    "chain when the head's own probability of the chain so far (the product of its per-token probabilities) is "
    f"below this (default: the folder's, else {MIN_CONFIDENCE})",
    fallback=MIN_CONFIDENCE,
)


class ChainHeadPlugin(DrafterPlugin):
    """The plugin of a head drafter whose chains the shared cut-off stops (eagle, eagle3, dflash):
    hybrid may pair it with a lookup, and a drafted token costs about a tenth of a decode."""

    draft_cost = 0.1
    pairs = True
    options = (MIN_CONFIDENCE_OPTION,)


class HeadDrafter(Drafter):
    """A drafter over a head's logits on a draft vocabulary, mapped to target ids by d2t."""

    drafts_trees = True

    def __init__(self, d2t: np.ndarray, target_vocab: int, min_confidence: float, n_rows: int) -> None:
        super().__init__()
        self.d2t = d2t
        # stop the chain once the head's own probability falls below this (EAGLE-2's observation:
        # draft confidence predicts acceptance), so the verify call stays narrow: a chain's path
        # probability (the product along the chain), or each multi-token head's own probability. Lossless
        # either way: whether position i is drafted depends only on the drafts before it.
        self.min_confidence = min_confidence
        self.track_confidence = False  # compute confidences without a cut-off too (hybrid compares them)
        self.expected = 0.0  # the last chain's sum over i of p(d_1..d_i): its expected accepted length
        self._full = np.full(target_vocab, -np.inf, np.float32)  # head logits scattered to the target vocab
        self._exp = np.zeros(len(d2t), np.float32)  # scratch for the confidence softmax (no per-step alloc)
        self._q = np.zeros((n_rows, target_vocab), np.float64)

    def _choose(self, logits: np.ndarray, seq: SeqState, i: int) -> tuple[int, float]:
        """(token, the head's confidence at draft position i: its top probability there, which
        under greedy decoding is the token's own)."""
        if self.sampling.greedy and self.sampling.repetition_penalty == 1.0:
            top = int(logits.argmax())
            conf = 1.0
            if self.min_confidence or self.track_confidence:  # p(top) = 1 / sum(exp(l - l_top))
                np.exp(np.subtract(logits, logits[top], out=self._exp), out=self._exp)
                conf = 1.0 / float(self._exp.sum())
            return int(self.d2t[top]), conf
        if self.sampling.repetition_penalty == 1.0:  # sampled: q on the draft vocabulary, 1/6 of the target's
            q = probs(logits, self.sampling)  # [Vd] (ids outside d2t have q = 0 in the target's vocabulary)
            self._q[i, self.d2t] = q  # (the row's other entries are never written: 0)
            if isinstance(self.rng, KeyedDraws):  # a seeded call: coupled to position i's draw
                tok = self.rng.pick_in(self.d2t, q, i, len(self._full))
            else:
                tok = int(self.d2t[sample(q, self.rng)])
            return tok, float(q.max())
        self._full[self.d2t] = logits  # draft vocab -> target vocab (other ids stay -inf)
        full = penalized(self._full, seq, i, self.sampling)
        if self.sampling.greedy:
            top = int(full.argmax())
            return top, 1.0 / float(np.exp(full - full[top]).sum())
        self._q[i] = probs(full, self.sampling)
        tok = sample(self._q[i], self.rng, i)  # (a seeded call: coupled to position i's draw)
        # the confidence that may cut the chain must not depend on the token just drawn: keeping
        # x only when q(x) is high would propose x from q restricted to likely tokens while
        # verification assumes q, which biases the output. The top probability depends only on
        # the drafts before it (and equals q(x) under greedy decoding).
        return tok, float(self._q[i].max())

    def _add_children(self, tree, frontier, row_of, cfg) -> list[int]:
        """One depth of a best-first tree: the top-`branch` children of each frontier node
        (row_of(u): the head's logits [Vd] for u's children), scored by path probability (the
        head's own probabilities multiplied along the path), added best first while the node
        budget lasts and the score stays >= min_score. Returns the added nodes, best first."""
        cands = []
        for u in frontier:
            row = row_of(u)
            top = np.argpartition(row, -cfg.branch)[-cfg.branch :]
            np.exp(np.subtract(row, row.max(), out=self._exp), out=self._exp)
            z = float(self._exp.sum())
            cands.extend((tree.score[u] * float(self._exp[t]) / z, u, int(self.d2t[t])) for t in top)
        cands.sort(reverse=True)
        added = []
        for score, u, tok in cands:
            if score < cfg.min_score:
                break
            c = tree.add(u, tok, score)
            if c < 0:
                break
            added.append(c)
        return added
