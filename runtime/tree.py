"""Token trees: candidate continuations verified in one target call, and their acceptance.

A tree holds node 0 = the pending token (the root) and drafted nodes 1..n-1 in topological order
(parent[i] < i). The target runs all n nodes at once (engines take `parents`): node i at position
past_len + depth(i), attending to its ancestors only, and its row is bit for bit the row plain
decoding would compute after the same path (tests/test_tree.py). Acceptance walks down from the
root; the accepted path's K/V rows are then committed to consecutive cache slots (compaction).

  greedy    at node u take the target's argmax x; if u has a child with token x, move there;
            else x is the correction (or bonus) token. The output equals plain greedy decoding.
  sampling  at node u with the target's processed distribution p, try u's children in turn: a
            child with token x is kept with probability p(x) / sum(p); when it is rejected, p(x)
            is set to 0 (and p renormalised, implicitly by the division). If no child is kept,
            the token is drawn from what is left of p. Children are deterministic candidates (a
            one-hot q each), so this is sampling from p by successive rejection: lossless
            (SpecInfer's multi-candidate rule with one-hot q; tested by chi-square).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from edgespec.runtime.verify import SamplingConfig, penalize, probs, sample


@dataclass(frozen=True)
class TreeConfig:
    nodes: int = 0  # tree size incl. the root (0 = chains); the verify call's width
    depth: int = 4  # longest path below the root
    branch: int = 2  # children drafted per expanded node (EAGLE: the head's top-b tokens)
    beam: int = 2  # nodes of a depth expanded further (EAGLE-2: the best by path probability)
    min_score: float = 0.0  # EAGLE: leave out candidates whose path probability is lower

    @classmethod
    def parse(cls, spec: str) -> TreeConfig:
        """"NODES[:DEPTH[:BRANCH[:BEAM[:MIN_SCORE]]]]", e.g. "9:4:2:2" (the CLI's --tree)."""
        parts = spec.split(":")
        try:
            ints = [int(x) for x in parts[:4]]
            extra = [float(parts[4])] if len(parts) == 5 else []
        except ValueError:
            ints = []
        if not 1 <= len(parts) <= 5 or len(ints) != min(len(parts), 4):
            raise ValueError(f"tree spec {spec!r}: expected NODES[:DEPTH[:BRANCH[:BEAM[:MIN_SCORE]]]], e.g. 9:4:2:2")
        return cls(*ints, *extra)

    @property
    def label(self) -> str:
        tail = f":{self.min_score:g}" if self.min_score else ""
        return f"{self.nodes}:{self.depth}:{self.branch}:{self.beam}{tail}"

    def check(self, max_width: int) -> None:
        if self.nodes and not 2 <= self.nodes <= max_width:
            raise ValueError(f"tree of {self.nodes} nodes: need 2..{max_width} (the folder's widest verify graph "
                             "is k+1). Hint: re-export with a larger --k or use fewer nodes")
        if self.nodes and (self.depth < 1 or self.branch < 1 or self.beam < 1):
            raise ValueError(f"bad tree settings {self}: depth, branch and beam must be >= 1")


class TokenTree:
    """Preallocated tree buffers, reused every step."""

    def __init__(self, max_nodes: int) -> None:
        self.tokens = np.zeros(max_nodes, np.int64)
        self.parents = np.full(max_nodes, -1, np.int64)
        self.depth = np.zeros(max_nodes, np.int64)
        self.score = np.zeros(max_nodes, np.float64)  # drafter's path probability (for ranking)
        self.path = np.zeros(max_nodes, np.int64)  # accepted node ids, root first
        self.max_nodes = max_nodes
        self.limit = max_nodes  # node budget of the current step
        self.n = 0
        self.t_drafted = self.t_verified = 0.0  # perf_counter stamps of the last step (stats)
        self._keep = np.zeros(max_nodes, bool)
        self._new = np.zeros(max_nodes, np.int64)

    def reset(self, root_token: int, limit: int | None = None) -> None:
        """Start a tree at the pending token; at most `limit` nodes this step (context room)."""
        self.tokens[0], self.parents[0], self.depth[0], self.score[0] = root_token, -1, 0, 1.0
        self.n = 1
        self.limit = self.max_nodes if limit is None else max(1, min(limit, self.max_nodes))

    def add(self, parent: int, token: int, score: float = 1.0) -> int:
        """Append a child (no duplicates of a sibling); its node id, or -1 when the tree is full."""
        c = self.child(parent, token)
        if c >= 0:
            return c
        if self.n >= self.limit:
            return -1
        i = self.n
        self.tokens[i], self.parents[i], self.depth[i], self.score[i] = token, parent, self.depth[parent] + 1, score
        self.n += 1
        return i

    def child(self, parent: int, token: int) -> int:
        for i in range(parent + 1, self.n):
            if self.parents[i] == parent and self.tokens[i] == token:
                return i
        return -1

    @property
    def max_depth(self) -> int:
        return int(self.depth[:self.n].max()) if self.n else 0

    def keep_chain_prefix(self, n_chain: int) -> None:
        """Prune to a tree whose nodes 0..n_chain-1 are a chain (node i at depth i) and whose other
        nodes all descend from node n_chain-1 (engines.base.tree_chain_prefix says why)."""
        if n_chain <= 1:
            return
        keep, new = self._keep, self._new
        keep[0], m = True, 1
        new[0] = 0
        for i in range(1, self.n):
            p = self.parents[i]
            keep[i] = keep[p] and (p == i - 1 if i < n_chain else p >= n_chain - 1)
            if keep[i]:
                new[i] = m
                self.tokens[m], self.parents[m], self.depth[m], self.score[m] = (
                    self.tokens[i], new[p], self.depth[i], self.score[i])
                m += 1
        self.n = m


def accept_tree_greedy(tree: TokenTree, tgt_logits: np.ndarray, tokens: np.ndarray, n: int,
                       repetition_penalty: float = 1.0) -> tuple[int, int]:
    """(n accepted, next token); tree.path[:n_acc+1] = the accepted nodes, root first, and their
    tokens are written at tokens[n:] (tokens[:n] is the context before them)."""
    cur, n_acc = 0, 0
    tree.path[0] = 0
    while True:
        row = tgt_logits[cur]
        if repetition_penalty != 1.0:
            row = penalize(row[None], tokens, n + n_acc, repetition_penalty)[0]
        x = int(row.argmax())
        nxt = tree.child(cur, x)
        if nxt < 0:
            return n_acc, x
        cur = nxt
        tokens[n + n_acc] = x
        n_acc += 1
        tree.path[n_acc] = cur


def accept_tree_sampled(tree: TokenTree, tgt_logits: np.ndarray, cfg: SamplingConfig, rng: np.random.Generator,
                        tokens: np.ndarray, n: int) -> tuple[int, int]:
    """Lossless tree acceptance (module docstring). tokens[:n] is the context before the root's
    successor; accepted tokens are written at tokens[n:] as the walk goes (the repetition
    penalty of a row sees its own path)."""
    cur, n_acc = 0, 0
    tree.path[0] = 0
    while True:
        row = tgt_logits[cur]
        if cfg.repetition_penalty != 1.0:
            row = penalize(row[None], tokens, n + n_acc, cfg.repetition_penalty)[0]
        p = probs(row, cfg)
        total = 1.0
        kept = -1
        for c in range(cur + 1, tree.n):
            if tree.parents[c] != cur:
                continue
            x = tree.tokens[c]
            if rng.random() * total < p[x]:  # u < p(x) / total: p renormalised over what is left
                kept = c
                break
            total -= p[x]
            p[x] = 0.0
        if kept < 0:
            if total <= 1e-12:  # every token with mass was a rejected child: numerically empty
                return n_acc, sample(probs(row, cfg), rng)
            return n_acc, sample(p, rng)
        cur = kept
        tokens[n + n_acc] = tree.tokens[cur]
        n_acc += 1
        tree.path[n_acc] = cur
