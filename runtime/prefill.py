"""Prompt processing: tokens into an engine's KV in chunks of its widest graph."""

from __future__ import annotations

import numpy as np


def prefill(
    engine,
    tokens: np.ndarray,
    past: int,
    hidden_out: np.ndarray | None = None,
    features: np.ndarray | None = None,
    aux_out: np.ndarray | None = None,
    tap=None,
    give_next=None,
    seen=None,
    seen_logits: bool = False,
) -> tuple[int, np.ndarray | None]:
    """Run tokens through an engine in chunks of its widest graph (the last chunk padded) and
    commit them; return (new past length, logits [V] of the last token, None if no tokens).

    hidden_out [max_len, H]: receives the hidden states of the new positions (the head drafters read
    them); aux_out [max_len, n*H] their hidden_aux rows (the aux-feature drafters read them).
    features [len(tokens), H]: an EAGLE head's feature rows for these tokens (the engine is
    a head). give_next: called before each chunk's call with the tokens that follow its rows (known
    in a prefill, all but the very last row's): a drafter's verifier that drafts inside the call
    takes them (its `give_next`). tap: called per chunk with (past, logits [n, V], hidden [n, H],
    hidden_aux [n, A] or None) of its committed rows (Generator.tap). seen: called per chunk with
    (past, n, logits [n', V]) right after its call (the drafter's `observe_prefill`: a recycle table
    reads the chunk's rows); seen_logits: it reads the logits (else it gets None before the last chunk:
    on a GPU the other chunks' [n, V] logits then stay on the device)."""
    widest = max(engine.widths)
    logits = None
    for i in range(0, len(tokens), widest):
        chunk = tokens[i : i + widest]
        if give_next is not None:
            give_next(tokens[i + 1 : i + 1 + widest])
        if features is not None:
            logits = engine.forward(chunk, past, features=features[i : i + widest])
        else:  # only the last chunk's last row is returned; the others' logits only for a reader
            need = i + widest >= len(tokens) or tap is not None or seen_logits
            logits = engine.forward(chunk, past, logits=need)
        engine.commit(past, len(chunk))
        if seen is not None:
            seen(past, len(chunk), logits)
        if hidden_out is not None:
            hidden_out[past : past + len(chunk)] = engine.last_hidden(len(chunk))
        if aux_out is not None:
            aux_out[past : past + len(chunk)] = engine.last_hidden_aux(len(chunk))
        if tap is not None:
            n = len(chunk)
            tap(past, logits[:n], engine.last_hidden(n), engine.last_hidden_aux(n) if engine.spec.aux_width else None)
        past += len(chunk)
    return past, (logits[-1] if logits is not None else None)


def decode_rows_match_verify_rows(engine, token: int = 1) -> bool:
    """Does a 1-token call give the same bits as the same token inside a 2-token call? (Greedy
    speculative output equals plain output only if it does.) Two calls at position 0, nothing
    committed."""
    one = engine.forward(np.array([token], np.int64), 0).copy()
    two = engine.forward(np.array([token, token], np.int64), 0)
    return bool(np.array_equal(one[0], two[0]))
