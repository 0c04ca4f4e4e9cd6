"""Lossless sampling: speculative samples follow the target's distribution (chi-square tests)."""

import numpy as np
import pytest
from helpers.sampling import CFG, PROMPT, TREE, chi2_pvalue, exact_tokens_23, fake_generator, sample_counts

from edgespec.runtime import verify
from edgespec.runtime.sampling import SamplingConfig, probs


@pytest.mark.parametrize("drafter", ["eagle", "hybrid", "medusa"])
def test_confidence_cut_off_keeps_the_target_distribution(drafter):
    """A chain cut by the head's confidence stays lossless: the cut depends on the drafts before
    a position, never on the token drawn there."""
    pytest.importorskip("scipy")
    g = fake_generator(drafter)
    g.reconfigure(eagle_min_confidence=0.25, medusa_min_confidence=0.4)
    p = chi2_pvalue(sample_counts(g), exact_tokens_23(g))
    assert p > 1e-3, f"{drafter} with a confidence cut-off: chi-square p = {p:.2g}"


@pytest.mark.parametrize("drafter", ["none", "draft", "ngram", "suffix", "eagle", "hybrid", "medusa"])
def test_speculative_sampling_keeps_the_target_distribution(drafter):
    pytest.importorskip("scipy")
    g = fake_generator(drafter)
    p = chi2_pvalue(sample_counts(g), exact_tokens_23(g))
    assert p > 1e-3, f"{drafter}: chi-square p = {p:.2g}: samples do not follow the target"
    if drafter != "none":
        assert g.last_stats.n_drafted > 0


@pytest.mark.parametrize("drafter", ["ngram", "suffix", "eagle", "hybrid", "medusa"])
def test_tree_sampling_keeps_the_target_distribution(drafter):
    """Token trees: children tried in turn, each rejected one zeroed in p; chi-square as above."""
    pytest.importorskip("scipy")
    g = fake_generator(drafter, TREE)
    p = chi2_pvalue(sample_counts(g), exact_tokens_23(g))
    assert p > 1e-3, f"{drafter} tree: chi-square p = {p:.2g}: samples do not follow the target"
    assert g.last_stats.n_drafted > g.last_stats.n_target_calls  # more than one candidate per step


def test_tree_sampling_with_repetition_penalty_stays_lossless():
    pytest.importorskip("scipy")
    cfg = SamplingConfig(temperature=1.0, repetition_penalty=1.8)
    g = fake_generator("eagle", TREE)
    p = chi2_pvalue(sample_counts(g, cfg), exact_tokens_23(g, cfg))
    assert p > 1e-3, f"eagle tree: chi-square p = {p:.2g} with repetition penalty"


def test_a_wrong_tree_rule_is_caught(monkeypatch):
    """Keep the first child without testing it: the chi-square test must notice."""
    pytest.importorskip("scipy")

    def first_child(tree, tgt_logits, cfg, rng, tokens, n):
        c = tree.child(0, int(tree.tokens[1])) if tree.n > 1 else -1
        if c < 0:
            return 0, verify.sample(probs(tgt_logits[0], cfg), rng)
        tree.path[1] = c
        tokens[n] = tree.tokens[c]
        return 1, verify.sample(probs(tgt_logits[c], cfg), rng)

    monkeypatch.setattr("edgespec.runtime.verify.accept_tree_sampled", first_child)
    g = fake_generator("eagle", TREE)
    p = chi2_pvalue(sample_counts(g), exact_tokens_23(g))
    assert p < 1e-3, f"a broken tree rule passed the test (p = {p:.2g})"


@pytest.mark.parametrize("drafter", ["none", "draft", "eagle", "medusa"])
def test_repetition_penalty_sampling_stays_lossless(drafter):
    """The penalty depends on each row's own context (drafts before it): the exact distribution
    of tokens 2-3 under it is matched by speculative samples."""
    pytest.importorskip("scipy")
    cfg = SamplingConfig(temperature=1.0, repetition_penalty=1.8)
    g = fake_generator(drafter)
    p = chi2_pvalue(sample_counts(g, cfg), exact_tokens_23(g, cfg))
    assert p > 1e-3, f"{drafter}: chi-square p = {p:.2g} with repetition penalty"


def test_repetition_penalty_greedy_identical():
    g = fake_generator("draft")
    cfg = SamplingConfig(repetition_penalty=1.5)
    outs = {}
    for d in ("none", "draft", "eagle", "ngram", "medusa"):
        g.set_drafter(d, 3)
        outs[d] = np.concatenate([c.copy() for c in g.generate_ids(PROMPT, 30, cfg)])
    plain = np.concatenate([c.copy() for c in g.generate_ids(PROMPT, 30)])
    for d in ("eagle", "ngram", "medusa"):
        t = fake_generator(d, TREE)
        outs[d + "-tree"] = np.concatenate([c.copy() for c in t.generate_ids(PROMPT, 30, cfg)])
    assert all(np.array_equal(o, outs["none"]) for o in outs.values())
    assert not np.array_equal(plain, outs["none"])  # the penalty did change the output


def test_typical_acceptance_is_opt_in_and_lossy():
    """Typical acceptance is off by default; switched on, the chi-square test sees that its samples
    no longer follow the target (so it must stay an explicit choice)."""
    pytest.importorskip("scipy")
    assert SamplingConfig().typical_epsilon == 0.0
    g = fake_generator("draft")
    counts = sample_counts(g, SamplingConfig(temperature=1.0, typical_epsilon=0.3))
    p = chi2_pvalue(counts, exact_tokens_23(g))
    assert p < 1e-3, f"typical acceptance looked lossless here (p = {p:.2g}); the test lost its teeth"


def test_a_wrong_acceptance_rule_is_caught(monkeypatch):
    """Accept every draft token: the output then follows the draft, and the test must notice."""
    pytest.importorskip("scipy")

    def accept_all(draft, dft_probs, tgt_logits, cfg, rng):
        return len(draft), verify.sample(probs(tgt_logits[len(draft)], cfg), rng)

    monkeypatch.setattr("edgespec.runtime.verify.accept_sampled", accept_all)
    g = fake_generator("draft")
    p = chi2_pvalue(sample_counts(g), exact_tokens_23(g))
    assert p < 1e-3, f"a broken rule passed the test (p = {p:.2g})"


def test_residual_guard_when_p_equals_q():
    rng = np.random.default_rng(0)
    logits = np.log(np.array([[0.5, 0.5, 1e-9, 1e-9]] * 2))
    q = probs(logits[:1], CFG)
    n, tok = verify.accept_sampled(np.array([0]), q, logits, CFG, rng)
    assert n in (0, 1) and 0 <= tok < 4


def test_top_k_and_top_p_processing():
    p = probs(np.log(np.array([0.5, 0.3, 0.15, 0.05])), SamplingConfig(1.0, top_k=2))
    assert np.allclose(p, [0.625, 0.375, 0, 0])
    p = probs(np.log(np.array([0.5, 0.3, 0.15, 0.05])), SamplingConfig(1.0, top_p=0.7))
    assert np.allclose(p, [0.625, 0.375, 0, 0])


def test_cost_sized_tree_sampling_keeps_the_target_distribution():
    """Adaptive trees (each step cut to its best-scored nodes by the fixed-cost TreeBudget): the
    cut depends on the drafts only, never on the tokens drawn, so sampling stays lossless."""
    pytest.importorskip("scipy")
    g = fake_generator("eagle", TREE)
    g.reconfigure(adaptive=True)
    assert g.tree_budget is not None
    p = chi2_pvalue(sample_counts(g), exact_tokens_23(g))
    assert p > 1e-3, f"eagle cost-sized tree: chi-square p = {p:.2g}"
