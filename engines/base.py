"""The engine protocols, one per kind of model a folder holds, and helpers every backend shares.

- Engine: a target or draft model with its own preallocated KV buffer. It runs a static-width
  graph over a few new tokens at `past_len` and keeps the new K/V rows of that call aside;
  `commit` writes the first n of them into the cache at `past_len`. Rejecting draft tokens
  therefore costs nothing: the caller just commits fewer rows and moves its length pointer, stale
  rows beyond it are masked and later overwritten.
- HeadEngine: a head, the same contract over (token, feature) pairs.
- HeadsEngine: multi-token heads, one stateless call per step.
- BlockDrafter: a block drafter, one call per step over verified features only (no commit).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

import numpy as np

if TYPE_CHECKING:
    from edgespec.engines.manifest import Manifest, ModelSpec


class EngineError(RuntimeError):
    """An engine that cannot be loaded or run as asked (with what to do about it)."""


class Engine(Protocol):
    """A target or draft model: what the loop and the drafters call. Optional abilities are
    declared as attributes (False: the call is not available), never probed."""

    max_len: int  # KV slots
    vocab_size: int  # logits width
    hidden_size: int  # width of last_hidden rows
    widths: tuple[int, ...]  # graph widths T this engine can run
    n_calls: int  # forward calls so far (stats)
    takes_tree: bool  # forward takes parents (a token tree)
    has_hidden: bool  # last_hidden gives the final-norm hidden states (the head drafters draft from them)
    top_k: int  # next-token candidates per row its graph outputs (last_topk; 0: none)
    manifest: Manifest | None  # the folder it was loaded from (None: a model of no folder, e.g. a test's fake)
    spec: ModelSpec | None  # its entry in that manifest (aux_width: its last_hidden_aux rows; None: no folder)

    def forward(
        self, token_ids: np.ndarray, past_len: int, parents: np.ndarray | None = None, logits: bool = True
    ) -> np.ndarray | None:
        """Run len(token_ids) <= max(widths) tokens at positions past_len...; logits [n, V] (a view,
        valid until the next call). parents [n]: a token tree (takes_tree). logits=False: the caller
        reads the rows through argmax_rows / last_topk only, so the logits may stay where the engine
        computed them (a GPU): returns None."""
        ...

    def argmax_rows(self, n: int) -> np.ndarray:
        """Each of the last forward's first n rows' argmax [n] int64 (its first maximum, as numpy's):
        the graph's top-k output's first ids where it has one (n x top_k ids cross from a GPU, not the
        n x V logits), else read off the logits (a view, valid until the next call)."""
        ...

    def commit(self, past_len: int, n_rows: int, rows: np.ndarray | None = None) -> None:
        """Write the first n_rows K/V rows of the last forward (or rows[:n_rows], a tree's path)
        into the cache at past_len."""
        ...

    def last_topk(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        """(ids [n, top_k] int64, probabilities [n, top_k] float32) of the last forward's first n rows,
        best first (views, valid until the next call): what the recycle table keeps. An engine whose
        graph has no top-k output (top_k 0) raises EngineError."""
        ...

    def last_hidden(self, n: int) -> np.ndarray:
        """Hidden states [n, H] of the last forward's first n rows (has_hidden)."""
        ...

    def last_hidden_aux(self, n: int) -> np.ndarray:
        """Aux features [n, n_aux*H] of the last forward's first n rows: the residual streams entering
        a few low/mid/high layers, concatenated (targets exported with them; others raise EngineError)."""
        ...

    def load_widths(self, widths) -> None:
        """Create the session(s) and run each width once (a first real call then pays nothing)."""
        ...

    def close(self) -> None:
        """Free what the engine holds beyond host arrays (device memory, sessions); it cannot run after."""
        ...


class HeadEngine(Protocol):
    """A head: an engine over (token, feature) pairs with its own KV, drafting over a draft
    vocabulary mapped to target ids by d2t. Its feature of a target row is the target's hidden
    state, or, with an input projection fc_t, fc_t applied to the target's aux features."""

    max_len: int
    vocab_size: int  # draft vocabulary Vd
    hidden_size: int
    widths: tuple[int, ...]
    n_calls: int
    takes_tree: bool  # forward takes parents (a forest of drafted nodes)
    d2t: np.ndarray  # [Vd] draft id -> target id
    fc_t: np.ndarray | None  # [n_aux*H, H] input projection the drafter applies to aux features (None: none)

    def forward(self, token_ids: np.ndarray, past_len: int, features=None, parents=None) -> np.ndarray:
        """Run n (token, feature) pairs, features [n, H], at positions past_len...; logits [n, Vd]
        (a view, valid until the next call). parents [n]: a forest of drafted nodes (takes_tree)."""
        ...

    def commit(self, past_len: int, n_rows: int, rows: np.ndarray | None = None) -> None:
        """As Engine.commit."""
        ...

    def last_hidden(self, n: int) -> np.ndarray:
        """The head's predicted features [n, H] of the last forward (the next step's input)."""
        ...

    def load_widths(self, widths) -> None:
        """As Engine.load_widths."""
        ...


class HeadsEngine(Protocol):
    """Multi-token heads: one call maps a feature [H] (the target's last verified hidden state) to
    K heads' logits [K, Vd], head i drafting the token i+1 places ahead. No KV, no sequence."""

    n_heads: int  # K
    hidden_size: int
    vocab_size: int  # draft vocabulary Vd
    n_calls: int
    d2t: np.ndarray  # [Vd] draft id -> target id

    def forward(self, feature: np.ndarray) -> np.ndarray:
        """feature [H] -> logits [K, Vd] (a view, valid until the next call)."""
        ...

    def load(self) -> None:
        """Create the session and run it once (a first real call then pays nothing)."""
        ...


class BlockDrafter(Protocol):
    """A block drafter: one call drafts a whole block from the target's aux features (low/mid/high
    layers) of verified positions and the last verified token. Its context cache holds verified
    positions only, so a rejected draft costs no rollback and there is no commit."""

    max_len: int  # context positions its cache holds
    vocab_size: int  # draft vocabulary Vd
    block_size: int  # b: the given token + b-1 drafted positions
    feature_width: int  # n_aux*H: width of the target's aux feature rows it reads
    n_calls: int
    d2t: np.ndarray  # [Vd] draft id -> target id

    def draft(self, feats: np.ndarray, ctx_len: int, anchor: int) -> np.ndarray:
        """feats [n, n_aux*H]: the target's aux features of positions ctx_len..ctx_len+n-1 (verified,
        appended to the context); anchor: the token at position ctx_len + n (verified, not yet
        through the target). Logits [b-1, Vd] drafting positions ctx_len+n+1 .. (a view, valid
        until the next call)."""
        ...

    def load(self) -> None:
        """Create the session and run each width once (a first real call then pays nothing)."""
        ...


def commit_host(kv: np.ndarray, new: np.ndarray, past_len: int, n_rows: int, rows: np.ndarray | None) -> None:
    """new [L, 2, w, W] rows into a host cache kv [L, 2, S_max, W] at past_len: the first n_rows, or
    rows[:n_rows] in order (a tree's accepted path), row by row (no temporary)."""
    if rows is None:
        kv[:, :, past_len : past_len + n_rows] = new[:, :, :n_rows]
        return
    for i, r in enumerate(rows[:n_rows]):
        kv[:, :, past_len + i] = new[:, :, r]


def pick_width(widths: tuple[int, ...], n_tokens: int) -> int:
    for w in widths:
        if w >= n_tokens:
            return w
    raise EngineError(f"{n_tokens} tokens in one call but the widest graph is {widths[-1]}")


def fill_tree(tree: np.ndarray, pos: np.ndarray, parents: np.ndarray, n: int, past_len: int) -> None:
    """Write a token tree into a graph's inputs: tree [w, w] (1 where the column node is the row
    node or an ancestor of it) and positions pos [w] (past_len + depth). parents[i] < i
    (topological order), -1 for a root (node 0; a forest may have more). Rows n.. (padding) see
    only themselves, at depth 0."""
    w = tree.shape[0]
    tree[:] = 0
    pos[:] = past_len
    for i in range(n):  # ancestors of i = ancestors of its parent + itself (parent < 0: a root)
        if i and parents[i] >= 0:
            tree[i, :i] = tree[parents[i], :i]
            pos[i] = pos[parents[i]] + 1
        tree[i, i] = 1
    for i in range(n, w):
        tree[i, i] = 1


def window_slots(past_len: int, width: int, bucket: int, max_len: int) -> int:
    """Cache window S fed to a call: the bucket multiple that holds the new rows too (<= max_len)."""
    return min(max_len, -(-(past_len + width) // bucket) * bucket)


# CUDA graphs an engine captures at load (its calls' other (width, window) pairs are captured at their
# first use). Each capture is one run at load (the capture itself) and a graph ONNX Runtime / the CUDA
# driver keep for the session's life, with the memory its run used; all the pairs of a 2048-slot folder
# are ~170, most of which a request never reaches, so the load pays for the short contexts every request
# starts with
CAPTURE_AT_LOAD = 64


def load_calls(widths, bucket: int, max_len: int, budget: int = CAPTURE_AT_LOAD) -> list[tuple[int, int]]:
    """(width, past_len) of the calls that capture CUDA graphs at load: for each width, its first
    budget // len(widths) cache windows (at least one), from the smallest that holds its rows up, each
    reached at past_len = window - width (window_slots and the host prologue's windows alike: the
    bucket multiple that holds past_len + width); windows past max_len are left to their first use."""
    widths = sorted(set(widths))
    per = max(1, budget // max(1, len(widths)))
    calls = []
    for w in widths:
        first = -(-w // bucket) * bucket
        calls += [(w, s - w) for s in range(first, first + per * bucket, bucket) if s <= max_len]
    return calls
