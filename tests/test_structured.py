"""Structured output (runtime/constrain.py): a grammar constrains the output and speculation stays
lossless under it. Fake engines: the rule itself against an oracle, chi-square tests of sampling;
tiny exported engines: speculative == constrained plain for every drafter; the CLI."""

import dataclasses
import json
import subprocess
import sys

import numpy as np
import pytest

llg = pytest.importorskip("llguidance")

from helpers.grammars import EOS, LARK, SCHEMA, fake_tokenizer  # noqa: E402

from edgespec.engines.fake import FakeEagleHead, FakeHeads, FakeModel, random_table  # noqa: E402
from edgespec.runtime.backends import Engines  # noqa: E402
from edgespec.runtime.config import RuntimeConfig  # noqa: E402
from edgespec.runtime.constrain import Constraint  # noqa: E402
from edgespec.runtime.drafters.eagle import EagleEngines  # noqa: E402
from edgespec.runtime.generator import Generator  # noqa: E402
from edgespec.runtime.grammar import GrammarError, grammar_from, grammar_tokenizer, json_object  # noqa: E402
from edgespec.runtime.sampling import SamplingConfig, penalize, probs  # noqa: E402

# ---- fake engines over an 8-token vocabulary: a..g and EOS ----------------------------------------
PROMPT = np.array([1, 2, 3, 1, 2])  # "bcdbc"
# position 1: a|b|c, 2: a|b|c|d, 3: e forced, then a|b until EOS (after at least one)
REGEX = "[abc][abcd]e[ab]+"
N_SAMPLES = 3000


def _fake_gen(drafter: str, k: int = 3) -> Generator:
    table = random_table(8, seed=11, sharpness=1.0)
    target = FakeModel(table, max_len=64)
    draft = FakeModel(table + np.random.default_rng(2).standard_normal(table.shape).astype(np.float32), max_len=64)
    head = FakeEagleHead(8, d2t=[0, 2, 3, 5, 6], max_len=64)  # q = 0 off its draft vocabulary
    heads = FakeHeads(8, d2t=[0, 1, 3, 4, 6, 7], n_heads=3)
    g = Generator(
        None,
        Engines(target, {"draft": draft, "eagle": EagleEngines(head, None), "medusa": heads}),
        RuntimeConfig(drafter=drafter, k=k, eagle_min_confidence=0.0, medusa_min_confidence=0.0),
    )
    g.eos = np.array([EOS])
    g.structured = Constraint(grammar_tokenizer(fake_tokenizer(), 8, [EOS]), 8, [EOS], max(target.widths))
    return g


def _ids(g, n, sampling=SamplingConfig(), grammar=None, prompt=PROMPT, rng=None):
    return np.concatenate([c.copy() for c in g.generate_ids(prompt, n, sampling, grammar, rng=rng)])


def _rule(m) -> int:
    """The forced token of a matcher's state (the library's fast-forward tokens, EOS when done), or -1."""
    if m.is_stopped():
        return EOS
    ff = m.compute_ff_tokens()
    return ff[0] if ff else -1


def _allowed(m) -> np.ndarray:
    bits = np.frombuffer(m.compute_bitmask(), np.uint8)
    return np.unpackbits(bits, bitorder="little")[:8].astype(bool)


def _logits(g, ctx):
    t = g.engines.target
    return t.table[ctx[-1]] + t.table2[ctx[-2]]


@pytest.mark.parametrize("regex", [REGEX, "(ab|ba)+c?d{2}", "[a-g]{2}[abc]{3}e"])
def test_constrained_plain_follows_the_rule_and_every_drafter_matches_it(regex):
    """Greedy: an oracle applies the rule token by token (forced, else masked argmax); plain and
    every drafter, several k, give exactly its output."""
    grammar = grammar_from(regex=regex)
    g = _fake_gen("none")
    ref = _ids(g, 12, grammar=grammar)
    m = llg.LLMatcher(g.structured.tokenizer, grammar.text)
    ctx = list(PROMPT)
    for tok in ref:
        forced = _rule(m)
        if forced < 0:
            x = np.where(_allowed(m), _logits(g, ctx), -np.inf)
            forced = int(x.argmax())
        assert tok == forced, (ref, ctx)
        assert m.consume_token(int(tok))
        ctx.append(int(tok))
    assert g.last_stats.n_forced > 0
    for d in ("ngram", "suffix", "draft", "eagle", "hybrid", "medusa", "recycle", "merged"):
        for k in (1, 3, 8):
            for adaptive in (False, True):  # (recycle, merged adaptive: cost-sized chains, redrafted by the grammar)
                g.reconfigure(drafter=d, k=k, adaptive=adaptive)
                out = _ids(g, 12, grammar=grammar)
                assert np.array_equal(out, ref), (d, k, adaptive, out, ref)


def test_drafts_the_grammar_forbids_never_reach_the_verify_call():
    """Every verify call holds the pending token and a grammar-valid continuation of the output
    (forbidden drafts were cut before it); the cuts and forced tokens are counted."""
    grammar = grammar_from(regex=REGEX)
    g = _fake_gen("draft", k=4)
    calls, forward = [], g.engines.target.forward

    def spy(ids, past, *a, **kw):
        calls.append((past, ids.copy()))
        return forward(ids, past, *a, **kw)

    g.engines.target.forward = spy
    for seed in range(20):
        calls.clear()
        out = _ids(g, 12, SamplingConfig(temperature=1.0, seed=seed), grammar)
        n_prompt = len(PROMPT)
        for past, ids in calls[1:]:  # after the prefill: [pending, chain...]
            m = llg.LLMatcher(g.structured.tokenizer, grammar.text)
            assert all(m.consume_token(int(t)) for t in out[: past - n_prompt + 1])
            assert all(m.consume_token(int(t)) for t in ids[1:]), (out, past, ids)
    st = g.last_stats
    assert st.n_grammar_cut > 0 and st.n_forced > 0 and st.n_masks > 0 and st.to_dict()["grammar"] == "regex"
    assert g.structured.n_redrafts > 0  # the draft model drafted again after the forced "e"


def _exact(g, grammar, n, cfg):
    """The distribution of the first n constrained tokens: forced ones with certainty, the others
    from the masked renormalised target distribution (enumerated)."""
    dist = {}

    def walk(ctx, m, prob):
        if len(ctx) == len(PROMPT) + n:
            dist[tuple(ctx[len(PROMPT) :])] = prob
            return
        forced = _rule(m)
        options = [(forced, 1.0)] if forced >= 0 else []
        if forced < 0:
            logits = penalize(_logits(g, ctx)[None], np.array(ctx), len(ctx), cfg.repetition_penalty)[0]
            p = probs(np.where(_allowed(m), logits, -np.inf), cfg)
            options = [(t, p[t]) for t in range(8) if p[t] > 0]
        for t, pt in options:
            m2 = m.deep_copy()
            assert m2.consume_token(int(t))
            walk(ctx + [int(t)], m2, prob * pt)

    walk(list(PROMPT), llg.LLMatcher(g.structured.tokenizer, grammar.text), 1.0)
    return dist


def _chi2(g, grammar, cfg, n=4, keyed=False) -> float:
    """Chi-square p of N_SAMPLES constrained samples against the exact masked distribution: drawn by
    rejection sampling from an rng (an unseeded call), or keyed by seed (sampling.KeyedDraws)."""
    from scipy.stats import chisquare

    exact = _exact(g, grammar, n, cfg)
    counts = dict.fromkeys(exact, 0)
    for s in range(N_SAMPLES):
        if keyed:
            out = _ids(g, n, dataclasses.replace(cfg, seed=s), grammar)
        else:
            out = _ids(g, n, cfg, grammar, rng=np.random.default_rng(s))
        out = tuple(int(t) for t in out)
        assert out in counts, f"{out} has probability 0 under the grammar"
        counts[out] += 1
    keys = sorted(exact)
    exp = np.array([exact[key] for key in keys]) * N_SAMPLES
    obs = np.array([counts[key] for key in keys], float)
    keep = exp > 5  # pool rare cells
    obs_k, exp_k = np.append(obs[keep], obs[~keep].sum()), np.append(exp[keep], exp[~keep].sum())
    if exp_k[-1] == 0:
        obs_k, exp_k = obs_k[:-1], exp_k[:-1]
    return float(chisquare(obs_k, exp_k * obs_k.sum() / exp_k.sum()).pvalue)


@pytest.mark.parametrize("drafter", ["none", "draft", "ngram", "eagle", "medusa", "recycle", "merged"])
def test_constrained_sampling_keeps_the_masked_target_distribution(drafter):
    """Masked p, q restricted the same way, cut drafts' positions drawn from p': chi-square."""
    pytest.importorskip("scipy")
    g = _fake_gen(drafter)
    p = _chi2(g, grammar_from(regex=REGEX), SamplingConfig(temperature=1.0))
    assert p > 1e-3, f"{drafter}: chi-square p = {p:.2g}: constrained samples do not follow the masked target"


@pytest.mark.parametrize("drafter", ["none", "draft", "recycle", "merged"])
def test_seeded_constrained_sampling_is_plain_and_keeps_the_masked_target_distribution(drafter):
    """Seeded (keyed draws): each drafter's constrained output is the seeded plain one, and its
    distribution the masked target's (chi-square)."""
    pytest.importorskip("scipy")
    g, plain, grammar = _fake_gen(drafter), _fake_gen("none"), grammar_from(regex=REGEX)
    for s in range(30):
        cfg = SamplingConfig(temperature=0.9, seed=s)
        assert np.array_equal(_ids(g, 10, cfg, grammar), _ids(plain, 10, cfg, grammar)), (drafter, s)
    p = _chi2(g, grammar, SamplingConfig(temperature=1.0), keyed=True)
    assert p > 1e-3, f"{drafter} seeded: chi-square p = {p:.2g}"


def test_constrained_sampling_with_repetition_penalty_and_top_k_stays_lossless():
    pytest.importorskip("scipy")
    cfg = SamplingConfig(temperature=0.8, top_k=3, repetition_penalty=1.6)
    p = _chi2(_fake_gen("draft"), grammar_from(regex=REGEX), cfg)
    assert p > 1e-3, f"chi-square p = {p:.2g} with a repetition penalty and top-k"


def test_an_unrestricted_q_is_caught(monkeypatch):
    """Verify with the drafter's raw q instead of q restricted to the allowed tokens: the
    chi-square test must notice (it has teeth)."""
    pytest.importorskip("scipy")
    from edgespec.runtime import constrain

    monkeypatch.setattr(constrain.Constraint, "_restrict", lambda self, q, row: None)
    p = _chi2(_fake_gen("draft"), grammar_from(regex=REGEX), SamplingConfig(temperature=1.0))
    assert p < 1e-3, f"a rule with an unrestricted q passed the test (p = {p:.2g})"


# ---- grammars, errors ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    "kwargs, words",
    [
        ({"json_schema": {"type": "foo"}}, "Invalid type: foo"),
        ({"json_schema": "{not json"}, "not JSON"),
        ({"json_schema": [1]}, "JSON object"),
        ({"json_schema": {"type": "object", "if": {}}}, "Unimplemented keys"),
        ({"json_schema": {"$ref": "#/nowhere"}}, "does not exist"),
        ({"grammar": "start: foo"}, 'unknown name: "foo"'),
        ({"grammar": ""}, "non-empty"),
        ({"regex": "a(b"}, "unclosed group"),
        ({"regex": "a", "grammar": "start: 'a'"}, "one output constraint"),
    ],
)
def test_a_bad_grammar_is_one_line_with_the_library_reason(kwargs, words):
    with pytest.raises(GrammarError) as e:
        grammar_from(**kwargs)
    assert words in str(e.value) and "\n" not in str(e.value)


def test_non_strict_schemas_ignore_unimplemented_keywords():
    assert grammar_from(json_schema={"type": "object", "if": {}}, strict=False).kind == "json_schema"
    assert grammar_from() is None and json_object().kind == "json_object"


def test_a_missing_llguidance_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "llguidance", None)  # import raises ImportError
    with pytest.raises(GrammarError, match=r"pip install 'edgespec\[structured\]'"):
        grammar_from(regex="a+")


def test_a_byte_level_bpe_tokenizer_is_read_natively_and_ff_tokens_come_whole():
    """A real BPE tokenizer (byte-level, as the default model's): llguidance reads the
    tokenizer.json itself; forced bytes come as their tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    text = ['{"name": "Ann", "age": 31}', '{"name": "Bob", "age": 4}', "name age city"] * 20
    tok.train_from_iterator(
        text,
        trainers.BpeTrainer(
            vocab_size=300, special_tokens=["</s>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
        ),
    )
    lt = grammar_tokenizer(tok, tok.get_vocab_size(), [tok.token_to_id("</s>")])
    schema = {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}
    m = llg.LLMatcher(lt, grammar_from(json_schema=schema).text)
    ff = m.compute_ff_tokens()
    assert tok.decode(ff).startswith('{"name'), tok.decode(ff)


# ---- tiny exported engines ------------------------------------------------------------------------
TINY_PROMPTS = [
    '{"name": "ab", "n": 12, "tags": ["x"], "ok": true} {"name": "cd", "n": 3, "tags": [], "ok": ',
    "call f(1,2) call gg(33) call ",
    "hello world hello",
]


@pytest.fixture(scope="module")
def full_engine(tiny_models, tmp_path_factory):
    """A tiny folder with every chain drafter: a self:1 draft, an EAGLE head, Medusa heads."""
    from tiny import tiny_eagle_head, tiny_medusa_heads

    from edgespec.export.target.exporter import ExportConfig, export

    root = tmp_path_factory.mktemp("structured")
    head, _, _ = tiny_eagle_head(tiny_models["llama"], root / "head", draft_vocab=48, noise=0.01)
    heads, _, _ = tiny_medusa_heads(tiny_models["llama"], root / "heads", n_heads=4)
    return export(
        ExportConfig(
            target=str(tiny_models["llama"]),
            draft="self:1",
            eagle=str(head),
            medusa=str(heads),
            out=str(root / "engine"),
            max_len=256,
            k=6,
            prefill_chunk=16,
            kv_bucket=32,
            precision="fp32",
            trees=True,
            progress=False,
            validate=False,
        )
    )


def _conforms(g, grammar, ids) -> bool:
    m = llg.LLMatcher(g.structured.tokenizer, grammar.text)
    return all(m.consume_token(int(t)) for t in ids)


@pytest.mark.parametrize("kind", ["json_schema", "lark", "regex"])
def test_tiny_speculative_equals_constrained_plain_for_every_drafter(full_engine, kind):
    grammar = {
        "json_schema": lambda: grammar_from(json_schema=SCHEMA),
        "lark": lambda: grammar_from(grammar=LARK),
        "regex": lambda: grammar_from(regex=r"(hello|world|call)( (hello|world|call|f|gg)){2,6}\."),
    }[kind]()
    g = Generator.load(
        full_engine,
        RuntimeConfig(drafter="none", k=4, adaptive=False, eagle_min_confidence=0.0, medusa_min_confidence=0.0),
    )
    prompts = [g.codec.encode(p) for p in TINY_PROMPTS]
    plain = [_ids(g, 60, grammar=grammar, prompt=p) for p in prompts]
    assert all(_conforms(g, grammar, out) for out in plain)
    plain_text = ["".join(g.stream_text(p, 60, SamplingConfig(), grammar=grammar)) for p in prompts]
    accepted = cut = 0
    for d in ("ngram", "suffix", "draft", "eagle", "hybrid", "medusa", "recycle", "merged"):
        for k, adaptive in ((2, False), (6, False), (6, True)):
            g.reconfigure(drafter=d, k=k, adaptive=adaptive)
            for p, ref, ref_text in zip(prompts, plain, plain_text, strict=True):
                out = _ids(g, 60, grammar=grammar, prompt=p)
                assert np.array_equal(out, ref), (kind, d, k, g.codec.decode(out), g.codec.decode(ref))
                # the streamed text too: every token's piece, forced tokens among the kept drafts included
                text = "".join(g.stream_text(p, 60, SamplingConfig(), grammar=grammar))
                assert text == ref_text, (kind, d, k, adaptive, text, ref_text)
                st = g.last_stats
                accepted, cut = accepted + st.n_accepted, cut + st.n_grammar_cut
                assert st.n_forced > 0
    assert accepted > 0 and cut > 0


@pytest.fixture(scope="module")
def aux_engines(tmp_path_factory):
    """Folders of the drafters that read the target's aux features: an EAGLE-3 head and a DFlash
    drafter (their init plus noise) on a tiny 8-layer llama (three distinct feature layers)."""
    from tiny import make_tiny, tiny_dflash, tiny_eagle3_head

    from edgespec.export.target.exporter import ExportConfig, export

    root = tmp_path_factory.mktemp("structured_aux")
    target = make_tiny("llama", root / "llama8", num_hidden_layers=8)
    common = dict(target=str(target), eagle="none", medusa="none", max_len=256, k=4, prefill_chunk=16)
    common |= dict(kv_bucket=32, precision="fp32", progress=False, validate=False)
    eagle3, _, _ = tiny_eagle3_head(target, root / "e3head", noise=0.05)
    return {
        "eagle3": export(ExportConfig(eagle3=str(eagle3), out=str(root / "e3"), **common)),
        "dflash": export(
            ExportConfig(dflash=str(tiny_dflash(target, root / "dfhead")), out=str(root / "df"), **common)
        ),
    }


@pytest.mark.parametrize("drafter", ["eagle3", "dflash"])
def test_tiny_aux_drafters_under_a_grammar_equal_constrained_plain(aux_engines, drafter):
    """EAGLE-3 and DFlash with a JSON schema and a regex: greedy (fixed and adaptive k, ids and
    streamed text) and seeded t = 0.8 outputs equal constrained plain decoding's, and conform."""
    cfg = RuntimeConfig(drafter="none", k=4, adaptive=False, eagle_min_confidence=0.0)
    g = Generator.load(aux_engines[drafter], cfg)
    prompts = [g.codec.encode(p) for p in TINY_PROMPTS]
    seeded = SamplingConfig(temperature=0.8, seed=5)
    n_drafted = 0
    for grammar in (
        grammar_from(json_schema=SCHEMA),
        grammar_from(regex=r"(hello|world|call)( (hello|world|f)){2,6}\."),
    ):
        g.reconfigure(drafter="none")
        plain = [_ids(g, 40, grammar=grammar, prompt=p) for p in prompts]
        plain_seeded = [_ids(g, 40, seeded, grammar=grammar, prompt=p) for p in prompts]
        plain_text = ["".join(g.stream_text(p, 40, SamplingConfig(), grammar=grammar)) for p in prompts]
        assert all(_conforms(g, grammar, out) for out in plain + plain_seeded)
        for k, adaptive in ((2, False), (4, True)):
            g.reconfigure(drafter=drafter, k=k, adaptive=adaptive)
            for p, ref, ref_seeded, ref_text in zip(prompts, plain, plain_seeded, plain_text, strict=True):
                assert np.array_equal(_ids(g, 40, grammar=grammar, prompt=p), ref), (drafter, k, adaptive)
                n_drafted += g.last_stats.n_drafted + g.last_stats.n_grammar_cut  # (kept or cut by the grammar)
                assert "".join(g.stream_text(p, 40, SamplingConfig(), grammar=grammar)) == ref_text
                assert np.array_equal(_ids(g, 40, seeded, grammar=grammar, prompt=p), ref_seeded), (drafter, k)
    assert n_drafted > 0  # the drafter ran under the grammars, not plain decoding in disguise


def test_tiny_trees_fall_back_to_chains_and_adaptive_k_stays_identical(full_engine):
    from edgespec.runtime.tree import TreeConfig

    grammar = grammar_from(json_schema=SCHEMA)
    g = Generator.load(full_engine, RuntimeConfig(drafter="none", k=4, adaptive=False))
    prompt = g.codec.encode(TINY_PROMPTS[0])
    ref = _ids(g, 60, grammar=grammar, prompt=prompt)
    g.reconfigure(drafter="ngram", k=4, tree=TreeConfig(nodes=6, depth=4, branch=2, beam=2))
    assert np.array_equal(_ids(g, 60, grammar=grammar, prompt=prompt), ref)
    assert g.last_stats.tree == ""  # this call drafted chains
    g.reconfigure(drafter="eagle", k=6, tree=TreeConfig(), adaptive=True)
    assert np.array_equal(_ids(g, 60, grammar=grammar, prompt=prompt), ref)
    sampled = _ids(g, 60, SamplingConfig(temperature=1.0, seed=3), grammar, prompt)
    assert _conforms(g, grammar, sampled)


def test_tiny_stream_api_parses_and_stats_report_the_grammar(full_engine):
    g = Generator.load(full_engine, RuntimeConfig(drafter="ngram", k=4))
    text = "".join(g.stream(TINY_PROMPTS[0], max_new_tokens=120, json_schema=SCHEMA))
    st = g.last_stats
    assert text.startswith('{ " n a m e " :') and _conforms(g, grammar_from(json_schema=SCHEMA), g.last_output_ids())
    d = st.to_dict()
    assert d["grammar"] == "json_schema" and d["forced_tokens"] == st.n_forced > 0
    assert "grammar" in d["time_split_s"] and "grammar json_schema" in st.line()
    with pytest.raises(GrammarError, match="Invalid type"):
        g.stream("x", json_schema={"type": "nope"})
    plain = Generator.load(full_engine, RuntimeConfig(drafter="none")).generate(TINY_PROMPTS[0], max_new_tokens=20)
    assert g.generate(TINY_PROMPTS[0], max_new_tokens=20) == plain  # unconstrained calls are untouched


def test_cli_generate_with_a_schema_file_and_a_bad_one(full_engine, tmp_path):
    good, bad = tmp_path / "s.json", tmp_path / "bad.json"
    good.write_text(json.dumps(SCHEMA))
    bad.write_text(json.dumps({"type": "object", "properties": {"a": {"type": "wat"}}}))
    base = [
        sys.executable,
        "-m",
        "edgespec.cli",
        "generate",
        "--engine",
        str(full_engine),
        "--prompt",
        TINY_PROMPTS[0],
        "--drafter",
        "ngram",
        "--k",
        "3",
        "--max-new-tokens",
        "80",
    ]
    r = subprocess.run(
        base + ["--json-schema", str(good), "--json", str(tmp_path / "st.json")], capture_output=True, text=True
    )
    assert r.returncode == 0, r.stderr
    assert "grammar json_schema" in r.stderr and json.loads((tmp_path / "st.json").read_text())["forced_tokens"] > 0
    r = subprocess.run(base + ["--json-schema", str(bad)], capture_output=True, text=True)
    assert r.returncode == 2 and r.stderr.strip().count("\n") == 0 and "wat" in r.stderr, r.stderr
    r = subprocess.run(base + ["--regex", "[0-9]{3}"], capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.replace(" ", "").strip().isdigit(), (r.stdout, r.stderr)


def test_cli_bench_structured_reports_validity_and_identity(full_engine, tmp_path):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(
        "".join(json.dumps({"id": str(i), "prompt": p, "schema": SCHEMA}) + "\n" for i, p in enumerate(TINY_PROMPTS))
    )
    out = tmp_path / "b.json"
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "edgespec.cli",
            "bench",
            "--engine",
            str(full_engine),
            "--prompts",
            str(prompts),
            "--drafter",
            "none,ngram,eagle",
            "--k",
            "3",
            "--max-new-tokens",
            "40",
            "--structured",
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr
    runs = json.loads(out.read_text())["runs"]
    assert [(x["drafter"], x["constrained"]) for x in runs] == [
        ("none", True),
        ("ngram", True),
        ("eagle", True),
        ("none", False),
    ]
    assert [x["totals"]["identical_to_none"] for x in runs[:3]] == [3, 3, 3]
    assert all(x["totals"]["forced_tokens"] > 0 for x in runs[:3]) and runs[3]["totals"]["forced_tokens"] == 0
    assert "valid JSON" in r.stdout and all("json" in p for p in runs[0]["prompts"])


def test_the_json_eval_prompts_carry_strict_schemas_they_quote():
    """tools/prompts/json_eval.jsonl (bench --structured): 20+ prompts, each with a schema that
    compiles strictly, bounded (so a small model can finish), and quoted in its prompt."""
    from pathlib import Path

    rows = [json.loads(x) for x in (Path(__file__).parent.parent / "tools/prompts/json_eval.jsonl").open()]
    assert len(rows) >= 20 and len({r["id"] for r in rows}) == len(rows)
    for r in rows:
        assert grammar_from(json_schema=r["schema"]).kind == "json_schema"
        assert json.dumps(r["schema"]) in r["messages"][-1]["content"], r["id"]
        assert r["schema"]["additionalProperties"] is False and set(r["schema"]["required"]) == set(
            r["schema"]["properties"]
        ), r["id"]


@pytest.mark.slow
def test_default_model_json_eval_outputs_validate_and_speculation_is_identical(default_engine):
    """The real model on json_eval prompts: every constrained output parses and validates against
    its schema, and speculative output equals constrained plain output for each drafter."""
    from pathlib import Path

    from edgespec.runtime.apps.bench import json_check, load_prompts

    pytest.importorskip("jsonschema")
    g = Generator.load(default_engine, RuntimeConfig(drafter="none", k=4, adaptive=False))
    rows = load_prompts(str(Path(__file__).parent.parent / "tools/prompts/json_eval.jsonl"), 24)[::4]
    forced = 0
    for r in rows:
        grammar = grammar_from(json_schema=r["schema"])
        ids = g.codec.encode(r["messages"])
        g.set_drafter("none")
        ref = _ids(g, 256, grammar=grammar, prompt=ids)
        assert g.last_stats.finish_reason == "stop", r["id"]
        assert json_check(g.codec.decode(ref), r["schema"]) == "valid", (r["id"], g.codec.decode(ref))
        forced += g.last_stats.n_forced
        for d in ("ngram", "suffix", "eagle"):
            g.set_drafter(d, 4)
            assert np.array_equal(_ids(g, 256, grammar=grammar, prompt=ids), ref), (r["id"], d)
    assert forced > 0
