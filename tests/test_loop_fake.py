"""The speculative loop on table-driven fake models: fast, exact, no ONNX Runtime."""

import numpy as np
import pytest

from edgespec.engines.fake import FakeModel, random_table
from edgespec.runtime.backends import Engines
from edgespec.runtime.config import RuntimeConfig
from edgespec.runtime.generator import Generator, PromptTooLongError
from edgespec.runtime.sampling import SamplingConfig

V = 64


def make(drafter: str, k: int, max_len: int = 512, draft_noise: float = 1.0) -> Generator:
    table = random_table(V, seed=0)
    target = FakeModel(table, max_len=max_len)
    noisy = table + np.random.default_rng(5).standard_normal(table.shape).astype(np.float32) * draft_noise
    draft = FakeModel(noisy, max_len=max_len)
    return Generator(None, Engines(target, {"draft": draft}), RuntimeConfig(drafter=drafter, k=k))


def run(g: Generator, prompt, n: int, **kw) -> np.ndarray:
    return np.concatenate([c.copy() for c in g.generate_ids(np.array(prompt), n, **kw)])


PROMPT = [3, 17, 5, 3, 17, 9, 22, 3, 17, 5, 41, 8, 3]


def test_plain_decoding_is_the_table_argmax_chain():
    g = make("none", 0)
    out = run(g, PROMPT, 20)
    # reference by hand: next = argmax(table[tok] + table2[prev])
    t = g.target
    seq = list(PROMPT)
    for _ in range(20):
        seq.append(int((t.table[seq[-1]] + t.table2[seq[-2]]).argmax()))
    assert out.tolist() == seq[len(PROMPT) :]
    assert g.last_stats.n_target_calls == 19 and g.last_stats.mean_accepted_length == 1.0


@pytest.mark.parametrize("drafter", ["ngram", "suffix", "draft"])
@pytest.mark.parametrize("k", range(1, 9))
def test_greedy_speculative_equals_plain(drafter, k):
    ref = run(make("none", 0), PROMPT, 120)
    g = make(drafter, k)
    out = run(g, PROMPT, 120)
    assert out.tolist() == ref.tolist()
    st = g.last_stats
    assert st.n_output == 120
    assert st.n_target_calls < 120 or drafter in ("ngram", "suffix")
    assert 1.0 <= st.mean_accepted_length <= k + 1


@pytest.mark.parametrize("drafter", ["ngram", "suffix"])
@pytest.mark.parametrize("nodes,depth,branch,beam", [(9, 4, 2, 2), (5, 2, 3, 2), (9, 8, 1, 1)])
def test_greedy_tree_equals_plain(drafter, nodes, depth, branch, beam):
    from edgespec.runtime.tree import TreeConfig

    ref = run(make("none", 0), PROMPT, 120)
    table = random_table(V, seed=0)
    g = Generator(
        None,
        Engines(FakeModel(table)),
        RuntimeConfig(drafter=drafter, k=4, tree=TreeConfig(nodes, depth, branch, beam)),
    )
    out = run(g, PROMPT, 120)
    assert out.tolist() == ref.tolist()
    # only accepted rows were committed, compacted in sequence order
    n = len(PROMPT) + 119
    assert g.target.kv[:n].tolist() == np.concatenate([PROMPT, out])[:n].tolist()


@pytest.mark.parametrize("drafter", ["ngram", "suffix"])
def test_cost_sized_trees_equal_plain(drafter):
    """Adaptive trees: each step verifies only the nodes its TreeBudget keeps (ancestor-closed,
    best scores first); the output is still plain decoding's."""
    from edgespec.runtime.tree import TreeConfig

    ref = run(make("none", 0), PROMPT, 120)
    g = Generator(
        None,
        Engines(FakeModel(random_table(V, seed=0))),
        RuntimeConfig(drafter=drafter, k=8, adaptive=True, tree=TreeConfig(9, 4, 2, 2)),
    )
    assert g.tree_budget is not None and g.adaptive is None
    widths = []
    for _ in range(3):
        out = run(g, PROMPT, 120)
        assert out.tolist() == ref.tolist()
        st = g.last_stats
        widths.append(1 + st.n_drafted / st.n_target_calls)  # mean nodes per verify call
    assert g.last_stats.adaptive and all(1.0 <= w <= 9.0 for w in widths)


def test_draft_model_that_equals_target_accepts_everything():
    g = make("draft", 4, draft_noise=0.0)
    run(g, PROMPT, 60)
    assert g.last_stats.acceptance_rate == 1.0
    assert g.last_stats.mean_accepted_length == 5.0


def test_rows_committed_are_exactly_the_sequence():
    g = make("draft", 5)
    out = run(g, PROMPT, 80)
    seq = PROMPT + out.tolist()
    n_rows = len(seq) - 1  # the last token is pending
    assert g.target.kv[:n_rows].tolist() == seq[:n_rows]


def test_context_limit_stops_with_length():
    g = make("ngram", 4, max_len=40)
    out = run(g, PROMPT, 100)
    assert len(PROMPT) + len(out) <= 40
    assert g.last_stats.finish_reason == "length"


def test_prompt_longer_than_context_is_refused_before_work():
    g = make("none", 0, max_len=16)
    with pytest.raises(PromptTooLongError, match="context is 16"):
        run(g, list(range(20)), 5)
    assert g.target.n_calls == 0


def test_k_beyond_exported_widths_is_refused():
    with pytest.raises(ValueError, match="num_speculative_tokens"):
        make("ngram", 12)


def test_memory_flat_over_long_generation():
    import tracemalloc

    g = make("draft", 4, max_len=4096)
    run(g, PROMPT, 200)  # warm up
    tracemalloc.start()
    run(g, PROMPT, 200)
    small, _ = tracemalloc.get_traced_memory()
    run(g, PROMPT, 3000)
    big, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    # 15x more tokens must not mean more retained memory (per-token ITL floats aside: 8 B each)
    assert big - small < 3000 * 8 * 3 + 50_000, (small, big)


def test_seeded_sampling_is_reproducible():
    g = make("draft", 3)
    a = run(g, PROMPT, 40, sampling=SamplingConfig(temperature=0.8, seed=7))
    b = run(g, PROMPT, 40, sampling=SamplingConfig(temperature=0.8, seed=7))
    c = run(g, PROMPT, 40, sampling=SamplingConfig(temperature=0.8, seed=8))
    assert a.tolist() == b.tolist() and a.tolist() != c.tolist()


@pytest.mark.parametrize("drafter", ["none", "ngram", "suffix", "draft"])
def test_kv_reuse_across_calls_gives_the_same_output(drafter):
    turn1 = run(make(drafter, 4), PROMPT, 30)
    g = make(drafter, 4)
    assert run(g, PROMPT, 30).tolist() == turn1.tolist()
    follow_up = PROMPT + turn1.tolist() + [7, 7, 3]  # a second turn: the first one plus new text
    reused = run(g, follow_up, 40)
    assert g.last_stats.n_prompt_cached >= len(PROMPT) + len(turn1) - 2
    fresh = make(drafter, 4)
    assert run(fresh, follow_up, 40).tolist() == reused.tolist()
    assert fresh.last_stats.n_prompt_cached == 0
    other = run(g, [9, 9, 9] + PROMPT, 20)  # a different prompt: nothing reusable
    assert g.last_stats.n_prompt_cached == 0
    assert other.tolist() == run(make(drafter, 4), [9, 9, 9] + PROMPT, 20).tolist()


def test_adaptive_k_keeps_greedy_identity():

    ref = run(make("none", 0), PROMPT, 150)
    for drafter in ("ngram", "draft"):
        g = make(drafter, 6)
        g.reconfigure(drafter=drafter, k=6, adaptive=True)
        assert g.adaptive is not None
        assert run(g, PROMPT, 150).tolist() == ref.tolist()
        assert g.last_stats.adaptive


def test_adaptive_policy_follows_costs_and_acceptance():
    from edgespec.runtime.adaptive import AdaptiveK

    cheap = AdaptiveK(8, {w: 0.020 + 0.001 * w for w in range(1, 10)})  # wide verify nearly free
    expensive = AdaptiveK(8, {1: 0.009} | {w: 0.021 + 0.003 * w for w in range(2, 10)})  # int4-like
    for pol in (cheap, expensive):
        for _ in range(50):  # drafts of 4, 3 accepted: a ~ 0.75
            pol.observe(4, 4, 3, pol.verify_s[5] if not np.isnan(pol.verify_s[5]) else 0.03, 0.0)
    assert cheap.choose() >= 3
    assert expensive.choose() in (0, 8)  # 8 only as the periodic probe
    assert sum(expensive.choose() == 0 for _ in range(15)) >= 14
    low = AdaptiveK(8, {w: 0.020 + 0.001 * w for w in range(1, 10)})
    for _ in range(60):
        low.observe(4, 4, 0, 0.024, 0.0)  # nothing accepted
    assert low.choose() == 0


def test_ngram_classes_are_its_match_length_and_adaptive_k_learns_each_apart():
    """Prompt lookup tells adaptive k its match's suffix length before drafting (draft_class: size - 1,
    -1 without a match); each class keeps its own acceptance, so a long match drafts long while short
    ones stay short. The proposal after draft_class is the one without it; greedy output stays plain's."""
    from edgespec.runtime.adaptive import AdaptiveK
    from edgespec.runtime.state import SeqState

    g = make("ngram", 6)
    seq = SeqState(np.zeros(64, np.int64), 0, 0, 0)
    for toks, cls in (([5, 6, 7, 8, 6, 7, 8], 2), ([5, 6, 7, 9, 7], 0), ([5, 6, 7, 2, 6, 7], 1), ([1, 2, 3], -1)):
        seq.tokens[: len(toks)], seq.n = toks, len(toks)
        assert g.drafter.draft_class(seq) == cls
        peeked = g.drafter.propose(seq, 4).tokens.copy()
        assert peeked.tolist() == g.drafter.propose(seq, 4).tokens.tolist()  # (no draft_class before it)
    assert g.drafter.n_classes == 3
    pol = AdaptiveK(8, {w: 1.0 + 0.15 * (w - 1) for w in range(1, 10)}, timed=False, classes=3)
    for _ in range(40):
        pol.observe(8, 8, 0, 0.0, 0.0, 0)  # short matches: nothing kept
        pol.observe(8, 8, 7, 0.0, 0.0, 2)  # long matches: 7 of 8 kept
    assert pol.choose(0) == 0 and pol.choose(2) >= 5
    ref = run(make("none", 0), PROMPT, 150)
    g.reconfigure(adaptive=True)
    assert run(g, PROMPT, 150).tolist() == ref.tolist()
