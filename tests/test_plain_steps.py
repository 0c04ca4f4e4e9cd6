"""A k = 0 stretch costs what plain decoding costs (issue 53): where drafts never pay, a seeded adaptive
call runs no drafter between probes (AdaptiveK drafters), and neither do the chain-budget drafters
(recycle, merged): where no first draft could pay the step drafts nothing (Drafter.chain_idle,
TreeBudget.idle_step), and elsewhere the budget's stopping rule keeps none of a chain whose first draft
does not pay, so it is drafted no further (Drafter.chain_gate, TreeBudget.stops_at_first). Counted, not
timed; the output stays the seeded plain output (fake engines over an 8-token vocabulary,
tests/test_sampling.py)."""

import copy

import numpy as np
import pytest
from helpers.sampling import PROMPT, fake_generator

from edgespec.runtime.adaptive import AdaptiveConfig, AdaptiveK, TreeBudget
from edgespec.runtime.generator import Generator
from edgespec.runtime.sampling import SamplingConfig

DEAR = {1: 1.0, 2: 3.0, 3: 3.1, 4: 3.2}  # verify cost by width: no draft pays for its row


@pytest.fixture
def dear_rows(monkeypatch):
    """Verify rows this dear whatever the clock says (the timed policies see these costs, drafts free)."""
    monkeypatch.setattr(Generator, "verify_costs", lambda self, widths, repeats=3: {w: DEAR[w] for w in widths})
    k_obs, b_obs = AdaptiveK.observe, TreeBudget.observe
    dear = lambda self, k, m, n, v, d, c=0: k_obs(self, k, m, n, DEAR[m + 1], 0.0, c)  # noqa: E731
    monkeypatch.setattr(AdaptiveK, "observe", dear)
    monkeypatch.setattr(TreeBudget, "observe", lambda self, n, n_acc, v: b_obs(self, n, n_acc, DEAR[n]))


def _steps(g: Generator, seed: int, n: int = 40) -> tuple[np.ndarray, list[tuple[int, int]]]:
    """(the output, per step: (drafts the drafter proposed, drafts the verify call took))."""
    steps, proposed, draft = [], [0], g._draft
    propose = g.drafter.propose

    def counted_propose(seq, k):
        prop = propose(seq, k)
        proposed[0] += prop.n_drafted
        return prop

    def counted_draft(seq, k, trees=True):
        proposed[0] = 0
        prop = draft(seq, k, trees)
        steps.append((proposed[0], prop.n_drafted))
        return prop

    g.drafter.propose, g._draft = counted_propose, counted_draft
    try:
        cfg = SamplingConfig(temperature=0.8, seed=seed)
        out = np.concatenate([c.copy() for c in g.generate_ids(PROMPT, n, cfg)])
    finally:
        del g.drafter.propose, g._draft
    return out, steps


@pytest.mark.parametrize("drafter", ["recycle", "merged"])
def test_a_chain_budget_stretch_drafts_only_its_probes(drafter, dear_rows, monkeypatch):
    plain = fake_generator("none")
    g = fake_generator(drafter)
    g.reconfigure(adaptive=True)
    assert g.chain_budget is not None
    probe_every = g._timed_sampled_policies()[1].cfg.probe_every
    for seed in range(4):
        cfg = SamplingConfig(temperature=0.8, seed=seed)
        ref = np.concatenate([c.copy() for c in plain.generate_ids(PROMPT, 40, cfg)])
        out, steps = _steps(g, seed)
        assert np.array_equal(out, ref), (drafter, seed)
        # a step drafts only where the budget verifies all of it (its probes), once every probe_every steps
        assert all(kept == n for n, kept in steps), (drafter, seed, steps)
        probes = sum(n > 0 for n, _ in steps)
        assert 0 < probes <= len(steps) // probe_every + 2, (drafter, seed, steps)
    # without the idle step the stretch drafts a first token each step; without the gate as well, up to k
    monkeypatch.setattr(TreeBudget, "idle_step", lambda self, score: False)
    _, steps = _steps(g, 0)
    assert all(n <= 1 or kept == n for n, kept in steps) and sum(n == 1 and not kept for n, kept in steps) > 10
    monkeypatch.setattr(TreeBudget, "stops_at_first", lambda self, score: False)
    _, steps = _steps(g, 0)
    assert any(n > 1 and kept == 0 for n, kept in steps)


@pytest.mark.parametrize("drafter", ["ngram", "eagle", "hybrid", "medusa"])
def test_an_adaptive_k_stretch_calls_no_drafter_between_probes(drafter, dear_rows):
    plain = fake_generator("none")
    g = fake_generator(drafter)
    g.reconfigure(adaptive=True)
    engine = g.drafter.engine
    calls0 = engine.n_calls if engine is not None else 0
    cfg = SamplingConfig(temperature=0.8, seed=3)
    ref = np.concatenate([c.copy() for c in plain.generate_ids(PROMPT, 60, cfg)])
    out, steps = _steps(g, 3, 60)
    assert np.array_equal(out, ref)
    k_max = g._timed_sampled_policies()[0]
    probes = sum(n > 0 for n, _ in steps)
    assert len(steps) > 40 and probes <= len(steps) // k_max.probe_wait() + 2, steps
    if engine is not None:  # the head runs on probe steps only (a catch-up and its drafts)
        assert engine.n_calls - calls0 <= probes * (g.k + 1)


def test_stops_at_first_is_choose_chains_stop():
    """stops_at_first(s) says True exactly where choose_chain(stopping=True) keeps none of a chain starting
    with a draft of score s (any continuation), a probe step included (it verifies the chain: False)."""
    rng = np.random.default_rng(7)
    costs = dict(enumerate([1.0, 1.2, 1.22, 1.24, 1.5, 1.52, 1.54, 1.8, 1.82], start=1))
    seen = {True: 0, False: 0}
    for i in range(2000):
        b = TreeBudget(9, costs, AdaptiveConfig(probe_every=4), timed=False)
        b.calibration = float(rng.uniform(0.05, 3.0))
        b._steps_at_one = int(rng.integers(0, 4))
        scores = np.cumprod(rng.uniform(0.02, 1.0, int(rng.integers(1, 9)))).tolist()
        stops = b.stops_at_first(scores[0])
        assert stops == (copy.deepcopy(b).choose_chain(scores, stopping=True) == 1), (i, scores, stops)
        seen[stops] += 1
    assert min(seen.values()) > 100  # both answers were tested


def test_idle_step_is_a_stop_at_any_first_draft():
    """idle_step(best) is True exactly where stops_at_first stops every first draft of score <= best and no
    probe is due; it then leaves the budget as choose_chain leaves it after a chain cut to none (the step counts
    toward the next probe; nothing predicted, so observe does not read the step as a miss)."""
    rng = np.random.default_rng(8)
    costs = dict(enumerate([1.0, 1.2, 1.22, 1.24, 1.5, 1.52, 1.54, 1.8, 1.82], start=1))
    seen = {True: 0, False: 0}
    for i in range(2000):
        b = TreeBudget(9, costs, AdaptiveConfig(probe_every=4, probe_k=1), timed=False)
        b.calibration = float(rng.uniform(0.05, 3.0))
        b._steps_at_one = int(rng.integers(0, 4))
        b.predicted = float(rng.uniform(0.1, 2.0))  # (the last choice's: an idle step must not leave it standing)
        best = float(rng.uniform(0.0, 1.0))
        due = b._steps_at_one + 1 >= b.cfg.probe_every
        firsts = np.linspace(0.0, best, 9).tolist()
        cut = copy.deepcopy(b)
        idle = b.idle_step(best)
        assert idle == (not due and all(cut.stops_at_first(s) for s in firsts)), (i, best)
        if idle:  # the same count as a chain of this best first draft cut to none
            assert cut.choose_chain([best], stopping=True) == 1
            assert (cut._steps_at_one, cut.predicted) == (b._steps_at_one, b.predicted)
        seen[idle] += 1
    assert min(seen.values()) > 100
