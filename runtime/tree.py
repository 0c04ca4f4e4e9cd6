"""Token trees: candidate continuations verified in one target call (acceptance: verify.py).

A tree holds node 0 = the pending token (the root) and drafted nodes 1..n-1 in topological order
(parent[i] < i). The target runs all n nodes at once (engines take `parents`): node i at position
past_len + depth(i), attending to its ancestors only, and its row is bit for bit the row plain
decoding would compute after the same path (tests/test_tree.py). Acceptance walks down from the
root; the accepted path's K/V rows are then committed to consecutive cache slots (compaction).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from edgespec.runtime.state import Proposal


@dataclass(frozen=True)
class TreeConfig:
    nodes: int = 0  # tree size incl. the root (0 = chains); the verify call's width
    depth: int = 4  # longest path below the root
    branch: int = 2  # children drafted per expanded node (EAGLE: the head's top-b tokens)
    beam: int = 2  # nodes of a depth expanded further (EAGLE-2: the best by path probability)
    min_score: float = 0.0  # EAGLE: leave out candidates whose path probability is lower

    @classmethod
    def parse(cls, spec: str) -> TreeConfig:
        """ "NODES[:DEPTH[:BRANCH[:BEAM[:MIN_SCORE]]]]", e.g. "9:4:2:2" (the CLI's --tree)."""
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
            raise ValueError(
                f"tree of {self.nodes} nodes: need 2..{max_width} (the folder's widest verify graph "
                "is k+1). Hint: re-export with a larger --k or use fewer nodes"
            )
        if self.nodes and (self.depth < 1 or self.branch < 1 or self.beam < 1):
            raise ValueError(f"bad tree settings {self}: depth, branch and beam must be >= 1")


class TokenTree:
    """Preallocated tree buffers, reused every step."""

    def __init__(self, max_nodes: int) -> None:
        self.tokens = np.zeros(max_nodes, np.int64)
        self.parents = np.full(max_nodes, -1, np.int64)
        self.depth = np.zeros(max_nodes, np.int64)
        self.score = np.zeros(max_nodes, np.float64)  # drafter's path probability (for ranking)
        self.source = np.zeros(max_nodes, np.int8)  # which of a combinator's drafters added the node (0: the only)
        self.prob = np.ones(max_nodes, np.float64)  # its drafter's own probability of it given its parent
        self.path = np.zeros(max_nodes, np.int64)  # accepted node ids, root first
        self.max_nodes = max_nodes
        self.limit = max_nodes  # node budget of the current step
        self.n = 0
        self.t_drafted = self.t_verified = 0.0  # perf_counter stamps of the last step (stats)
        self._keep = np.zeros(max_nodes, bool)
        self._eff = np.zeros(max_nodes, np.float64)  # path_scores
        self._new = np.zeros(max_nodes, np.int64)
        # the same tree on Python ints, for the per-node lookups while it grows and is walked (numpy
        # scalar reads cost more, with the caches cold after the model call): (parent, token) -> node
        self._kids: dict[tuple[int, int], int] = {}
        self._depths: list[int] = []  # depth of each node

    def reset(self, root_token: int, limit: int | None = None) -> None:
        """Start a tree at the pending token; at most `limit` nodes this step (context room)."""
        self.tokens[0], self.parents[0], self.depth[0], self.score[0] = root_token, -1, 0, 1.0
        self.n = 1
        self._kids.clear()
        self._depths[:] = [0]
        self.limit = self.max_nodes if limit is None else max(1, min(limit, self.max_nodes))

    def add(self, parent: int, token: int, score: float = 1.0, source: int = 0, prob: float = 1.0) -> int:
        """Append a child (no duplicates of a sibling); its node id, or -1 when the tree is full.
        source, prob: who drafted it and how likely they thought it given its parent (a combinator
        calibrates its sources by them)."""
        c = self.child(parent, token)
        if c >= 0:
            return c
        if self.n >= self.limit:
            return -1
        i = self.n
        d = self._depths[parent] + 1
        self.tokens[i], self.parents[i], self.depth[i], self.score[i] = token, parent, d, score
        self.source[i], self.prob[i] = source, prob
        self._kids[parent, int(token)] = i
        self._depths.append(d)
        self.n += 1
        return i

    def child(self, parent: int, token: int) -> int:
        """parent's child with this token, -1: none."""
        return self._kids.get((parent, int(token)), -1)

    def node_depth(self, i: int) -> int:
        """Node i's depth (an int; the root's 0)."""
        return self._depths[i]

    @property
    def max_depth(self) -> int:
        return max(self._depths[: self.n]) if self.n else 0

    def keep_chain_prefix(self, n_chain: int) -> None:
        """Prune to a tree whose nodes 0..n_chain-1 are a chain (node i at depth i) and whose other
        nodes all descend from node n_chain-1 (engines.base.tree_chain_prefix says why)."""
        if n_chain <= 1:
            return
        keep = self._keep
        keep[0] = True
        for i in range(1, self.n):
            p = self.parents[i]
            keep[i] = keep[p] and (p == i - 1 if i < n_chain else p >= n_chain - 1)
        self._compact()

    def path_scores(self) -> np.ndarray:
        """[n] each node's score capped by its ancestors' (min along its path; the root 1.0): what a
        node can add to the accepted length is bounded by its parent's. Drafters that score by path
        probability give their own scores back; a merged tree (hybrid) may not be monotone."""
        eff = self._eff
        eff[0] = 1.0
        for i in range(1, self.n):
            eff[i] = min(self.score[i], eff[self.parents[i]])
        return eff[: self.n]

    def keep_best(self, n_keep: int, eff: np.ndarray | None = None) -> None:
        """Prune to the root and the n_keep - 1 drafted nodes of highest path_scores (ties: the
        earlier node; `eff`: those scores when the caller has them already). They never rise along
        a path and a parent comes before its children, so every kept node's ancestors are kept too."""
        if n_keep >= self.n:
            return
        eff = self.path_scores() if eff is None else eff
        keep = self._keep
        keep[: self.n] = False
        keep[0] = True
        for i in sorted(range(1, self.n), key=lambda i: -eff[i])[: max(0, n_keep - 1)]:
            keep[i] = True
        self._compact()

    def _compact(self) -> None:
        """Move the nodes marked in _keep (an ancestor-closed set) to the front, in order."""
        keep, new = self._keep, self._new
        new[0], m = 0, 1
        for i in range(1, self.n):
            if keep[i]:
                p = self.parents[i]
                new[i] = m
                self.tokens[m], self.parents[m], self.depth[m], self.score[m] = (
                    self.tokens[i],
                    new[p],
                    self.depth[i],
                    self.score[i],
                )
                self.source[m], self.prob[m] = self.source[i], self.prob[i]
                m += 1
        self.n = m
        toks, pars = self.tokens[:m].tolist(), self.parents[:m].tolist()
        self._kids = {(pars[j], toks[j]): j for j in range(1, m)}
        self._depths = self.depth[:m].tolist()

    def proposal(self) -> Proposal:
        """The drafted tree as the verify call takes it (views of the buffers)."""
        return Proposal(self.tokens[: self.n], self.parents[: self.n], None, self, self.max_depth)


TREE_BLOCK = 128  # the context blocks ORT's CPU attention GEMM sums separately (measured, tests/test_tree.py)


def tree_chain_prefix(past_len: int, n_nodes: int, block: int = TREE_BLOCK) -> int:
    """How many leading nodes of a tree verified at past_len must form a chain (node i at depth i)
    for its rows to equal a chain's bit for bit: up to the first multiple of `block` inside
    [past_len, past_len + n_nodes). The attention's probability x value GEMM sums each block of
    slots on its own, so an ancestor must sit in the same block in the tree as in the chain."""
    b = -past_len % block
    return b if 1 < b < n_nodes else 1
