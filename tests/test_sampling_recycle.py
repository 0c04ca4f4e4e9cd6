"""Lossless sampling with the recycle table's drafters (recycle, merged: the table's stored top
candidates as one-hot drafts, chains and trees, fixed and cost-sized): the distribution of tokens
2-3 matches the target's exactly (chi-square, as tests/test_sampling.py)."""

import numpy as np
import pytest
from test_sampling import TREE, _chi2_pvalue, _exact_tokens_23, _gen, _sample_counts

from edgespec.runtime.sampling import SamplingConfig


@pytest.mark.parametrize("drafter", ["recycle", "merged"])
@pytest.mark.parametrize("tree", [False, True])
@pytest.mark.parametrize("adaptive", [False, True])
def test_recycle_sampling_keeps_the_target_distribution(drafter, tree, adaptive):
    pytest.importorskip("scipy")
    g = _gen(drafter, TREE) if tree else _gen(drafter)
    g.reconfigure(adaptive=adaptive)
    p = _chi2_pvalue(_sample_counts(g), _exact_tokens_23(g))
    assert p > 1e-3, f"{drafter} tree={tree} adaptive={adaptive}: chi-square p = {p:.2g}"
    st = g.last_stats
    assert st.n_drafted > 0 and st.n_accepted > 0  # the table drafted, and some drafts were kept
    if tree and not adaptive:
        assert st.n_drafted > st.n_target_calls  # more than one candidate per step


@pytest.mark.parametrize("tree", [True, False])  # (False: a cost-sized chain)
def test_a_seed_reproduces_the_output(tree):
    g = _gen("merged", TREE) if tree else _gen("merged")
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
