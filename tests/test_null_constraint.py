"""The null output constraint (runtime/constraint.py): a plain call runs the same step as a
constrained one, through hooks that are the plain path's own choices, and its stats carry no
grammar counts. Fake engines, no llguidance."""

import inspect
import re

import numpy as np
import pytest

from edgespec.engines.fake import FakeModel, random_table
from edgespec.runtime.backends import Engines
from edgespec.runtime.config import RuntimeConfig
from edgespec.runtime.constraint import NO_CONSTRAINT, OutputConstraint
from edgespec.runtime.generator import Generator
from edgespec.runtime.sampling import SamplingConfig, probs, sample
from edgespec.runtime.state import SeqState, chain
from edgespec.runtime.stats import GenerationStats
from edgespec.runtime.tree import TreeConfig
from edgespec.runtime.verify import accept

V = 64
PROMPT = np.array([3, 17, 5, 3, 17, 9, 22, 3, 17, 5, 41, 8, 3])
SAMPLINGS = [
    SamplingConfig(),
    SamplingConfig(repetition_penalty=1.3),
    SamplingConfig(temperature=0.8, top_p=0.9, seed=1),
    SamplingConfig(temperature=0.7, top_k=8, repetition_penalty=1.2, seed=2),
]


def _gen(drafter: str, k: int, **cfg) -> Generator:
    table = random_table(V, seed=0)
    draft = FakeModel(table + np.random.default_rng(5).standard_normal(table.shape).astype(np.float32), max_len=256)
    engines = Engines(FakeModel(table, max_len=256), {"draft": draft})
    return Generator(None, engines, RuntimeConfig(drafter=drafter, k=k, **cfg))


def _seq(m: int) -> tuple[SeqState, np.ndarray]:
    """A sequence with m drafts in its draft slots, and verify logits [m+1, V] for them."""
    rng = np.random.default_rng(m)
    tokens = np.zeros(64, np.int64)
    tokens[: len(PROMPT)] = PROMPT
    n = len(PROMPT)
    tokens[n : n + m] = rng.integers(0, V, m)
    logits = rng.standard_normal((m + 1, V)).astype(np.float32)
    logits[np.arange(m), tokens[n : n + m]] += 3.0  # some drafts are the argmax
    return SeqState(tokens, n, n, n - 1), logits


@pytest.mark.parametrize("sampling", SAMPLINGS)
@pytest.mark.parametrize("m", [0, 1, 4])
def test_the_null_hooks_are_the_plain_path(sampling, m):
    seq, logits = _seq(m)
    prop = chain(seq, m)
    assert NO_CONSTRAINT.shape(prop, seq, None, None, m) is prop  # the very proposal: nothing copied
    want_seq, _ = _seq(m)
    want = accept(chain(want_seq, m), logits.copy(), want_seq, sampling, np.random.default_rng(7))
    got = NO_CONSTRAINT.accept(prop, logits.copy(), seq, sampling, np.random.default_rng(7))
    assert got == want and np.array_equal(seq.tokens, want_seq.tokens)
    n_acc = got[0]
    assert NO_CONSTRAINT.drafter_kept(n_acc) == NO_CONSTRAINT.drafts_kept(n_acc) == n_acc
    assert NO_CONSTRAINT.drafts(prop) == m and NO_CONSTRAINT.depth(prop) == prop.depth == m
    assert NO_CONSTRAINT.forced_kept == 0 and NO_CONSTRAINT.shape_s == 0.0
    assert NO_CONSTRAINT.trees_ok and NO_CONSTRAINT.kind == ""
    assert NO_CONSTRAINT.drafter_sampling(sampling) is sampling  # the drafter's settings, unchanged
    last = logits[0].copy()
    plain = int(last.argmax()) if sampling.greedy else sample(probs(last, sampling), np.random.default_rng(3))
    assert NO_CONSTRAINT.first(last, sampling, np.random.default_rng(3)) == plain


def test_the_null_counters_leave_the_stats_as_they_were():
    st = GenerationStats()
    st.record_grammar(NO_CONSTRAINT)
    assert st.to_dict() == GenerationStats().to_dict()
    assert type(st.grammar_s) is float and type(st.n_forced) is int  # the JSON spells 0.0 and 0 as before


@pytest.mark.parametrize("sampling", SAMPLINGS)
@pytest.mark.parametrize(
    "drafter,k,cfg",
    [("ngram", 4, {}), ("draft", 3, {"adaptive": True}), ("suffix", 3, {"tree": TreeConfig(9, 4, 2, 2)})],
)
def test_a_plain_call_runs_through_the_null_constraint(monkeypatch, drafter, k, cfg, sampling):
    """generate_ids without a grammar hands every hook NO_CONSTRAINT (a greedy call accepts from the
    rows' argmax ids: accept_argmax), and speculation equals plain decoding (greedy), or the same seed
    gives the same output twice (sampling)."""
    seen = []
    for hook in ("shape", "needs_logits", "accept", "accept_argmax", "first", "drafter_kept"):
        orig = getattr(OutputConstraint, hook)

        def spy(self, *a, _orig=orig, _hook=hook):
            seen.append((_hook, self))
            return _orig(self, *a)

        monkeypatch.setattr(OutputConstraint, hook, spy)
    g = _gen(drafter, k, **cfg)
    out = np.concatenate([c.copy() for c in g.generate_ids(PROMPT, 60, sampling)])
    accepts = "accept_argmax" if sampling.greedy and sampling.repetition_penalty == 1.0 else "accept"
    assert {h for h, _ in seen} == {"shape", "needs_logits", accepts, "first", "drafter_kept"}
    assert all(con is NO_CONSTRAINT for _, con in seen)
    d = g.last_stats.to_dict()
    assert d["grammar"] is None and d["forced_tokens"] == d["grammar_cut"] == d["grammar_masks"] == 0
    assert d["forced_rows"] == 0 and d["time_split_s"]["grammar"] == 0.0 and d["grammar_ms_per_step"] == 0.0
    assert d["tree"] == (cfg["tree"].label if "tree" in cfg else "")
    if sampling.greedy:
        ref = np.concatenate([c.copy() for c in _gen("none", 0).generate_ids(PROMPT, 60, sampling)])
    else:
        ref = np.concatenate([c.copy() for c in _gen(drafter, k, **cfg).generate_ids(PROMPT, 60, sampling)])
    assert out.tolist() == ref.tolist()


def test_the_step_and_the_loop_carry_no_grammar_branch():
    step = inspect.getsource(Generator._step)
    assert len(step.splitlines()) <= 20  # the step fits on one screen
    for fn in (Generator._step, Generator._prefill, Generator.generate_ids):
        assert not re.search(r"\bcon is (not )?None\b|\bif (not )?con\b|\bcon else\b", inspect.getsource(fn))
