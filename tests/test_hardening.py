"""Bad input gets a one-line error that names it and says what to do, never a traceback or a
silent wrong answer: table-driven probes of the CLI (`edgespec CMD: error: ...`, exit 2) and the
Python API, export's --force and stale temporaries, and the manifest's file records (sizes at
every load, sha256 with --verify and `edgespec check`), broken optional heads included."""

import hashlib
import importlib.util
import io
import json
import math
import os
import re
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
from helpers.cli import copy_folder, one_line_error, run_cli

from edgespec.cli import main
from edgespec.engines.manifest import ManifestError, load_manifest
from edgespec.runtime.apps.chat import ChatSettings, handle_command
from edgespec.runtime.config import RuntimeConfig
from edgespec.runtime.drafters import shipped
from edgespec.runtime.generator import Generator
from edgespec.runtime.sampling import SamplingConfig, check_max_new_tokens

# main() runs in this process: its ORT pool must not become the one later tests share
pytestmark = pytest.mark.usefixtures("own_thread_pools")

ROOT = Path(__file__).resolve().parents[1]


def _truncate(path: Path, n: int) -> None:
    data = path.read_bytes()
    path.write_bytes(data[:n])


# ---- sampling settings and lengths -----------------------------------------------------------

BAD_SAMPLING = [
    (dict(temperature=math.nan), "temperature=nan: must be a finite number"),
    (dict(temperature=math.inf), "temperature=inf: must be a finite number"),
    (dict(temperature=-1.0), "temperature=-1.0: must be >= 0"),
    (dict(top_p=math.nan), "top_p=nan: must be a finite number"),
    (dict(top_p=0.0), r"top_p=0.0: must be in \(0, 1\]"),
    (dict(top_p=1.5), r"top_p=1.5: must be in \(0, 1\]"),
    (dict(top_k=-1), "top_k=-1: must be >= 0"),
    (dict(repetition_penalty=math.nan), "repetition_penalty=nan: must be a finite number"),
    (dict(repetition_penalty=-math.inf), "repetition_penalty=-inf: must be a finite number"),
    (dict(repetition_penalty=0.0), "repetition_penalty=0.0: must be > 0"),
    (dict(typical_epsilon=math.nan), "typical_epsilon=nan: must be a finite number"),
    (dict(typical_epsilon=1.0), r"typical_epsilon=1.0: must be in \[0, 1\)"),
]


@pytest.mark.parametrize("kw, match", BAD_SAMPLING)
def test_sampling_settings_refuse_non_finite_and_out_of_range_values(kw, match):
    with pytest.raises(ValueError, match=match):
        SamplingConfig(**kw).check()


@pytest.mark.parametrize("n", [0, -5, 2.5, True, None])
def test_max_new_tokens_must_be_at_least_one(n):
    with pytest.raises(ValueError, match=r"max_new_tokens=.*: must be an integer >= 1"):
        check_max_new_tokens(n)
    check_max_new_tokens(1)
    check_max_new_tokens(np.int64(3))


@pytest.fixture(scope="module")
def gen(tiny_engine):
    return Generator.load(tiny_engine, RuntimeConfig(drafter="ngram", k=3))


@pytest.mark.parametrize(
    "kw, match",
    [({"max_new_tokens": 0}, "max_new_tokens=0"), ({"max_new_tokens": -5}, "max_new_tokens=-5")]
    + [(kw, match) for kw, match in BAD_SAMPLING if "top_k" not in kw],
)
def test_python_api_refuses_at_the_call(gen, kw, match):
    with pytest.raises(ValueError, match=match):
        gen.stream("hello hello", **kw)  # raised by the call itself, before any iteration
    sampling = SamplingConfig(**{k: v for k, v in kw.items() if k != "max_new_tokens"})
    with pytest.raises(ValueError, match=match):
        next(gen.generate_ids(np.array([5, 6, 7]), kw.get("max_new_tokens", 4), sampling))
    assert gen.generate("hello hello", max_new_tokens=3)  # and the generator still works after


GENERATE_PROBES = [
    (["--temperature", "nan"], "temperature=nan: must be a finite number"),
    (["--temperature", "inf"], "temperature=inf: must be a finite number"),
    (["--temperature", "-1"], "temperature=-1.0: must be >= 0"),
    (["--repetition-penalty", "nan"], "repetition_penalty=nan"),
    (["--top-p", "nan"], "top_p=nan"),
    (["--typical-epsilon", "inf"], "typical_epsilon=inf"),
    (["--max-new-tokens", "0"], "max_new_tokens=0: must be an integer >= 1"),
    (["--max-new-tokens", "-5"], "max_new_tokens=-5: must be an integer >= 1"),
]


@pytest.mark.parametrize("extra, match", GENERATE_PROBES)
def test_cli_generate_refuses_bad_settings(tiny_engine, capsys, extra, match):
    rc, err = run_cli(capsys, "generate", "--engine", tiny_engine, "--prompt", "hello", *extra)
    assert rc == 2 and match in one_line_error(err, "generate")


@pytest.mark.parametrize(
    "cmd, extra, match",
    [
        ("chat", ["--temperature", "nan"], "temperature=nan"),
        ("chat", ["--max-new-tokens", "0"], "max_new_tokens=0"),
        ("bench", ["--temperature", "inf"], "temperature=inf"),
        ("bench", ["--max-new-tokens", "-1"], "max_new_tokens=-1"),
        ("bench", ["--k", "two"], "--k 'two'"),
        ("demo", ["--max-new-tokens", "0"], "max_new_tokens=0"),
        ("tune", ["--max-new-tokens", "0"], "max_new_tokens=0"),
    ],
)
def test_cli_other_commands_refuse_bad_settings_before_loading(tiny_engine, capsys, cmd, extra, match):
    rc, err = run_cli(capsys, cmd, "--engine", tiny_engine, *extra)
    assert rc == 2 and match in one_line_error(err, cmd)


@pytest.mark.parametrize("port", ["-1", "70000", "http"])
def test_cli_serve_port_is_checked_by_argparse(tiny_engine, capsys, port):
    rc, err = run_cli(capsys, "serve", "--engine", tiny_engine, "--port", port)
    assert rc == 2 and "argument --port" in one_line_error(err, "serve")


@pytest.mark.parametrize(
    "arg, match",
    [
        ("-1", "must be >= 0"),
        ("nan", "must be a finite number"),
        ("inf", "must be a finite number"),
        ("warm", "give a number"),
    ],
)
def test_chat_temperature_command_refuses_at_the_command(gen, arg, match):
    settings = ChatSettings(temperature=0.5)
    msg = handle_command(f"/temperature {arg}", gen, settings, [])
    assert msg.startswith("error: ") and match in msg and settings.temperature == 0.5
    assert handle_command("/temperature 0.7", gen, settings, []) == "temperature = 0.7"
    assert handle_command("/k x", gen, settings, []).startswith("error: /k 'x'")


# ---- broken folder files ----------------------------------------------------------------------


def _strip_records(folder: Path) -> None:
    """The folder as an export older than the file records wrote it."""
    d = json.loads((folder / "manifest.json").read_text())
    d.pop("files", None)
    (folder / "manifest.json").write_text(json.dumps(d))


@pytest.mark.parametrize("records", [True, False])
def test_truncated_tokenizer_is_named(tiny_engine, tmp_path, capsys, records):
    folder = copy_folder(tiny_engine, tmp_path / "e")
    if not records:
        _strip_records(folder)
    _truncate(folder / "tokenizer.json", 200)
    match = "tokenizer file tokenizer.json size mismatch" if records else "tokenizer .*tokenizer.json cannot be read"
    with pytest.raises(ValueError, match=match):
        Generator.load(folder, RuntimeConfig(drafter="none"))
    rc, err = run_cli(capsys, "generate", "--engine", folder, "--prompt", "hi")
    assert rc == 2 and "tokenizer.json" in one_line_error(err, "generate")


def test_broken_chat_template_fails_chat_calls_only(tiny_engine, tmp_path, capsys):
    folder = copy_folder(tiny_engine, tmp_path / "e")
    (folder / "chat_template.jinja").write_text("{% for m in messages %}{{ m['content'] }")
    with pytest.warns(RuntimeWarning, match=r"chat template .*chat_template.jinja line 1 cannot be used"):
        g = Generator.load(folder, RuntimeConfig(drafter="none"))
    assert g.generate("hello", max_new_tokens=3)  # a raw prompt never uses the template
    with pytest.raises(ValueError, match="chat_template.jinja line 1 cannot be used.*raw-text prompts still work"):
        g.generate([{"role": "user", "content": "hi"}], max_new_tokens=3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        rc, err = run_cli(capsys, "generate", "--engine", folder, "--prompt", "hi", "--max-new-tokens", "2")
        assert rc == 0
        rc, err = run_cli(capsys, "generate", "--engine", folder, "--prompt", "hi", "--chat", "--max-new-tokens", "2")
    assert rc == 2 and "chat_template.jinja" in one_line_error(err, "generate")


@pytest.mark.parametrize("records", [True, False])
def test_truncated_target_weights_name_the_file_and_sizes(tiny_engine, tmp_path, capsys, records):
    folder = copy_folder(tiny_engine, tmp_path / "e")
    if not records:
        _strip_records(folder)
    full = (folder / "target.weights").stat().st_size
    _truncate(folder / "target.weights", full // 2)
    if records:
        match = f"target file target.weights size mismatch: {full // 2} bytes, the manifest records {full}"
    else:
        match = f"weights file .*target.weights is {full // 2} bytes, but the manifest's target tensors need"
    with pytest.raises((ManifestError, RuntimeError), match=match):
        Generator.load(folder, RuntimeConfig(drafter="none"))
    rc, err = run_cli(capsys, "generate", "--engine", folder, "--prompt", "hi")
    assert rc == 2 and "target.weights" in one_line_error(err, "generate")


# ---- file records: export writes them, load checks sizes, --verify and `check` hashes ---------


def test_export_records_each_files_size_and_sha256(tiny_engine):
    m = load_manifest(tiny_engine)
    listed = {f for files in m.role_files().values() for f in files}
    assert set(m.files) == listed >= {"target.onnx", "target.weights", "tokenizer.json"}
    for rel, rec in m.files.items():  # recorded from the finished bytes, which recording left alone
        data = (tiny_engine / rel).read_bytes()
        assert rec.size == len(data) and rec.sha256 == hashlib.sha256(data).hexdigest(), rel
    assert set(m.check_files(verify=True).values()) == {"ok"}


def test_check_command_and_verify_find_a_changed_byte(tiny_engine, tmp_path, capsys):
    folder = copy_folder(tiny_engine, tmp_path / "e")
    rc, out = main(["check", str(folder)]), capsys.readouterr().out
    assert rc == 0 and len(out.splitlines()) == len(load_manifest(folder).files)
    assert all(line.split()[-1] == "ok" for line in out.splitlines())
    data = bytearray((folder / "target.onnx").read_bytes())
    data[len(data) // 2] ^= 0xFF  # same size: only the hash can tell
    (folder / "target.onnx").write_bytes(bytes(data))
    assert load_manifest(folder)  # sizes only: loads
    with pytest.raises(ManifestError, match="target file target.onnx hash mismatch"):
        load_manifest(folder, verify=True)
    with pytest.raises(ManifestError, match="target.onnx hash mismatch"):
        Generator.load(folder, RuntimeConfig(drafter="none", verify=True))
    rc, out = main(["check", str(folder)]), capsys.readouterr().out
    bad = [line for line in out.splitlines() if not line.endswith(" ok")]
    assert rc == 1 and len(bad) == 1 and bad[0].startswith("target.onnx") and "hash mismatch" in bad[0]
    rc, err = run_cli(capsys, "generate", "--engine", folder, "--prompt", "hi", "--verify")
    assert rc == 2 and "target.onnx hash mismatch" in one_line_error(err, "generate")


def test_check_command_on_a_folder_without_records(tiny_engine, tmp_path, capsys):
    folder = copy_folder(tiny_engine, tmp_path / "e")
    _strip_records(folder)
    rc = main(["check", str(folder)])
    out, err = capsys.readouterr()
    assert rc == 0 and all(line.endswith("not recorded") for line in out.splitlines())
    assert "records no sizes or hashes" in err
    (folder / "target.onnx").unlink()
    assert main(["check", str(folder)]) == 1
    assert re.search(r"^target\.onnx +missing \(read by target\)$", capsys.readouterr().out, re.M)


# ---- broken optional models: the drafter is off, the target loads ----------------------------


@pytest.fixture(scope="module")
def draft_engine(tiny_models, tmp_path_factory):
    """A tiny folder whose draft model has its own weights file (an optional model's file)."""
    from tiny import make_tiny

    from edgespec.export.target.exporter import ExportConfig, export

    root = tmp_path_factory.mktemp("draft_engine")
    other = make_tiny("llama", root / "d", seed=3, num_hidden_layers=1)
    return export(
        ExportConfig(
            target=str(tiny_models["llama"]),
            draft=str(other),
            out=str(root / "e"),
            max_len=128,
            k=3,
            prefill_chunk=16,
            kv_bucket=32,
            precision="fp32",
            progress=False,
            validate=False,
        )
    )


@pytest.mark.parametrize("records", [True, False])
def test_a_broken_draft_disables_its_drafter_only(draft_engine, tmp_path, capsys, records):
    folder = copy_folder(draft_engine, tmp_path / "e")
    if not records:
        _strip_records(folder)
    _truncate(folder / "draft.weights", 100)
    with pytest.warns(RuntimeWarning, match=r"draft.weights .*drafter\(s\) draft disabled.*re-export"):
        g = Generator.load(folder, RuntimeConfig(drafter="ngram", k=2))
    assert g.generate("hello hello", max_new_tokens=4)
    with pytest.raises(ValueError, match=r"drafter 'draft' is disabled: .*draft.weights.*choose another drafter"):
        g.set_drafter("draft", 2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        rc, err = run_cli(capsys, "generate", "--engine", folder, "--prompt", "hi", "--drafter", "draft")
    assert rc == 2 and "drafter 'draft' is disabled" in one_line_error(err, "generate")


def _default_folder_copy(src: Path, tmp_path: Path) -> Path:
    """A copy of the default model's folder (the test session's export): hard links to its big
    files (ONNX Runtime refuses a symlink that leaves the folder) where the file system allows,
    else copies."""
    m = load_manifest(src, files=False)
    if m.models().get("eagle") is None or m.models().get("medusa") is None:
        pytest.skip("the default folder has no EAGLE / Medusa heads")
    folder = tmp_path / "e"
    folder.mkdir()
    for f in Path(src).iterdir():
        try:
            if f.stat().st_size < 50 << 20:
                raise OSError("small: copy it")
            os.link(f, folder / f.name)  # never written by the tests (they truncate only the heads' files)
        except OSError:
            shutil.copy(f, folder / f.name)
    return folder


@pytest.mark.parametrize(
    "broken, drafters",
    [("eagle.weights", ("eagle", "hybrid")), ("medusa.weights", ("medusa",)), ("medusa.onnx", ("medusa",))],
)
def test_a_broken_head_disables_its_drafters_only(default_engine, tmp_path, broken, drafters):
    folder = _default_folder_copy(default_engine, tmp_path)
    m = load_manifest(folder)
    m.record_files().save()  # the copy as a current export would record it
    if broken.endswith(".onnx"):
        (folder / broken).unlink()
    else:
        _truncate(folder / broken, 1000)
    with pytest.warns(RuntimeWarning, match=f"{broken}.*drafter\\(s\\) {', '.join(drafters)} disabled"):
        g = Generator.load(folder, RuntimeConfig(drafter="ngram", k=3))
    assert g.generate("def add(a, b):", max_new_tokens=4)
    for d in drafters:
        with pytest.raises(ValueError, match=f"drafter '{d}' is disabled: .*{broken}"):
            g.set_drafter(d, 3)
    other = "medusa" if "eagle" in drafters else "eagle"
    g.set_drafter(other, 3)  # the other head still drafts
    assert g.generate("def add(a, b):", max_new_tokens=4)


def test_a_truncated_head_without_records_disables_its_drafters(default_engine, tmp_path):
    folder = _default_folder_copy(default_engine, tmp_path)
    _strip_records(folder)
    _truncate(folder / "eagle.weights", 1000)
    with pytest.warns(RuntimeWarning, match=r"weights file .*eagle.weights is 1000 bytes.*eagle, hybrid disabled"):
        g = Generator.load(folder, RuntimeConfig(drafter="none"))
    with pytest.raises(ValueError, match="drafter 'hybrid' is disabled"):
        g.set_drafter("hybrid", 3)


# ---- export: --out, --force, stale temporaries --------------------------------------------------


def _export(tiny_models, out, **kw):
    from edgespec.export.target.exporter import ExportConfig, export

    return export(
        ExportConfig(
            target=str(tiny_models["llama"]),
            out=str(out),
            max_len=128,
            k=2,
            prefill_chunk=16,
            kv_bucket=32,
            precision="fp32",
            progress=False,
            validate=False,
            **kw,
        )
    )


def test_export_out_naming_a_file_is_refused_before_it_runs(tiny_models, tmp_path, capsys):
    f = tmp_path / "notes.txt"
    f.write_text("mine")
    rc, err = run_cli(capsys, "export", "--target", tiny_models["llama"], "--out", f, "--force")
    assert rc == 2 and f"--out {f} is a file" in one_line_error(err, "export")
    assert f.read_text() == "mine" and sorted(tmp_path.iterdir()) == [f]


def test_force_replaces_only_engine_folders_or_empty_ones(tiny_models, tmp_path, capsys):
    from edgespec.export.target.exporter import ExportError

    mine = tmp_path / "mine"
    (mine / "sub").mkdir(parents=True)
    (mine / "thesis.tex").write_text("years of work")
    with pytest.raises(
        ExportError,
        match=r"--force will not replace .*mine: it is not an edgespec engine folder .*"
        r"holds 1 files, 1 folders \(sub/, thesis.tex\)",
    ):
        _export(tiny_models, mine, force=True)
    assert (mine / "thesis.tex").read_text() == "years of work"
    rc, err = run_cli(capsys, "export", "--target", tiny_models["llama"], "--out", mine, "--force", "--no-validate")
    assert rc == 2 and "not an edgespec engine folder" in one_line_error(err, "export")
    empty = tmp_path / "empty"
    empty.mkdir()
    assert load_manifest(_export(tiny_models, empty, force=True))  # an empty folder is fine
    assert load_manifest(_export(tiny_models, empty, force=True))  # and an engine folder


def test_stale_partials_of_dead_exports_are_removed(tiny_models, tmp_path, capsys):
    from edgespec.export.partials import mark

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = tmp_path / f".old.partial-{dead.pid}"
    (stale / "x").mkdir(parents=True)
    (stale / "x" / "target.weights").write_bytes(b"0" * 1000)
    mark(stale, dead.pid)  # edgespec's marker: only such folders are removed
    alive = tmp_path / f".busy.partial-{os.getppid()}"  # an export still running: left alone
    alive.mkdir()
    mark(alive, os.getppid())
    unrelated = tmp_path / ".notes.partial-draft"  # not ours (no pid)
    unrelated.mkdir()
    lookalike = tmp_path / f".mine.partial-{dead.pid}"  # a user's folder named like ours, no marker: kept
    (lookalike / "notes.txt").parent.mkdir()
    (lookalike / "notes.txt").write_text("mine")
    _export(tiny_models, tmp_path / "e")
    err = capsys.readouterr().err
    assert not stale.exists() and alive.exists() and unrelated.exists()
    assert (lookalike / "notes.txt").read_text() == "mine" and str(lookalike) not in err
    assert f"removed {stale}" in err and f"pid {dead.pid}" in err


def test_bench_peers_checks_matplotlib_before_benchmarking(monkeypatch, capsys):
    spec = importlib.util.spec_from_file_location("bench_peers", ROOT / "tools" / "bench_peers.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    monkeypatch.setattr(mod, "load_prompts", lambda *a: pytest.fail("benchmarked before checking --png"))
    with pytest.raises(SystemExit) as e:
        mod.main(["--png", "x.png", "--engine", "nowhere"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "--png needs matplotlib" in err and "Traceback" not in err


def test_cli_errors_end_without_a_traceback_in_a_real_process(tiny_engine, tmp_path):
    """The same one-line errors from a fresh `python -m edgespec.cli` (no test harness around main)."""
    folder = copy_folder(tiny_engine, tmp_path / "e")
    _truncate(folder / "tokenizer.json", 100)
    for argv in (
        ["generate", "--engine", str(tiny_engine), "--prompt", "x", "--temperature", "nan"],
        ["generate", "--engine", str(folder), "--prompt", "x"],
        ["serve", "--engine", str(tiny_engine), "--port", "-1"],
    ):
        res = subprocess.run([sys.executable, "-m", "edgespec.cli", *argv], capture_output=True, text=True)
        assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr
        assert f"edgespec {argv[0]}: error: " in res.stderr


def test_chat_loop_reports_a_bad_turn_and_goes_on(gen):
    from edgespec.runtime.apps.chat import chat_loop

    lines = iter(["/temperature nan", "hello", "/quit"])
    out = io.StringIO()
    chat_loop(gen, ChatSettings(max_new_tokens=4), inp=lambda _: next(lines), out=out)
    text = out.getvalue()
    assert "error: temperature=nan: must be a finite number" in text and "tok/s" in text


def test_soak_tool_runs_every_drafter_and_reports_growth(tiny_engine):
    pytest.importorskip("psutil")
    spec = importlib.util.spec_from_file_location("soak", ROOT / "tools" / "soak.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    rep = mod.soak(str(tiny_engine), n=4, every=2, warmup=3, max_new_tokens=4, k=2, trim=True)
    assert rep["config"]["drafters"] == list(shipped(load_manifest(tiny_engine), RuntimeConfig()))
    assert [s["generations"] for s in rep["samples"]] == [0, 2, 4]
    assert {"growth_mb", "growth_after_trim_mb", "py_blocks_growth"} <= set(rep["summary"])
