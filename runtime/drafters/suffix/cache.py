"""Suffix decoding's cache of recent requests: a suffix array over their tokens, kept as one sorted
array of fixed-width byte keys (the first DEPTH tokens of every suffix, big-endian, so byte order is
token order): finding every occurrence of a pattern of n <= DEPTH tokens is two binary searches
(`np.searchsorted`), whatever the cache size. New requests go to a small unsorted tail, searched
through its positions ordered by token (re-sorted once after each request: a pattern's first token
by binary search, then filtered token by token); the tail is merged into the sorted part when it
grows past `tail_tokens`. The oldest requests are dropped when the cache passes `max_tokens`
(bounded memory: ~2 * DEPTH + 8 bytes per cached token with 16-bit ids). With a file it is saved
there and read back checked (`read_tokens`).
"""

from __future__ import annotations

import os
import stat
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from edgespec.runtime.files import set_aside, write_atomic

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
