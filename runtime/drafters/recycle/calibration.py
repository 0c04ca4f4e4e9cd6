"""The merged and recycle drafters' online calibration: the chance a drafted node is kept given its
parent was, per source (the lookup, the table), depth and the source's own probability of it, learned
from every verified tree and cost-sized chain (`Calibration`). Its estimates score the nodes of
merged's trees (so the cost-sized tree machinery sizes one tree over both sources) and, with
--adaptive, each draft of a chain (TreeBudget.choose_chain keeps the prefix that pays).
"""

from __future__ import annotations

import numpy as np

DEPTHS = 4  # calibration depth buckets: 1, 2, 3, 4 and deeper
P_EDGES = (0.1, 0.2, 0.35, 0.5, 0.7, 0.9)  # calibration bins of a source's own probability
_BIN = [sum(q / 20 >= e for e in P_EDGES) for q in range(21)]  # bin of p by round-down to 0.05


class Calibration:
    """The chance a node is kept given its parent was, learned online per source (0: the lookup, 1:
    the table), depth bucket and bin of the source's own probability p: decayed counts of the nodes
    verify calls tested (those whose parent was kept) and of the kept ones among them, started from
    a prior of `prior` nodes kept at the bin's middle probability (uncalibrated: p itself)."""

    def __init__(self, n_sources: int = 2, decay: float = 0.995, prior: float = 2.0) -> None:
        mids = np.array([0.05, 0.15, 0.275, 0.425, 0.6, 0.8, 0.95])  # [bins]
        shape = (n_sources, DEPTHS, len(mids))
        self.decay = decay
        self.tested = np.full(shape, prior)  # [sources, depths, bins] decayed tested counts (+ prior)
        self.kept = np.broadcast_to(prior * mids, shape).copy()  # their kept counts (+ prior)
        self.est = self.kept / self.tested  # [sources, depths, bins] the estimates
        self._est = self.est.tolist()  # the same as nested lists (read per candidate while drafting)

    def estimate(self, source: int, depth: int, p: float) -> float:
        return self._est[source][min(depth, DEPTHS) - 1][_BIN[int(min(p, 1.0) * 20)]]

    def best_first(self, sources: tuple[int, ...] = (0, 1)) -> float:
        """The highest estimate a first draft (depth 1) of these sources can have: the best first path
        score a chain could start with (Drafter.chain_idle)."""
        return max(max(self._est[s][0]) for s in sources)

    def observe_tree(self, tree, n_acc: int) -> None:
        """A verified tree whose accepted path is tree.path[:n_acc + 1]: every node whose parent was
        kept was tested, kept or not. Each cell a tree tested decays once, then counts its nodes. On
        Python ints and floats (a tree has a few nodes; numpy's calls cost more with the caches cold
        after the model call)."""
        n = tree.n
        if n <= 1:
            return
        on = set(tree.path[: n_acc + 1].tolist())
        par, src = tree.parents[1:n].tolist(), tree.source[1:n].tolist()
        dep, prob = tree.depth[1:n].tolist(), tree.prob[1:n].tolist()
        cells: dict[tuple[int, int, int], list[int]] = {}  # cell -> [nodes tested, nodes kept], in node order
        for i in range(n - 1):
            if par[i] in on:
                cell = (src[i], min(dep[i], DEPTHS) - 1, _BIN[int(min(prob[i] * 20, 20))])
                seen = cells.setdefault(cell, [0, 0])
                seen[0] += 1
                seen[1] += i + 1 in on
        self._count(cells)

    def observe_chain(self, probs: list[float], n_look: int, n: int, n_acc: int) -> None:
        """A verified chain of n drafts (the first n_look from the lookup, source 0; the rest from the
        table), probs their sources' own probabilities, n_acc of them kept: draft i was tested when
        every draft before it was kept. The same counts as observe_tree of that chain as a tree."""
        cells: dict[tuple[int, int, int], list[int]] = {}
        for i in range(min(n, n_acc + 1)):
            cell = (0 if i < n_look else 1, min(i + 1, DEPTHS) - 1, _BIN[int(min(probs[i] * 20, 20))])
            seen = cells.setdefault(cell, [0, 0])
            seen[0] += 1
            seen[1] += i < n_acc
        self._count(cells)

    def chain_scores(self, probs: list[float], n_look: int, out: list[float]) -> list[float]:
        """out := the path scores of a chain whose first n_look drafts came from the lookup (source 0),
        the rest from the table: the product of each draft's estimate down to it."""
        out.clear()
        path, est = 1.0, self.estimate
        for i, p in enumerate(probs):
            path *= est(0 if i < n_look else 1, i + 1, p)
            out.append(path)
        return out

    def _count(self, cells: dict) -> None:
        """Decay each tested cell once, then count its nodes tested and kept."""
        tested, kept, decay = self.tested, self.kept, self.decay
        for cell, (n_tested, n_kept) in cells.items():
            t, k = float(tested[cell]) * decay, float(kept[cell]) * decay
            for _ in range(n_tested):  # (one at a time: the same sums, bit for bit, as counting node by node)
                t += 1.0
            for _ in range(n_kept):
                k += 1.0
            tested[cell], kept[cell] = t, k
            self.est[cell] = self._est[cell[0]][cell[1]][cell[2]] = k / t


def table_gate(chain_gate, calibration: Calibration):
    """extend's gate for a chain whose first draft comes from the table: the chain gate (None: none) of
    that draft's path score as the chain's calibration scores it (Calibration.chain_scores)."""
    if chain_gate is None:
        return None
    return lambda p: chain_gate(calibration.estimate(1, 1, p))
