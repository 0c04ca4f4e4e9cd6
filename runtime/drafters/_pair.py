"""The base of the drafters that combine a lookup with a second source (hybrid: a head drafter,
merged: the recycle table): both hear every call, step and request, the lookup first, so each keeps
learning whichever of them proposed."""

from __future__ import annotations

import numpy as np

from edgespec.runtime.drafters.base import Drafter
from edgespec.runtime.sampling import SamplingConfig
from edgespec.runtime.state import Proposal, SeqState


class LookupPair(Drafter):
    """A lookup drafter and a second drafter: configure, observe, observe_prefill, accepted and finish
    go to both, the lookup first; what each step proposes from them is the subclass's."""

    def __init__(self, lookup: Drafter, second: Drafter) -> None:
        super().__init__()
        self.lookup, self.second = lookup, second

    def configure(self, sampling: SamplingConfig, rng: np.random.Generator) -> None:
        super().configure(sampling, rng)
        self.lookup.configure(sampling, rng)
        self.second.configure(sampling, rng)

    def finish(self, seq: SeqState) -> None:
        self.lookup.finish(seq)
        self.second.finish(seq)

    @property
    def needs_logits(self) -> bool:
        return self.lookup.needs_logits or self.second.needs_logits

    def observe(self, tgt, seq: SeqState, prop: Proposal, logits) -> None:
        self.lookup.observe(tgt, seq, prop, logits)
        self.second.observe(tgt, seq, prop, logits)

    def observe_prefill(self, tgt, seq: SeqState, past: int, n: int, logits) -> None:
        self.lookup.observe_prefill(tgt, seq, past, n, logits)
        self.second.observe_prefill(tgt, seq, past, n, logits)

    def accepted(self, seq: SeqState, n_old: int, n_acc: int) -> None:
        self.lookup.accepted(seq, n_old, n_acc)  # (merged as hybrid's lookup: its table's committed rows)
        self.second.accepted(seq, n_old, n_acc)
