"""hybrid: suffix decoding or the EAGLE head per step, by expected accepted length
(runtime/drafters/hybrid.py). The choice on fake estimates, greedy identity on fake and ORT engines,
and what the stats record."""

import numpy as np
import pytest

from edgespec.engines.fake import FakeEagleHead, FakeModel, random_table
from edgespec.runtime.backends import Engines
from edgespec.runtime.config import RuntimeConfig
from edgespec.runtime.drafters.eagle import EagleEngines
from edgespec.runtime.drafters.hybrid import HEAD, SUFFIX, ChoiceConfig, HybridDrafter, SourcePicker, SuffixHeadHybrid
from edgespec.runtime.generator import Generator
from edgespec.runtime.sampling import SamplingConfig

V = 32
REPEATS = [3, 17, 5, 3, 17, 9, 22, 3, 17, 5, 11, 8, 3, 17, 5, 3, 17, 9]  # matches for suffix decoding


def _gen(k: int = 4, drafter: str = "hybrid", **cfg) -> Generator:
    table = random_table(V, seed=0)
    target = FakeModel(table, max_len=256)
    head = FakeEagleHead(V, d2t=np.arange(V), max_len=256)
    return Generator(
        None,
        Engines(target, {"eagle": EagleEngines(head, None)}),
        RuntimeConfig(drafter=drafter, k=k, eagle_min_confidence=0.0, **cfg),
    )


def _run(g: Generator, prompt, n: int, **kw) -> list[int]:
    return [int(t) for c in g.generate_ids(np.array(prompt), n, **kw) for t in c]


def _prompts():
    rng = np.random.default_rng(1)
    return [REPEATS, rng.integers(0, V, 12).tolist(), REPEATS[:9] + rng.integers(0, V, 6).tolist(), REPEATS]


# ---- the choice, on fake estimates -----------------------------------------------------------------


def test_larger_estimate_wins_and_a_tie_goes_to_suffix():
    assert SourcePicker.pick(2.0, 2.5) == HEAD
    assert SourcePicker.pick(2.5, 2.0) == SUFFIX
    assert SourcePicker.pick(1.5, 1.5) == SUFFIX  # no model call for the same expectation


def test_estimates_are_calibrated_by_observed_over_predicted():
    pk = SourcePicker(ChoiceConfig(ema=0.2))
    assert pk.head_estimate(3.0) == 3.0 and pk.suffix_estimate(4, 2.0) == 2.0  # priors: raw predictions
    for _ in range(60):  # the head predicts 3 and keeps 1; suffix matches of 4 tokens keep what they predict
        pk.observe(HEAD, 4, 3.0, 1)
        pk.observe(SUFFIX, 4, 2.0, 2)
    assert pk.head_estimate(3.0) == pytest.approx(1.0, rel=0.01)
    assert pk.suffix_estimate(4, 2.0) == pytest.approx(2.0, rel=0.01)
    assert pk.head_bound(6) == pytest.approx(2.0, rel=0.01)  # 6 certain tokens: 6 * the head's ratio
    # a raw head chain of 3 now loses to a suffix chain of score 1.5 it would have beaten before
    assert pk.pick(pk.suffix_estimate(4, 1.5), pk.head_estimate(3.0)) == SUFFIX


def test_suffix_ratios_are_kept_per_match_length():
    pk = SourcePicker()
    for _ in range(40):
        pk.observe(SUFFIX, 2, 2.0, 0)  # 2-token matches: never kept
        pk.observe(SUFFIX, 8, 2.0, 2)  # 8-token matches: always
    assert pk.suffix_estimate(2, 2.0) < 0.1 and pk.suffix_estimate(8, 2.0) == pytest.approx(2.0)
    assert pk.suffix_estimate(5, 2.0) == 2.0  # untouched length: its prior


def test_sampled_head_estimate_is_its_running_accepted_length():
    pk = SourcePicker(ChoiceConfig(prior_head_sampled=1.0, ema=0.5))
    pk.observe_head_sampled(3)
    assert pk.head_sampled == 2.0


# ---- the drafter ------------------------------------------------------------------------------------


def test_hybrid_is_the_suffix_choice_by_default_and_ngram_on_request():
    assert isinstance(_gen().drafter, SuffixHeadHybrid)
    assert isinstance(_gen(hybrid_lookup="ngram").drafter, HybridDrafter)
    with pytest.raises(ValueError, match="hybrid_lookup"):
        RuntimeConfig(hybrid_lookup="trie").check()


@pytest.mark.parametrize("lookup", ["suffix", "ngram"])
@pytest.mark.parametrize("k", [1, 2, 4, 7])
def test_greedy_hybrid_equals_plain(k, lookup):
    """Successive calls (the suffix cache and the running estimates grow) stay identical to plain."""
    plain = _gen(drafter="none")
    g = _gen(k, hybrid_lookup=lookup)
    sources = {}
    for p in _prompts():
        assert _run(g, p, 60) == _run(plain, p, 60), (k, lookup, p)
        for src, (steps, _, _) in g.last_stats.sources.items():
            sources[src] = sources.get(src, 0) + steps
    st = g.last_stats
    assert st.n_drafted > 0
    assert set(sources) == ({SUFFIX, HEAD} if lookup == "suffix" else {"ngram", HEAD}), sources
    assert sum(v[0] for v in st.sources.values()) <= st.n_target_calls
    assert st.to_dict()["draft_sources"].keys() == st.sources.keys()


def test_greedy_tree_hybrid_equals_plain():
    from edgespec.runtime.tree import TreeConfig

    plain = _gen(drafter="none")
    g = _gen(6, tree=TreeConfig(nodes=7, depth=3, branch=2, beam=2))
    for p in _prompts():
        assert _run(g, p, 50) == _run(plain, p, 50)
    assert g.last_stats.n_drafted > 0


def _plant(pk: SourcePicker, head: float, suffix: float) -> None:
    """Fix the ratios (no learning): the head's, and every match length's of suffix decoding."""
    for r, v in [(pk.head, head)] + [(r, suffix) for r in pk.suffix]:
        r.obs, r.pred, r.ema = v, 1.0, 0.0


def test_the_estimates_decide_which_source_drafts():
    """A head with ratio 0 never beats a suffix chain, and is not even run where suffix decoding
    drafts; suffix ratios of 0 let the head win wherever it drafts. The output is the same."""
    plain = _run(_gen(drafter="none"), REPEATS, 60)
    g = _gen(4)
    _plant(g.drafter.greedy_picker, head=0.0, suffix=1.0)
    assert _run(g, REPEATS, 60) == plain
    src, calls = g.last_stats.sources, g.last_stats.n_draft_calls
    assert src[SUFFIX][0] > 0
    assert calls < 4 * src.get(HEAD, [0])[0] + src[SUFFIX][0]  # suffix steps cost no head chain

    g = _gen(4)
    _plant(g.drafter.greedy_picker, head=1.0, suffix=0.0)
    assert _run(g, REPEATS, 60) == plain
    assert SUFFIX not in g.last_stats.sources and g.last_stats.sources[HEAD][0] > 0


def test_the_losing_chain_teaches_its_ratio_under_greedy():
    g = _gen(4)
    _run(g, REPEATS, 60)
    pk = g.drafter.greedy_picker
    assert pk.head.pred != 1.0  # the head learned ...
    assert any(r.pred != 1.0 for r in pk.suffix)  # ... and so did suffix decoding, one of them as the loser


def test_a_step_without_a_proposal_learns_nothing():
    """accepted() after a step that did not ask the drafter (adaptive k = 0) must not learn from
    the chains of the step before."""
    from edgespec.runtime.state import SeqState

    g = _gen(4)
    _run(g, REPEATS, 20)
    pk = g.drafter.greedy_picker
    before = (pk.head.obs, pk.head.pred, [r.obs for r in pk.suffix])
    g.drafter.accepted(SeqState(g._tokens, n=6, n_prompt=3, tgt_past=5), 5, 0)
    assert (pk.head.obs, pk.head.pred, [r.obs for r in pk.suffix]) == before


def test_sampling_chooses_before_the_head_draws(monkeypatch):
    """Under sampling the head's chain is drafted only once the choice fell on it: where suffix
    decoding is expected to keep more than the head's running accepted length, the head is not
    asked (its draws could not have influenced the choice)."""
    g = _gen(4)
    d = g.drafter
    calls = []
    real = d.head.propose

    def counting(seq, k):
        calls.append(seq.n)
        return real(seq, k)

    monkeypatch.setattr(d.head, "propose", counting)
    # (unseeded, drawing from an rng: a seed keys the draws by position and its drafters draft greedily)
    out = _run(g, REPEATS * 3, 60, sampling=SamplingConfig(temperature=0.8), rng=np.random.default_rng(1))
    src = g.last_stats.sources
    assert len(out) == 60 and src.get(SUFFIX, [0])[0] > 0
    assert len(calls) < g.last_stats.n_target_calls  # suffix steps did not run the head
    assert d.picker is not d.greedy_picker  # sampled estimates are the call's own


def test_seeded_sampling_reproduces_with_the_same_cache():
    cfg = SamplingConfig(temperature=0.8, seed=4)
    a, b = _gen(4), _gen(4)
    assert _run(a, REPEATS, 40, sampling=cfg) == _run(b, REPEATS, 40, sampling=cfg)


# ---- ORT engines (tiny llama + a tiny EAGLE head) ----------------------------------------------------


@pytest.fixture(scope="module")
def eagle_engine(tiny_models, tmp_path_factory):
    from tiny import tiny_eagle_head

    from edgespec.export.target.exporter import ExportConfig, export

    root = tmp_path_factory.mktemp("hybrid")
    head_dir, _, _ = tiny_eagle_head(tiny_models["llama"], root / "head", draft_vocab=48, noise=0.01)
    return export(
        ExportConfig(
            target=str(tiny_models["llama"]),
            eagle=str(head_dir),
            out=str(root / "engine"),
            max_len=256,
            k=6,
            prefill_chunk=16,
            kv_bucket=32,
            precision="fp32",
            trees=True,
            progress=False,
        )
    )


@pytest.mark.parametrize("fuse_head", [True, False])
def test_ort_greedy_hybrid_suffix_equals_plain(eagle_engine, fuse_head):
    g = Generator.load(eagle_engine, RuntimeConfig(drafter="none", k=1, adaptive=False, fuse_head=fuse_head))
    rng = np.random.default_rng(7)
    prompts = [rng.integers(3, 60, n) for n in (5, 30)] + [np.array([5, 6, 7, 5, 6, 7, 5, 6])]
    prompts.append(prompts[1])  # the same request again: suffix decoding finds the earlier answer
    plain = [_run(g, p, 40) for p in prompts]
    for k, ad in ((2, False), (6, False), (6, True)):
        h = Generator.load(eagle_engine, RuntimeConfig(drafter="hybrid", k=k, adaptive=ad, fuse_head=fuse_head))
        assert isinstance(h.drafter, SuffixHeadHybrid)
        seen = set()
        for p, ref in zip(prompts, plain, strict=True):
            assert _run(h, p, 40) == ref, (k, ad, p)
            seen |= set(h.last_stats.sources)
        assert h.last_stats.n_drafted > 0 and SUFFIX in seen, seen
