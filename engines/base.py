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


def window_slots(past_len: int, width: int, bucket: int, max_len: int) -> int:
    """Cache window S fed to a call: the bucket multiple that holds the new rows too (<= max_len)."""
    return min(max_len, -(-(past_len + width) // bucket) * bucket)


def prefill(engine, tokens: np.ndarray, past: int, hidden_out: np.ndarray | None = None,
            features: np.ndarray | None = None) -> tuple[int, np.ndarray | None]:
    """Run tokens through an engine in chunks of its widest graph (the last chunk padded) and
    commit them; return (new past length, logits [V] of the last token, None if no tokens).
    hidden_out [max_len, H]: receives the hidden states of the new positions (for EAGLE);
    features [len(tokens), H]: an EAGLE head's feature rows for these tokens."""
    widest = max(engine.widths)
    logits = None
    for i in range(0, len(tokens), widest):
        chunk = tokens[i:i + widest]
        if features is None:
            logits = engine.forward(chunk, past)
        else:
            logits = engine.forward(chunk, past, features=features[i:i + widest])
        engine.commit(past, len(chunk))
        if hidden_out is not None:
            hidden_out[past:past + len(chunk)] = engine.last_hidden(len(chunk))
        past += len(chunk)
    return past, (logits[-1] if logits is not None else None)
