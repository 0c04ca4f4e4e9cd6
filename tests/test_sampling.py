"""Lossless sampling: speculative samples follow the target's distribution (chi-square tests)."""

import numpy as np
import pytest
from edgespec.engines.fake import FakeModel, random_table
from edgespec.runtime import verify
from edgespec.runtime.generator import Generator, GeneratorConfig
from edgespec.runtime.verify import SamplingConfig, probs

V = 8  # small vocabulary: exact target distributions of the first tokens are cheap to enumerate
PROMPT = np.array([1, 2, 3, 1, 2])
N_SAMPLES = 3000
CFG = SamplingConfig(temperature=1.0)


def _gen(drafter: str) -> Generator:
    table = random_table(V, seed=11, sharpness=1.0)
    target = FakeModel(table, max_len=64)
    draft = FakeModel(table + np.random.default_rng(2).standard_normal(table.shape).astype(np.float32), max_len=64)
    return Generator(None, target, GeneratorConfig(drafter=drafter, k=3), draft_engine=draft)


def _exact_tokens_23(g: Generator) -> np.ndarray:
    t = g.target

    def nxt(cur, prev):
        return probs(t.table[cur] + t.table2[prev], CFG)

    p1 = nxt(PROMPT[-1], PROMPT[-2])
    dist = np.zeros((V, V))
    for a in range(V):
        p2 = nxt(a, PROMPT[-1])
        for b in range(V):
            dist[b] += p1[a] * p2[b] * nxt(b, a)
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


def _sample_counts(g: Generator) -> np.ndarray:
    counts = np.zeros((V, V))
    for s in range(N_SAMPLES):
        out = np.concatenate([c.copy() for c in g.generate_ids(PROMPT, 3, SamplingConfig(1.0, seed=s))])
        counts[out[1], out[2]] += 1
    return counts


@pytest.mark.parametrize("drafter", ["none", "draft", "ngram"])
def test_speculative_sampling_keeps_the_target_distribution(drafter):
    pytest.importorskip("scipy")
    g = _gen(drafter)
    p = _chi2_pvalue(_sample_counts(g), _exact_tokens_23(g))
    assert p > 1e-3, f"{drafter}: chi-square p = {p:.2g}: samples do not follow the target"
    if drafter != "none":
        assert g.last_stats.n_drafted > 0


def test_a_wrong_acceptance_rule_is_caught(monkeypatch):
    """Accept every draft token: the output then follows the draft, and the test must notice."""
    pytest.importorskip("scipy")

    def accept_all(draft, dft_probs, tgt_logits, cfg, rng):
        return len(draft), verify.sample(probs(tgt_logits[len(draft)], cfg), rng)

    monkeypatch.setattr("edgespec.runtime.generator.accept_sampled", accept_all)
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
