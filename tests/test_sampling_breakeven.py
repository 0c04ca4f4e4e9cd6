"""Adaptive k under sampling (runtime/adaptive.py `sampled_policy`): reproducible for a seed,
lossless, and it turns speculation off when drafts are not kept."""

import dataclasses

import numpy as np
import pytest
from helpers.sampling import CFG, chi2_pvalue, exact_tokens_23, fake_generator, sample_counts

from edgespec.engines.fake import FakeModel, random_table
from edgespec.runtime import drafters
from edgespec.runtime.adaptive import ROW_COST, SAMPLED, AdaptiveK, fixed_costs, sampled_policy
from edgespec.runtime.backends import Engines
from edgespec.runtime.config import RuntimeConfig
from edgespec.runtime.drafters import Drafter
from edgespec.runtime.generator import Generator
from edgespec.runtime.sampling import SamplingConfig
from edgespec.runtime.state import chain

V = 32
PROMPT = np.array([3, 17, 5, 3, 17, 9, 22, 3, 17, 5, 11, 8, 3])
T07 = SamplingConfig(temperature=0.7, seed=11)


def _run(g: Generator, n: int, sampling: SamplingConfig, prompt=PROMPT, rng=None) -> list[int]:
    return [int(t) for c in g.generate_ids(prompt, n, sampling, rng=rng) for t in c]


def _fake(drafter: str, adaptive: bool = True, k: int = 6, table=None) -> Generator:
    table = random_table(V, seed=0, sharpness=1.5) if table is None else table
    noisy = table + np.random.default_rng(5).standard_normal(table.shape).astype(np.float32)
    return Generator(
        None,
        Engines(FakeModel(table), {"draft": FakeModel(noisy)}),
        RuntimeConfig(drafter=drafter, k=k, adaptive=adaptive),
    )


# ---- the policy -------------------------------------------------------------------------------------


def test_policy_ignores_timings_and_follows_accepted_counts():
    a = sampled_policy(8, "ngram", "cpu")
    b = sampled_policy(8, "ngram", "cpu")
    ks_a, ks_b = [], []
    for step in range(80):
        ks_a.append(a.choose())
        ks_b.append(b.choose())
        kept = step % 3  # the same accepted counts, wildly different measured times
        a.observe(ks_a[-1], ks_a[-1], min(kept, ks_a[-1]), verify_s=0.001, draft_s=0.0)
        b.observe(ks_b[-1], ks_b[-1], min(kept, ks_b[-1]), verify_s=5.0, draft_s=3.0)
    assert ks_a == ks_b


def test_policy_turns_off_when_drafts_are_not_kept_and_probes_cheaply():
    pol = sampled_policy(8, "ngram", "cpu")
    assert pol.choose() >= 1  # prior acceptance 0.5 pays for a CPU verify row
    for _ in range(40):
        pol.observe(1, 1, 0, 0.0, 0.0)
    ks = [pol.choose() for _ in range(64)]
    assert set(ks) == {0, 1} and ks.count(1) == 4  # a 1-token probe every 16 steps (it costs one row)


def test_a_sampled_calls_prior_counts_as_two_drafting_steps():
    """Within a call the prior acceptance weighs as two drafting steps (a running mean), then the EMA:
    drafts that are not kept switch a call off after a few steps, not the ~10 an EMA from 0.5 takes
    (chat at t = 1.0 drafted 1.16-1.34 rows a call for 1.03 tokens). Each call starts afresh."""
    pol = AdaptiveK(8, {w: 1.0 + 0.1 * (w - 1) for w in range(1, 10)}, SAMPLED, timed=False)
    greedy_cfg = AdaptiveK(8, {w: 1.0 for w in range(1, 10)}, timed=False)
    for p in (pol, greedy_cfg):
        p.begin()
        p.observe(1, 1, 0, 0.0, 0.0)
    assert pol.acceptance[0] == pytest.approx(0.5 * 2 / 3)  # (prior x 2 + 0) / 3
    assert greedy_cfg.acceptance[0] == pytest.approx(0.45)  # greedy calls: the EMA from the start
    for _ in range(20):
        pol.observe(1, 1, 1, 0.0, 0.0)
    ema = SAMPLED.ema
    before = pol.acceptance[0]
    pol.observe(1, 1, 0, 0.0, 0.0)  # past 1 / ema - 2 steps: the EMA's weight
    assert pol.acceptance[0] == pytest.approx((1 - ema) * before)
    pol.begin()
    assert pol.acceptance[0] == SAMPLED.prior_acceptance and pol._n_drafting == [0]


def test_a_dear_probe_waits_longer():
    """A probe that costs a head call waits until probes cost <= 1% of the time (SAMPLED.probe_share)."""
    pol = AdaptiveK(8, fixed_costs(9, "cpu"), SAMPLED, draft_cost=1.2, timed=False)  # 1.2 + 0.08 decodes a probe
    for _ in range(40):
        pol.observe(1, 1, 0, 0.0, 0.0)
    assert pol.probe_wait() == 128
    assert [i for i, k in enumerate(pol.choose() for _ in range(300)) if k] == [127, 255]


def test_policy_drafts_more_when_drafts_are_kept_and_rows_are_cheap():
    cpu, gpu = sampled_policy(8, "ngram", "cpu"), sampled_policy(8, "ngram", "cuda")
    for pol in (cpu, gpu):
        for _ in range(60):
            pol.observe(4, 4, 3, 0.0, 0.0)  # a ~ 0.75
    assert 1 <= cpu.choose() < gpu.choose()
    assert ROW_COST["cuda"] < ROW_COST["cpu"]


def test_policy_takes_recorded_verify_costs():
    steep = sampled_policy(4, "ngram", "cpu", verify_cost={1: 1.0, 2: 3.0, 3: 5.0, 4: 7.0, 5: 9.0})
    for _ in range(60):
        steep.observe(2, 2, 1, 0.0, 0.0)
    assert steep.choose() == 0 or steep.choose() == 1


def test_greedy_policy_still_follows_measured_times():
    pol = AdaptiveK(4, {w: 1.0 for w in range(1, 6)})
    pol.observe(2, 2, 2, verify_s=3.0, draft_s=1.0)
    assert pol.verify_s[3] != 1.0 and pol.draft_s_per_token > 0


# ---- the loop ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("drafter", ["ngram", "suffix", "draft"])
def test_same_seed_same_output_whatever_the_timing(drafter, monkeypatch):
    g = _fake(drafter)
    a = _run(g, 80, T07)
    assert g.last_stats.adaptive and g.last_stats.n_drafted > 0
    assert _run(g, 80, T07) == a or drafter == "suffix"  # suffix: the cache now holds the first answer
    monkeypatch.setattr(Generator, "verify_costs", lambda self, widths, repeats=3: {w: 10.0**w for w in widths})
    other = _fake(drafter)  # other measured costs: the greedy policy would differ, the sampled one may not
    assert _run(other, 80, T07) == a
    assert _run(other, 80, dataclasses.replace(T07, seed=12)) != a


def test_sampled_calls_use_the_policy_only_when_adaptive():
    g = _fake("ngram", adaptive=False)
    _run(g, 30, T07)
    assert not g.last_stats.adaptive  # an explicit fixed k stays fixed
    g.reconfigure(adaptive=True)
    _run(g, 30, T07)
    assert g.last_stats.adaptive


class _AlwaysWrong(Drafter):
    """Proposes k copies of a token the target never samples (its logit is -1e4 everywhere)."""

    name = "ngram"

    def propose(self, seq, k):
        seq.draft_slots(k)[:] = 0
        return chain(seq, k)


def test_rejected_drafts_settle_on_plain_decoding():
    table = random_table(V, seed=0, sharpness=1.5)
    table[:, 0] = -1e4
    fixed, adaptive = _fake("ngram", adaptive=False, table=table), _fake("ngram", table=table)
    unseeded = dataclasses.replace(T07, seed=None)  # with the caller's rng: sampled_policy (fixed costs)
    for g in (fixed, adaptive):
        g.drafter = _AlwaysWrong()
        _run(g, 200, unseeded, rng=np.random.default_rng(0))
    st = adaptive.last_stats
    assert st.n_accepted == 0 and fixed.last_stats.n_drafted >= 6 * 199
    # the prior drafts a few tokens while its acceptance estimate decays (a CPU row costs 0.08 of a
    # decode, so that takes ~15 steps), then a one-token probe every 16 steps
    assert st.n_drafted <= 40 + st.n_target_calls // 16, st.n_drafted
    assert st.n_target_calls - st.n_drafted > 150  # nearly every step plain


@pytest.mark.parametrize("drafter", ["ngram", "draft", "hybrid", "eagle"])
def test_sampled_adaptive_keeps_the_target_distribution(drafter, monkeypatch):
    """Chi-square over tokens 2 and 3, as test_sampling.py does: k chosen from the accepted
    counts of earlier steps keeps the target's distribution. A verify row is set to cost just
    under the prior acceptance, so a first step that is rejected makes the second one plain."""
    pytest.importorskip("scipy")
    monkeypatch.setitem(ROW_COST, "cpu", 0.48)
    monkeypatch.setattr(drafters.spec_of(drafter), "draft_cost", 0.0)
    g = fake_generator(drafter)
    g.reconfigure(adaptive=True)
    ks = []
    real = sampled_policy

    def watched(*a, **kw):
        pol = real(*a, **kw)
        choose = pol.choose
        pol.choose = lambda c=0: ks.append(choose(c)) or ks[-1]
        return pol

    monkeypatch.setattr("edgespec.runtime.speculation.sampled_policy", watched)
    p = chi2_pvalue(sample_counts(g), exact_tokens_23(g))
    assert p > 1e-3, f"{drafter} sampled adaptive: chi-square p = {p:.2g}"
    assert g.last_stats.adaptive and len(set(ks)) > 1, set(ks)
    assert CFG.temperature == 1.0


def test_learned_policies_survive_a_drafter_switch():
    """What adaptive k learned (greedy and seeded) is kept per configuration in the drafter store:
    switching to another drafter and back resumes it (a bench interleaves drafters prompt by prompt)."""
    g = _fake("ngram")
    _run(g, 30, T07)
    _run(g, 30, SamplingConfig())
    greedy, keyed = g.adaptive, g._policies["keyed"]
    assert greedy is not None and keyed is not None
    g.reconfigure(drafter="suffix")
    assert g.adaptive is not greedy
    g.reconfigure(drafter="ngram")
    assert g.adaptive is greedy and g._policies["keyed"] is keyed
    g.reconfigure(drafter="ngram", k=4)  # another configuration: its own
    assert g.adaptive is not greedy


def test_unseeded_calls_follow_the_clock_and_a_callers_rng_the_fixed_costs(monkeypatch):
    """A call without a seed draws from fresh entropy: nothing to reproduce, so its adaptive k follows
    measured times as seeded calls' does (the fixed-cost policy drafted 8-wide every step on a folder
    whose recorded width table was measured under load); a call whose rng the caller passes keeps the
    fixed costs, so that rng reproduces it."""
    made = []

    def counted(*a, **kw):
        made.append(1)
        return sampled_policy(*a, **kw)

    monkeypatch.setattr("edgespec.runtime.speculation.sampled_policy", counted)
    g = _fake("ngram")
    _run(g, 40, dataclasses.replace(T07, seed=None))
    assert not made and g._policies["keyed"] is not None and g.last_stats.adaptive
    _run(g, 40, dataclasses.replace(T07, seed=None), rng=np.random.default_rng(1))
    assert made == [1]
    a = _run(g, 40, dataclasses.replace(T07, seed=None), rng=np.random.default_rng(2))
    assert _run(g, 40, dataclasses.replace(T07, seed=None), rng=np.random.default_rng(2)) == a


def test_recorded_costs_are_the_width_tables_line(monkeypatch):
    """The fixed costs read the export's width table as a line (least squares): a table measured under
    load, where wider calls came out cheaper, prices rows at their average cost, never below plain's."""
    from types import SimpleNamespace

    g = _fake("ngram", k=3)

    def table(ms):
        probe = {"chosen": "int4-rowop", "ms_by_width": {"int4-rowop": {str(w): v for w, v in enumerate(ms, 1)}}}
        g.manifest = SimpleNamespace(export_probe=probe, target=SimpleNamespace(precision="int4"))
        return g._recorded_costs()

    costs = table([5.0, 6.0, 7.0, 8.0])  # a row: 1 ms of a 5 ms call
    assert costs == pytest.approx({1: 1.0, 2: 1.2, 3: 1.4, 4: 1.6})
    noisy = table([14.0, 12.8, 12.9, 12.5, 13.3, 12.0, 10.2, 10.9, 11.5])  # (a folder exported under load)
    assert noisy is None  # the line falls: the caller's ROW_COST
    assert g._sampled_adaptive().verify_s[2] == pytest.approx(1 + ROW_COST["cpu"])
    assert table([5.0, 6.0]) is None  # the table lacks width 3, 4 (k + 1)
