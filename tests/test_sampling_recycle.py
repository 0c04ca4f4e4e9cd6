"""Lossless sampling with the recycle table's drafters (recycle, merged: the table's stored top
candidates as one-hot drafts, chains and trees, fixed and cost-sized): the distribution of tokens
2-3 matches the target's exactly (chi-square, as tests/test_sampling.py)."""

import numpy as np
import pytest
from helpers.sampling import TREE, chi2_pvalue, exact_tokens_23, fake_generator, sample_counts

from edgespec.runtime.sampling import SamplingConfig


@pytest.mark.parametrize("drafter", ["recycle", "merged"])
@pytest.mark.parametrize("tree", [False, True])
@pytest.mark.parametrize("adaptive", [False, True])
def test_recycle_sampling_keeps_the_target_distribution(drafter, tree, adaptive):
    pytest.importorskip("scipy")
    g = fake_generator(drafter, TREE) if tree else fake_generator(drafter)
    g.reconfigure(adaptive=adaptive)
    p = chi2_pvalue(sample_counts(g), exact_tokens_23(g))
    assert p > 1e-3, f"{drafter} tree={tree} adaptive={adaptive}: chi-square p = {p:.2g}"
    st = g.last_stats
    assert st.n_drafted > 0 and st.n_accepted > 0  # the table drafted, and some drafts were kept
    if tree and not adaptive:
        assert st.n_drafted > st.n_target_calls  # more than one candidate per step


@pytest.mark.parametrize("tree", [True, False])  # (False: a cost-sized chain)
def test_a_seed_reproduces_the_output(tree):
    g = fake_generator("merged", TREE) if tree else fake_generator("merged")
    g.reconfigure(adaptive=True)
    assert (g.tree_budget if tree else g.chain_budget) is not None
    cfg = SamplingConfig(temperature=0.7, seed=5)
    prompt = np.array([1, 2, 3, 1, 2])
    g.drafter_store = {}
    g.reconfigure()
    a = np.concatenate([c.copy() for c in g.generate_ids(prompt, 40, cfg)])
    g.drafter_store = {}
    g.reconfigure()
    b = np.concatenate([c.copy() for c in g.generate_ids(prompt, 40, cfg)])
    assert np.array_equal(a, b)


# ---- sampled drafts from the table's stored rows (SparseQ) ----------------------------------------


def _sparse_q_run(n: int = 30_000):
    """(p-value of the step's token against p, kept fraction, sum(min(p, q))) of n one-draft steps,
    x ~ q over a few tokens (one with no target mass) on rows wider than one block."""
    from scipy.stats import chisquare

    from edgespec.runtime.state import SparseQ
    from edgespec.runtime.verify import accept_sampled

    V = 600
    rng = np.random.default_rng(0)
    logits = np.full((2, V), -30.0, np.float32)  # [T, V] the mass on 12 tokens in three blocks
    hot = np.array([3, 9, 17, 260, 261, 300, 511, 512, 513, 590, 595, 599])
    logits[0, hot] = rng.standard_normal(len(hot)).astype(np.float32) * 1.5
    cfg = SamplingConfig(temperature=0.7)
    p = np.exp((logits[0] - logits[0].max()) / 0.7).astype(np.float64)
    p /= p.sum()
    ids = np.array([[260, 3, 512, 42, 599, -1, -1, -1]])  # 42: no target mass
    qs = np.array([[0.35, 0.25, 0.2, 0.1, 0.1, 0.0, 0.0, 0.0]])
    q = SparseQ(ids, qs)
    draws = rng.choice(5, size=n, p=qs[0, :5])
    counts, kept = np.zeros(V), 0
    for j in draws:
        n_acc, nxt = accept_sampled(ids[0, j : j + 1], q, logits, cfg, rng)
        tok = ids[0, j] if n_acc else nxt
        kept += n_acc
        counts[tok] += 1
    keep = p * n > 5
    obs, exp = np.append(counts[keep], counts[~keep].sum()), np.append(p[keep] * n, p[~keep].sum() * n)
    dense_q = np.zeros(V)
    dense_q[ids[0, :5]] = qs[0, :5]
    return chisquare(obs, exp).pvalue, kept / n, np.minimum(p, dense_q).sum()


def test_a_sparse_q_keeps_the_target_distribution_and_keeps_sum_min_p_q():
    """The sparse rule: the step's token follows p exactly, and x is kept with chance
    sum(min(p, q)) (against p(x) alone for the first candidate)."""
    pytest.importorskip("scipy")
    n = 30_000
    pvalue, kept, want = _sparse_q_run(n)
    assert pvalue > 1e-3
    assert abs(kept - want) < 4 * np.sqrt(want * (1 - want) / n)


def test_a_residual_left_unsubtracted_is_caught(monkeypatch):
    """Redraw from p itself after a rejection (no residual): the test above must notice."""
    pytest.importorskip("scipy")
    from edgespec.runtime.sampling import RowDist

    monkeypatch.setattr(RowDist, "subtract", lambda self, ids, qs: None)
    assert _sparse_q_run()[0] < 1e-3


def test_subtract_leaves_the_residual():
    """RowDist.subtract: w = max(0, p - q) * the old total over q's tokens, the rest unchanged, the
    block sums and total current."""
    from edgespec.runtime.sampling import RowDist

    V = 700
    logits = np.random.default_rng(1).standard_normal(V).astype(np.float32)
    d = RowDist(V).load(logits, SamplingConfig(temperature=1.0))
    w0, total = d.w.astype(np.float64), d.total
    ids, qs = [5, 300, 699, -1], [0.5, 0.3, 0.2, 0.0]
    d.subtract(ids, qs)
    want = w0.copy()
    for x, q in zip(ids[:3], qs[:3], strict=True):
        want[x] = max(0.0, w0[x] - q * total)
    np.testing.assert_allclose(d.w, want, rtol=1e-6)
    np.testing.assert_allclose(d.total, want.sum(), rtol=1e-5)
    np.testing.assert_allclose(d.blocks.sum(), d.total, rtol=1e-6)


def _table_drafter(sharpen):
    from edgespec.runtime.drafters.recycle import RecycleDrafter, RecycleTable
    from edgespec.runtime.state import SeqState

    V = 50
    table = RecycleTable(V)
    ids = np.array([[7, 8, 9, 10, -1, -1, -1, -1]])
    probs = np.array([[0.5, 0.3, 0.15, 0.05, 0, 0, 0, 0]], np.float32)
    for ctx in range(V):  # every token's row: the same four candidates
        table.observe_span(np.array([ctx]), 0, 1, ids, probs)
    d = RecycleDrafter(table, sharpen=sharpen)
    d.configure(SamplingConfig(temperature=0.7), np.random.default_rng(3))
    seq = SeqState(np.zeros(16, np.int64), 1, 1, 0)
    return d, seq, table.probs[0, :4].astype(np.float64)  # (as stored: float16)


def test_sampled_drafts_are_drawn_from_the_sharpened_row():
    d, seq, stored = _table_drafter(2.0)
    want = stored ** (2.0 / 0.7)
    want /= want.sum()
    seen = np.zeros(4)
    for _ in range(4000):
        prop = d.propose(seq, 2)
        assert prop.n_drafted == 2 and prop.q is not None
        np.testing.assert_allclose(prop.q.probs[:, :4], [want, want])
        np.testing.assert_allclose(prop.q.probs.sum(axis=1), 1.0)
        seen[prop.tokens[1] - 7] += 1
    assert np.abs(seen / seen.sum() - want).max() < 0.03


def test_sharpen_inf_drafts_the_first_candidate_one_hot():
    d, seq, _ = _table_drafter(float("inf"))
    for _ in range(50):
        prop = d.propose(seq, 3)
        assert prop.tokens[1:].tolist() == [7, 7, 7]
        assert prop.q.probs[:, 0].tolist() == [1.0] * 3


def test_a_sharpen_of_zero_is_refused():
    from edgespec.runtime.drafters.recycle import RecycleError

    with pytest.raises(RecycleError, match="--recycle-sharpen"):
        _table_drafter(0.0)


def test_a_sampled_chain_cut_is_a_stopping_rule():
    """stopping=True (sampled chains): whether draft i is verified depends on scores[:i + 1] alone, so
    replacing every score past the first draft left out never moves the cut; the best-prefix rule
    of greedy chains does look past it (the check has teeth)."""
    from edgespec.runtime.adaptive import AdaptiveConfig, TreeBudget

    rng = np.random.default_rng(4)
    # a width table that is not convex (as measured ones can be: a kernel's blocking makes width 4
    # about as dear as 3), where a longer prefix can pay though the draft before it did not
    costs = dict(enumerate([1.0, 1.2, 1.22, 1.24, 1.5, 1.52, 1.54, 1.8, 1.82], start=1))
    moved = {True: 0, False: 0}
    for _ in range(3000):
        scores = np.cumprod(rng.uniform(0.05, 1.0, 8)).tolist()  # path scores: falling with depth
        tail = np.cumprod(rng.uniform(0.05, 1.0, 8)).tolist()
        for stopping in (True, False):
            b = TreeBudget(9, costs, AdaptiveConfig(probe_every=10**9), timed=False)
            m = b.choose_chain(scores, stopping=stopping)  # nodes: the root and m - 1 drafts
            if m > len(scores):
                continue
            cap = scores[m - 1]  # the first draft left out; its successors' scores follow its token
            other = scores[:m] + [cap * t for t in tail][: len(scores) - m]
            moved[stopping] += b.choose_chain(other, stopping=stopping) != m
    assert moved[True] == 0
    assert moved[False] > 0


@pytest.mark.parametrize("tree", [False, True])
def test_hybrid_with_merged_as_its_lookup(tree):
    """--hybrid-lookup merged: per step merged's chain (suffix decoding continued from the table) or
    the head's; greedy output equals plain, sampled output follows the target (chi-square), and both
    sources propose."""
    pytest.importorskip("scipy")
    from helpers.sampling import PROMPT

    from edgespec.runtime.drafters.recycle import MergedDrafter

    g = fake_generator("hybrid", TREE) if tree else fake_generator("hybrid")
    g.reconfigure(hybrid_lookup="merged")
    assert isinstance(g.drafter.lookup, MergedDrafter)
    plain = fake_generator("none")
    want = np.concatenate([c.copy() for c in plain.generate_ids(PROMPT, 40)])
    for _ in range(3):  # the table fills across calls
        assert np.array_equal(np.concatenate([c.copy() for c in g.generate_ids(PROMPT, 40)]), want)
    assert g.last_stats.sources["merged"][2] > 0  # (drafts of merged kept)
    p = chi2_pvalue(sample_counts(g), exact_tokens_23(g))
    assert p > 1e-3, f"hybrid with merged, tree={tree}: chi-square p = {p:.2g}"
    sampled = SamplingConfig(temperature=1.0, seed=3)
    if not tree:  # a sampled call drafts from the lookup alone by default
        list(g.generate_ids(PROMPT, 40, sampled))
        assert set(g.last_stats.sources) == {"merged"}
    g.reconfigure(hybrid_lookup="merged", hybrid_sampled_head=True)
    p = chi2_pvalue(sample_counts(g), exact_tokens_23(g))
    assert p > 1e-3, f"hybrid with merged and its head sampled, tree={tree}: chi-square p = {p:.2g}"
    if not tree:  # --hybrid-sampled-head: the head drafts where merged's estimate falls short
        list(g.generate_ids(PROMPT, 40, sampled))
        assert {"merged", "head"} <= set(g.last_stats.sources)
