"""Suffix decoding (after SuffixDecoding, Oliaro et al. 2024, arXiv 2411.04975): draft from what
followed the longest earlier match of the sequence's last tokens, in the current prompt + output
AND in the recent requests of this process (cache.py: a suffix array over their tokens), weighted
by how often each continuation followed.

A draft follows the most frequent continuation token by token: at each step the candidates are
the tokens that followed the current pattern, with empirical probabilities count / total; the
chain stops when the path's probability (their product) drops below `min_prob`, or after
`alpha * n` tokens for a match of n tokens (a short match predicts little). Trees take the top
`branch` continuations of the best nodes by path probability. Drafts are deterministic
candidates (a one-hot q), so verification is the usual lossless rule.
"""

from __future__ import annotations

import numpy as np

from edgespec.runtime.drafters import Drafter, DrafterPlugin, Option, register
from edgespec.runtime.drafters.suffix.cache import DEPTH, SEP, SuffixCache, SuffixConfig, agreeing
from edgespec.runtime.state import Proposal, SeqState, chain

__all__ = [
    "DEPTH",
    "SEP",
    "SuffixCache",
    "SuffixConfig",
    "SuffixDrafter",
    "agreeing",
    "recent_requests",
]


SMALL = 64  # occurrences a match keeps as Python ints (read token by token); more stay arrays


def _agree(arr: np.ndarray, place: int, want: list) -> int:
    """agreeing() of one place, on Python ints: want[d] = the token d back from the end."""
    got = arr[max(place - len(want) + 1, 0) : place + 1].tolist()
    a = 0
    for x, y in zip(reversed(got), want, strict=False):  # (got is shorter at the start of arr)
        if x != y:
            break
        a += 1
    return a


class _Match:
    """Where a pattern occurs: positions of the token after each occurrence, in the current
    sequence (`here`, all < its length) and in the cache (`cached`). A few occurrences (the common
    case: SMALL or fewer) are kept as lists of ints and their tokens read one by one, as numpy's
    calls cost more than that with the caches cold after the model call; more stay arrays."""

    __slots__ = ("here", "cached", "_next")

    def __init__(self, here: np.ndarray | list, cached: np.ndarray | list) -> None:
        if len(here) + len(cached) <= SMALL:
            here = here.tolist() if isinstance(here, np.ndarray) else here
            cached = cached.tolist() if isinstance(cached, np.ndarray) else cached
        else:
            here, cached = np.asarray(here, np.int64), np.asarray(cached, np.int64)
        self.here, self.cached = here, cached
        self._next = None  # the tokens at here and cached, read by followers (after reuses them)

    def followers(self, seq_tokens: np.ndarray, n: int, cache_tokens: np.ndarray) -> tuple[list, list]:
        """(tokens, counts) that follow the occurrences, most frequent first (ties: the lower id)."""
        if isinstance(self.here, list):
            self.here = [i for i in self.here if i < n]  # the drafts past n are ours, not evidence
            at_seq, at_cache = seq_tokens.item, cache_tokens.item
            self._next = nxt_here, nxt_cached = [at_seq(i) for i in self.here], [at_cache(i) for i in self.cached]
            counts: dict[int, int] = {}
            for t in nxt_here + nxt_cached:
                if t != SEP:
                    counts[t] = counts.get(t, 0) + 1
            ranked = sorted(counts.items(), key=lambda tc: (-tc[1], tc[0]))
            return [t for t, _ in ranked], [c for _, c in ranked]
        self.here = self.here[self.here < n]
        nxt = np.concatenate([seq_tokens[self.here], cache_tokens[self.cached]])
        nxt = nxt[nxt != SEP]
        ids, counts = np.unique(nxt, return_counts=True)
        order = np.argsort(-counts, kind="stable")
        return ids[order].tolist(), counts[order].tolist()

    def after(self, seq_tokens: np.ndarray, cache_tokens: np.ndarray, token: int) -> _Match:
        """The occurrences of pattern + token (after followers, whose tokens it reuses)."""
        if isinstance(self.here, list):
            if self._next is None:
                self._next = [seq_tokens.item(i) for i in self.here], [cache_tokens.item(i) for i in self.cached]
            nxt_here, nxt_cached = self._next
            return _Match(
                [i + 1 for i, t in zip(self.here, nxt_here, strict=True) if t == token],
                [i + 1 for i, t in zip(self.cached, nxt_cached, strict=True) if t == token],
            )
        return _Match(
            self.here[seq_tokens[self.here] == token] + 1, self.cached[cache_tokens[self.cached] == token] + 1
        )


class SuffixDrafter(Drafter):
    """Drafts from the longest match of the sequence's last tokens in the current sequence and in
    the process's cache of recent requests (module docstring)."""

    name = "suffix"
    drafts_trees = True

    def __init__(self, cache: SuffixCache) -> None:
        super().__init__()
        self.cache, self.cfg = cache, cache.cfg
        self.last_size = 0  # the last chain's match length (0: no match)
        self.last_score = 0.0  # the last chain's sum of path probabilities: its expected accepted length
        self.last_probs: list[float] = []  # the last chain's continuation frequency per draft

    def finish(self, seq: SeqState) -> None:
        self.cache.add(seq.tokens[: seq.n])  # the request it served becomes evidence for the next ones

    def _longest(self, seq: SeqState) -> tuple[int, _Match | None]:
        """(n, its occurrences) for the longest suffix of the sequence (min_match..DEPTH tokens)
        that occurred before. In the sequence and in the cache's unsorted tail: the earlier places
        of its last token, extended backwards while they agree (one pass each); in the sorted part:
        a binary search on n (a suffix that occurs has shorter ones that do), two `searchsorted`
        calls per probe, only for lengths the others did not reach."""
        toks, n, cache = seq.tokens, seq.n, self.cache
        top = min(DEPTH, n - 1)
        if top < self.cfg.min_match:
            return 0, None
        last = toks[n - 1]
        here = np.flatnonzero(toks[: n - 1] == last)  # earlier places of the last token
        tail = cache.tail_places(int(last))
        if len(here) + len(tail) <= SMALL:  # (the common case: on Python ints, no more numpy paths)
            return self._longest_few(toks, n, top, here.tolist(), tail.tolist())
        agree_here = agreeing(toks, here, toks, n - 1, top)
        agree_tail = agreeing(cache.tokens, tail, toks, n - 1, top)
        size = max(int(agree_here.max()) if len(here) else 0, int(agree_tail.max()) if len(tail) else 0)
        size = self._sorted_longer(toks, n, top, size)
        if size < self.cfg.min_match:
            return 0, None
        cached = tail[agree_tail >= size] + 1
        if cache._n_sorted:
            cached = np.concatenate([cache.sorted_occurrences(toks[n - size : n]), cached])
        return size, _Match(here[agree_here >= size] + 1, cached)

    def _longest_few(self, toks: np.ndarray, n: int, top: int, here: list, tail: list) -> tuple[int, _Match | None]:
        """_longest for a few earlier places of the last token (here: in the sequence, tail: in the
        cache's unsorted tail): each one's agreement counted on Python ints."""
        want = toks[n - top : n].tolist()[::-1]  # toks[n - 1 - d], d = 0 .. top - 1
        agree_here = [_agree(toks, c, want) for c in here]
        agree_tail = [_agree(self.cache.tokens, c, want) for c in tail]
        size = self._sorted_longer(toks, n, top, max(agree_here + agree_tail, default=0))
        if size < self.cfg.min_match:
            return 0, None
        cached = [c + 1 for c, a in zip(tail, agree_tail, strict=True) if a >= size]
        if self.cache._n_sorted:
            cached = np.concatenate([self.cache.sorted_occurrences(toks[n - size : n]), np.array(cached, np.int64)])
        return size, _Match([c + 1 for c, a in zip(here, agree_here, strict=True) if a >= size], cached)

    def _sorted_longer(self, toks: np.ndarray, n: int, top: int, size: int) -> int:
        """The longest suffix found: size, or longer where the cache's sorted part has one (a binary
        search on the length: a suffix that occurs has shorter ones that do)."""
        lo, hi = max(size + 1, self.cfg.min_match), top if self.cache._n_sorted else 0
        while lo <= hi:
            mid = (lo + hi) // 2
            if self.cache.sorted_count(toks[n - mid : n]):
                lo, size = mid + 1, mid
            else:
                hi = mid - 1
        return size

    def propose(self, seq: SeqState, k: int) -> Proposal:
        size, match = self._longest(seq)
        limit = min(k, int(np.ceil(self.cfg.alpha * size)))
        slots = seq.draft_slots(limit)
        path, m, ctoks = 1.0, 0, self.cache.tokens
        self.last_size, self.last_score = size, 0.0
        probs = self.last_probs
        probs.clear()
        while m < limit:
            ids, cnt = match.followers(seq.tokens, seq.n, ctoks)
            if not len(ids):
                break
            p = cnt[0] / sum(cnt)
            path *= p
            if path < self.cfg.min_prob:
                break
            slots[m] = ids[0]
            probs.append(float(p))
            m += 1
            self.last_score += path
            match = match.after(seq.tokens, ctoks, ids[0])
        return chain(seq, m)

    def propose_tree(self, seq: SeqState, tree, cfg) -> None:
        """Best first by path probability: the top `branch` continuations of the `beam` best
        nodes of each depth."""
        size, match = self._longest(seq)
        limit = min(cfg.depth, int(np.ceil(self.cfg.alpha * size)))
        frontier, ctoks = ([(0, match)] if match is not None else []), self.cache.tokens
        for _ in range(limit):
            cands = []
            for u, mu in frontier:
                ids, cnt = mu.followers(seq.tokens, seq.n, ctoks)
                total = sum(cnt)
                top = zip(ids[: cfg.branch], cnt[: cfg.branch], strict=True)
                cands.extend((tree.score[u] * c / total, u, t, mu) for t, c in top)
            cands.sort(key=lambda c: -c[0])
            frontier = []
            for score, u, tok, mu in cands:
                if score < max(self.cfg.min_prob, cfg.min_score):
                    break
                c = tree.add(u, tok, score)
                if c < 0:
                    return
                if len(frontier) < cfg.beam:
                    frontier.append((c, mu.after(seq.tokens, ctoks, tok)))
            if not frontier:
                return


def recent_requests(ctx) -> SuffixCache:
    """The generator's cache of the requests its suffix drafters served: made at the first build,
    then kept in its drafter store, so it lives across requests and drafter switches."""
    if "suffix" not in ctx.store:
        c = ctx.cfg
        cfg = SuffixConfig(max_tokens=c.suffix_cache_tokens, file=c.suffix_cache)
        ctx.store["suffix"] = SuffixCache(cfg, ctx.target_vocab)
    return ctx.store["suffix"]


class SuffixPlugin(DrafterPlugin):
    name = "suffix"
    order = 2
    summary = (
        "suffix decoding: the most frequent continuation of the longest match of the last tokens "
        "in the prompt + output AND in this process's recent requests"
    )
    trees = True
    draft_cost = 0.03
    redrafts = True
    options = (
        Option(
            "suffix_cache_tokens",
            int,
            1_000_000,
            "suffix drafter: tokens of recent requests kept in its cache (default 1000000)",
        ),
        Option(
            "suffix_cache",
            str,
            None,
            "suffix drafter: load its cache of recent requests from this .npy file and keep it saved there",
        ),
    )

    def build(self, ctx) -> Drafter:
        return SuffixDrafter(recent_requests(ctx))


PLUGIN = register(SuffixPlugin())
