"""What the loop carries: the token sequence with its length pointers, and one step's proposal."""

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
    0 <- 1 <- ... <- T-1. q [T-1, V] or None: the drafter's distribution of each draft (None: a
    one-hot q on its token, i.e. a deterministic drafter or greedy decoding)."""

    tokens: np.ndarray  # [T] int64, T = 1 + drafted tokens
    parents: np.ndarray | None = None  # [T] a tree's parent of each node; None: a chain
    q: np.ndarray | None = None  # [T-1, V] draft distributions (lossless sampling); None: one-hot
    tree: object | None = None  # the TokenTree behind a tree proposal (children lookup, accepted path)
    depth: int = 0  # longest drafted path (a chain: its length); per-position stats count by it

    @property
    def n_drafted(self) -> int:
        return len(self.tokens) - 1

    def rows(self) -> np.ndarray | None:
        """The K/V rows of the verify call to commit, in order: None for a chain (its first rows);
        a tree's accepted path (filled by its acceptance)."""
        return None if self.parents is None else self.tree.path


def chain(seq: SeqState, m: int, q: np.ndarray | None = None) -> Proposal:
    """The proposal of m drafts a drafter wrote into seq.draft_slots(m)."""
    return Proposal(seq.verify_window(m), None, q, None, m)
