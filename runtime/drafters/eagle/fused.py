"""The head's part of a fused target+head graph: one call runs the target and the head after it.

The fused graph (its head's names carry FUSED_PREFIX) reads the head's KV window next to the
target's and returns, per row, the head's logits, K/V and predicted feature. The head's input
token of a row is given (head_next: the tokens that follow, known in a prefill) or the target's
argmax (verify). Its KV stays the head engine's own host buffer, aligned with the target's: commit
writes the head's rows with the target's, and `last` gives the head's draft at the last
committed row, so the next step starts one head call ahead.
"""

from __future__ import annotations

import numpy as np

from edgespec.engines.base import EngineError, commit_host
from edgespec.engines.manifest import FUSED_PREFIX


class FusedHead:
    """Buffers and bindings of the head inside a fused graph; `head` is the head engine (OrtModel)
    whose KV the graph reads and whose rows commit writes."""

    def __init__(self, head, widths: tuple[int, ...], provider: str) -> None:
        if head.device is not None or provider != "cpu":
            raise EngineError("the fused target+head graph runs on the CPU provider only (host KV)")
        self.head = head
        self.ids = {w: np.zeros((1, w), np.int64) for w in widths}  # given next tokens
        self.given = np.zeros(1, np.int64)  # rows that take them (the rest: the target's argmax)
        self.logits = {w: np.zeros((1, w, head.vocab_size), np.float32) for w in widths}
        self.new_kv = {w: np.zeros((1, 2, w, head.spec.kv_width), head.kv.dtype) for w in widths}
        self.hidden = {w: np.zeros((1, w, head.hidden_size), head.kv.dtype) for w in widths}
        self.row = 0  # the head row of the last committed target row (its draft of the next token)

    def inputs(self, width: int, n_slots: int) -> list[tuple[str, np.ndarray]]:
        """The head's inputs of a (width, window) call: its given tokens and its KV window."""
        p, kv = FUSED_PREFIX, self.head.kv
        return [
            (p + "input_ids", self.ids[width]),
            (p + "n_given", self.given),
            (p + "past_key_0", kv[0, 0, :n_slots]),
            (p + "past_value_0", kv[0, 1, :n_slots]),
        ]

    def outputs(self, width: int) -> list[tuple[str, np.ndarray]]:
        p = FUSED_PREFIX
        return [
            (p + "logits", self.logits[width]),
            (p + "new_kv", self.new_kv[width]),
            (p + "hidden", self.hidden[width]),
        ]

    def give(self, width: int, head_next: np.ndarray | None) -> None:
        """Set the next call's given tokens (None: every row takes the target's argmax)."""
        given = 0 if head_next is None else len(head_next)
        if given:
            self.ids[width][0, :given] = head_next
        self.given[0] = given

    def commit(self, width: int, past_len: int, n_rows: int, rows: np.ndarray | None) -> None:
        """The head's rows of the last call into its cache, as the target's are committed."""
        commit_host(self.head.kv, self.new_kv[width], past_len, n_rows, rows)
        self.row = int(rows[n_rows - 1]) if rows is not None else n_rows - 1

    def last(self, width: int) -> tuple[np.ndarray, np.ndarray]:
        """(logits [Vd], predicted feature [H]) at the last committed row; views."""
        return self.logits[width][0, self.row], self.hidden[width][0, self.row]
