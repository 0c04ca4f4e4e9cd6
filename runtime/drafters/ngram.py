"""The `ngram` drafter (prompt lookup): the tokens that followed the most recent earlier occurrence
of the sequence's last n tokens (longest n first) in prompt + output."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from edgespec.runtime.drafters import Drafter, DrafterPlugin, Option, register
from edgespec.runtime.state import Proposal, SeqState, chain

MAX_TREE_MATCHES = 8  # earlier occurrences an n-gram tree merges (per suffix length)


@dataclass(frozen=True)
class NgramConfig:
    min_n: int = 1  # shortest suffix that may match
    max_n: int = 3  # longest suffix tried first


class NgramDrafter(Drafter):
    """Prompt lookup: find the most recent earlier occurrence of the sequence's last n tokens
    (longest n first) in prompt + output, and propose the tokens that followed it."""

    name = "ngram"
    drafts_trees = True

    def __init__(self, cfg: NgramConfig = NgramConfig()) -> None:
        super().__init__()
        if not 1 <= cfg.min_n <= cfg.max_n:
            raise ValueError(f"ngram sizes need 1 <= min_n <= max_n (got {cfg.min_n}, {cfg.max_n})")
        self.cfg = cfg

    def _matches(self, seq: SeqState):
        """(suffix size, starts of its earlier occurrences), longest suffix first; each start j has
        j + size <= n - 1, so at least one token follows the match."""
        toks, n = seq.tokens, seq.n
        for size in range(min(self.cfg.max_n, n - 1), self.cfg.min_n - 1, -1):
            windows = np.lib.stride_tricks.sliding_window_view(toks[: n - 1], size)  # [n-size, size]
            hits = np.flatnonzero((windows == toks[n - size : n]).all(axis=1))
            if len(hits):
                yield size, hits

    def propose(self, seq: SeqState, k: int) -> Proposal:
        for size, hits in self._matches(seq):  # the most recent occurrence of the longest suffix
            start = int(hits[-1]) + size
            m = min(k, seq.n - start)
            seq.draft_slots(m)[:] = seq.tokens[start : start + m]
            return chain(seq, m)
        return chain(seq, 0)

    def propose_tree(self, seq: SeqState, tree, cfg) -> None:
        """A trie of the continuations after several earlier occurrences of the suffix (longest
        suffix first, most recent first), so the chain proposal is its first branch."""
        toks, n = seq.tokens, seq.n
        for size, hits in self._matches(seq):
            for h in hits[::-1][:MAX_TREE_MATCHES]:
                parent = 0
                for j in range(int(h) + size, min(int(h) + size + cfg.depth, n)):
                    parent = tree.add(parent, toks[j])
                    if parent < 0:
                        return


def ngram_config(cfg) -> NgramConfig:
    return NgramConfig(cfg.ngram_min, cfg.ngram_max)


class NgramPlugin(DrafterPlugin):
    name = "ngram"
    order = 1
    aliases = ("prompt_lookup",)
    summary = "the tokens that followed the latest earlier occurrence of the last 3/2/1 tokens in prompt + output"
    trees = True
    draft_cost = 0.02
    redrafts = True
    options = (
        Option("ngram_min", int, 1, "prompt lookup: shortest suffix to match (default 1)"),
        Option("ngram_max", int, 3, "prompt lookup: longest suffix, tried first (default 3)"),
    )

    def build(self, ctx) -> Drafter:
        return NgramDrafter(ngram_config(ctx.cfg))


PLUGIN = register(NgramPlugin())
