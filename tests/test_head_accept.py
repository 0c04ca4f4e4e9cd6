"""tools/head_accept.py on the real default model: the engine's eval answers, marked EVAL, and each
head's teacher-forced acceptance by task type."""

import json
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

TOOLS = Path(__file__).resolve().parent.parent / "tools"


def test_head_accept_scores_the_shipped_head_on_eval_answers(default_engine, tmp_path, capsys):
    sys.path.insert(0, str(TOOLS))
    import head_accept

    from edgespec.export.train.text_data import EVAL_MARK

    prompts = tmp_path / "eval.jsonl"
    rows = [
        {"id": "a", "category": "qa", "messages": [{"role": "user", "content": "What is the capital of France?"}]},
        {"id": "b", "category": "math", "messages": [{"role": "user", "content": "What is 12 times 12?"}]},
    ]
    prompts.write_text("".join(json.dumps(r) + "\n" for r in rows))
    head = Path(__file__).resolve().parent.parent / "export" / "heads" / "smollm2-135m-instruct"
    work = tmp_path / "answers"
    cfg = head_accept.parse(
        ["--engine", str(default_engine), "--prompts", str(prompts), "--work", str(work), "--eagle", str(head)]
        + ["--max-new-tokens", "16"]
    )
    head_accept.main(cfg)
    assert (work / EVAL_MARK).exists() and (work / "done").exists()
    table = [line.split("|")[1:-1] for line in capsys.readouterr().out.splitlines() if line.startswith("| ")]
    by_task = {r[0].strip(): [float(x) for x in r[1:]] for r in table if r[0].strip() != "task"}
    assert set(by_task) == {"qa", "math", "all"}
    tokens, step1, step2, oov, target, per_call = by_task["all"]
    assert tokens == by_task["qa"][0] + by_task["math"][0] > 0
    assert all(0.0 <= x <= 1.0 for x in (step1, step2, oov, target, per_call))
    assert target > 0.2  # the target's own top-1 probability on its greedy answers
