"""Drafters that draft from the target's own hidden states: an EAGLE head, Medusa heads, and
hybrid (prompt lookup where the context has a match, the EAGLE head elsewhere).

The generator keeps the target's final-norm hidden state of every position in a buffer
(`tgt_features` [slots, H]), current after prefill and every verify whatever the drafter, so a
drafter switch finds it ready.
"""

from __future__ import annotations

import numpy as np

from edgespec.runtime.drafters import Drafter, NgramDrafter, penalized
from edgespec.runtime.prefill import prefill
from edgespec.runtime.sampling import SamplingConfig, probs, sample
from edgespec.runtime.state import Proposal, SeqState, chain


class _HeadDrafter(Drafter):
    """What the EAGLE and Medusa drafters share: picking a token from a head's logits over the
    draft vocabulary (greedy, or sampled with its q), and growing trees from such logits."""

    drafts_trees = True

    def __init__(self, d2t: np.ndarray, target_vocab: int, min_confidence: float, n_rows: int) -> None:
        super().__init__()
        self.d2t = d2t
        # stop the chain once the head's own probability falls below this (EAGLE-2's observation:
        # draft confidence predicts acceptance), so the verify call stays narrow: EAGLE's chain
        # probability (the product along the chain), each Medusa head's own probability. Lossless
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
        self._full[self.d2t] = logits  # draft vocab -> target vocab (other ids stay -inf)
        full = penalized(self._full, seq, i, self.sampling)
        if self.sampling.greedy:
            top = int(full.argmax())
            return top, 1.0 / float(np.exp(full - full[top]).sum())
        self._q[i] = probs(full, self.sampling)
        tok = sample(self._q[i], self.rng)
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
            top = np.argpartition(row, -cfg.branch)[-cfg.branch:]
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


class EagleDrafter(_HeadDrafter):
    """EAGLE: a one-layer head drafts from the target's own features (chain).

    Head row j holds the pair (f_j, token_{j+1}), f_j = the target's hidden state at position j
    (`tgt_features`, kept current by the generator). Its output predicts f_{j+1} and so
    token_{j+2}. One step: catch up on the pairs the target has verified since the last step (one
    call, true features; its last row drafts d_1), then k-1 calls that feed the head its own
    predicted feature: (f^_{n-1}, d_1) -> d_2, ... Those speculative rows sit past `dft_past` and
    are overwritten by the next catch-up, so rejection needs no rollback work.

    Fused (`fused`: the target+head graph, which then verifies in the target's place: `verifier`):
    the verify call itself
    computes the head's rows for the pairs it verifies, taking the target's argmax as each row's
    next token, which under greedy decoding is the token that does follow every accepted row and
    the bonus row. So when greedy (no repetition penalty) and the head was caught up to the call's
    past_len, the committed rows catch it up and the bonus row's head logits are d_1: no head
    call for d_1. Otherwise (sampling; a prefix the head had not caught up to) the catch-up call
    runs as without fusion, so output never depends on it.
    """

    name = "eagle"

    def __init__(self, head, tgt_features: np.ndarray, target_vocab: int, min_confidence: float = 0.0,
                 fused=None) -> None:
        super().__init__(head.d2t, target_vocab, min_confidence, 64)
        self.head = self.engine = head
        self.tgt_features = tgt_features
        self.dft_past = 0  # head rows holding true pairs 0..dft_past-1
        self._feat = np.zeros((1, tgt_features.shape[1]), tgt_features.dtype)  # f^ fed back
        n_tree = max(head.widths)  # tree scratch: per node feature, head row, head-call inputs
        self._tree_feat = np.zeros((n_tree, tgt_features.shape[1]), tgt_features.dtype)
        self._tree_in = np.zeros((n_tree, tgt_features.shape[1]), tgt_features.dtype)
        self._tree_par = np.zeros(n_tree, np.int64)
        self._tree_rows = np.zeros(n_tree, np.int64)
        self.fused = self.verifier = fused  # the target+head graph, verifying in the target's place
        self._fused_ready = False  # the last target call caught the head up (d_1 is in fused.last_head())

    def _caught_up_by_target(self, seq: SeqState, past_len: int) -> None:
        """After a target call at past_len whose rows are committed: did its head rows catch us up?"""
        p = self.sampling
        self._fused_ready = (self.fused is not None and p.greedy and p.repetition_penalty == 1.0 and not p.masked
                             and self.dft_past == past_len)
        if self._fused_ready:
            self.dft_past = seq.n - 1

    def forget(self) -> None:
        self.dft_past = 0

    def start(self, seq: SeqState, n_cached: int = 0) -> None:
        # pair j needs tokens j, j+1 of the common prefix and f_j: valid for j <= n_cached - 2
        self.dft_past = min(self.dft_past, max(n_cached - 1, 0))
        self._caught_up_by_target(seq, n_cached)  # the prefill ran from n_cached

    def _catch_up(self, seq: SeqState, feat_out: np.ndarray) -> np.ndarray:
        """Run the head over the pairs the target verified since the last step (j0..n-2, true
        features; at least the pending token's); its last row drafts d_1. Returns those logits
        [Vd] and writes that row's predicted feature into feat_out [H]."""
        n, head, j0 = seq.n, self.head, self.dft_past
        self.dft_past, logits = prefill(head, seq.tokens[j0 + 1:n], j0, features=self.tgt_features[j0:n - 1])
        feat_out[:] = head.last_hidden((n - 2 - j0) % max(head.widths) + 1)[-1]  # last row of the last chunk
        return logits

    def _first(self, seq: SeqState, feat_out: np.ndarray) -> np.ndarray:
        """The head's logits [Vd] for d_1, its predicted feature into feat_out [H]: from the fused
        verify when that caught the head up, else from a catch-up call."""
        if not self._fused_ready:
            return self._catch_up(seq, feat_out)
        logits, feat = self.fused.last_head()
        feat_out[:] = feat
        return logits

    def propose(self, seq: SeqState, k: int):
        n, head = seq.n, self.head
        k = min(k, head.max_len - n)
        self.expected = 0.0
        if k <= 0:
            return chain(seq, 0)
        logits = self._first(seq, self._feat[0])
        slots = seq.draft_slots(k)
        path = 1.0  # the head's probability of d_1..d_{i+1} all being right, ~ P(d_{i+1} is kept)
        for i in range(k):
            slots[i], conf = self._choose(logits, seq, i)
            path *= conf
            if path < self.min_confidence:
                k = i  # a row that is probably wasted: propose d_1..d_i only
                break
            self.expected += path
            if i + 1 < k:  # speculative row at slot n-1+i: (f^, d_{i+1})
                logits = head.forward(slots[i:i + 1], n - 1 + i, features=self._feat)[-1]
                head.commit(n - 1 + i, 1)
                self._feat[0] = head.last_hidden(1)[0]
        return chain(seq, k, None if self.sampling.greedy or k == 0 else self._q[:k])

    def propose_tree(self, seq: SeqState, tree, cfg) -> None:
        """EAGLE-2 style dynamic tree: each depth adds the top-`branch` children of the last
        depth's expanded nodes, best path probability first (the head's own probabilities
        multiplied along the path) while the node budget lasts; the `beam` best of them are
        expanded next: the head runs once over all drafted nodes (a forest under the committed
        context, tree attention) for their children."""
        n, head = seq.n, self.head
        if head.max_len - n < cfg.depth + 1 or tree.limit < 2:
            return
        feat = self._tree_feat
        logits = self._first(seq, feat[0])[None]  # [rows, Vd]: the head's logits of the last expanded nodes
        rows_of = self._tree_rows  # each node's row in `logits`
        rows_of[0] = 0
        frontier = [0]
        for d in range(1, cfg.depth + 1):
            added = self._add_children(tree, frontier, lambda u, lg=logits: lg[rows_of[u]], cfg)
            frontier = added[:cfg.beam]  # the best of them grow the next depth
            if not frontier or tree.n >= tree.limit or d == cfg.depth:
                break
            # the head over drafted nodes 1..n-1: row i-1 = (f^ of i's parent, token i) at depth(i)
            m = tree.n - 1
            for i in range(1, tree.n):
                self._tree_in[i - 1] = feat[tree.parents[i]]
                self._tree_par[i - 1] = tree.parents[i] - 1  # depth-1 nodes are the forest's roots
            logits = head.forward(tree.tokens[1:tree.n], n - 1, features=self._tree_in[:m],
                                  parents=self._tree_par[:m])
            hidden = head.last_hidden(m)
            for c in frontier:
                feat[c] = hidden[c - 1]
                rows_of[c] = c - 1

    def accepted(self, seq: SeqState, n_old: int, n_acc: int) -> None:
        # the speculative rows lie past dft_past already; a fused verify may have caught us up
        self._caught_up_by_target(seq, n_old - 1)


class Eagle3Drafter(EagleDrafter):
    """EAGLE-3: EAGLE's chain and tree drafting on a head that reads the target's low/mid/high
    layer features. Head row j's feature input is fc(a_j), a_j the target's hidden_aux row of
    position j (`tgt_aux`, kept current by the generator), made at catch-up into a buffer of its
    own (one matmul, no allocation); speculative rows feed the head its own output, as in EAGLE.
    No fused target+head graph."""

    name = "eagle3"

    def __init__(self, head, tgt_aux: np.ndarray, target_vocab: int, min_confidence: float = 0.0) -> None:
        from edgespec.engines.ort import OrtProjection

        fc_t = head.fc_t  # [n*H, H]
        super().__init__(head, np.zeros((len(tgt_aux), fc_t.shape[1]), np.float32), target_vocab, min_confidence)
        self.tgt_aux = tgt_aux
        self.fc = OrtProjection(fc_t)  # on ONNX Runtime's threads, not OpenBLAS's (see OrtProjection)

    def _catch_up(self, seq: SeqState, feat_out: np.ndarray) -> np.ndarray:
        j0, n = self.dft_past, seq.n
        self.fc(self.tgt_aux[j0:n - 1], self.tgt_features[j0:n - 1])  # g_j = fc(a_j)
        return super()._catch_up(seq, feat_out)


class MedusaDrafter(_HeadDrafter):
    """Medusa: K heads on the target's feature of the last verified position (the one whose own
    next token is the pending bonus token) draft the K tokens after it in one call. Head i does not
    see the drafts before its own (so its q is its own distribution, still a valid proposal for
    lossless sampling). Nothing to roll back: the heads keep no state."""

    name = "medusa"

    def __init__(self, heads, tgt_features: np.ndarray, target_vocab: int, min_confidence: float = 0.0) -> None:
        super().__init__(heads.d2t, target_vocab, min_confidence, heads.n_heads)
        self.heads = self.engine = heads
        self.tgt_features = tgt_features

    def propose(self, seq: SeqState, k: int):
        k = min(k, self.heads.n_heads)
        logits = self.heads.forward(self.tgt_features[seq.n - 2])  # [K, Vd]; f of the last verified token
        slots = seq.draft_slots(k)
        for i in range(k):
            slots[i], conf = self._choose(logits[i], seq, i)
            if conf < self.min_confidence:
                k = i  # not confident: propose d_1..d_i only
                break
        return chain(seq, k, None if self.sampling.greedy or k == 0 else self._q[:k])

    def propose_tree(self, seq: SeqState, tree, cfg) -> None:
        """Medusa's tree, chosen per step: depth d takes head d-1's top-`branch` tokens under each of
        the `beam` best nodes of depth d-1, best path probability first while the node budget
        lasts (a static tree is the special case where scores never cut it short)."""
        logits = self.heads.forward(self.tgt_features[seq.n - 2])  # [K, Vd]
        frontier = [0]
        for d in range(1, min(cfg.depth, self.heads.n_heads) + 1):
            frontier = self._add_children(tree, frontier, lambda u, d=d: logits[d - 1], cfg)[:cfg.beam]
            if not frontier or tree.n >= tree.limit:
                break


class HybridDrafter(Drafter):
    """Prompt lookup where the context has a match (it copies long spans for free), the EAGLE head
    elsewhere (new text). The head still catches up on every verified token, so it is ready.
    `--hybrid-lookup ngram`; the default hybrid (suffix decoding or the head, whichever is expected
    to keep more) is in hybrid_choice.py."""

    name = "hybrid"
    drafts_trees = True

    def __init__(self, ngram: NgramDrafter, eagle: EagleDrafter) -> None:
        super().__init__()
        self.ngram, self.eagle = ngram, eagle
        self.engine, self.verifier = eagle.engine, eagle.verifier

    def configure(self, sampling: SamplingConfig, rng: np.random.Generator) -> None:
        self.eagle.configure(sampling, rng)

    def forget(self) -> None:
        self.eagle.forget()

    def start(self, seq: SeqState, n_cached: int = 0) -> None:
        self.eagle.start(seq, n_cached)

    def propose(self, seq: SeqState, k: int) -> Proposal:
        prop = self.ngram.propose(seq, k)
        if prop.n_drafted == 0:
            prop = self.eagle.propose(seq, k)
            self.source = "head" if prop.n_drafted else ""
        else:
            self.source = "ngram"
        return prop

    def propose_tree(self, seq: SeqState, tree, cfg) -> None:
        self.ngram.propose_tree(seq, tree, cfg)
        self.source = "ngram"
        if tree.n == 1:
            self.eagle.propose_tree(seq, tree, cfg)
            self.source = "head" if tree.n > 1 else ""

    def accepted(self, seq: SeqState, n_old: int, n_acc: int) -> None:
        self.eagle.accepted(seq, n_old, n_acc)
