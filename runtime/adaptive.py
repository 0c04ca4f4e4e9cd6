"""Adaptive speculation length: pick k per step from measured costs and running acceptance.

Model: each drafted token is accepted with probability a (independently, given the previous one
was), so a step that drafts k tokens yields E[tokens] = 1 + a + ... + a^k = (1 - a^(k+1)) / (1 - a)
target tokens, and costs draft(k) + verify(k + 1). The policy picks the k in 0..k_max with the
most expected tokens per second, where verify(T) is the measured time of a width-T target call
(an exponential moving average per width) and draft(k) = k times the measured time per drafted
token. k = 0 (plain decoding) is always a candidate, so speculation that does not pay on this
machine and this text is switched off by itself; it comes back when acceptance rises, because
every `probe_every` steps one step drafts k_max to keep the estimate of a alive.

Greedy decoding only: the output is the same whatever k each step uses. Sampled generation keeps
a fixed k, so that a seed reproduces its output whatever the machine's timing.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class AdaptiveConfig:
    ema: float = 0.1  # weight of the newest observation in the running estimates
    prior_acceptance: float = 0.5  # a before any observation
    probe_every: int = 16  # while k = 0 is chosen, draft k_max once every this many steps


class AdaptiveK:
    def __init__(self, k_max: int, verify_cost_s: dict[int, float], cfg: AdaptiveConfig = AdaptiveConfig()) -> None:
        self.k_max = k_max
        self.cfg = cfg
        self.verify_s = np.array([verify_cost_s.get(w, np.nan) for w in range(k_max + 2)])  # [k_max+2]
        self.verify_s[0] = 0.0
        self.acceptance = cfg.prior_acceptance
        self.draft_s_per_token = 0.0
        self._steps_at_zero = 0
        self._k = np.arange(k_max + 1)

    def choose(self) -> int:
        a = min(self.acceptance, 0.999)
        gain = (1 - a ** (self._k + 1)) / (1 - a)  # E[tokens] for k = 0..k_max
        cost = self.draft_s_per_token * self._k + self.verify_s[self._k + 1]
        k = int(np.nanargmax(gain / cost))
        if k == 0:
            self._steps_at_zero += 1
            if self._steps_at_zero >= self.cfg.probe_every:
                self._steps_at_zero = 0
                return self.k_max
        return k

    def observe(self, k: int, m: int, n_acc: int, verify_s: float, draft_s: float) -> None:
        """One finished step: asked k, got m drafted, n_acc accepted; its measured times."""
        e = self.cfg.ema
        w = m + 1
        if w < len(self.verify_s):
            old = self.verify_s[w]
            self.verify_s[w] = verify_s if np.isnan(old) else (1 - e) * old + e * verify_s
        if m > 0:
            # per-token acceptance from this step: n_acc successes before the first failure
            reached = n_acc + (1 if n_acc < m else 0)
            self.acceptance = (1 - e) * self.acceptance + e * (n_acc / reached)
            self.draft_s_per_token = (1 - e) * self.draft_s_per_token + e * (draft_s / m)
