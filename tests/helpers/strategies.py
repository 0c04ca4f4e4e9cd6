"""Hypothesis strategies: logits as a model could emit them (and worse), chains and token trees."""

import numpy as np
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from edgespec.runtime.tree import TokenTree

FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# logits as a model could emit them, and worse: a few distinct values (ties), -inf (masked
# tokens), huge magnitudes; every row keeps at least one finite value (a row of -inf has no
# distribution: no model emits one)
LOGIT = st.one_of(
    st.sampled_from([0.0, 1.0, -1.0, 3.0, -np.inf, 1e30, -1e30, 3e38, -3e38]),
    st.floats(-50, 50, allow_nan=False, width=32),
)


@st.composite
def logits(draw, rows: int, vocab: int) -> np.ndarray:
    x = np.array(draw(st.lists(LOGIT, min_size=rows * vocab, max_size=rows * vocab)), np.float32).reshape(rows, vocab)
    for r in range(rows):
        if not np.isfinite(x[r]).any():
            x[r, draw(st.integers(0, vocab - 1))] = draw(st.floats(-50, 50, width=32))
    return x


@st.composite
def chain_case(draw):
    vocab = draw(st.integers(2, 12))
    m = draw(st.integers(0, 6))
    tgt = draw(logits(m + 1, vocab))
    draft = np.array(draw(st.lists(st.integers(0, vocab - 1), min_size=m, max_size=m)), np.int64)
    return draft, tgt


@st.composite
def tree_case(draw):
    """A random token tree (parents before children, no two siblings with one token) and its rows."""
    vocab = draw(st.integers(2, 8))
    n_max = draw(st.integers(1, 10))
    tree = TokenTree(n_max)
    tree.reset(draw(st.integers(0, vocab - 1)))
    for _ in range(n_max - 1):
        tree.add(draw(st.integers(0, tree.n - 1)), draw(st.integers(0, vocab - 1)))
    return tree, draw(logits(tree.n, vocab))
