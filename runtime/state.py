"""What the loop carries: the token sequence with its length pointers, one step's proposal, and
the target's committed rows that drafters read."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class SeqState:
    tokens: np.ndarray  # [max_len + max_k] int64: prompt, output, then scratch slots for the draft
    n: int  # tokens in the sequence; tokens[n-1] is the pending one (not yet in the target KV)
    n_prompt: int  # prompt length
    tgt_past: int  # rows in the target KV (= n - 1 between steps)

    @property
    def pending(self) -> int:
        return int(self.tokens[self.n - 1])

    def draft_slots(self, m: int) -> np.ndarray:
        """Where a drafter writes m proposed tokens (right after the pending token)."""
        return self.tokens[self.n : self.n + m]

    def verify_window(self, m: int) -> np.ndarray:
        """[pending, d_1..d_m]: the target's input for one verify call (a view, no copy)."""
        return self.tokens[self.n - 1 : self.n + m]

    def advance(self, n_acc: int, next_token: int) -> None:
        """After a verify whose n_acc accepted tokens sit at tokens[n:n + n_acc]: append the
        target's own next token; the pending token and the accepted ones are now in the KV."""
        self.tokens[self.n + n_acc] = next_token
        self.n += n_acc + 1
        self.tgt_past += n_acc + 1


@dataclass
class Proposal:
    """One step's draft, as the verify call takes it.

    tokens [T]: node 0 is the pending token, then the drafts (a chain: a view of the sequence's
    draft slots, so accepted tokens are already in place; a tree: its nodes in topological order).
    parents [T] or None: a token tree (parents[0] = -1, parents[i] < i); None is the chain
    0 <- 1 <- ... <- T-1. q [T-1, V], a SparseQ, or None: the drafter's distribution of each draft
    (None: a one-hot q on its token, i.e. a deterministic drafter or greedy decoding)."""

    tokens: np.ndarray  # [T] int64, T = 1 + drafted tokens
    parents: np.ndarray | None = None  # [T] a tree's parent of each node; None: a chain
    q: np.ndarray | SparseQ | None = None  # [T-1, V] draft distributions (lossless sampling); None: one-hot
    tree: object | None = None  # the TokenTree behind a tree proposal (children lookup, accepted path)
    depth: int = 0  # longest drafted path (a chain: its length); per-position stats count by it

    @property
    def n_drafted(self) -> int:
        return len(self.tokens) - 1

    def rows(self) -> np.ndarray | None:
        """The K/V rows of the verify call to commit, in order: None for a chain (its first rows);
        a tree's accepted path (filled by its acceptance)."""
        return None if self.parents is None else self.tree.path


def chain(seq: SeqState, m: int, q: np.ndarray | SparseQ | None = None) -> Proposal:
    """The proposal of m drafts a drafter wrote into seq.draft_slots(m)."""
    return Proposal(seq.verify_window(m), None, q, None, m)


def chain_prefix(seq: SeqState, prop: Proposal, m: int) -> Proposal:
    """A chain proposal cut to its first m drafts (their q rows with them)."""
    if m == prop.n_drafted:
        return prop
    q = prop.q
    return chain(seq, m, None if q is None else q.head(m) if isinstance(q, SparseQ) else q[:m])


@dataclass
class SparseQ:
    """Draft distributions over a few tokens each (a table drafter's: the rest of the vocabulary has
    q = 0): row i puts probs[i, j] on ids[i, j], distinct tokens; ids -1 pad a row (probability 0). Verification
    reads only these entries (verify._accept_sampled_sparse) instead of V-wide rows."""

    ids: np.ndarray  # [m, K] int64 the tokens each draft's q covers (-1: none)
    probs: np.ndarray  # [m, K] float64 their probabilities (each row sums to 1)

    def __len__(self) -> int:
        return len(self.ids)

    def head(self, m: int) -> SparseQ:
        return SparseQ(self.ids[:m], self.probs[:m])

    def dense_row(self, i: int, out: np.ndarray) -> np.ndarray:
        """out [V] := row i as a dense distribution."""
        out.fill(0.0)
        for x, q in zip(self.ids[i].tolist(), self.probs[i].tolist(), strict=True):
            if x >= 0:
                out[x] += q
        return out


class TargetRows:
    """The target's committed rows that drafters read, one per position: its final-norm hidden states
    (`features` [slots, H]: what the head drafters read) and its hidden_aux rows (`aux` [slots, A]:
    what the aux-feature drafters read); None where no loaded drafter reads them. One per Generator,
    sized for the drafters its folder loaded rather than per drafter object, and kept current after
    every prefill and verify whatever the drafter, so a drafter switch finds a reused prefix's rows."""

    def __init__(self, n_slots: int, hidden_size: int, features: bool, aux_width: int) -> None:
        self.features = np.zeros((n_slots, hidden_size), np.float32) if features else None
        self.aux = np.zeros((n_slots, aux_width), np.float32) if aux_width else None

    def keep(self, tgt, past: int, n_rows: int, rows: np.ndarray | None, n_call: int) -> None:
        """Copy the rows tgt's last call committed at past: its first n_rows, or rows[:n_rows] of its
        n_call rows (a tree's accepted path), in sequence order."""
        aux = self.aux
        if aux is not None:  # (the aux-feature drafters' input)
            if rows is None:
                aux[past : past + n_rows] = tgt.last_hidden_aux(n_rows)
            else:
                got = tgt.last_hidden_aux(n_call)
                for i in range(n_rows):
                    aux[past + i] = got[rows[i]]
        feats = self.features
        if feats is None:
            return
        if rows is None:
            feats[past : past + n_rows] = tgt.last_hidden(n_rows)
            return
        hidden = tgt.last_hidden(n_call)
        for i in range(n_rows):
            feats[past + i] = hidden[rows[i]]
