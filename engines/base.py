"""The engine protocol: one model with its own preallocated KV buffer.

An engine runs a static-width graph over a few new tokens at `past_len` and keeps the new K/V rows
of that call aside; `commit` writes the first n of them into the cache at `past_len`. Rejecting
draft tokens therefore costs nothing: the caller just commits fewer rows and moves its length
pointer, stale rows beyond it are masked and later overwritten.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np


class EngineError(RuntimeError):
    """An engine that cannot be loaded or run as asked (with what to do about it)."""


class ModelEngine(Protocol):
    max_len: int  # KV slots
    vocab_size: int  # logits width
    widths: tuple[int, ...]  # graph widths T this engine can run

    def forward(self, token_ids: np.ndarray, past_len: int) -> np.ndarray:
        """Run len(token_ids) <= max(widths) tokens at positions past_len...; logits [n, V] (a view,
        valid until the next call)."""
        ...

    def commit(self, past_len: int, n_rows: int) -> None:
        """Write the first n_rows K/V rows of the last forward into the cache at past_len."""
        ...

    def width_for(self, n_tokens: int) -> int:
        """The graph width a call with n_tokens runs at (the smallest width >= n_tokens)."""
        ...


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


TREE_BLOCK = 128  # the context blocks ORT's CPU attention GEMM sums separately (measured, tests/test_tree.py)


def tree_chain_prefix(past_len: int, n_nodes: int, block: int = TREE_BLOCK) -> int:
    """How many leading nodes of a tree verified at past_len must form a chain (node i at depth i)
    for its rows to equal a chain's bit for bit: up to the first multiple of `block` inside
    [past_len, past_len + n_nodes). The attention's probability x value GEMM sums each block of
    slots on its own, so an ancestor must sit in the same block in the tree as in the chain."""
    b = -past_len % block
    return b if 1 < b < n_nodes else 1


def decode_rows_match_verify_rows(engine, token: int = 1) -> bool:
    """Does a 1-token call give the same bits as the same token inside a 2-token call? (Greedy
    speculative output equals plain output only if it does.) Two calls at position 0, nothing
    committed."""
    one = engine.forward(np.array([token], np.int64), 0).copy()
    two = engine.forward(np.array([token, token], np.int64), 0)
    return bool(np.array_equal(one[0], two[0]))


def window_slots(past_len: int, width: int, bucket: int, max_len: int) -> int:
    """Cache window S fed to a call: the bucket multiple that holds the new rows too (<= max_len)."""
    return min(max_len, -(-(past_len + width) // bucket) * bucket)


def prefill(engine, tokens: np.ndarray, past: int, hidden_out: np.ndarray | None = None,
            features: np.ndarray | None = None) -> tuple[int, np.ndarray | None]:
    """Run tokens through an engine in chunks of its widest graph (the last chunk padded) and
    commit them; return (new past length, logits [V] of the last token, None if no tokens).
    hidden_out [max_len, H]: receives the hidden states of the new positions (for EAGLE);
    features [len(tokens), H]: an EAGLE head's feature rows for these tokens. An engine with an
    EAGLE head fused in gets each row's next token for the head (the last row's is the argmax)."""
    widest = max(engine.widths)
    logits = None
    fused = getattr(engine, "head", None) is not None
    for i in range(0, len(tokens), widest):
        chunk = tokens[i:i + widest]
        if features is not None:
            logits = engine.forward(chunk, past, features=features[i:i + widest])
        elif fused:
            logits = engine.forward(chunk, past, head_next=tokens[i + 1:i + 1 + widest])
        else:
            logits = engine.forward(chunk, past)
        engine.commit(past, len(chunk))
        if hidden_out is not None:
            hidden_out[past:past + len(chunk)] = engine.last_hidden(len(chunk))
        past += len(chunk)
    return past, (logits[-1] if logits is not None else None)
