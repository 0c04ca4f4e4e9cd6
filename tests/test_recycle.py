"""Token recycling (runtime/drafters/recycle/): the table from every row of every target call, greedy
output identical to plain decoding (chains, trees, cost-sized trees; fake and tiny ONNX models),
sampling that keeps the target's distribution, and the graph's top-k output leaving the logits
bitwise alone."""

import io
import warnings

import numpy as np
import pytest

from edgespec.engines.fake import FakeModel, random_table
from edgespec.runtime.backends import Engines
from edgespec.runtime.config import RuntimeConfig
from edgespec.runtime.drafters.recycle import Calibration, RecycleConfig, RecycleTable
from edgespec.runtime.generator import Generator
from edgespec.runtime.sampling import SamplingConfig
from edgespec.runtime.tree import TreeConfig

V = 64
PROMPT = [3, 17, 5, 3, 17, 9, 22, 3, 17, 5, 41, 8, 3]


def _fake(drafter: str = "recycle", max_len: int = 512, **cfg) -> Generator:
    target = FakeModel(random_table(V, seed=0), max_len=max_len)
    return Generator(None, Engines(target), RuntimeConfig(drafter=drafter, **({"k": 4} | cfg)))


def _run(g: Generator, prompt, n: int, **kw) -> list[int]:
    return [int(t) for c in g.generate_ids(np.array(prompt, np.int64), n, **kw) for t in c]


def test_table_keeps_the_latest_rows_by_their_longest_context():
    t = RecycleTable(50, RecycleConfig(bits=6), k=3)
    toks = np.array([5, 6, 7, 8, 0, 0])
    ids = np.arange(12).reshape(4, 3) + 10
    probs = np.linspace(0.9, 0.1, 12, dtype=np.float32).reshape(4, 3)
    t.observe_span(toks, 0, 4, ids, probs)  # rows of 5, 6, 7, 8 (a prefill chunk)
    assert t.ids[t.row(-1, -1, 5)].tolist() == [10, 11, 12]  # order 1 (no context before position 0)
    assert t.ids[t.row(5, 6, 7)].tolist() == [16, 17, 18]  # order 3
    assert t.ids[t.row(9, 6, 7)].tolist() == [16, 17, 18]  # order 2: (6, 7) ... written by the same row
    assert t.row(9, 9, 9) == -1  # never seen
    assert abs(float(t.probs[t.row(6, 7, 8), 0]) - probs[3, 0]) < 1e-3
    # a tree after tokens[:4]: root 8 (the pending token), children 20 and 21, 22 under 20
    nodes, parents = np.array([8, 20, 21, 22]), np.array([-1, 0, 0, 1])
    tree_ids = np.arange(12).reshape(4, 3) + 30
    t.observe_tree(toks, 3, nodes, parents, tree_ids, probs)
    assert t.ids[t.row(6, 7, 8)].tolist() == [30, 31, 32]  # the root's row, its context the sequence's
    assert t.ids[t.row(7, 8, 21)].tolist() == [36, 37, 38]  # a sibling's context skips its sibling
    assert t.ids[t.row(8, 20, 22)].tolist() == [39, 40, 41]
    assert t.ids[t.row(1, 2, 22)].tolist() == [39, 40, 41]  # order 1 of 22
    # a chain (parents None) is the path 0 <- 1 <- 2
    t.observe_tree(toks, 3, np.array([8, 23, 24]), None, tree_ids[:3], probs[:3])
    assert t.ids[t.row(8, 23, 24)].tolist() == [36, 37, 38]
    # the argmax-only rows of a graph without top-k: one column, the rest empty
    t.observe_span(toks, 1, 2, np.array([[44], [45]]), np.ones((2, 1), np.float32))
    assert t.ids[t.row(5, 6, 7)].tolist() == [45, -1, -1]


def test_hashed_orders_never_answer_for_another_context():
    t = RecycleTable(1000, RecycleConfig(bits=4), k=2)  # 16 slots per order: collisions everywhere
    rng = np.random.default_rng(0)
    toks = rng.integers(0, 1000, 400)
    ids = np.stack([toks[1:], toks[1:]], axis=1)
    t.observe_span(toks, 0, 399, ids, np.ones((399, 2), np.float32))
    for i in range(2, 399):
        r = t.row(int(toks[i - 2]), int(toks[i - 1]), int(toks[i]))
        assert r >= 0  # order 1 is dense
        # whatever order answered, its row's next token is one the target gave after that context
        if r >= 1000:
            key = int(t.keys[r])
            want = (int(toks[i - 2]) * 1000 + int(toks[i - 1])) * 1000 + int(toks[i])
            assert key in (want, int(toks[i - 1]) * 1000 + int(toks[i]))


@pytest.mark.parametrize("k", [1, 4, 8])
def test_greedy_recycle_chains_equal_plain(k):
    ref = _run(_fake("none", k=None), PROMPT, 120)
    g = _fake(k=k)
    for _ in range(3):  # the table is kept across requests: later calls draft from earlier ones
        assert _run(g, PROMPT, 120) == ref
    st = g.last_stats
    assert st.n_drafted > 0 and st.mean_accepted_length > 1.5
    assert g.drafter.recycle_table is g.drafter_store["recycle"]


@pytest.mark.parametrize("tree", ["9:4:2:2", "5:2:3:2", "9:8:1:1", "9:6:4:1"])
def test_greedy_recycle_trees_equal_plain(tree):
    ref = _run(_fake("none", k=None), PROMPT, 120)
    g = _fake(k=8, tree=TreeConfig.parse(tree))
    for _ in range(2):
        assert _run(g, PROMPT, 120) == ref
    n = len(PROMPT) + 119  # only accepted rows were committed, in sequence order
    assert g.target.kv[:n].tolist() == (PROMPT + ref)[:n]
    assert g.last_stats.n_drafted > g.last_stats.n_target_calls  # trees of more than one node


def test_cost_sized_recycle_trees_equal_plain():
    ref = _run(_fake("none", k=None), PROMPT, 120)
    g = _fake(k=8, adaptive=True, tree=TreeConfig(9, 4, 2, 2))
    assert g.tree_budget is not None
    for _ in range(3):
        assert _run(g, PROMPT, 120) == ref


def test_the_table_learns_from_prefill_and_every_node():
    """A prompt's prefill alone fills the table; then every node of every verify call goes in,
    accepted or not."""
    g = _fake(k=4, tree=TreeConfig(9, 3, 3, 2))
    table = g.drafter.recycle_table
    _run(g, PROMPT * 3, 1)  # the prefill alone
    assert table.seen == len(PROMPT) * 3
    assert table.ids[table.row(PROMPT[-3], PROMPT[-2], PROMPT[-1]), 0] == g.last_output_ids()[0]
    g.forget()
    _run(g, PROMPT, 40)
    st = g.last_stats  # the prefill's rows, then each verify call's root and drafted nodes
    assert table.seen - len(PROMPT) * 3 == len(PROMPT) + st.n_target_calls + st.n_drafted
    assert st.n_drafted > st.n_accepted  # (rejected nodes among them)


@pytest.mark.parametrize(("every_row", "orders"), [("1", 3), ("", 3), ("3", 3), ("1234", 4), ("1", 4), ("1234", 1)])
def test_committed_only_orders_and_context_lengths_equal_plain(every_row, orders):
    ref = _run(_fake("none", k=None), PROMPT, 120)
    for tree in (TreeConfig(), TreeConfig(9, 4, 2, 2)):
        g = _fake(k=8 if tree.nodes else 4, tree=tree, recycle_every_row=every_row, recycle_orders=orders)
        for _ in range(2):
            assert _run(g, PROMPT, 120) == ref
        assert g.last_stats.n_drafted > 0 and g.drafter.recycle_table.orders == orders


def test_committed_only_orders_hold_committed_contexts_only():
    """recycle_every_row="1": the 2- and 3-token contexts come from committed rows only (prefill and
    accepted paths); with every order from every row, rejected tree nodes' contexts are there too."""

    def hashed_keys(g):
        t = g.drafter.recycle_table
        k2, k3 = t.keys[V : V + t.slots], t.keys[V + t.slots : V + 2 * t.slots]
        return set(k2[k2 >= 0].tolist()), set(k3[k3 >= 0].tolist())

    for every_row in ("1", "1234"):
        g = _fake(k=8, tree=TreeConfig(9, 4, 3, 2), recycle_every_row=every_row)
        _run(g, PROMPT, 120)
        toks = g._tokens[: len(PROMPT) + 1 + g.last_stats.n_step_tokens].tolist()  # prompt and committed tokens
        two = {toks[i - 1] * V + toks[i] for i in range(1, len(toks))}
        three = {(toks[i - 2] * V + toks[i - 1]) * V + toks[i] for i in range(2, len(toks))}
        k2, k3 = hashed_keys(g)
        assert k2 and k3
        if every_row == "1":
            assert k2 <= two and k3 <= three
        else:
            assert not k3 <= three  # (rejected nodes' contexts)


def test_drafters_observe_every_target_call():
    """The plugin hooks: observe_prefill sees each prefill chunk's rows, observe each verify call
    before its acceptance (a drafter's own state, not the generator's)."""
    from edgespec.runtime.drafters import DrafterPlugin, register, unregister
    from edgespec.runtime.drafters.ngram import NgramDrafter, ngram_config

    class Watch(NgramDrafter):
        name = "toy_watch"

        def __init__(self, cfg) -> None:
            super().__init__(cfg)
            self.prefill_rows, self.calls = 0, []

        def observe_prefill(self, tgt, seq, past, n, logits) -> None:
            assert past == self.prefill_rows  # chunks in order
            self.prefill_rows += n

        def observe(self, tgt, seq, prop, logits) -> None:
            assert prop.tokens[0] == seq.tokens[seq.n - 1]  # before acceptance: the root is the pending token
            self.calls.append(len(prop.tokens))

    class WatchPlugin(DrafterPlugin):
        name = "toy_watch"
        summary = "prompt lookup that counts what it observes"

        def build(self, ctx):
            return Watch(ngram_config(ctx.cfg))

    register(WatchPlugin())
    try:
        g = _fake("toy_watch")
        prompt = PROMPT * 12  # (more than one prefill chunk of the fake engine)
        _run(g, prompt, 60)
        st = g.last_stats
        assert g.drafter.prefill_rows == len(prompt)
        assert len(g.drafter.calls) == st.n_target_calls and sum(g.drafter.calls) == st.n_target_calls + st.n_drafted
        assert st.n_drafted > 0
        assert not hasattr(g, "_observe") and not hasattr(g, "_recycle")
    finally:
        unregister("toy_watch")


def test_table_settings_are_checked():
    from edgespec.runtime.drafters.recycle import RecycleError

    with pytest.raises(RecycleError, match="orders 5"):
        RecycleTable(V, RecycleConfig(orders=5))
    with pytest.raises(RecycleError, match="vocab"):
        RecycleTable(200_000, RecycleConfig(orders=4))
    with pytest.raises(RecycleError, match="every_row"):
        RecycleTable(V, RecycleConfig(every_row="15"))


@pytest.mark.parametrize("lookup", ["suffix", "ngram"])
@pytest.mark.parametrize("tree", ["", "9:4:2:2", "9:6:3:1"])
def test_greedy_merged_equals_plain(lookup, tree):
    """merged: the lookup first, the table after, one tree scored by calibrated acceptance; with
    --adaptive each step keeps the nodes that pay (TreeBudget)."""
    ref = _run(_fake("none", k=None), PROMPT, 120)
    for adaptive in (False, True):
        g = _fake(
            "merged",
            k=8,
            adaptive=adaptive,
            merged_lookup=lookup,
            tree=TreeConfig.parse(tree) if tree else TreeConfig(),
        )
        for _ in range(2):
            assert _run(g, PROMPT, 120) == ref
        assert g.last_stats.n_drafted > 0
        assert set(g.last_stats.sources) <= {lookup, "recycle", f"{lookup}+recycle"}


def test_calibration_learns_per_source_and_depth():
    from edgespec.runtime.drafters.recycle import Calibration
    from edgespec.runtime.tree import TokenTree

    cal = Calibration()
    assert abs(cal.estimate(1, 1, 0.95) - 0.95) < 1e-9  # the prior: p itself (the bin's middle)
    tree = TokenTree(8)
    for _ in range(200):  # the table's node always kept, the lookup's sibling never
        tree.reset(0)
        tree.add(0, 5, 0.9, source=1, prob=0.9)
        tree.add(0, 6, 0.9, source=0, prob=0.9)
        tree.add(1, 7, 0.5, source=1, prob=0.5)  # (its parent kept: tested, rejected)
        tree.path[:2] = (0, 1)
        cal.observe_tree(tree, 1)
    assert cal.estimate(1, 1, 0.9) > 0.95 and cal.estimate(0, 1, 0.9) < 0.05
    assert cal.estimate(1, 2, 0.5) < 0.05
    assert abs(cal.estimate(0, 3, 0.9) - 0.95) < 1e-9  # untested cells keep the prior


def test_a_step_allocates_nothing_that_stays():
    import tracemalloc

    g = _fake(k=4, max_len=4096, tree=TreeConfig(9, 4, 2, 2))
    _run(g, PROMPT, 200)  # warm up (the table's scratch buffers grow once)
    tracemalloc.start()
    _run(g, PROMPT, 200)
    small, _ = tracemalloc.get_traced_memory()
    _run(g, PROMPT, 3000)
    big, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert big - small < 3000 * 8 * 3 + 50_000, (small, big)


def test_table_is_saved_beside_the_suffix_cache(tmp_path):
    cache = tmp_path / "cache.npy"
    g = _fake(k=4, suffix_cache=str(cache))
    ref = _run(g, PROMPT, 40)
    g.drafter.recycle_table.save()
    saved = tmp_path / "cache.recycle.npz"
    assert saved.exists()
    g2 = _fake(k=4, suffix_cache=str(cache))
    t1, t2 = g.drafter.recycle_table, g2.drafter.recycle_table
    assert np.array_equal(t1.keys, t2.keys) and np.array_equal(t1.ids, t2.ids)
    assert _run(g2, PROMPT, 40) == ref
    assert g2.last_stats.n_drafted > 0


def test_sampled_recycle_and_merged_keep_the_target_distribution():
    pytest.importorskip("scipy")
    from helpers.sampling import chi2_pvalue, exact_tokens_23, fake_generator, sample_counts

    for drafter in ("recycle", "merged"):
        for tree in (TreeConfig(), TreeConfig(nodes=7, depth=3, branch=3, beam=2)):
            g = fake_generator(drafter, tree)
            p = chi2_pvalue(sample_counts(g), exact_tokens_23(g))
            assert p > 1e-3, f"{drafter} {tree.label}: chi-square p = {p:.2g}: samples do not follow the target"
            assert g.last_stats.n_drafted > 0


# ---- ONNX: the graph's top-k output ------------------------------------------------------------------
def _greedy_equal(folder, cfgs) -> None:
    plain = Generator.load(folder, RuntimeConfig(drafter="none"))
    for cfg in cfgs:
        g = Generator.load(folder, cfg)
        for prompt in ("def fib(n):", "hello hello hello world", "abcabcabcabd"):
            ids = np.array([ord(c) for c in prompt], np.int64)
            want = [int(t) for c in plain.generate_ids(ids, 48) for t in c]
            for _ in range(2):
                assert [int(t) for c in g.generate_ids(ids, 48) for t in c] == want, (cfg, prompt)


def test_tiny_folder_top_k_output_and_greedy_recycle(tiny_engine):
    from edgespec.engines.manifest import load_manifest
    from edgespec.engines.ort import OrtModel

    m = load_manifest(tiny_engine)
    assert m.target.top_k == 8
    e = OrtModel(m, m.target)
    toks = np.random.default_rng(3).integers(0, 256, 16)
    logits = e.forward(toks, 0).copy()
    ids, probs = e.last_topk(16)
    want = np.argsort(-logits, axis=-1, kind="stable")[:, :8]
    assert np.array_equal(ids, want)
    p = np.exp(logits - logits.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    assert np.allclose(probs, np.take_along_axis(p, want, -1), atol=1e-6)
    _greedy_equal(
        tiny_engine,
        [
            RuntimeConfig(drafter="recycle", k=4),
            RuntimeConfig(drafter="recycle", k=8, tree=TreeConfig(9, 4, 2, 2)),
            RuntimeConfig(drafter="recycle", k=8, adaptive=True, tree=TreeConfig(9, 4, 3, 2)),
        ],
    )


def test_top_k_output_leaves_the_logits_bitwise_alike(tiny_models, tiny_engine, tmp_path, monkeypatch):
    """The same tiny model exported without the top-k output: every width's logits the same bits,
    and an old folder (no top-k) still drafts, from the logits' argmax."""
    from tiny import TINY_EXPORT

    from edgespec.engines.manifest import load_manifest
    from edgespec.engines.ort import OrtModel
    from edgespec.export.target.exporter import ExportConfig, export
    from edgespec.export.target.graph.builder import GraphOptions

    monkeypatch.setattr(GraphOptions, "writes_top_k", property(lambda self: 0))
    cfg = TINY_EXPORT | dict(validate=False)
    old = export(ExportConfig(target=str(tiny_models["llama"]), draft="self:1", out=str(tmp_path / "old"), **cfg))
    monkeypatch.undo()
    with_k, without = load_manifest(tiny_engine), load_manifest(old)
    assert with_k.target.top_k == 8 and without.target.top_k == 0
    a, b = OrtModel(with_k, with_k.target), OrtModel(without, without.target)
    toks = np.random.default_rng(4).integers(0, 256, 40)
    for e in (a, b):
        e.forward(toks[:16], 0)
        e.commit(0, 16)
    for w in (1, 2, 5, 9, 16):
        la, lb = a.forward(toks[16 : 16 + w], 16).copy(), b.forward(toks[16 : 16 + w], 16)
        assert np.array_equal(la, lb), (w, np.abs(la - lb).max())
    with pytest.warns(RuntimeWarning, match="no top-k output"):
        _greedy_equal(old, [RuntimeConfig(drafter="recycle", k=4)])


def test_seeded_sampling_reproduces_its_output():
    """Two generators with the same history give a seed the same output (the table is part of it)."""
    g = _fake(k=4)
    cfg = SamplingConfig(temperature=0.8, seed=3)
    a = _run(g, PROMPT, 30, sampling=cfg)
    g2 = _fake(k=4)
    assert _run(g2, PROMPT, 30, sampling=cfg) == a


def test_warm_fills_the_folder_table_and_refuses_eval_files(tiny_engine, tmp_path):
    from edgespec.runtime.drafters.recycle import WARM_FILE
    from edgespec.runtime.drafters.recycle.warm import WarmError, warm

    with pytest.raises(WarmError, match="eval prompt file"):
        warm(str(tiny_engine), ["tools/prompts/drafts_eval.jsonl"])
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("the quick brown fox jumps over the lazy dog.\n\n" * 20)
    path = warm(str(tiny_engine), [str(corpus)], out=io.StringIO())
    try:
        assert path == tiny_engine / WARM_FILE and path.exists()
        g = Generator.load(tiny_engine, RuntimeConfig(drafter="recycle", k=4))
        assert g.drafter.recycle_table.seen == 0 and (g.drafter.recycle_table.keys >= 0).sum() > 20
    finally:
        path.unlink()


def test_warm_from_the_models_own_answers(tiny_engine):
    from edgespec.runtime.drafters.recycle import WARM_FILE
    from edgespec.runtime.drafters.recycle.warm import WarmError, warm

    with pytest.raises(WarmError, match="--answers"):
        warm(str(tiny_engine))
    with pytest.warns(RuntimeWarning, match=f"has no warm table.*Hint: edgespec warm {tiny_engine} --answers"):
        Generator.load(tiny_engine, RuntimeConfig(drafter="recycle", k=4))
    log = io.StringIO()
    path = warm(str(tiny_engine), answers=6, max_new_tokens=12, out=log)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", RuntimeWarning)  # warm now: nothing to say
            Generator.load(tiny_engine, RuntimeConfig(drafter="merged", k=4))
        assert "answer tokens to 6 wide-mix prompts" in log.getvalue() and path.name == WARM_FILE
        assert f"edgespec tune {tiny_engine} --prompts" in log.getvalue()  # (the default drafter is ngram)
        g = Generator.load(tiny_engine, RuntimeConfig(drafter="recycle", k=4))
        assert (g.drafter.recycle_table.keys >= 0).sum() > 20
        plain = Generator.load(tiny_engine, RuntimeConfig(drafter="none"))
        ids = plain.codec.encode([{"role": "user", "content": "hello there"}])
        want = [int(t) for c in plain.generate_ids(ids, 24) for t in c]
        assert [int(t) for c in g.generate_ids(ids, 24) for t in c] == want
        assert g.last_stats.n_drafted > 0
    finally:
        path.unlink()


def test_calibration_counts_a_chain_as_the_same_chain_as_a_tree():
    """observe_chain (cost-sized chains) against observe_tree (the reference) on the same drafts."""
    from edgespec.runtime.drafters.recycle import Calibration
    from edgespec.runtime.tree import TokenTree

    rng = np.random.default_rng(3)
    by_chain, by_tree, tree = Calibration(), Calibration(), TokenTree(12)
    for _ in range(300):
        n, n_look = int(rng.integers(1, 9)), int(rng.integers(0, 4))
        probs = rng.random(n).round(3).tolist()
        n_acc = int(rng.integers(0, n + 1))
        by_chain.observe_chain(probs, n_look, n, n_acc)
        tree.reset(0)
        for i, p in enumerate(probs):
            tree.add(i, 100 + i, p, source=0 if i < n_look else 1, prob=p)
        tree.path[: n_acc + 1] = np.arange(n_acc + 1)
        by_tree.observe_tree(tree, n_acc)
    assert np.array_equal(by_chain.tested, by_tree.tested) and np.array_equal(by_chain.kept, by_tree.kept)
    scores = by_chain.chain_scores([0.9, 0.5, 0.2], 1, [])
    assert scores[0] == by_chain.estimate(0, 1, 0.9)
    assert scores[2] == scores[1] * by_chain.estimate(1, 3, 0.2) < scores[0]


def test_chain_budget_keeps_the_prefix_that_pays():
    from edgespec.runtime.adaptive import TreeBudget

    cheap = TreeBudget(9, {w: 1.0 + 0.01 * (w - 1) for w in range(1, 10)})  # rows nearly free
    dear = TreeBudget(9, {w: float(w) for w in range(1, 10)})  # a row costs a decode
    scores = [0.9, 0.8, 0.6, 0.3, 0.1, 0.05]
    assert cheap.choose_chain(scores) == 7  # every draft
    assert dear.choose_chain(scores) == 1  # plain decoding
    mid = TreeBudget(9, {w: 1.0 + 0.1 * (w - 1) for w in range(1, 10)})  # 1 + 0.9 + ... per 1 + 0.1 per row
    assert mid.choose_chain(scores) == 5  # 3.6 / 1.4 beats 3.3 / 1.3 and 3.7 / 1.5
    assert cheap.choose_chain([0.9, 0.95, 0.95]) == 4 and abs(cheap.predicted - 2.7) < 1e-12  # (capped: a prefix)
    picks = [dear.choose_chain(scores) for _ in range(2 * dear.cfg.probe_every - 1)]  # (16 counted already: 1)
    assert picks.count(7) == 2 and picks[dear.cfg.probe_every - 2] == 7  # each 16th step probes the whole chain


@pytest.mark.parametrize("drafter", ["recycle", "merged"])
def test_adaptive_chains_are_cut_by_their_scores(drafter):
    """--adaptive chains of a drafter that scores them: a cost-sized prefix per step (TreeBudget), and
    greedy output still plain decoding's."""
    ref = _run(_fake("none", k=None), PROMPT, 120)
    g = _fake(drafter, k=6, adaptive=True)
    assert g.chain_budget is not None and g.adaptive is None
    widths = []
    real = g._step

    def step(seq, k, *a, **kw):
        out = real(seq, k, *a, **kw)
        widths.append(len(out[0].tokens))
        return out

    g._step = step
    for _ in range(2):
        assert _run(g, PROMPT, 120) == ref
    assert g.last_stats.adaptive and g.last_stats.n_drafted > 0
    assert len(set(widths)) > 1, set(widths)
    assert g.drafter.calibration.tested.sum() > Calibration().tested.sum()  # it learned from the chains


@pytest.mark.parametrize("tree", ["", "9:4:2:2"])
def test_merged_names_the_source_of_each_kept_draft(tree):
    """kept_sources: the step's kept drafts as runs of their sources (the chat page's and
    --show-acceptance's colours): a chain's lookup drafts before its table drafts, a tree's by its path."""
    g = _fake("merged", k=6, tree=TreeConfig.parse(tree) if tree else TreeConfig())
    seen = set()
    for _ in g.generate_ids(np.array(PROMPT, np.int64), 120):
        m, n_acc = g.last_step
        runs = g.drafter.kept_sources(n_acc)
        assert sum(n for n, _ in runs) == n_acc and all(n > 0 for n, _ in runs)
        labels = [label for _, label in runs]
        assert set(labels) <= {"suffix", "recycle"}
        if not tree:
            assert labels in ([], ["suffix"], ["recycle"], ["suffix", "recycle"])
        seen |= set(labels)
    assert seen == {"suffix", "recycle"}
