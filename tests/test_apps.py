"""Chat REPL, acceptance colouring and the HTML bench report."""

import io
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from edgespec.runtime.apps.chat import ChatSettings, chat_loop
from edgespec.runtime.config import RuntimeConfig
from edgespec.runtime.generator import Generator
from edgespec.runtime.text import provenance

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def gen(tiny_engine):
    return Generator.load(tiny_engine, RuntimeConfig(drafter="ngram", k=4))


def test_chat_reuses_the_kv_of_earlier_turns(gen):
    lines = iter(["hello there", "/k 3", "and again", "/drafter none", "once more", "/stats", "/quit"])
    out = io.StringIO()
    chat_loop(gen, ChatSettings(max_new_tokens=12), inp=lambda _: next(lines), out=out)
    text = out.getvalue()
    assert text.count("tok/s") >= 3 and "k = 3" in text and "drafter = none" in text
    # the third turn reused the rows of the first two
    assert gen.last_stats.n_prompt_cached > 20


def test_provenance_of_each_step():
    assert provenance(0, 0, 1) == ["plain"]
    assert provenance(4, 2, 3) == ["draft0", "draft1", "correction"]
    assert provenance(3, 3, 4) == ["draft0", "draft1", "draft2", "bonus"]
    assert provenance(3, 3, 2) == ["draft0", "draft1"]  # cut by max_new_tokens


def test_generate_show_acceptance(tiny_engine):
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "edgespec.cli",
            "generate",
            "--engine",
            str(tiny_engine),
            "--prompt",
            "hello hello hello hello",
            "--max-new-tokens",
            "20",
            "--show-acceptance",
            "--drafter",
            "ngram",
        ],
        capture_output=True,
        text=True,
    )
    assert res.returncode == 0, res.stderr
    assert "\033[38;5;" in res.stdout and "accepted draft" in res.stdout


def test_bench_html_report_renders(tiny_engine, tmp_path):
    pytest.importorskip("matplotlib")
    html = tmp_path / "r.html"
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "edgespec.cli",
            "bench",
            "--engine",
            str(tiny_engine),
            "--prompts",
            str(_prompts(tmp_path)),
            "--drafter",
            "none,ngram",
            "--k",
            "2,4",
            "--max-new-tokens",
            "16",
            "--html",
            str(html),
        ],
        capture_output=True,
        text=True,
    )
    assert res.returncode == 0, res.stderr
    doc = html.read_text()
    assert doc.count("data:image/png;base64,") == 3 and "<table>" in doc and "speedup vs none" in doc
    if shutil.which("chromium") is None:
        pytest.skip("chromium not installed: rendered check skipped (apt-get install chromium)")
    png = tmp_path / "r.png"
    subprocess.run(["bash", str(ROOT / "tools/screenshot_report.sh"), str(html), str(png)], check=True, timeout=120)
    assert png.stat().st_size > 20_000  # a page with plots, not a blank one


def _prompts(tmp_path):
    p = tmp_path / "p.jsonl"
    p.write_text(json.dumps({"id": 1, "prompt": "hello hello world hello world"}) + "\n")
    return p


def test_serve_and_chat_export_the_default_model_when_its_folder_is_missing(tmp_path, monkeypatch):
    """A fresh machine: `edgespec serve` (like `demo`) builds the default folder first; another
    folder that does not exist is an error as before, and nothing is exported for it."""
    import argparse

    import edgespec.cli as cli
    from edgespec.export.target import exporter

    made = []
    monkeypatch.setattr(exporter, "export", lambda cfg: made.append((cfg.out, cfg.precision)))
    monkeypatch.setattr(cli, "DEFAULT_ENGINE", str(tmp_path / "default"))
    assert cli._default_engine_ready(argparse.Namespace(engine=str(tmp_path / "default")), "serve")
    assert made == [(str(tmp_path / "default"), "auto")]
    assert cli._default_engine_ready(argparse.Namespace(engine=str(tmp_path / "other")), "serve")
    assert len(made) == 1  # not the default folder: Generator.load then says it does not exist
