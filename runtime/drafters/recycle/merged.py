"""The merged drafter: a lookup (suffix decoding or prompt lookup) first, the recycle table after, in
one chain or one tree scored by calibration.py's estimates."""

from __future__ import annotations

from typing import TYPE_CHECKING

from edgespec.runtime.drafters._pair import LookupPair
from edgespec.runtime.drafters.recycle.calibration import Calibration, table_gate
from edgespec.runtime.drafters.recycle.drafter import RecycleDrafter, grow
from edgespec.runtime.state import Proposal, SeqState, chain

if TYPE_CHECKING:
    from edgespec.runtime.drafters.ngram import NgramDrafter
    from edgespec.runtime.drafters.suffix import SuffixDrafter

LOOKUPS = ("suffix", "ngram")  # what merged drafts first


class MergedDrafter(LookupPair):
    """merged: a lookup (suffix decoding or prompt lookup) first, the recycle table after. Chains:
    the lookup's chain, continued from the table up to k (the table's alone where the lookup has no
    match). Trees: one tree of both, best node first (`grow`), each node scored by the calibrated
    chance it is kept (`Calibration`, per source, depth and own probability, learned from every
    verified tree), so the cost-sized tree machinery (--adaptive: TreeBudget keeps the nodes that pay
    for their verify rows by the folder's measured width table) sizes one tree over both sources;
    --adaptive chains are cut the same way, each draft scored by the same calibration.
    Greedy calls keep learning across calls; a sampled call starts from the prior (its seed then
    reproduces its output given the same table and cache)."""

    name = "merged"
    drafts_trees = True
    scores_chains = True

    def __init__(self, lookup: SuffixDrafter | NgramDrafter, recycle: RecycleDrafter) -> None:
        super().__init__(lookup, recycle)
        self.recycle = recycle
        self.recycle_table = recycle.recycle_table  # (shared: filled through the observe hooks)
        self.greedy_calibration = Calibration()
        self.calibration = self.greedy_calibration
        self._scratch = None  # the lookup's own tree, merged into the step's
        self._tree = None  # the tree drafted this step (learned from after its verify call)
        self.chain_probs: list[float] = []  # the last chain's per-draft probability (its source's own)
        self._n_look = 0  # drafts of it from the lookup (the rest from the table)
        self._scores: list[float] = []
        self._verified = -1  # drafts of it the verify call took (-1: not cost-sized, nothing to learn)
        self._kept = (None, 0)  # the last step's (tree or None for a chain, drafts kept): kept_sources

    def configure(self, sampling, rng) -> None:
        super().configure(sampling, rng)
        self.calibration = self.greedy_calibration if sampling.greedy else Calibration()

    def propose(self, seq: SeqState, k: int) -> Proposal:
        self._tree = None
        self._verified = -1  # a new chain (a grammar redrafts mid-step): cost-sized only if chain_verified says so
        probs = self.chain_probs
        probs.clear()
        idle = self.chain_idle
        if idle is not None and idle(self.calibration.best_first()):  # no chain would be verified: draft none
            self._n_look, self.source = 0, ""
            return chain(seq, 0)
        m = self.lookup.propose(seq, k).n_drafted
        look_probs = self.lookup.last_probs  # (prompt lookup has none: 1 each)
        probs += look_probs[:m] if look_probs is not None else [1.0] * m
        rec, gate = self.recycle, self.chain_gate
        if m and gate is not None and gate(self.calibration.estimate(0, 1, probs[0])):
            m, k = 1, 1  # the budget verifies none of this chain: its lookup draft alone, no table drafts
            del probs[1:]
        total = rec.extend(seq, m, k, probs=probs, gate=table_gate(gate, self.calibration))
        self._n_look = m
        look = self.lookup.name
        self.source = (look if total == m else f"{look}+recycle") if m else ("recycle" if total else "")
        if self.sampling.greedy or not total:
            return chain(seq, total)
        rec.one_hot_q(seq.draft_slots(m))  # the lookup's drafts
        return chain(seq, total, rec.sparse_q(total))

    def propose_tree(self, seq: SeqState, tree, cfg) -> None:
        from edgespec.runtime.tree import TokenTree

        if self._scratch is None or self._scratch.max_nodes < tree.max_nodes:
            self._scratch = TokenTree(tree.max_nodes)
        look = self._scratch
        look.reset(int(tree.tokens[0]), tree.limit)
        self.lookup.propose_tree(seq, look, cfg)
        grow(tree, seq, cfg, self.recycle_table, look, self.calibration.estimate)
        self._tree = tree
        srcs = tree.source[1 : tree.n].tolist()  # (not .all() / .any(): two more numpy paths a step)
        look = self.lookup.name
        self.source = "" if tree.n == 1 else ("recycle" if all(srcs) else look if not any(srcs) else f"{look}+recycle")

    def chain_scores(self) -> list[float]:
        return self.calibration.chain_scores(self.chain_probs, self._n_look, self._scores)

    def chain_verified(self, m: int) -> None:
        self._verified = m

    @property
    def last_size(self) -> int:
        """The last chain's lookup match length (0: the table's drafts alone), as suffix decoding
        reports it: hybrid calibrates each match length apart (--hybrid-lookup merged)."""
        return self.lookup.last_size if self._n_look else 0

    @property
    def last_score(self) -> float:
        """The last chain's expected accepted length by the calibration: the sum of its path scores.
        Sampled, only the drafts whose rows follow from the prefix (the lookup's and the first table
        draft): the later table drafts' scores follow from drawn tokens, and a choice of this chain
        by them would verify a drawn token more often where it leads somewhere confident."""
        scores = self.chain_scores()
        return sum(scores if self.sampling.greedy else scores[: self._n_look + 1])

    def kept_sources(self, n_kept: int) -> list[tuple[int, str]]:
        runs: list[tuple[int, str]] = []
        look, (tree, n_acc) = self.lookup.name, self._kept
        n = min(n_kept, n_acc)
        if tree is None:  # a chain: the lookup's drafts first
            srcs = [0] * min(n, self._n_look) + [1] * max(0, n - self._n_look)
        else:  # the kept path of the tree (read before the next step resets it)
            srcs = tree.source[tree.path[1 : n + 1]].tolist()
        for src in srcs:  # 0: the lookup, 1: the table
            label = "recycle" if src else look
            if runs and runs[-1][1] == label:
                runs[-1] = (runs[-1][0] + 1, label)
            else:
                runs.append((1, label))
        return runs

    def accepted(self, seq: SeqState, n_old: int, n_acc: int) -> None:
        super().accepted(seq, n_old, n_acc)
        self._kept = (self._tree, n_acc)  # (kept_sources reads it, if anyone asks)
        if self._tree is not None:
            self.calibration.observe_tree(self._tree, n_acc)
            self._tree = None
        if self._verified >= 0:
            self.calibration.observe_chain(self.chain_probs, self._n_look, self._verified, n_acc)
            self._verified = -1
