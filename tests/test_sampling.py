"""Lossless sampling: speculative samples follow the target's distribution (chi-square tests)."""

import numpy as np
import pytest

from edgespec.engines.fake import FakeEagleHead, FakeHeads, FakeModel, random_table
from edgespec.runtime import verify
from edgespec.runtime.backends import Engines
from edgespec.runtime.config import RuntimeConfig
from edgespec.runtime.drafters.eagle import EagleEngines
from edgespec.runtime.generator import Generator
from edgespec.runtime.sampling import SamplingConfig, probs
from edgespec.runtime.tree import TreeConfig

V = 8  # small vocabulary: exact target distributions of the first tokens are cheap to enumerate
PROMPT = np.array([1, 2, 3, 1, 2])
N_SAMPLES = 3000
CFG = SamplingConfig(temperature=1.0)


TREE = TreeConfig(nodes=7, depth=3, branch=3, beam=2)


def _gen(drafter: str, tree: TreeConfig = TreeConfig()) -> Generator:
    table = random_table(V, seed=11, sharpness=1.0)
    target = FakeModel(table, max_len=64)
    draft = FakeModel(table + np.random.default_rng(2).standard_normal(table.shape).astype(np.float32), max_len=64)
    head = FakeEagleHead(V, d2t=[0, 2, 3, 5, 6], max_len=64)  # a reduced draft vocabulary: q = 0 elsewhere
    heads = FakeHeads(V, d2t=[0, 1, 3, 4, 6, 7], n_heads=3)
    return Generator(
        None,
        Engines(target, {"draft": draft, "eagle": EagleEngines(head, None), "medusa": heads}),
        RuntimeConfig(drafter=drafter, k=3, tree=tree, eagle_min_confidence=0.0, medusa_min_confidence=0.0),
    )


@pytest.mark.parametrize("drafter", ["eagle", "hybrid", "medusa"])
def test_confidence_cut_off_keeps_the_target_distribution(drafter):
    """A chain cut by the head's confidence stays lossless: the cut depends on the drafts before
    a position, never on the token drawn there."""
    pytest.importorskip("scipy")
    g = _gen(drafter)
    g.reconfigure(eagle_min_confidence=0.25, medusa_min_confidence=0.4)
    p = _chi2_pvalue(_sample_counts(g), _exact_tokens_23(g))
    assert p > 1e-3, f"{drafter} with a confidence cut-off: chi-square p = {p:.2g}"


def _exact_tokens_23(g: Generator, cfg: SamplingConfig = CFG) -> np.ndarray:
    t = g.target

    def nxt(cur, prev, ctx=()):
        logits = t.table[cur] + t.table2[prev]
        if cfg.repetition_penalty != 1.0:
            seen = np.unique(np.concatenate([PROMPT, np.array(ctx, np.int64)]))
            logits = logits.copy()
            logits[seen] = np.where(
                logits[seen] > 0, logits[seen] / cfg.repetition_penalty, logits[seen] * cfg.repetition_penalty
            )
        return probs(logits, cfg)

    p1 = nxt(PROMPT[-1], PROMPT[-2])
    dist = np.zeros((V, V))
    for a in range(V):
        p2 = nxt(a, PROMPT[-1], [a])
        for b in range(V):
            dist[b] += p1[a] * p2[b] * nxt(b, a, [a, b])
    return dist  # [token2, token3]


def _chi2_pvalue(counts: np.ndarray, expected_p: np.ndarray) -> float:
    from scipy.stats import chisquare

    exp = expected_p.ravel() * counts.sum()
    obs = counts.ravel()
    keep = exp > 5  # pool rare cells
    obs_k = np.append(obs[keep], obs[~keep].sum())
    exp_k = np.append(exp[keep], exp[~keep].sum())
    if exp_k[-1] == 0:
        obs_k, exp_k = obs_k[:-1], exp_k[:-1]
    return float(chisquare(obs_k, exp_k).pvalue)


def _sample_counts(g: Generator, cfg: SamplingConfig = CFG) -> np.ndarray:
    counts = np.zeros((V, V))
    for s in range(N_SAMPLES):
        # an unseeded call drawing from rng: the rejection rule (a seed would key the draws by position)
        rng = np.random.default_rng(s)
        out = np.concatenate([c.copy() for c in g.generate_ids(PROMPT, 3, cfg, rng=rng)])
        counts[out[1], out[2]] += 1
    return counts


@pytest.mark.parametrize("drafter", ["none", "draft", "ngram", "suffix", "eagle", "hybrid", "medusa"])
def test_speculative_sampling_keeps_the_target_distribution(drafter):
    pytest.importorskip("scipy")
    g = _gen(drafter)
    p = _chi2_pvalue(_sample_counts(g), _exact_tokens_23(g))
    assert p > 1e-3, f"{drafter}: chi-square p = {p:.2g}: samples do not follow the target"
    if drafter != "none":
        assert g.last_stats.n_drafted > 0


@pytest.mark.parametrize("drafter", ["ngram", "suffix", "eagle", "hybrid", "medusa"])
def test_tree_sampling_keeps_the_target_distribution(drafter):
    """Token trees: children tried in turn, each rejected one zeroed in p; chi-square as above."""
    pytest.importorskip("scipy")
    g = _gen(drafter, TREE)
    p = _chi2_pvalue(_sample_counts(g), _exact_tokens_23(g))
    assert p > 1e-3, f"{drafter} tree: chi-square p = {p:.2g}: samples do not follow the target"
    assert g.last_stats.n_drafted > g.last_stats.n_target_calls  # more than one candidate per step


def test_tree_sampling_with_repetition_penalty_stays_lossless():
    pytest.importorskip("scipy")
    cfg = SamplingConfig(temperature=1.0, repetition_penalty=1.8)
    g = _gen("eagle", TREE)
    p = _chi2_pvalue(_sample_counts(g, cfg), _exact_tokens_23(g, cfg))
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
    g = _gen("eagle", TREE)
    p = _chi2_pvalue(_sample_counts(g), _exact_tokens_23(g))
    assert p < 1e-3, f"a broken tree rule passed the test (p = {p:.2g})"


@pytest.mark.parametrize("drafter", ["none", "draft", "eagle", "medusa"])
def test_repetition_penalty_sampling_stays_lossless(drafter):
    """The penalty depends on each row's own context (drafts before it): the exact distribution
    of tokens 2-3 under it is matched by speculative samples."""
    pytest.importorskip("scipy")
    cfg = SamplingConfig(temperature=1.0, repetition_penalty=1.8)
    g = _gen(drafter)
    p = _chi2_pvalue(_sample_counts(g, cfg), _exact_tokens_23(g, cfg))
    assert p > 1e-3, f"{drafter}: chi-square p = {p:.2g} with repetition penalty"


def test_repetition_penalty_greedy_identical():
    g = _gen("draft")
    cfg = SamplingConfig(repetition_penalty=1.5)
    outs = {}
    for d in ("none", "draft", "eagle", "ngram", "medusa"):
        g.set_drafter(d, 3)
        outs[d] = np.concatenate([c.copy() for c in g.generate_ids(PROMPT, 30, cfg)])
    plain = np.concatenate([c.copy() for c in g.generate_ids(PROMPT, 30)])
    for d in ("eagle", "ngram", "medusa"):
        t = _gen(d, TREE)
        outs[d + "-tree"] = np.concatenate([c.copy() for c in t.generate_ids(PROMPT, 30, cfg)])
    assert all(np.array_equal(o, outs["none"]) for o in outs.values())
    assert not np.array_equal(plain, outs["none"])  # the penalty did change the output


def test_typical_acceptance_is_opt_in_and_lossy():
    """Typical acceptance is off by default; switched on, the chi-square test sees that its samples
    no longer follow the target (so it must stay an explicit choice)."""
    pytest.importorskip("scipy")
    assert SamplingConfig().typical_epsilon == 0.0
    g = _gen("draft")
    counts = _sample_counts(g, SamplingConfig(temperature=1.0, typical_epsilon=0.3))
    p = _chi2_pvalue(counts, _exact_tokens_23(g))
    assert p < 1e-3, f"typical acceptance looked lossless here (p = {p:.2g}); the test lost its teeth"


def test_a_wrong_acceptance_rule_is_caught(monkeypatch):
    """Accept every draft token: the output then follows the draft, and the test must notice."""
    pytest.importorskip("scipy")

    def accept_all(draft, dft_probs, tgt_logits, cfg, rng):
        return len(draft), verify.sample(probs(tgt_logits[len(draft)], cfg), rng)

    monkeypatch.setattr("edgespec.runtime.verify.accept_sampled", accept_all)
    g = _gen("draft")
    p = _chi2_pvalue(_sample_counts(g), _exact_tokens_23(g))
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
    g = _gen("eagle", TREE)
    g.reconfigure(adaptive=True)
    assert g.tree_budget is not None
    p = _chi2_pvalue(_sample_counts(g), _exact_tokens_23(g))
    assert p > 1e-3, f"eagle cost-sized tree: chi-square p = {p:.2g}"
