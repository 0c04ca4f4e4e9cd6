"""The prompt files in tools/prompts: loadable by `edgespec bench`, unique ids, and the multi-turn
edit sessions (tools/prompts/edit_session.jsonl, written by tools/make_edit_session.py) well formed:
each turn's conversation is the previous one plus the target's answer and the next request."""

import importlib.util
import json
import re
import sys
from pathlib import Path

import pytest

from edgespec.runtime.apps.bench import BenchConfig, load_prompts

ROOT = Path(__file__).parent.parent
PROMPTS = sorted((ROOT / "tools/prompts").glob("*.jsonl"))
EDIT = ROOT / "tools/prompts/edit_session.jsonl"
ENGINE = ROOT / "engines/smollm2-135m-instruct"
ID = re.compile(r"edit-session-(\d+)-(\d+)")


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _sessions(rows: list[dict]) -> dict[int, list[dict]]:
    out: dict[int, list[dict]] = {}
    for r in rows:
        out.setdefault(int(ID.fullmatch(r["id"]).group(1)), []).append(r)
    return out


@pytest.fixture(scope="module")
def edit_rows():
    return _rows(EDIT)


@pytest.mark.parametrize("path", PROMPTS, ids=lambda p: p.name)
def test_bench_loads_every_prompt_file(path):
    rows = _rows(path)
    loaded = load_prompts(str(path), limit=len(rows) + 1)
    assert [r["id"] for r in loaded] == [r["id"] for r in rows]
    assert len({r["id"] for r in rows}) == len(rows), f"{path.name}: ids repeat"
    for r in loaded:
        assert ("messages" in r) != ("prompt" in r), f"{path.name} {r['id']}: needs exactly one of messages/prompt"


def test_edit_sessions_are_well_formed_chat_rows(edit_rows):
    assert len(edit_rows) <= BenchConfig(engine="-").limit, "bench (default --limit) must run every row"
    for r in edit_rows:
        assert set(r) == {"id", "category", "messages"} and r["category"] == "edit_session", r["id"]
        assert ID.fullmatch(r["id"]), f"{r['id']}: ids are edit-session-<session>-<turn>"
        msgs = r["messages"]
        roles = [m["role"] for m in msgs]
        assert roles == ["user", "assistant"] * (len(msgs) // 2) + ["user"], f"{r['id']}: roles {roles}"
        for m in msgs:
            assert set(m) == {"role", "content"} and isinstance(m["content"], str) and m["content"].strip(), r["id"]


def test_edit_sessions_grow_turn_by_turn(edit_rows):
    sessions = _sessions(edit_rows)
    assert len(sessions) >= 2 and sorted(sessions) == list(range(len(sessions)))
    for s, rows in sessions.items():
        assert [int(ID.fullmatch(r["id"]).group(2)) for r in rows] == list(range(1, len(rows) + 1)), s
        assert len(rows) >= 5 and len(rows[0]["messages"]) == 1
        for prev, cur in zip(rows, rows[1:], strict=False):
            p, c = prev["messages"], cur["messages"]
            assert c[0] == p[0], f"{cur['id']}: the first message (the pasted file) must stay"
            # the previous conversation, less its oldest (answer, request) pairs when it outgrew the budget
            kept = c[:-2]
            assert any(kept == p[:1] + p[1 + 2 * j :] for j in range(len(p) // 2 + 1)), (
                f"{cur['id']}: does not continue {prev['id']}"
            )
            assert kept[-1] == p[-1], f"{cur['id']}: must answer {prev['id']}'s request"


def test_edit_sessions_match_their_generator(edit_rows, monkeypatch):
    """The jsonl holds the script's files and requests (regenerate it after editing the script)."""
    spec = importlib.util.spec_from_file_location("make_edit_session", ROOT / "tools/make_edit_session.py")
    mod = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, mod)  # dataclasses look their module up there
    spec.loader.exec_module(mod)
    sessions = _sessions(edit_rows)
    assert len(sessions) == len(mod.SESSIONS)
    for s, session in enumerate(mod.SESSIONS):
        rows = sessions[s]
        assert len(rows) == len(session.requests)
        assert rows[0]["messages"][0]["content"] == mod.first_message(session)
        for r, request in zip(rows[1:], session.requests[1:], strict=True):
            assert r["messages"][-1]["content"] == request + session.ask, r["id"]


def test_edit_session_prompts_fit_the_default_folder(edit_rows):
    if not (ENGINE / "manifest.json").exists():
        pytest.skip("default engine folder not exported here")
    from edgespec.engines.manifest import load_manifest
    from edgespec.runtime.text import TextCodec

    manifest = load_manifest(ENGINE)
    codec = TextCodec(manifest)
    sizes = [len(codec.encode(r["messages"])) for r in edit_rows]
    assert max(sizes) <= 900, f"longest prompt {max(sizes)} tokens; the generator's budget is 900"
    assert max(sizes) + 160 <= manifest.max_len
