"""Suffix decoding (after SuffixDecoding, Oliaro et al. 2024, arXiv 2411.04975): draft from what
followed the longest earlier match of the sequence's last tokens, in the current prompt + output
AND in the recent requests of this process, weighted by how often each continuation followed.

The cache of recent requests is a suffix array over their tokens, kept as one sorted array of
fixed-width byte keys (the first DEPTH tokens of every suffix, big-endian, so byte order is token
order): finding every occurrence of a pattern of n <= DEPTH tokens is two binary searches
(`np.searchsorted`), whatever the cache size. New requests go to a small unsorted tail, searched
through its positions ordered by token (re-sorted once after each request: a pattern's first token
by binary search, then filtered token by token); the tail is merged into the sorted part when it
grows past `tail_tokens`. The oldest
requests are dropped when the cache passes `max_tokens` (bounded memory: ~2 * DEPTH + 8 bytes per
cached token with 16-bit ids).

A draft follows the most frequent continuation token by token: at each step the candidates are
the tokens that followed the current pattern, with empirical probabilities count / total; the
chain stops when the path's probability (their product) drops below `min_prob`, or after
`alpha * n` tokens for a match of n tokens (a short match predicts little). Trees take the top
`branch` continuations of the best nodes by path probability. Drafts are deterministic
candidates (a one-hot q), so verification is the usual lossless rule.
"""

from __future__ import annotations

import os
import stat
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from edgespec.runtime.drafters import Drafter, DrafterPlugin, Option, register
from edgespec.runtime.files import set_aside, write_atomic
from edgespec.runtime.state import Proposal, SeqState, chain

DEPTH = 12  # longest pattern matched in the cache (tokens); longer contexts match on their last DEPTH
SEP = -1  # between cached requests: no match runs across two of them
_BACK = np.arange(DEPTH)  # 0, 1, ..., DEPTH - 1: distances back from a place


@dataclass(frozen=True)
class SuffixConfig:
    max_tokens: int = 1_000_000  # cached request tokens kept (oldest requests dropped past it)
    tail_tokens: int = 16_384  # unsorted recent tokens before they are merged into the sorted index
    min_match: int = 2  # shortest pattern that may draft (a 1-token match is mostly noise)
    alpha: float = 2.0  # draft at most alpha * (match length) tokens
    min_prob: float = 0.1  # stop the chain when the path's empirical probability is lower
    max_candidates: int = 4096  # cached occurrences counted per pattern (an even sample beyond)
    file: str | None = None  # .npy file the cache is loaded from and saved to (CLI / server)


class SuffixCache:
    """Tokens of recent requests, searchable by pattern in time independent of their number."""

    def __init__(self, cfg: SuffixConfig = SuffixConfig(), vocab_size: int = 1 << 16) -> None:
        self.cfg = cfg
        # ids are stored +1 (0 is the separator) in 16 bits when they fit, else 32
        self._dtype = np.dtype(">u2") if vocab_size + 1 < (1 << 16) else np.dtype(">u4")
        self.tokens = np.zeros(0, np.int64)  # cached tokens, requests separated by SEP
        self._n_sorted = 0  # tokens[:_n_sorted] are in the sorted index
        self._keys = np.zeros(0, f"S{DEPTH * self._dtype.itemsize}")  # [n_sorted] sorted suffix keys
        self._pos = np.zeros(0, np.int64)  # [n_sorted] start of each key's suffix in tokens
        self._tail_for = (-1, -1)  # (len(tokens), n_sorted) the tail's index below was built for
        self._tail_order = np.zeros(0, np.int64)  # [tail] the tail's positions ordered by token
        self._tail_sorted = np.zeros(0, np.int64)  # [tail] its tokens in that order
        if cfg.file and Path(cfg.file).exists():
            self.tokens = self._load(cfg.file, vocab_size)
            self._reindex()

    def __len__(self) -> int:
        return len(self.tokens)

    def add(self, ids: np.ndarray) -> None:
        """One finished request (prompt + output) into the cache."""
        self.tokens = np.concatenate([self.tokens, np.asarray(ids, np.int64), [SEP]])
        if len(self.tokens) > self.cfg.max_tokens:  # drop whole oldest requests
            cut = len(self.tokens) - self.cfg.max_tokens
            seps = np.flatnonzero(self.tokens[cut:] == SEP)
            cut += int(seps[0]) + 1 if len(seps) else 0
            self.tokens = self.tokens[cut:]
            self._reindex()
        elif len(self.tokens) - self._n_sorted > self.cfg.tail_tokens:
            self._reindex()
            self.save()  # the file follows the index: at most tail_tokens behind

    def save(self) -> None:
        """Write the cached tokens to cfg.file (when set) whole: a temporary file renamed over the old
        one, so a kill mid-save leaves the old cache, never half of one."""
        if self.cfg.file:
            tokens = self.tokens.astype(np.int32)
            write_atomic(self.cfg.file, lambda f: np.save(f, tokens))

    def _load(self, file: str, vocab_size: int) -> np.ndarray:
        """The last max_tokens of a saved cache; a damaged one (`read_tokens`) is set aside as
        NAME.bad with one warning and the cache starts empty, never an error at each request."""
        try:
            return read_tokens(file, vocab_size, self.cfg.max_tokens)
        except (ValueError, OSError, EOFError) as e:
            bad = set_aside(file)
            where = f"set aside as {bad.name}" if bad else "ignored"
            warnings.warn(
                f"{file}: damaged suffix cache ({str(e).splitlines()[0] if str(e) else type(e).__name__}), "
                f"{where}; the suffix drafter starts cold (an empty cache)",
                RuntimeWarning,
                stacklevel=4,
            )
            return np.zeros(0, np.int64)

    def _encode(self, rows: np.ndarray) -> np.ndarray:
        """[n, DEPTH] token rows (SEP = -1 padding) -> [n] byte keys in token order."""
        return np.ascontiguousarray((rows + 1).astype(self._dtype)).view(self._keys.dtype).ravel()

    def _reindex(self) -> None:
        n = len(self.tokens)
        padded = np.concatenate([self.tokens, np.full(DEPTH, SEP)])
        rows = np.lib.stride_tricks.sliding_window_view(padded, DEPTH)[:n].copy()  # [n, DEPTH]
        # a suffix ends at its request's separator: what follows belongs to another request
        after_sep = np.maximum.accumulate((rows == SEP).astype(np.int8), axis=1).astype(bool)
        rows[after_sep] = SEP
        keys = self._encode(rows)
        order = np.argsort(keys, kind="stable")
        self._keys, self._pos = keys[order], order.astype(np.int64)
        self._n_sorted = n

    def _range(self, pattern: np.ndarray) -> tuple[int, int]:
        """[lo, hi) of the sorted keys that start with pattern (len <= DEPTH)."""
        enc = (np.asarray(pattern, np.int64) + 1).astype(self._dtype).tobytes()
        width = DEPTH * self._dtype.itemsize
        return (
            int(np.searchsorted(self._keys, np.bytes_(enc), side="left")),
            int(np.searchsorted(self._keys, np.bytes_(enc + b"\xff" * (width - len(enc))), side="right")),
        )

    def count(self, pattern: np.ndarray) -> bool:
        """Does pattern occur in the cache (followed by a token)?"""
        return self.sorted_count(pattern) or len(self._tail_hits(pattern)) > 0

    def sorted_count(self, pattern: np.ndarray) -> bool:
        """Does pattern occur in the sorted part?"""
        if not self._n_sorted:
            return False
        lo, hi = self._range(pattern)
        return hi > lo

    def tail_places(self, token: int) -> np.ndarray:
        """Positions in tokens of `token` in the unsorted tail, ascending: a binary search in the
        tail's positions ordered by token (re-sorted once after the cache changed)."""
        if self._tail_for != (len(self.tokens), self._n_sorted):
            tail = self.tokens[self._n_sorted :]
            self._tail_order = np.argsort(tail, kind="stable") + self._n_sorted  # (stable: ascending places)
            self._tail_sorted = self.tokens[self._tail_order]
            self._tail_for = (len(self.tokens), self._n_sorted)
        lo = int(self._tail_sorted.searchsorted(token, "left"))
        hi = int(self._tail_sorted.searchsorted(token, "right"))
        return self._tail_order[lo:hi]

    def _tail_hits(self, pattern: np.ndarray) -> np.ndarray:
        """Positions after each occurrence of pattern in the unsorted tail (the sorted part ends
        with a separator, so no match spans both): the places of its first token (`tail_places`),
        filtered token by token (never a scan of the tail)."""
        n, toks = len(pattern), self.tokens
        at = self.tail_places(int(pattern[0]))
        at = at[at < len(toks) - n]  # (a match must be followed by a token)
        for j in range(1, n):
            if not len(at):
                break
            at = at[toks[at + j] == pattern[j]]
        return at + n

    def sorted_occurrences(self, pattern: np.ndarray) -> np.ndarray:
        """Positions just after occurrences of pattern (len <= DEPTH) in the sorted part: at most
        cfg.max_candidates (an even sample beyond)."""
        n = len(pattern)
        if not self._n_sorted:
            return self._pos[:0]
        lo, hi = self._range(pattern)
        if hi - lo > self.cfg.max_candidates:  # an even sample: the index groups them by what follows
            return self._pos[np.linspace(lo, hi - 1, self.cfg.max_candidates).astype(np.int64)] + n
        return self._pos[lo:hi] + n

    def occurrences(self, pattern: np.ndarray) -> np.ndarray:
        """Positions just after cached occurrences of pattern (len <= DEPTH): at most
        cfg.max_candidates from the sorted index, then every one in the unsorted tail."""
        return np.concatenate([self.sorted_occurrences(pattern), self._tail_hits(pattern)])


def read_tokens(file: str, vocab_size: int, max_tokens: int) -> np.ndarray:
    """The last max_tokens of a saved cache (.npy of int32 tokens, SEP between requests), checked: a
    regular .npy file (a FIFO or a device would block or never end) holding a 1-D integer array of
    ids in SEP .. vocab_size - 1; ValueError (or the reader's OSError) names what is wrong. The file
    is mapped, so only the kept tail is read."""
    st = os.stat(file)
    if not stat.S_ISREG(st.st_mode):
        raise ValueError("not a regular file")
    with open(file, "rb") as f:
        if f.read(6) != b"\x93NUMPY":
            raise ValueError("not a .npy file")
    arr = np.load(file, mmap_mode="r", allow_pickle=False)
    try:
        if arr.ndim != 1 or arr.dtype.kind not in "iu":
            raise ValueError(f"an array of shape {arr.shape} and dtype {arr.dtype}, not a 1-D list of token ids")
        tokens = np.array(arr[-max_tokens:] if max_tokens else arr[:0], np.int64)
    finally:
        del arr  # (the map closes: the file may be renamed next)
    if len(tokens) and (int(tokens.min()) < SEP or int(tokens.max()) >= vocab_size):
        raise ValueError(f"ids from {int(tokens.min())} to {int(tokens.max())}, outside {SEP} .. {vocab_size - 1}")
    return tokens


def agreeing(arr: np.ndarray, cand: np.ndarray, toks: np.ndarray, end: int, top: int) -> np.ndarray:
    """For each place in cand (arr[place] == toks[end]): how many tokens agree counting backwards
    from it, at most top (a separator or the array's start ends the agreement). All the places at
    once, as a [len(cand), top] comparison (a loop over the distance made ~40 numpy calls a step on
    repetitive text, each microseconds with the caches cold after the model call)."""
    if not len(cand):
        return cand
    back = cand[:, None] - _BACK[:top]  # [c, top] the places d = 0 .. top-1 tokens back
    eq = arr[np.maximum(back, 0)] == toks[end - top + 1 : end + 1][::-1]  # [c, top] (toks[end - d])
    eq &= back >= 0
    return np.logical_and.accumulate(eq, axis=1).sum(axis=1)


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
