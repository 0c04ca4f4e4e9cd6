"""The EAGLE drafter's verifying engine: the fused target+head graph, one call runs the target and the
head after it.

The fused graph (its head's names carry FUSED_PREFIX) reads the head's KV window next to the
target's and returns, per row, the head's logits, K/V and predicted feature. The head's input
token of a row is given (`give_next`: the tokens that follow, known in a prefill) or the target's
argmax (verify). Its KV stays the head engine's own host buffer, aligned with the target's: commit
writes the head's rows with the target's, and `last_head` gives the head's draft at the last
committed row, so the next step starts one head call ahead. The target's part is the plain ORT
engine (OrtModel, on the plain target's KV buffer); this subclass only adds the head's inputs and
outputs to its bindings, so a call costs what the plain path costs plus the head's rows.
"""

from __future__ import annotations

import numpy as np

from edgespec.engines.base import EngineError, commit_host, pick_width
from edgespec.engines.manifest import FUSED_PREFIX, Manifest, ModelSpec
from edgespec.engines.ort import OrtModel


class FusedVerifier(OrtModel):
    """The fused graph's engine: runs the target's calls in the target's place (the drafter's
    `verifier`). `head` is the head engine (OrtModel) whose KV the graph reads and whose rows
    commit writes."""

    verifies = True  # (its session's pool spins as the target's: engines/session.py)

    def __init__(
        self, manifest: Manifest, spec: ModelSpec, head: OrtModel, threads: int | None = None, kv=None
    ) -> None:
        if head.device is not None:
            raise EngineError("the fused target+head graph runs on the CPU provider only (host KV)")
        super().__init__(manifest, spec, "cpu", threads, kv=kv)
        self.head = head
        widths, kv_dtype = self.widths, head.kv.dtype
        self._head_ids = {w: np.zeros((1, w), np.int64) for w in widths}  # given next tokens
        self._given = np.zeros(1, np.int64)  # rows that take them (the rest: the target's argmax)
        self._head_logits = {w: np.zeros((1, w, head.vocab_size), np.float32) for w in widths}
        self._head_new_kv = {w: np.zeros((1, 2, w, head.spec.kv_width), kv_dtype) for w in widths}
        self._head_hidden = {w: np.zeros((1, w, head.hidden_size), kv_dtype) for w in widths}
        self._next: np.ndarray | None = None  # the next call's given tokens (give_next)
        self._row = 0  # the head row of the last committed target row (its draft of the next token)
        self._rows: np.ndarray | None = None  # the last commit's rows in sequence order (None: the first n)
        self._fresh = False  # the last committed target rows were this graph's, not yet taken (take_commit)

    def _extra_io(self, width: int, n_slots: int) -> tuple[list, list]:
        """The head's inputs of a (width, window) call (its given tokens, its KV window) and its outputs."""
        p, kv = FUSED_PREFIX, self.head.kv
        inputs = [
            (p + "input_ids", self._head_ids[width]),
            (p + "n_given", self._given),
            (p + "past_key_0", kv[0, 0, :n_slots]),
            (p + "past_value_0", kv[0, 1, :n_slots]),
        ]
        outputs = [
            (p + "logits", self._head_logits[width]),
            (p + "new_kv", self._head_new_kv[width]),
            (p + "hidden", self._head_hidden[width]),
        ]
        return inputs, outputs

    def give_next(self, next_ids: np.ndarray) -> None:
        """The tokens that follow the next call's first len(next_ids) rows (known in a prefill): that
        call's head rows take them; a call without them (verify) takes the target's argmax everywhere."""
        self._next = next_ids

    def forward(self, token_ids: np.ndarray, past_len: int, features=None, parents=None, logits: bool = True):
        nxt, self._next = self._next, None
        given = 0 if nxt is None else len(nxt)
        if given:
            self._head_ids[pick_width(self.widths, len(token_ids))][0, :given] = nxt
        self._given[0] = given
        return super().forward(token_ids, past_len, features, parents, logits)

    def commit(self, past_len: int, n_rows: int, rows: np.ndarray | None = None) -> None:
        # the head's rows ride along: its KV is aligned with the target's
        commit_host(self.head.kv, self._head_new_kv[self._last_width], past_len, n_rows, rows)
        self._row = int(rows[n_rows - 1]) if rows is not None else n_rows - 1
        self._rows, self._fresh = rows, True
        super().commit(past_len, n_rows, rows)

    def take_commit(self) -> bool:
        """Were the last committed target rows this graph's (its head rows with them)? Once per commit: a
        later call on the plain target, which shares the KV, commits without this graph."""
        fresh, self._fresh = self._fresh, False
        return fresh

    def last_argmax(self) -> int:
        """The argmax of the last committed row: the next token its head row took (a prefill's last row)."""
        return int(self.argmax_rows(self._row + 1)[self._row])

    def argmax_led(self, following: np.ndarray) -> int:
        """Of the last commit's rows (in sequence order), how many lead where each row's committed next
        token (following [n_rows]) is its argmax, the token its head row took: those head rows hold
        true pairs. (A sampled call's drawn tokens; greedy: all of them.)"""
        n_rows, rows = len(following), self._rows
        top = self.argmax_rows(n_rows if rows is None else int(rows[:n_rows].max()) + 1)
        got = (top[:n_rows] if rows is None else top[rows[:n_rows]]).tolist()
        want = following.tolist()
        n = 0
        while n < n_rows and got[n] == want[n]:
            n += 1
        return n

    def last_head(self) -> tuple[np.ndarray, np.ndarray]:
        """The head's output at the last committed row: (logits [Vd] drafting the token after that
        row's next one, predicted feature [H]); views, valid until the next call."""
        w = self._last_width
        return self._head_logits[w][0, self._row], self._head_hidden[w][0, self._row]

    def last_head_logits(self, n: int) -> np.ndarray:
        """The head's logits [n, Vd] of the last forward's first n rows."""
        return self._head_logits[self._last_width][0, :n]
