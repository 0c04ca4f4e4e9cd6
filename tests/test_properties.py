"""Property tests (hypothesis) of the acceptance code with random logits and drafts, ties, -inf
and extreme values included: greedy keeps exactly the longest matching prefix and then the
target's argmax; sampling keeps 0..m drafts and its next token has probability under the target
(or under the residual after a rejection); a tree's accepted path is a root-to-node chain."""

import numpy as np
import pytest

pytest.importorskip("hypothesis")

from helpers.strategies import FAST, chain_case, tree_case  # noqa: E402
from hypothesis import given  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from edgespec.runtime.sampling import SamplingConfig, penalize, probs  # noqa: E402
from edgespec.runtime.state import Proposal, SeqState  # noqa: E402
from edgespec.runtime.tree import TokenTree  # noqa: E402
from edgespec.runtime.verify import (  # noqa: E402
    accept,
    accept_greedy,
    accept_sampled,
    accept_tree_greedy,
    accept_tree_sampled,
)

SAMPLING = st.builds(
    SamplingConfig,
    temperature=st.sampled_from([1e-3, 0.3, 1.0, 2.0, 1e3]),
    top_k=st.sampled_from([0, 1, 2, 5]),
    top_p=st.sampled_from([1.0, 0.9, 0.5, 1e-6]),
    seed=st.integers(0, 2**32 - 1),
)


@FAST
@given(chain_case())
def test_greedy_keeps_the_longest_matching_prefix_then_the_argmax(case):
    draft, tgt = case
    n, nxt = accept_greedy(draft, tgt)
    top = tgt.argmax(axis=-1)
    assert 0 <= n <= len(draft)
    assert all(draft[i] == top[i] for i in range(n))  # every kept draft is the target's choice ...
    assert n == len(draft) or draft[n] != top[n]  # ... and the first one that is not stops it
    assert nxt == top[n]  # then the target's own token: correction or bonus


@st.composite
def q_rows(draw, draft: np.ndarray, vocab: int) -> np.ndarray | None:
    """A draft model's distributions, or None (a deterministic drafter: one-hot q)."""
    if draw(st.booleans()):
        return None
    w = np.array(
        draw(
            st.lists(
                st.sampled_from([0.0, 0.0, 1e-300, 1e-9, 0.2, 1.0, 7.0]),
                min_size=len(draft) * vocab,
                max_size=len(draft) * vocab,
            )
        ),
        np.float64,
    ).reshape(len(draft), vocab)
    w[np.arange(len(draft)), draft] += draw(st.sampled_from([0.0, 1e-12, 1.0]))  # q(x) may even be 0
    sums = w.sum(axis=1, keepdims=True)
    return np.divide(w, sums, out=np.full_like(w, 1.0 / vocab), where=sums > 0)


@FAST
@given(chain_case(), SAMPLING, st.data())
def test_sampled_acceptance_stays_in_range_and_in_support(case, cfg, data):
    draft, tgt = case
    q = data.draw(q_rows(draft, tgt.shape[1]))
    n, nxt = accept_sampled(draft, q, tgt, cfg, np.random.default_rng(cfg.seed))
    p = probs(tgt, cfg)
    assert np.isfinite(p).all() and np.allclose(p.sum(axis=-1), 1.0)
    assert 0 <= n <= len(draft) and 0 <= nxt < tgt.shape[1]
    if n == len(draft):  # every draft kept: the bonus token is drawn from p
        assert p[n, nxt] > 0
        return
    x = draft[n]  # rejected: the replacement comes from norm(max(0, p - q)), or from p when that is empty
    residual = p[n].copy()
    if q is None:
        residual[x] = 0.0
    else:
        residual = np.maximum(residual - q[n], 0.0)
    assert residual[nxt] > 0 or (residual.sum() <= 0 and p[n, nxt] > 0)


@FAST
@given(chain_case(), st.sampled_from([0.05, 0.09, 0.5]), st.integers(0, 2**32 - 1))
def test_typical_acceptance_stays_in_range_and_in_support(case, eps, seed):
    draft, tgt = case
    cfg = SamplingConfig(temperature=1.0, typical_epsilon=eps, seed=seed)
    n, nxt = accept_sampled(draft, None, tgt, cfg, np.random.default_rng(seed))
    assert 0 <= n <= len(draft) and probs(tgt, cfg)[n, nxt] > 0


@FAST
@given(chain_case(), st.sampled_from([1.0, 1.3, 0.7]), st.booleans(), st.integers(0, 2**32 - 1))
def test_accept_with_a_repetition_penalty_matches_the_penalized_rows(case, penalty, greedy, seed):
    """verify.accept on a chain: the rule of its mode over the penalized rows (row i sees the
    context and the drafts before it)."""
    draft, tgt = case
    m = len(draft)
    ctx = np.array([0, 1, 1, draft[0] if m else 0], np.int64)
    tokens = np.zeros(len(ctx) + m + 2, np.int64)
    tokens[: len(ctx)] = ctx
    tokens[len(ctx) : len(ctx) + m] = draft
    seq = SeqState(tokens=tokens, n=len(ctx), n_prompt=len(ctx), tgt_past=len(ctx) - 1)
    prop = Proposal(tokens[len(ctx) - 1 : len(ctx) + m], depth=m)
    cfg = SamplingConfig(temperature=0.0 if greedy else 0.8, repetition_penalty=penalty, seed=seed)
    n, nxt = accept(prop, tgt, seq, cfg, np.random.default_rng(seed))
    rows = penalize(tgt, tokens, len(ctx), penalty) if penalty != 1.0 else tgt
    if greedy:
        assert (n, nxt) == accept_greedy(draft, rows)
    else:
        assert 0 <= n <= m and probs(rows, cfg)[n].max() > 0


def _check_path(tree: TokenTree, n_acc: int, tokens: np.ndarray, n: int) -> None:
    """path[:n_acc+1] runs from the root down parent links, and its tokens were written in order."""
    path = tree.path[: n_acc + 1]
    assert path[0] == 0 and 0 <= n_acc < tree.n
    for i in range(1, n_acc + 1):
        assert tree.parents[path[i]] == path[i - 1]
        assert tokens[n + i - 1] == tree.tokens[path[i]]


@FAST
@given(tree_case())
def test_tree_greedy_follows_the_argmax_down_a_chain(case):
    tree, tgt = case
    tokens = np.zeros(32, np.int64)
    n_acc, nxt = accept_tree_greedy(tree, tgt, tokens, 3)
    _check_path(tree, n_acc, tokens, 3)
    path = tree.path[: n_acc + 1]
    for i in range(1, n_acc + 1):  # each step took the target's argmax at the node above
        assert tree.tokens[path[i]] == tgt[path[i - 1]].argmax()
    assert nxt == tgt[path[n_acc]].argmax() and tree.child(int(path[n_acc]), nxt) < 0  # stopped: no such child


@FAST
@given(tree_case(), SAMPLING)
def test_tree_sampled_path_is_a_chain_and_next_has_mass(case, cfg):
    tree, tgt = case
    tokens = np.zeros(32, np.int64)
    n_acc, nxt = accept_tree_sampled(tree, tgt, cfg, np.random.default_rng(cfg.seed), tokens, 5)
    _check_path(tree, n_acc, tokens, 5)
    last = int(tree.path[n_acc])
    p = probs(tgt[last], cfg)
    assert p[nxt] > 0
    children = {int(tree.tokens[c]) for c in range(last + 1, tree.n) if tree.parents[c] == last}
    # every child of the last node was rejected, so its token comes back only when the children
    # held (numerically) all the mass
    assert nxt not in children or p[sorted(children)].sum() >= 1 - 1e-9


# ---- the server's request schema ----------------------------------------------------------------
JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(10**30), 10**30) | st.floats(allow_nan=True) | st.text(max_size=20),
    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=12), kids, max_size=4),
    max_leaves=12,
)
KEYS = [
    "model",
    "messages",
    "prompt",
    "max_tokens",
    "max_completion_tokens",
    "temperature",
    "top_p",
    "top_k",
    "seed",
    "stop",
    "stream",
    "stream_options",
    "speculative",
    "n",
    "repetition_penalty",
    "response_format",
]
MESSAGE = st.fixed_dictionaries(
    {
        "role": st.sampled_from(["user", "system", "assistant", "tool", 7, None]),
        "content": JSON
        | st.lists(st.fixed_dictionaries({"type": st.sampled_from(["text", "image_url"]), "text": JSON}), max_size=3),
    }
)
BODY = st.dictionaries(st.sampled_from(KEYS), JSON, max_size=8) | st.fixed_dictionaries(
    {"messages": st.lists(MESSAGE, max_size=3)}, optional={k: JSON for k in KEYS[2:]}
)


@FAST
@given(body=BODY | JSON, chat=st.booleans())
def test_any_request_body_is_a_checked_request_or_a_400(body, chat):
    """Whatever JSON arrives, the schema either returns a request whose numbers the loop can run
    (finite sampling settings, max_tokens >= 1, a drafter the folder has, k in range) or raises
    BadRequest with a status and an OpenAI-style body; never any other exception."""
    pytest.importorskip("starlette")
    from edgespec.runtime.apps.server_request import parse_request
    from edgespec.runtime.apps.server_schema import Abilities, BadRequest, Speculation

    ab = Abilities(drafters=("none", "ngram", "eagle"), tree_drafters=("ngram", "eagle"), k_max=8, context=256)
    try:
        req = parse_request(body, chat, "m", Speculation("ngram", 4), ab, 64)
    except BadRequest as e:
        assert e.status in (400, 404, 413) and set(e.body()["error"]) >= {"message", "type", "param", "code"}
        return
    req.sampling.check()
    assert req.max_tokens >= 1 and req.n_bytes >= 0 and all(isinstance(s, str) for s in req.stop)
    spec = req.speculation
    assert spec is None or (spec.drafter in ab.drafters and (spec.drafter == "none" or 1 <= spec.k <= ab.k_max))


SCHEMA_WORDS = st.sampled_from(
    [
        "type",
        "properties",
        "items",
        "enum",
        "required",
        "anyOf",
        "oneOf",
        "$ref",
        "pattern",
        "minimum",
        "maxLength",
        "additionalProperties",
        "const",
        "format",
        "if",
    ]
)
SCHEMA = st.recursive(
    JSON | st.sampled_from(["object", "string", "integer", "array", "#/x", "[a-", "^a$"]),
    lambda kids: st.dictionaries(SCHEMA_WORDS, kids, max_size=4) | st.lists(kids, max_size=3),
    max_leaves=16,
)


@FAST
@given(schema=SCHEMA, strict=st.sampled_from([True, False, None, "yes"]))
def test_any_response_format_schema_is_a_grammar_or_a_400(schema, strict):
    """Whatever a json_schema response_format holds, parsing gives a checked grammar or a 400
    naming the field: llguidance's errors never escape as another exception."""
    pytest.importorskip("starlette")
    pytest.importorskip("llguidance")
    from edgespec.runtime.apps.server_request import parse_response_format
    from edgespec.runtime.apps.server_schema import BadRequest
    from edgespec.runtime.grammar import Grammar

    fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema, "strict": strict}}
    try:
        g = parse_response_format(fmt)
    except BadRequest as e:
        assert e.status == 400 and e.param.startswith("response_format")
        return
    assert isinstance(g, Grammar) and g.kind == "json_schema"
