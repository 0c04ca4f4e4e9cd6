"""Adaptive speculation length: pick k per step from measured costs and running acceptance.

Model: each drafted token is accepted with probability a (independently, given the previous one
was), so a step that drafts k tokens yields E[tokens] = 1 + a + ... + a^k = (1 - a^(k+1)) / (1 - a)
target tokens, and costs draft(k) + verify(k + 1). The policy picks the k in 0..k_max with the
most expected tokens per second, where verify(T) is the measured time of a width-T target call
(an exponential moving average per width) and draft(k) = k times the measured time per drafted
token. k = 0 (plain decoding) is always a candidate, so speculation that does not pay on this
machine and this text is switched off by itself; it comes back when acceptance rises, because
every `probe_every` steps one step drafts k_max to keep the estimate of a alive (under sampling, one
token, and only as often as keeps the probes' measured cost under 1% of the time: `probe_share`).

Under greedy decoding the output is the same whatever k each step uses, so the policy may follow
the clock; so may seeded calls (each position's draw is keyed to the seed: sampling.KeyedDraws) and
unseeded ones (fresh draws: nothing to reproduce). Where a caller fixed the draws (an rng passed in,
a seed with typical acceptance) the k of a step decides which of them the step makes, so a policy
that followed measured times would make the output depend on the machine's load. Those calls use
`sampled_policy`: the same model on fixed relative costs (a verify row, a drafted token, in decodes:
the folder's recorded width table as a line, else `ROW_COST`; each drafter's
`DrafterPlugin.draft_cost`) and a fresh acceptance estimate per call that learns from accepted
counts only, so k, and the output, follow from the rng, the folder and the settings.
It settles on k = 0 when acceptance is too low to pay (drafts at temperature 0.7 are kept less
often than greedy ones), and its probes draft one token (`probe_k`): one extra verify row instead
of k_max. Every sampled call's estimate starts from the prior, which weighs as two drafting steps
(`prior_steps`), so a call whose drafts are not kept stops drafting after a few steps.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from edgespec.runtime.drafters import spec_of


@dataclass(frozen=True)
class AdaptiveConfig:
    ema: float = 0.1  # weight of the newest observation in the running estimates
    prior_acceptance: float = 0.5  # a before any observation
    probe_every: int = 16  # while k = 0 is chosen, draft a probe once every this many steps
    probe_k: int = 0  # tokens a probe drafts (0: k_max)
    probe_share: float = 0.0  # probes cost <= this share of a k = 0 stretch: waits grow with their cost (0: off)
    probe_max: int = 256  # the longest wait between probes (with probe_share)
    prior_steps: float = 0.0  # > 0: within a call the prior counts as this many drafting steps (a running
    #                           mean, then the EMA once its weight falls to ema); 0: the EMA from the start


# sampled calls: a cheap probe (one extra verify row), at most 1% of the time: a head's probe pays a
# catch-up call over the steps since the last one (EAGLE on the default folder: ~1.3 decodes, so one
# every 16 steps cost 3-4% of plain where sampled drafts never pay)
SAMPLED = AdaptiveConfig(probe_k=1, probe_share=0.01, prior_steps=2.0)
# Fixed costs of the sampled policy, in decodes (a width-1 target call = 1), used where the folder
# recorded no width table (manifest export_probe). An extra verify row on the CPU: 0.06 with the row
# kernel (135M attn-full, quiet, past 256: T=9 6.79 ms against T=1 4.55), 0.10-0.13 with MatMulNBits
# or a 1B target (docs/results/row-kernel.md); 0.08 sits between, and the sampled recycle tree's
# decode speed moves < 1.5% over 0.04-0.12 (offline replay, docs/results/recycle.md). On a GPU rows
# are nearly free.
ROW_COST = {"cpu": 0.08, "cuda": 0.02, "tensorrt": 0.02, "trt": 0.02}


class AdaptiveK:
    def __init__(
        self,
        k_max: int,
        verify_cost_s: dict[int, float],
        cfg: AdaptiveConfig = AdaptiveConfig(),
        draft_cost: float = 0.0,
        timed: bool = True,
        classes: int = 1,
    ) -> None:
        """verify_cost_s: width -> cost of a target call; draft_cost: of one drafted token; timed:
        both follow the measured times of observed steps (False: they stay as given); classes: kinds
        of step the drafter tells apart before drafting (Drafter.draft_class), each with its own
        acceptance estimate, k = 0 stretch and probes (the costs are shared)."""
        self.k_max = k_max
        self.cfg = cfg
        self.timed = timed
        self.verify_s = np.array([verify_cost_s.get(w, np.nan) for w in range(k_max + 2)])  # [k_max+2]
        self.verify_s[0] = 0.0
        self.acceptance = [cfg.prior_acceptance] * classes  # per class: per-token acceptance, a running estimate
        self.draft_s_per_token = draft_cost
        self._steps_at_zero = [0] * classes
        self._n_drafting = [0] * classes  # per class: this call's drafting steps (prior_steps)
        self._drafted = False  # a drafting step was measured (timed)
        self._plain_wait = [0] * classes  # per class, > 0: k = 0 stands (no drafting step of the class since it
        #                                   won), probing after this many of its steps
        self._k = np.arange(k_max + 1)

    def begin(self) -> None:
        """A new call: its acceptance estimate starts from the prior (how often drafts are kept varies by
        request: an estimate carried over from earlier ones drafted less where drafts paid, HumanEval-20
        t = 0.7 ngram 1.12x -> 1.07x); the measured costs carry over."""
        for c in range(len(self.acceptance)):
            self.acceptance[c] = self.cfg.prior_acceptance
            self._steps_at_zero[c] = self._plain_wait[c] = self._n_drafting[c] = 0

    def choose(self, c: int = 0) -> int:
        """k for a step of class c (Drafter.draft_class; 0 where the drafter tells none apart)."""
        if not self._plain_wait[c]:
            a = min(self.acceptance[c], 0.999)
            gain = (1 - a ** (self._k + 1)) / (1 - a)  # E[tokens] for k = 0..k_max
            cost = self.draft_s_per_token * self._k + self.verify_s[self._k + 1]
            k = int(np.nanargmax(gain / cost))
            if k:
                return k
            # k = 0 stands until a drafting step moves the estimates (a plain step only refines
            # verify(1)): the stretch's steps cost no numpy (~25 us each, 0.5% of a 5 ms decode)
            self._plain_wait[c] = self.probe_wait()
        self._steps_at_zero[c] += 1
        if self._steps_at_zero[c] >= self._plain_wait[c]:
            self._steps_at_zero[c] = self._plain_wait[c] = 0
            return self.cfg.probe_k or self.k_max
        return 0

    def probe_wait(self) -> int:
        """Steps at k = 0 between probes: probe_every, or (probe_share) as many as keep a probe's extra
        cost (its drafts and extra verify rows, in decodes) under that share of the stretch."""
        c = self.cfg
        if not c.probe_share:
            return c.probe_every
        pk = min(c.probe_k or self.k_max, self.k_max)
        v = self.verify_s
        extra = (self.draft_s_per_token * pk + v[pk + 1] - v[1]) / v[1]
        if not extra > 0:  # (nan: a width never measured)
            return c.probe_every
        return int(min(max(c.probe_every, extra / c.probe_share), max(c.probe_max, c.probe_every)))

    def observe(self, k: int, m: int, n_acc: int, verify_s: float, draft_s: float, c: int = 0) -> None:
        """One finished step of class c: asked k, got m drafted, n_acc accepted; its measured times."""
        e = self.cfg.ema
        w = m + 1
        if self.timed and w < len(self.verify_s):  # (on Python floats: a plain step runs no numpy here)
            old = self.verify_s.item(w)
            self.verify_s[w] = verify_s if old != old else (1 - e) * old + e * verify_s
        if m > 0:
            self._plain_wait[c] = 0  # the class's estimate moves: choose afresh
            # per-token acceptance from this step: n_acc successes before the first failure
            reached = n_acc + (1 if n_acc < m else 0)
            weight = e
            if self.cfg.prior_steps:  # the prior as a few steps' worth: an EMA at 0.1 holds it for ~10
                self._n_drafting[c] += 1
                weight = max(e, 1.0 / (self._n_drafting[c] + self.cfg.prior_steps))
            self.acceptance[c] = (1 - weight) * self.acceptance[c] + weight * (n_acc / reached)
            if self.timed:  # (the first measurement replaces the given cost: an EMA from 0 would take
                # ~10 drafting steps to see a head's real cost, drafting and probing as if it were free)
                d = self.draft_s_per_token if self._drafted else draft_s / m
                self.draft_s_per_token, self._drafted = (1 - e) * d + e * (draft_s / m), True


def sampled_policy(
    k_max: int, drafter: str, provider: str, verify_cost: dict[int, float] | None = None, classes: int = 1
) -> AdaptiveK:
    """The adaptive k of one sampled call (module docstring): fixed costs, acceptance from counts.
    verify_cost: a recorded cost per verify width, in decodes (None: ROW_COST per extra row)."""
    costs = verify_cost or fixed_costs(k_max + 1, provider)
    return AdaptiveK(k_max, costs, SAMPLED, draft_cost=spec_of(drafter).draft_cost, timed=False, classes=classes)


def width_line(ms_by_width: dict) -> tuple[float, float]:
    """(slope, value at width 0) of the least-squares line through a width table {width: cost} (keys
    ints or the manifest's strings); (0, 0) for fewer than two widths. A table measured under load can
    fall with width where its line, not each entry, says what a row costs."""
    if len(ms_by_width) < 2:
        return 0.0, 0.0
    widths = np.array([int(w) for w in ms_by_width], np.float64)  # [n]
    slope, at_zero = np.polyfit(widths, np.array(list(ms_by_width.values()), np.float64), 1)
    return float(slope), float(at_zero)


def fixed_costs(widest: int, provider: str) -> dict[int, float]:
    """Verify cost by width 1..widest in decodes when none was recorded: ROW_COST per extra row."""
    row = ROW_COST.get(provider, ROW_COST["cpu"])
    return {w: 1.0 + row * (w - 1) for w in range(1, widest + 1)}


class TreeBudget:
    """Adaptive tree size: each step verifies the n best nodes of the drafted tree, n chosen for the
    most expected tokens per second of the verify call.

    Model: a drafted node is accepted with probability ~ r * its score (the drafter's path
    probability; r calibrates it, learned from the steps seen), so verifying the root and the n - 1
    best-scored nodes yields E(n) = 1 + r * (s_(1) + ... + s_(n-1)) tokens at cost verify(n), the
    measured time of a width-n target call (the width table). n = 1 (the pending token alone, a
    plain decode) is a candidate, so a tree that does not pay on this machine shrinks by itself.
    Drafting is already spent when n is chosen, so it does not enter the ratio. Chains of drafters
    that score their drafts (Drafter.scores_chains: recycle, merged) are cut the same way
    (choose_chain): a chain's prefixes are its only subtrees. Under sampling the
    costs stay fixed (timed=False) for the same reason as sampled_policy's."""

    def __init__(
        self,
        max_nodes: int,
        verify_cost_s: dict[int, float],
        cfg: AdaptiveConfig = AdaptiveConfig(),
        timed: bool = True,
    ) -> None:
        self.cfg = cfg
        self.timed = timed
        self.verify_s = np.array([verify_cost_s.get(w, np.nan) for w in range(max_nodes + 1)])  # [max_nodes+1]
        self._verify = self.verify_s.tolist()  # the same as Python floats (choose_chain)
        self.calibration = 1.0  # r: accepted drafts per unit of kept score
        self.predicted = 0.0  # sum of the kept nodes' scores of the last choice
        self._gain = np.zeros(max_nodes + 1)  # [max_nodes+1] E(n), index n
        self._steps_at_one = 0

    def choose(self, scores: np.ndarray) -> int:
        """Nodes to keep (root included) of a tree whose drafted nodes have these scores [n-1]."""
        n = len(scores) + 1
        gain = self._gain[: n + 1]
        gain[0], gain[1] = np.nan, 1.0
        np.cumsum(np.sort(scores)[::-1], out=gain[2:])  # best-first sums of scores
        gain[2:] = 1.0 + self.calibration * gain[2:]
        best = int(np.nanargmax(gain / self.verify_s[: n + 1]))
        if best == 1:  # every probe_every such steps, verify the whole tree to keep r alive
            self._steps_at_one += 1
            if self._steps_at_one >= self.cfg.probe_every:
                self._steps_at_one, best = 0, n
        self.predicted = float(gain[best] - 1.0) / self.calibration if best > 1 else 0.0
        return best

    def choose_chain(self, scores: list[float], stopping: bool = False) -> int:
        """choose for a chain: nodes to keep (root included) of a chain whose drafts have these path
        scores, best first by position. A prefix is all a chain can keep, so a draft's score is capped
        by the ones before it; on Python floats (a chain has a few drafts, and each numpy call costs
        microseconds with the caches cold after the model call).
        stopping: stop at the first draft that does not raise the rate instead of taking the best
        prefix, so whether draft i is kept for the verify call depends on scores[:i + 1] alone. A
        sampled chain needs this: its drafts are drawn from q, and draft i's own token decides the
        rows, hence the scores, of the drafts after it; a cut that looked at those would verify x
        more often where x leads somewhere confident, drafting from a q the acceptance rule does
        not assume (verify.accept_sampled, docs/design.md)."""
        v, r = self._verify, self.calibration
        best, best_rate, kept, total, cap = 1, 1.0 / v[1], 0.0, 0.0, 1.0
        for i, s in enumerate(scores[: len(v) - 2]):
            cap = min(cap, s)
            total += cap
            rate = (1.0 + r * total) / v[i + 2]  # (nan where a width was never measured: never chosen)
            if rate > best_rate:
                best, best_rate, kept = i + 2, rate, total
            elif stopping:
                break
        if best == 1 and scores:  # the probe, as in choose; probe_k drafts of it (SAMPLED: one, as AdaptiveK's:
            # a seeded merged chain probing all 8 verified ~0.45 extra rows a call for 0.04 tokens at t = 1.0)
            self._steps_at_one += 1
            if self._steps_at_one >= self.cfg.probe_every:
                self._steps_at_one, best = 0, min(len(scores), self.cfg.probe_k or len(scores), len(v) - 2) + 1
                kept = sum(scores[: best - 1])
        self.predicted = kept
        return best

    def stops_at_first(self, score: float) -> bool:
        """Does choose_chain(stopping=True) keep none of a chain whose first draft has this path score,
        whatever drafts follow it? True when that draft does not raise the rate and no probe is due (a
        probe verifies probe_k drafts, 0: the whole chain; a one-draft probe needs no more than this one);
        a seeded chain drafter then drafts no further (Drafter.chain_gate),
        as the rest would never be verified. The same arithmetic as choose_chain."""
        v = self._verify
        if self._steps_at_one + 1 >= self.cfg.probe_every:
            return self.cfg.probe_k == 1  # a due probe verifies probe_k drafts (0: the whole chain)
        if len(v) < 3:
            return True
        return not (1.0 + self.calibration * min(1.0, score)) / v[2] > 1.0 / v[1]

    def idle_step(self, best_score: float) -> bool:
        """Does this step draft nothing? True when stops_at_first would stop a chain at any first draft
        (best_score: the highest first path score the drafter could draft now) and no probe is due;
        the step then counts toward the next probe, as a chain cut to nothing does in choose_chain.
        A seeded call's recycle / merged chains skip the lookup and the table there: at t = 0.7 on the
        chat prompts 6 steps in 10, ~0.26 ms each (Drafter.chain_idle)."""
        if self._steps_at_one + 1 >= self.cfg.probe_every:
            return False  # the probe's draft is drafted
        v = self._verify
        if len(v) >= 3 and (1.0 + self.calibration * min(1.0, best_score)) / v[2] > 1.0 / v[1]:
            return False
        self._steps_at_one += 1
        self.predicted = 0.0  # (as choose_chain's cut to none: observe learns nothing from the step)
        return True

    def floor(self) -> float:
        """The lowest path score worth drafting: a node adds r * s tokens for at least the cheapest
        extra row, verify(2) - verify(1), which must beat plain decoding's 1 token per verify(1).
        Drafters stop growing below it (TreeConfig.min_score), so a CPU with dear rows does not pay
        the head for depths it will cut. 0 on the step before a probe (the whole tree is drafted)."""
        if len(self.verify_s) < 3 or self._steps_at_one >= self.cfg.probe_every - 1:
            return 0.0
        v1, v2 = self.verify_s[1], self.verify_s[2]
        if not v2 > v1 > 0:  # nan (not measured) or rows for free
            return 0.0
        return float((v2 - v1) / (v1 * max(self.calibration, 1e-3)))

    def observe(self, n: int, n_acc: int, verify_s: float) -> None:
        """One finished step: verified n nodes, n_acc drafts accepted, in verify_s seconds."""
        e = self.cfg.ema
        if self.timed and n < len(self.verify_s):
            old = self.verify_s[n]
            self.verify_s[n] = self._verify[n] = verify_s if np.isnan(old) else (1 - e) * old + e * verify_s
        if self.predicted > 0:
            self.calibration = (1 - e) * self.calibration + e * min(4.0, n_acc / self.predicted)


def sampled_tree_budget(max_nodes: int, provider: str, verify_cost: dict[int, float] | None = None) -> TreeBudget:
    """The tree budget of one sampled call: fixed costs in decodes (recorded, else ROW_COST per row)."""
    return TreeBudget(max_nodes, verify_cost or fixed_costs(max_nodes, provider), timed=False)
