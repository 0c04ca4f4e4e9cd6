"""The one piece of mutable state the loop carries: the token sequence and its length pointers."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class SeqState:
    tokens: np.ndarray  # [max_len + max_k] int64: prompt, output, then scratch slots for the draft
    n: int  # tokens in the sequence; tokens[n-1] is the pending one (not yet in the target KV)
    n_prompt: int  # prompt length
    tgt_past: int  # rows in the target KV (= n - 1 between steps)

    @property
    def pending(self) -> int:
        return int(self.tokens[self.n - 1])

    def draft_slots(self, m: int) -> np.ndarray:
        """Where a drafter writes m proposed tokens (right after the pending token)."""
        return self.tokens[self.n:self.n + m]

    def verify_window(self, m: int) -> np.ndarray:
        """[pending, d_1..d_m]: the target's input for one verify call (a view, no copy)."""
        return self.tokens[self.n - 1:self.n + m]
