"""Every registered drafter against the same references (parametrized over the registry): greedy
output identical to plain decoding, sampling that keeps the target's distribution (chi-square),
its CLI flags and options present, and a toy drafter that passes all of it with nothing but its
registry entry (a new drafter is its module and nothing else)."""

import numpy as np
import pytest
from helpers.sampling import V, chi2_pvalue, exact_tokens_23, sample_counts

from edgespec.engines.fake import FakeEagleHead, FakeHeads, FakeModel, random_table
from edgespec.runtime import drafters as reg
from edgespec.runtime.backends import Engines
from edgespec.runtime.config import RuntimeConfig
from edgespec.runtime.drafters import Drafter, DrafterPlugin, register, unregister
from edgespec.runtime.drafters.eagle import EagleEngines
from edgespec.runtime.generator import Generator
from edgespec.runtime.state import chain

TABLE = random_table(V, seed=11, sharpness=1.0)


def _fake_sections() -> dict:
    """Fake engines for the drafter sections the fakes cover (the others' own tests use theirs)."""
    noisy = TABLE + np.random.default_rng(2).standard_normal(TABLE.shape).astype(np.float32)
    return {
        "draft": FakeModel(noisy, max_len=64),
        "eagle": EagleEngines(FakeEagleHead(V, d2t=[0, 2, 3, 5, 6], max_len=64), None),
        "medusa": FakeHeads(V, d2t=[0, 1, 3, 4, 6, 7], n_heads=3),
    }


def _gen(drafter: str) -> Generator:
    opts = {o.name: 0.0 for o in RuntimeConfig.options() if o.name.endswith("min_confidence")}
    return Generator(
        None, Engines(FakeModel(TABLE, max_len=64), _fake_sections()), RuntimeConfig(drafter=drafter, k=3, **opts)
    )


def _covered() -> list[str]:
    fakes = _fake_sections()
    return [n for n, s in reg.registry().items() if all(need in fakes for need in s.needs(RuntimeConfig()))]


def _greedy_identical(drafter: str) -> None:
    plain, spec = _gen("none"), _gen(drafter)
    for prompt in ([1, 2, 3], [4, 4, 4, 4, 5], [7, 1, 7, 1, 7]):
        ids = np.array(prompt, np.int64)
        want = [int(t) for c in plain.generate_ids(ids, 24) for t in c]
        assert [int(t) for c in spec.generate_ids(ids, 24) for t in c] == want, drafter


def _keeps_distribution(drafter: str) -> None:
    g = _gen(drafter)
    p = chi2_pvalue(sample_counts(g), exact_tokens_23(g))
    assert p > 1e-3, f"{drafter}: chi-square p = {p:.2g}"


def test_the_registry_lists_every_drafter_once_with_its_flags():
    names = reg.names()
    assert names[0] == "none" and len(set(names)) == len(names)
    fields = {f for f in RuntimeConfig.__dataclass_fields__}
    for spec in reg.registry().values():
        assert spec.summary and all(o.name in fields and o.help for o in spec.options), spec.name
    assert set(reg.tree_names()) <= set(names)


@pytest.mark.parametrize("drafter", _covered())
def test_greedy_output_is_plain_output(drafter):
    _greedy_identical(drafter)


@pytest.mark.parametrize("drafter", _covered())
def test_sampling_keeps_the_target_distribution(drafter):
    pytest.importorskip("scipy")
    _keeps_distribution(drafter)


class RepeatDrafter(Drafter):
    """A toy: proposes the pending token k times (deterministic: q one-hot)."""

    name = "toy_repeat"

    def propose(self, seq, k):
        seq.draft_slots(k)[:] = seq.tokens[seq.n - 1]
        return chain(seq, k)


class ToyPlugin(DrafterPlugin):
    name = "toy_repeat"
    summary = "the pending token, k times"

    def build(self, ctx):
        return RepeatDrafter()


@pytest.fixture
def toy():
    register(ToyPlugin())
    yield "toy_repeat"
    unregister("toy_repeat")


def test_a_toy_drafter_passes_with_its_registry_entry_only(toy):
    assert toy in reg.names() and toy in _covered()
    _greedy_identical(toy)
    pytest.importorskip("scipy")
    _keeps_distribution(toy)


def test_a_broken_section_turns_off_only_the_drafters_that_need_it():
    """hybrid needs the section of the head it pairs with (--hybrid-head), not EAGLE-1's."""
    engines = Engines(FakeModel(TABLE, max_len=64), {"eagle3": object()}, broken={"eagle": "eagle.weights is short"})
    assert "disabled" in engines.why_off("eagle", RuntimeConfig())
    assert "disabled" in engines.why_off("hybrid", RuntimeConfig())  # default --hybrid-head eagle
    assert engines.why_off("hybrid", RuntimeConfig(hybrid_head="eagle3")) is None
    assert engines.why_off("eagle3", RuntimeConfig()) is None and engines.why_off("ngram", RuntimeConfig()) is None


def test_every_registered_drafter_is_in_the_cli_help(capsys):
    from edgespec.cli import main

    with pytest.raises(SystemExit):
        main(["generate", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert all(f"{name}:" in out for name in reg.names()), out
    assert all("--" + o.name.replace("_", "-") in out for o in RuntimeConfig.options())
