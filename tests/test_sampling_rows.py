"""The row primitives of sampled verification (sampling.RowDist, sample): a loaded row is probs()'s
distribution, draws over several blocks follow it (chi-square), removed tokens and tokens of zero
weight are never drawn, and the chain and tree walks over wide rows keep the target's distribution
of the first token."""

import numpy as np
import pytest

from edgespec.runtime.sampling import BLOCK, RowDist, SamplingConfig, _draw, penalize, probs, row_dist, sample
from edgespec.runtime.tree import TokenTree
from edgespec.runtime.verify import accept_sampled, accept_tree_sampled

V = 3 * BLOCK - 37  # several blocks, the last one short
N = 20000


def _logits(seed: int = 0, rows: int = 1) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal((rows, V)) * 2.5).astype(np.float32)  # [rows, V]


def _pvalue(tokens: np.ndarray, p: np.ndarray) -> float:
    from scipy.stats import chisquare

    counts = np.bincount(tokens, minlength=len(p)).astype(np.float64)
    exp = p * len(tokens)
    keep = exp > 5  # pool rare cells
    obs_k, exp_k = np.append(counts[keep], counts[~keep].sum()), np.append(exp[keep], exp[~keep].sum())
    if exp_k[-1] == 0:
        assert obs_k[-1] == 0, "a token of probability 0 was drawn"
        obs_k, exp_k = obs_k[:-1], exp_k[:-1]
    return float(chisquare(obs_k, exp_k * obs_k.sum() / exp_k.sum()).pvalue)


@pytest.mark.parametrize(
    "cfg",
    [
        SamplingConfig(0.7),
        SamplingConfig(1.0, top_k=5),
        SamplingConfig(1.0, top_p=0.8),
        SamplingConfig(1e-3),
        SamplingConfig(1e3),
        SamplingConfig(1e-40),  # 1 / t past float32: the float64 path
    ],
)
def test_a_loaded_row_is_the_processed_distribution(cfg):
    row = _logits()[0]
    d = RowDist(V).load(row, cfg)
    want = probs(row, cfg)
    assert np.allclose(d.w / d.total, want, rtol=1e-5, atol=1e-12), np.abs(d.w / d.total - want).max()
    assert d.total == pytest.approx(float(d.w.sum(dtype=np.float64)), rel=1e-6)


def test_penalised_rows_and_extreme_logits():
    row = _logits()[0]
    row[3], row[9], row[11] = 3e38, -3e38, -np.inf
    cfg = SamplingConfig(0.7)
    d = RowDist(V).load(row, cfg)
    assert np.allclose(d.w / d.total, probs(row, cfg), atol=1e-12)
    pen = penalize(_logits(1), np.arange(40), 30, 1.5)  # float64 rows
    d.load(pen[0], cfg)
    assert np.allclose(d.w / d.total, probs(pen[0], cfg), rtol=1e-5, atol=1e-12)
    inf = np.zeros(V)
    inf[5] = np.inf  # an overflowed logit takes the mass
    assert d.load(inf, cfg).draw(np.random.default_rng(0)) == 5


def test_draws_follow_the_row_and_skip_removed_tokens():
    pytest.importorskip("scipy")
    cfg = SamplingConfig(0.7)
    row = _logits(2)[0]
    d = RowDist(V).load(row, cfg)
    rng = np.random.default_rng(1)
    p = probs(row, cfg)
    assert _pvalue(np.array([d.draw(rng) for _ in range(N)]), p) > 1e-3
    gone = np.argsort(-p)[:3]  # the three likeliest, one of them alone in its block's top
    for x in gone:
        d.remove(int(x))
    left = p.copy()
    left[gone] = 0.0
    left /= left.sum()
    got = np.array([d.draw(rng) for _ in range(N)])
    assert not np.isin(got, gone).any()
    assert _pvalue(got, left) > 1e-3
    assert _pvalue(np.array([sample(p, rng) for _ in range(N)]), p) > 1e-3  # the generic draw


def test_a_token_of_zero_weight_is_never_drawn():
    w = np.zeros(V, np.float32)
    w[[0, BLOCK + 1, 2 * BLOCK - 1]] = [1e-30, 1.0, 1e-45]  # a denormal last
    cum = np.cumsum(np.add.reduceat(w, np.arange(0, V, BLOCK)), dtype=np.float64)
    assert _draw(w, cum, 0.0) == 0
    assert _draw(w, cum, np.nextafter(1.0, 0.0)) in (BLOCK + 1, 2 * BLOCK - 1)
    d = RowDist(V)
    d.w[:] = w
    d.remove(BLOCK + 1)
    d.remove(0)
    assert d.blocks[0] == 0.0 and d.total > 0
    assert d.draw(np.random.default_rng(0)) == 2 * BLOCK - 1


def test_workspace_is_per_vocabulary():
    assert row_dist(V) is row_dist(V) and row_dist(V + 1) is not row_dist(V)
    assert len(row_dist(V + 1).w) == V + 1


def test_chain_walk_over_wide_rows_keeps_the_first_token_distribution():
    """A chain of one-hot drafts (the target's top tokens and a poor one): the first output token,
    kept draft or replacement, follows the target's row 0."""
    pytest.importorskip("scipy")
    cfg = SamplingConfig(0.7)
    rows = _logits(3, 3)
    p0 = probs(rows[0], cfg)
    for first in (int(p0.argmax()), int(np.argsort(p0)[-7])):
        draft = np.array([first, int(rows[1].argmax())])
        out = np.empty(N, np.int64)
        for s in range(N):
            n, nxt = accept_sampled(draft, None, rows, cfg, np.random.default_rng(s))
            out[s] = draft[0] if n else nxt
        assert _pvalue(out, p0) > 1e-3, f"first draft {first}"


def test_tree_walk_over_wide_rows_keeps_the_first_token_distribution():
    """Three children of the root (the likeliest tokens): the first token
    follows the root's row; the second, given the first child was kept, its own row."""
    pytest.importorskip("scipy")
    cfg = SamplingConfig(0.7)
    rows = _logits(4, 5)
    p0 = probs(rows[0], cfg)
    tree = TokenTree(5)
    tree.reset(7)
    kids = np.argsort(-p0)[:3]
    for x in kids:
        tree.add(0, int(x))
    tree.add(1, int(rows[1].argmax()))
    tokens = np.zeros(16, np.int64)
    first, second = np.empty(N, np.int64), []
    for s in range(N):
        n_acc, nxt = accept_tree_sampled(tree, rows[:5], cfg, np.random.default_rng(s), tokens, 0)
        first[s] = tokens[0] if n_acc else nxt
        if n_acc and tree.path[1] == 1:
            second.append(tokens[1] if n_acc > 1 else nxt)
    assert _pvalue(first, p0) > 1e-3
    assert _pvalue(np.array(second), probs(rows[1], cfg)) > 1e-3
