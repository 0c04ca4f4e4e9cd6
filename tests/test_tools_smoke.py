"""Every tools/*.py the docs cite runs: each on a tiny folder (a tiny llama with an EAGLE head and
Medusa heads) or with its smallest settings, as a subprocess, checked for exit status 0 and a line of
its report. Timings mean nothing here; that the tool still runs against today's package does.
(Tools with their own tests are not repeated: bench_peers' matplotlib check, device_check, head_accept,
load_test, make_edit_session, quality, results_table, soak, synthetic_model; device_pack is H5's.)"""

import json
import runpy
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytest.importorskip("torch")


@pytest.fixture(scope="module")
def folder(tiny_models, tmp_path_factory):
    """A tiny folder with a self:1 draft, an EAGLE head and Medusa heads (the sections profile_step
    once refused to read), room for HumanEval and chat prompts (max_len 1024)."""
    from tiny import TINY_EXPORT, tiny_eagle_head, tiny_medusa_heads

    from edgespec.export.target.exporter import ExportConfig, export

    root = tmp_path_factory.mktemp("smoke")
    head, _, _ = tiny_eagle_head(tiny_models["llama"], root / "head", draft_vocab=48, noise=0.01)
    heads, _, _ = tiny_medusa_heads(tiny_models["llama"], root / "heads")
    cfg = TINY_EXPORT | dict(max_len=1024, validate=False)
    out = root / "folder"
    export(
        ExportConfig(
            target=str(tiny_models["llama"]), draft="self:1", eagle=str(head), medusa=str(heads), out=str(out), **cfg
        )
    )
    return out


@pytest.fixture(scope="module")
def prompts(tmp_path_factory) -> Path:
    p = tmp_path_factory.mktemp("prompts") / "p.jsonl"
    p.write_text(
        "".join(json.dumps({"id": str(i), "prompt": f"def f{i}(x):\n    return x + x + x"}) + "\n" for i in range(2))
    )
    return p


def _run(*argv, timeout: int = 120) -> str:
    r = subprocess.run([sys.executable, *map(str, argv)], cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, f"{argv[0]} exited {r.returncode}:\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}"
    return r.stdout + r.stderr


CASES = {  # tool -> (its arguments: {F} the folder, {P} a prompt file, {T} a scratch folder; a word its report holds)
    "profile_step": ("{F} --past 16 --width 3 --calls 2", "decode"),
    "width_table": ("{F} --past 16 --widths 1,2 --repeats 2", "T=2"),
    "ab_engines": ("{F} {F} --prompts 1 --rounds 1 --max-new-tokens 4", "tok/s"),
    "head_call_cost": ("{F} --rounds 3", "eagle"),
    "ab_fused_head": ("--engine {F} --prompts {P} --limit 1 --k 1 --max-new-tokens 4", "fuse"),
    "chat_ttft": ("--engine {F} --max-new-tokens 4", "TTFT"),
    "recycle_sweep": ("{F} {P} --k 2 --set drafter=ngram --set drafter=recycle --max-new-tokens 8", "ngram"),
    "recycle_host_time": ("{F} {P} 1", "recycle"),
    "host_step_replay": ("{F} 1 none,ngram:2 --repeat 1", "ngram"),
    "structured_check": (
        "--engine {F} --limit 1 --max-new-tokens 8 --drafters ngram --sampling greedy --settings 2:fixed",
        "ngram",
    ),
    "sampled_replay": ("collect {F} {T}/traj.npz {P} --new 8", ""),
    "suffix_cost": ("--tokens 5000 --steps 5", "tokens"),
    "gemm_rows": ("--rows 1,2 --repeats 2", "M=2"),
    "layout_goals": ("--no-duplicates", "goal"),
}


@pytest.mark.parametrize("tool", sorted(CASES))
def test_tool_runs(tool, folder, prompts, tmp_path):
    args, word = CASES[tool]
    argv = args.format(F=folder, P=prompts, T=tmp_path).split()
    out = _run(f"tools/{tool}.py", *argv)
    assert word.lower() in out.lower(), out[-2000:]


def test_itl_ab_runs(folder, capsys):
    """itl_ab's command line takes only the folder (3 rounds of 10 prompts): its main, smaller."""
    runpy.run_path(str(ROOT / "tools/itl_ab.py"))["main"](str(folder), rounds=2, n_prompts=1, new_tokens=8)
    assert "logprobs" in capsys.readouterr().out


def test_chat_screenshot_runs(folder, tmp_path):
    if not (shutil.which("chromium") or shutil.which("chromium-browser")) or not shutil.which("chromedriver"):
        pytest.skip("no headless Chromium here: apt-get install -y chromium chromium-driver")
    pytest.importorskip("selenium")
    _run("tools/chat_screenshot.py", "--engine", folder, "--out", tmp_path / "page.png", timeout=300)
    assert (tmp_path / "page.png").stat().st_size > 0


def test_every_tool_the_docs_cite_is_run_somewhere():
    """A tool cited by README.md or docs/ is run here or named in another test module."""
    import re

    docs = [ROOT / "README.md", *(ROOT / "docs").glob("*.md"), *(ROOT / "docs/results").glob("*.md")]
    cited = {m for p in docs for m in re.findall(r"tools/(\w+)\.py", p.read_text())}
    tests = "".join(p.read_text() for p in (ROOT / "tests").glob("test_*.py") if p.name != "test_tools_smoke.py")
    here = set(CASES) | {"itl_ab", "chat_screenshot", "device_pack"}
    missing = sorted(t for t in cited - here if not re.search(rf"\b{t}\b", tests))
    assert missing == [], missing
