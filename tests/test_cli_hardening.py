"""Issue 41, part C: engine folders whose manifest.json a user edited, and backends this machine
lacks, get a one-line `edgespec CMD: error: ...` (exit 2) naming the field or package and what to
do, never a traceback; the manifest's numbers are range-checked when it is read (max_len against
the graphs and the machine's memory, ids against the vocabulary, dtypes against a list)."""

import json
import re
import sys
import time
from pathlib import Path

import pytest
from helpers.cli import copy_folder, one_line_error, run_cli

from edgespec.cli import main
from edgespec.engines.manifest import ManifestError, load_manifest
from edgespec.runtime.apps.chat import ChatSettings, handle_command
from edgespec.runtime.config import RuntimeConfig
from edgespec.runtime.generator import FolderLoadError, Generator

# main() runs in this process: its ORT pool must not become the one later tests share
pytestmark = pytest.mark.usefixtures("own_thread_pools")


def _edited(folder: Path, tmp_path: Path, edit) -> Path:
    """A copy of the engine folder whose manifest.json `edit(d)` changed, as a user's editor would."""
    out = copy_folder(folder, tmp_path / "edited")
    d = json.loads((out / "manifest.json").read_text())
    edit(d)
    (out / "manifest.json").write_text(json.dumps(d))
    return out


def _no_drafters(d: dict) -> None:
    """The folder as an export without a draft model (only the model-free drafters)."""
    d["drafters"] = {}
    d["files"].pop("draft.onnx", None)


# ---- defect 7: --provider trt without TensorRT -----------------------------------------------------


def test_provider_trt_without_tensorrt_is_one_line_with_a_hint(tiny_engine, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorrt", None)  # `import tensorrt` fails, as on a machine without it
    monkeypatch.setitem(sys.modules, "cuda", None)  # and cuda-python
    rc, err = run_cli(capsys, "generate", "--engine", tiny_engine, "--prompt", "hi", "--provider", "trt")
    line = one_line_error(err, "generate")
    assert rc == 2 and "provider 'trt' (native TensorRT) needs the tensorrt and cuda-python packages" in line
    assert "Hint: pip install tensorrt cuda-python" in line and "--provider cpu" in line


# ---- defect 8: edited manifests ----------------------------------------------------------------------


def test_no_eos_with_a_regex_says_the_manifest_lists_none(tiny_engine, tmp_path, capsys):
    pytest.importorskip("llguidance")
    folder = _edited(tiny_engine, tmp_path, lambda d: d.update(eos_token_ids=[]))
    rc, err = run_cli(
        capsys, "generate", "--engine", folder, "--prompt", "hi", "--regex", "a+", "--max-new-tokens", "2"
    )
    line = one_line_error(err, "generate")
    assert rc == 2 and "needs the folder's EOS token" in line and "eos_token_ids: []" in line
    rc, _ = run_cli(capsys, "generate", "--engine", folder, "--prompt", "hi", "--max-new-tokens", "2")
    assert rc == 0  # free text needs no EOS: the folder still generates


@pytest.mark.parametrize(
    "field, value, match",
    [
        ("bos_token_id", 10**12, "bos_token_id = 1000000000000, outside the target's vocabulary of 256 ids"),
        ("bos_token_id", -1, "bos_token_id = -1, outside the target's vocabulary of 256 ids"),
        ("eos_token_ids", [1, 2**40], "eos_token_ids = [1, 1099511627776], outside the target's vocabulary"),
        ("bos_token_id", 1e12, "Manifest.bos_token_id: 1000000000000.0 is not int"),  # a float is no id
    ],
)
def test_token_ids_outside_the_vocabulary_are_refused(tiny_engine, tmp_path, capsys, field, value, match):
    folder = _edited(tiny_engine, tmp_path, lambda d: d.update({field: value}))
    with pytest.raises(ManifestError, match=re.escape(match)):
        load_manifest(folder)
    rc, err = run_cli(capsys, "generate", "--engine", folder, "--prompt", "hi", "--chat", "--max-new-tokens", "2")
    assert rc == 2 and match.split(",")[0] in one_line_error(err, "generate")


@pytest.mark.parametrize(
    "edit, match",
    [
        (lambda t: t["weights"]["embed"].update(dtype="float99"), "target weight embed dtype 'float99', not one of"),
        (lambda t: t.update(kv_dtype="float99"), "target kv_dtype 'float99', not one of float16, float32"),
        (lambda t: t["graph"]["outputs"][0].update(dtype="float99"), "target graph output logits dtype 'float99'"),
        (lambda t: t["weights"]["embed"].update(nbytes=12), r"target weight embed is float32 \[256, 64\] .* 12 bytes"),
    ],
)
def test_unknown_dtypes_are_refused_by_name(tiny_engine, tmp_path, capsys, edit, match):
    folder = _edited(tiny_engine, tmp_path, lambda d: edit(d["target"]))
    with pytest.raises(ManifestError, match=match):
        load_manifest(folder)
    rc, err = run_cli(capsys, "generate", "--engine", folder, "--prompt", "hi")
    line = one_line_error(err, "generate")
    assert rc == 2 and "manifest.json says" in line and "Hint: re-export the folder" in line


def test_a_huge_max_len_is_refused_at_load_in_well_under_a_second(tiny_engine, tmp_path, capsys):
    folder = _edited(tiny_engine, tmp_path, lambda d: d.update(max_len=10**9))
    t0 = time.perf_counter()
    with pytest.raises(ManifestError, match=r"max_len = 1000000000, but the target graph's rope table .* 256 positi"):
        load_manifest(folder)
    assert time.perf_counter() - t0 < 1.0  # was an ArrayMemoryError after 148 s
    rc, err = run_cli(capsys, "generate", "--engine", folder, "--prompt", "hi")
    assert rc == 2 and "max_len = 1000000000" in one_line_error(err, "generate")


def test_a_context_beyond_the_machines_memory_is_refused_at_load(tiny_engine, monkeypatch):
    """The KV bytes of the context a load chooses are compared with the machine's memory (here pretended
    to be 100 KiB: the tiny caches at 256 tokens need 192 KiB), before any allocation."""
    from edgespec.engines import context

    m = load_manifest(tiny_engine)
    monkeypatch.setattr(context, "memory_bytes", lambda: 100 << 10)
    with pytest.raises(context.ContextError, match=r"context of 256 tokens needs .* more than this machine's"):
        context.at_load(m, 256, "fp32")
    assert context.at_load(m, 128, "fp32").max_len == 128
    monkeypatch.setattr(context, "memory_bytes", lambda: 1 << 20)
    assert context.at_load(m, 256, "fp32").max_len == 256


@pytest.mark.parametrize(
    "max_len, match",
    [
        (8, r"max_len = 8, but its own graphs need at least 16 \(the target's widest call is 16 tokens"),
        (0, "max_len = 0, it must be >= 1"),
        (250, "max_len = 250, not a multiple of kv_bucket = 32"),
    ],
)
def test_a_max_len_the_graphs_cannot_run_is_refused(tiny_engine, tmp_path, capsys, max_len, match):
    folder = _edited(tiny_engine, tmp_path, lambda d: d.update(max_len=max_len))
    with pytest.raises(ManifestError, match=match):
        load_manifest(folder)
    rc, err = run_cli(capsys, "generate", "--engine", folder, "--prompt", "hi")  # max_len 8: an AssertionError before
    assert rc == 2 and f"max_len = {max_len}" in one_line_error(err, "generate")


# ---- item 4: the one-line path covers what folder loading can raise ------------------------------


@pytest.mark.parametrize(
    "error",
    [
        ImportError("No module named 'cuda'", name="cuda"),
        OverflowError("number too large to fit in target type"),
        TypeError("data type 'float99' not understood"),
        MemoryError("Unable to allocate 715. GiB for an array"),
    ],
)
def test_load_errors_are_one_line_naming_the_type_and_folder(tiny_engine, capsys, monkeypatch, error):
    def fail(*a, **k):
        raise error

    monkeypatch.setattr("edgespec.runtime.generator.make_engines", fail)
    with pytest.raises(FolderLoadError, match=f"{type(error).__name__}: {error}") as e:
        Generator.load(tiny_engine, RuntimeConfig(drafter="none"))
    assert e.value.__cause__ is error  # the original stays chained for a traceback
    rc, err = run_cli(capsys, "generate", "--engine", tiny_engine, "--prompt", "hi")
    line = one_line_error(err, "generate")
    assert rc == 2 and f"{tiny_engine}: loading the engine folder failed with {type(error).__name__}" in line
    assert "Hint: install the missing package (cuda)" in line if isinstance(error, ImportError) else "re-export" in line


def test_errors_outside_folder_loading_are_not_swallowed(tiny_engine, capsys, monkeypatch):
    def bug(*a, **k):
        raise TypeError("a bug in generation")

    monkeypatch.setattr(Generator, "stream_text", bug)
    with pytest.raises(TypeError, match="a bug in generation"):
        main(["generate", "--engine", str(tiny_engine), "--prompt", "hi"])


# ---- also seen: a changed vocab size, chat's /help ----------------------------------------------------


def test_a_changed_vocab_size_is_reported_as_the_vocab_size(tiny_engine, tmp_path, capsys):
    def vocab(d):
        _no_drafters(d)
        d["target"]["arch"]["vocab_size"] = 300

    folder = _edited(tiny_engine, tmp_path, vocab)
    rc, err = run_cli(capsys, "generate", "--engine", folder, "--prompt", "hi")
    line = one_line_error(err, "generate")
    assert rc == 2 and "target vocab_size = 300, but its graph's logits output is 256 wide" in line


def test_a_vocab_size_edited_with_the_graph_spec_is_named_by_the_graph(tiny_engine, tmp_path, capsys):
    """The manifest edited consistently (arch and declared logits): the ONNX graph itself says 256."""

    def vocab(d):
        _no_drafters(d)
        d["target"]["arch"]["vocab_size"] = 300
        d["target"]["graph"]["outputs"][0]["shape"][-1] = 300

    folder = _edited(tiny_engine, tmp_path, vocab)
    rc, err = run_cli(capsys, "generate", "--engine", folder, "--prompt", "hi")
    line = one_line_error(err, "generate")
    assert rc == 2 and "says target vocab_size = 300, but target.onnx's logits output has 256 there" in line


def test_chat_help_lists_only_the_drafters_the_folder_runs(tiny_engine, tmp_path):
    folder = _edited(tiny_engine, tmp_path, _no_drafters)
    g = Generator.load(folder, RuntimeConfig(drafter="ngram", k=3))
    help_ = handle_command("/help", g, ChatSettings(), [])
    model_free = {"none", "ngram", "suffix", "recycle", "merged"}
    assert set(_help_drafters(help_)) == model_free
    g = Generator.load(tiny_engine, RuntimeConfig(drafter="ngram", k=3))  # the folder with a draft model
    assert set(_help_drafters(handle_command("/help", g, ChatSettings(), []))) == model_free | {"draft"}


def _help_drafters(help_: str) -> list[str]:
    line = next(x for x in help_.splitlines() if x.strip().startswith("/drafter NAME"))
    return line.split("NAME", 1)[1].strip().split(" | ")
