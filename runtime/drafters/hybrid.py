"""Hybrid drafting by expected accepted length: each step proposes suffix decoding's chain or the
EAGLE head's chain, whichever is expected to keep more tokens.

Suffix decoding (suffix/) covers text that occurred before, in this prompt + output and in the
process's recent requests; the head covers new text. Each source predicts its own chain's
accepted length from its own probabilities: the sum over i of the path probability p(d_1..d_i),
which is the expected accepted length if those probabilities were right (the suffix drafter's
continuation frequencies, the head's confidences). Neither is calibrated: a head is sure of
itself on text unlike its training data, and a single earlier occurrence gives a suffix path
probability 1. So each prediction is scaled by a running ratio of observed to predicted accepted
length: one for the head, one per match length for suffix decoding (a long match predicts
better than a short one). The larger estimate wins; a tie goes to suffix decoding (no model call).

Lossless: the choice uses only what is known before verification.
  greedy    both chains are deterministic: both are drafted and compared, and the loser's chain
            also teaches its ratio how much of it the target would have kept (its common prefix
            with the tokens that came; a lower bound when all of those matched). The head is not
            run when even a chain of k certain tokens could not beat the suffix's estimate.
  sampling  by default the lookup's chain alone (`--hybrid-sampled-head` brings the head back): at
            temperature a head keeps ~0.3 tokens a step for a catch-up call of 1-2.5 decodes on the
            CPU, and the first head step priced every later step of the pair so high that adaptive
            k switched the lookup off with it (hybrid at t = 0.7 kept 1.00 tokens per call where its
            lookup alone keeps 1.26; docs/results/sampling-heads.md). With the head: its tokens are
            draws from its q; choosing by them would propose from q given that it was chosen while
            verification assumes q. So the head's estimate is its running accepted length, taken
            before it drafts, and only the source that drafted learns. These estimates start afresh
            every call, so a seed reproduces its output given the same cache of recent requests.
Trees: suffix decoding's tree where it matches, the head's elsewhere.

--hybrid-lookup merged puts merged (recycle/merged.py: suffix decoding continued from the recycle table)
in suffix decoding's place: its estimate is its calibrated sum of path scores, per lookup match
length (0: the table alone). Its sampled table drafts are drawn from q, so its sampled estimate
counts only the drafts whose rows follow from the prefix (MergedDrafter.last_score), and the
chosen chain carries its q.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from edgespec.runtime.drafters import Drafter, DrafterPlugin, Option, register, registry, spec_of
from edgespec.runtime.drafters._pair import LookupPair
from edgespec.runtime.drafters.ngram import NgramDrafter, ngram_config
from edgespec.runtime.drafters.suffix import DEPTH, SuffixDrafter, recent_requests
from edgespec.runtime.sampling import SamplingConfig
from edgespec.runtime.state import Proposal, SeqState, chain

SUFFIX, HEAD = "suffix", "head"  # the sources, as the stats name them
MAX_DRAFT = 64  # chain tokens kept per source (k is bounded by the folder's verify widths)


@dataclass(frozen=True)
class ChoiceConfig:
    ema: float = 0.1  # weight of the newest step in the running ratios and accepted lengths
    prior_ratio: float = 1.0  # observed / predicted before any step (1: take the raw predictions)
    prior_head_sampled: float = 1.0  # the head's accepted length per step under sampling, before any step


class Ratio:
    """A running ratio of observed to predicted accepted length: both are moving averages, so a
    step that predicted little weighs little."""

    __slots__ = ("obs", "pred", "ema")

    def __init__(self, prior: float, ema: float) -> None:
        self.obs, self.pred, self.ema = prior, 1.0, ema

    @property
    def value(self) -> float:
        return self.obs / self.pred

    def observe(self, predicted: float, observed: float) -> None:
        e = self.ema
        self.obs = (1 - e) * self.obs + e * observed
        self.pred = (1 - e) * self.pred + e * predicted


class SourcePicker:
    """The estimates the choice compares, and what they learn from each verified step."""

    def __init__(self, cfg: ChoiceConfig = ChoiceConfig()) -> None:
        self.cfg = cfg
        self.head = Ratio(cfg.prior_ratio, cfg.ema)
        self.suffix = [Ratio(cfg.prior_ratio, cfg.ema) for _ in range(DEPTH + 1)]  # by match length
        self.head_sampled = cfg.prior_head_sampled  # running accepted length of the head's steps (sampling)

    def suffix_estimate(self, size: int, score: float) -> float:
        """A suffix chain's expected accepted length: its score (sum of path probabilities) for a
        match of `size` tokens, calibrated."""
        return self.suffix[size].value * score

    def head_estimate(self, expected: float) -> float:
        """A head chain's expected accepted length from its sum of path probabilities, calibrated."""
        return self.head.value * expected

    def head_bound(self, k: int) -> float:
        """The most any head chain of k tokens can be estimated to keep (every confidence 1)."""
        return self.head.value * k

    @staticmethod
    def pick(e_suffix: float, e_head: float) -> str:
        """The source with the larger estimate; a tie goes to suffix decoding (no model call)."""
        return HEAD if e_head > e_suffix else SUFFIX

    def observe(self, source: str, size: int, predicted: float, kept: int) -> None:
        """A verified chain of `source` that predicted `predicted` and kept `kept` tokens."""
        (self.head if source == HEAD else self.suffix[size]).observe(predicted, kept)

    def observe_head_sampled(self, kept: int) -> None:
        e = self.cfg.ema
        self.head_sampled = (1 - e) * self.head_sampled + e * kept


def _common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


class LookupHeadPair(LookupPair):
    """A lookup drafter and a head drafter, one of them proposing each step: the head keeps catching
    up on every verified token (it runs the verify calls' engine too), so it is ready; trees are the
    lookup's where it matches, the head's elsewhere."""

    name = "hybrid"
    drafts_trees = True
    lookup_name = ""  # the lookup, as the stats name the source

    def __init__(self, lookup: Drafter, head: Drafter, sampled_head: bool = False) -> None:
        """sampled_head: the head drafts under sampling too (module docstring: off, the lookup alone)."""
        super().__init__(lookup, head)
        self.head, self.sampled_head = head, sampled_head
        self.engine = head.engine

    @property
    def head_drafts(self) -> bool:
        """May the head propose this call?"""
        return self.sampling.greedy or self.sampled_head

    @property
    def verifier(self):
        # (the head's: the fused graph only where its rows are used, so none where the head does not draft)
        return self.head.verifier if self.head_drafts else None

    def forget(self) -> None:
        self.head.forget()

    def start(self, seq: SeqState, n_cached: int = 0) -> None:
        self.head.start(seq, n_cached)

    def propose_tree(self, seq: SeqState, tree, cfg) -> None:
        self.lookup.propose_tree(seq, tree, cfg)
        self.source = self.lookup_name
        if tree.n == 1 and self.head_drafts:
            self.head.propose_tree(seq, tree, cfg)
            self.source = HEAD if tree.n > 1 else ""


class SuffixHeadHybrid(LookupHeadPair):
    """hybrid: per step, suffix decoding or the EAGLE head by expected accepted length (module
    docstring)."""

    lookup_name = SUFFIX

    def __init__(
        self,
        suffix: Drafter,
        head,
        cfg: ChoiceConfig = ChoiceConfig(),
        lookup_name: str = SUFFIX,
        sampled_head: bool = False,
    ) -> None:
        """suffix: suffix decoding, or a lookup reporting the same last_size / last_score of its chain
        (merged: suffix decoding continued from the recycle table); sampled_head: the head drafts under
        sampling too (module docstring)."""
        super().__init__(suffix, head, sampled_head)
        self.suffix, self.cfg, self.lookup_name = suffix, cfg, lookup_name
        self._q = None  # the lookup's chain's q this step (merged, sampled: its table drafts are drawn)
        head.track_confidence = True  # its chain estimate needs the confidences even without a cut-off
        self.greedy_picker = SourcePicker(cfg)  # greedy estimates keep learning across calls
        self.picker = self.greedy_picker
        self._chains = np.zeros((2, MAX_DRAFT), np.int64)  # this step's chain per source (0 suffix, 1 head)
        self._m = [0, 0]  # their lengths (0: not drafted this step)
        self._pred = [0.0, 0.0]  # their raw predictions (sums of path probabilities)
        self._size = 0  # the suffix chain's match length
        self._chosen = ""  # the source that proposed this step ("" before a proposal / for trees)

    def configure(self, sampling: SamplingConfig, rng: np.random.Generator) -> None:
        super().configure(sampling, rng)
        self.picker = self.greedy_picker if sampling.greedy else SourcePicker(self.cfg)

    def _use(self, source: str, seq: SeqState) -> Proposal:
        """The chain of `source`, back in the draft slots (the other may have written over them)."""
        i = 0 if source == SUFFIX else 1
        m = self._m[i]
        seq.draft_slots(m)[:] = self._chains[i, :m]
        self._chosen, self.source = source, (self.lookup_name if i == 0 else source) if m else ""
        if i == 0:  # (merged: its calibration learns from the chain it verifies; suffix: nothing)
            self.suffix.chain_verified(m)
        return chain(seq, m, self._q if i == 0 else None)

    def propose(self, seq: SeqState, k: int) -> Proposal:
        k, pk = min(k, MAX_DRAFT), self.picker
        prop = self.suffix.propose(seq, k)
        m_s, self._q = prop.n_drafted, prop.q
        self._size, self._pred[0] = self.suffix.last_size, self.suffix.last_score
        self._chains[0, :m_s] = seq.draft_slots(m_s)
        self._m[0], self._m[1] = m_s, 0
        e_s = pk.suffix_estimate(self._size, self._pred[0]) if m_s else 0.0
        if not self.sampling.greedy:
            if not self.head_drafts or (m_s and e_s >= pk.head_sampled):
                return self._use(SUFFIX, seq)  # (m_s = 0: nothing drafted)
            prop = self.head.propose(seq, k)  # drafted after the choice: its q is the proposal's
            self._m[1] = prop.n_drafted
            self._chosen, self.source = HEAD, HEAD if prop.n_drafted else ""
            return prop
        if m_s and e_s >= pk.head_bound(k):
            return self._use(SUFFIX, seq)
        m_h = self.head.propose(seq, k).n_drafted
        self._pred[1] = self.head.expected
        self._chains[1, :m_h] = seq.draft_slots(m_h)
        self._m[1] = m_h
        head_wins = m_h and (not m_s or pk.pick(e_s, pk.head_estimate(self._pred[1])) == HEAD)
        return self._use(HEAD if head_wins else SUFFIX, seq)

    def propose_tree(self, seq: SeqState, tree, cfg) -> None:
        self._chosen = ""  # trees teach no estimates
        super().propose_tree(seq, tree, cfg)

    def accepted(self, seq: SeqState, n_old: int, n_acc: int) -> None:
        super().accepted(seq, n_old, n_acc)
        pk, chosen = self.picker, self._chosen
        self._chosen = ""  # a step that proposes nothing (k = 0) must not learn from this one's chains
        if not chosen:
            return
        if not self.sampling.greedy:
            if chosen == HEAD:
                pk.observe_head_sampled(n_acc)
            elif self._m[0]:
                pk.observe(SUFFIX, self._size, self._pred[0], n_acc)
            return
        came = seq.tokens[n_old : seq.n]  # the kept drafts and the target's own token
        for i, source in enumerate((SUFFIX, HEAD)):
            m = self._m[i]
            if m:
                kept = n_acc if source == chosen else _common_prefix(self._chains[i, :m], came)
                pk.observe(source, self._size, self._pred[i], kept)


class HybridDrafter(LookupHeadPair):
    """`--hybrid-lookup ngram`: prompt lookup where the context has a match (it copies long spans
    for free), the head drafter elsewhere (new text)."""

    lookup_name = "ngram"

    def propose(self, seq: SeqState, k: int) -> Proposal:
        prop = self.lookup.propose(seq, k)
        if prop.n_drafted == 0 and self.head_drafts:
            prop = self.head.propose(seq, k)
            self.source = HEAD if prop.n_drafted else ""
        else:
            self.source = self.lookup_name
        return prop


LOOKUPS = ("suffix", "ngram", "merged")  # what hybrid pairs its head drafter with


def head_names() -> tuple[str, ...]:
    """The head drafters hybrid can pair with (the registered drafters marked `pairs`)."""
    return tuple(n for n, s in registry().items() if s.pairs)


class HybridPlugin(DrafterPlugin):
    """hybrid: a lookup paired with a head drafter; it needs (and reads) what its head does."""

    name = "hybrid"
    order = 5
    summary = (
        "per step, suffix decoding or a head drafter, whichever is expected to keep more tokens "
        "(--hybrid-lookup ngram: prompt lookup where the context has a match, the head elsewhere)"
    )
    trees = True
    draft_cost = 0.1
    options = (
        Option(
            "hybrid_lookup",
            str,
            "suffix",
            "what the hybrid drafter pairs its head with: suffix (default: "
            "per step, suffix decoding or the head, whichever is expected to keep more tokens), merged "
            "(the same choice with suffix decoding continued from the recycle table) or ngram "
            "(prompt lookup wherever it matches, the head elsewhere)",
            choices=LOOKUPS,
        ),
        Option(
            "hybrid_sampled_head",
            bool,
            False,
            "hybrid at temperature: let the head draft where the lookup has no chain (default off: on "
            "the CPU its catch-up call costs more than the tokens a sampled target keeps of its drafts)",
        ),
        Option(
            "hybrid_head",
            str,
            "eagle",
            "the head drafter hybrid pairs the lookup with: "
            "any registered head drafter (default eagle; the folder must ship it)",
            choices=head_names,
        ),
    )

    def build(self, ctx) -> Drafter:
        head = spec_of(ctx.cfg.hybrid_head).build(ctx)
        sampled_head = ctx.cfg.hybrid_sampled_head
        if ctx.cfg.hybrid_lookup == "ngram":
            return HybridDrafter(NgramDrafter(ngram_config(ctx.cfg)), head, sampled_head)
        if ctx.cfg.hybrid_lookup == "merged":
            return SuffixHeadHybrid(spec_of("merged").build(ctx), head, lookup_name="merged", sampled_head=sampled_head)
        return SuffixHeadHybrid(SuffixDrafter(recent_requests(ctx)), head, sampled_head=sampled_head)

    def needs(self, cfg) -> tuple[str, ...]:
        return spec_of(cfg.hybrid_head).needs(cfg)

    def needs_features(self, cfg) -> bool:
        return spec_of(cfg.hybrid_head).needs_features(cfg)


PLUGIN = register(HybridPlugin())
