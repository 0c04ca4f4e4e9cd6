"""What the loop asks of an output constraint, and the null one that constrains nothing.

Every call runs its steps through a constraint, as it runs them through a drafter, so the step
and the loop carry no grammar branch: a grammar (constrain.Constraint) shapes each proposal
before the verify call and accepts it on masked logits; `NO_CONSTRAINT` hands the proposal
through and accepts it with verify.accept, so a plain call takes the plain step (a method call
per hook, no allocation).

  first(logits, sampling, rng)              the first output token from the prompt's last logits [V]
  shape(prop, seq, tgt, drafter, k)         the proposal to verify with the engine tgt
  accept(prop, logits, seq, sampling, rng)  (n accepted, the step's last token) of the verified proposal
  needs_logits(sampling)                    whether accept reads the rows' logits; if not, the loop leaves
                                            them on the device and calls accept_argmax(prop, tgt, seq)
  drafter_kept(n_acc)                       how many of the drafter's own tokens were kept (drafter.accepted)
  drafts(prop), drafts_kept(n_acc), depth(prop), forced_kept
                                            the step's counts for GenerationStats.record_step
  drafter_sampling(sampling)                the settings the drafter drafts with
  kind, trees_ok, shape_s and the call's counters (GenerationStats.record_grammar)
"""

from __future__ import annotations

import numpy as np

from edgespec.runtime.sampling import SamplingConfig, probs, sample
from edgespec.runtime.state import Proposal, SeqState
from edgespec.runtime.verify import accept, accept_argmax


class OutputConstraint:
    """The interface an output constraint implements; these defaults constrain nothing (`NO_CONSTRAINT`).
    Stateless, so one instance serves every generator and thread."""

    kind = ""  # what constrains the output (GenerationStats.grammar; "": nothing)
    trees_ok = True  # the drafter may propose token trees (a grammar walks chains only)
    shape_s = 0.0  # seconds in the last shape(): the loop counts them as grammar time, not draft time
    forced_kept = 0  # forced tokens among the last step's kept ones (step tokens, not drafts)
    # the call's counters, which GenerationStats.record_grammar copies: all zero leaves its defaults
    n_forced = n_cut = n_masks = n_forced_rows = 0
    seconds = 0.0

    def drafter_sampling(self, sampling: SamplingConfig) -> SamplingConfig:
        return sampling

    def first(self, logits: np.ndarray, sampling: SamplingConfig, rng) -> int:
        return int(logits.argmax()) if sampling.greedy else sample(probs(logits, sampling), rng)

    def shape(self, prop: Proposal, seq: SeqState, tgt, drafter, k: int) -> Proposal:
        return prop

    def accept(
        self, prop: Proposal, tgt_logits: np.ndarray, seq: SeqState, sampling: SamplingConfig, rng
    ) -> tuple[int, int]:
        return accept(prop, tgt_logits, seq, sampling, rng)

    def needs_logits(self, sampling: SamplingConfig) -> bool:
        """Does accept() read the verified rows' logits [T, V]? A greedy call without a repetition
        penalty accepted by verify.accept (this class's accept, not overridden) reads only each row's
        argmax: the loop then asks the engine for its rows' argmax ids (on a GPU T ids come back, not
        T x V floats) and calls accept_argmax. Sampling, a penalty and a constraint's own accept (a
        grammar masks the logits) read the logits."""
        own = type(self).accept is not OutputConstraint.accept
        return own or not sampling.greedy or sampling.repetition_penalty != 1.0

    def accept_argmax(self, prop: Proposal, tgt, seq: SeqState) -> tuple[int, int]:
        """accept() of a call needs_logits() said False for, from the verified rows' argmax ids [T]
        (the engine tgt's argmax_rows: its logits may have stayed on the device)."""
        return accept_argmax(prop, tgt.argmax_rows(len(prop.tokens)), seq)

    def drafter_kept(self, n_acc: int) -> int:
        return n_acc

    def drafts(self, prop: Proposal) -> int:
        """Drafts the step verified (forced tokens apart)."""
        return prop.n_drafted

    def drafts_kept(self, n_acc: int) -> int:
        """Drafts the step kept (forced tokens apart)."""
        return n_acc

    def depth(self, prop: Proposal) -> int:
        """The positions the per-position stats count (a tree: its depth)."""
        return prop.depth


NO_CONSTRAINT = OutputConstraint()
