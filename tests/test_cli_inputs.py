"""Issue 56, part B: the paths and numbers `edgespec warm`, `quality` and `export-drafter` read or
write are checked before any model loads: a folder, FIFO, device, missing, unreadable, empty, huge or
non-UTF-8 file, a count below 1, an output under a file, a reference of another vocabulary: each one
line `edgespec CMD: error: ...`, exit code 2, no traceback and no hang (runtime/files.py)."""

import os
import time
from pathlib import Path

import pytest
from helpers.cli import one_line_error, run_cli

# main() runs in this process: its ORT pool must not become the one later tests share
pytestmark = pytest.mark.usefixtures("own_thread_pools")


def _bad_path(kind: str, tmp_path: Path) -> tuple[str, str]:
    """(a path of this kind, what its one-line error must say)."""
    p = tmp_path / f"bad-{kind}"
    if kind == "folder":
        return "/etc", "/etc is a folder, not a file"
    if kind == "missing":
        return str(p), "no such file"
    if kind == "fifo":
        os.mkfifo(p)
        return str(p), "is a FIFO (named pipe), not a file"
    if kind == "device":
        return "/dev/zero", "/dev/zero is a device file, not a file"
    if kind == "empty":
        p.write_bytes(b"")
        return str(p), "is empty"
    if kind == "not_utf8":
        p.write_bytes(b"plain start \xff\xfe\x00 then binary")
        return str(p), "is not UTF-8 text (byte 0xff at offset 12)"
    if kind == "huge":
        with open(p, "wb") as f:
            f.truncate(65 << 20)  # (sparse: no disk written)
        return str(p), "65.0 MiB, over the 64 MiB read whole"
    if kind == "unreadable":
        p.write_text("text")
        p.chmod(0)
        return str(p), "permission denied"
    raise AssertionError(kind)


BAD_FILES = ["folder", "missing", "fifo", "device", "empty", "not_utf8", "huge", "unreadable"]


def _refused(capsys, cmd: str, *argv, says: str) -> str:
    t0 = time.perf_counter()
    rc, err = run_cli(capsys, cmd, *argv)
    line = one_line_error(err, cmd)
    assert rc == 2 and says in line, line
    assert time.perf_counter() - t0 < 5  # no hang on a FIFO or a device, no model loaded
    return line


def _skip_unreadable_as_root(kind: str) -> None:
    if kind == "unreadable" and os.geteuid() == 0:
        pytest.skip("root reads any file")


# ---- edgespec warm -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", BAD_FILES)
def test_warm_text_that_cannot_be_read_is_one_line(kind, tmp_path, capsys):
    _skip_unreadable_as_root(kind)
    path, says = _bad_path(kind, tmp_path)
    line = _refused(capsys, "warm", tmp_path, "--text", path, says=says)
    assert line.startswith("edgespec warm: error: --text ")


@pytest.mark.parametrize("kind", ["folder", "missing", "fifo", "device", "empty"])
def test_warm_keep_out_that_cannot_be_read_is_one_line(kind, tmp_path, capsys):
    good = tmp_path / "corpus.txt"
    good.write_text("some text\n\nmore text\n")
    path, says = _bad_path(kind, tmp_path)
    _refused(capsys, "warm", tmp_path, "--text", good, "--keep-out", path, says=says)


@pytest.mark.parametrize("n", ["0", "-5"])
def test_warm_max_tokens_below_one_is_refused(n, tmp_path, capsys):
    good = tmp_path / "corpus.txt"
    good.write_text("some text\n\nmore text\n")
    _refused(capsys, "warm", tmp_path, "--text", good, "--max-tokens", n, says=f"--max-tokens {n}: give at least 1")


def test_warm_into_something_that_is_no_engine_folder_is_one_line(tmp_path, capsys):
    good = tmp_path / "corpus.txt"
    good.write_text("some text\n\nmore text\n")
    _refused(capsys, "warm", tmp_path / "nowhere", "--text", good, says="nowhere")
    _refused(capsys, "warm", good, "--text", good, says="corpus.txt")


def test_warm_into_a_folder_whose_table_is_a_folder_is_one_line(tiny_engine, tmp_path, capsys):
    from helpers.cli import copy_folder

    folder = copy_folder(tiny_engine, tmp_path / "copy")
    (folder / "recycle.npz").mkdir()  # where the table would be written
    good = tmp_path / "corpus.txt"
    good.write_text("some text\n\nmore text\n")
    _refused(capsys, "warm", folder, "--text", good, says="recycle.npz is a folder; name a file to write")


# ---- edgespec quality --------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", BAD_FILES)
def test_quality_text_that_cannot_be_read_is_one_line(kind, tmp_path, capsys):
    _skip_unreadable_as_root(kind)
    path, says = _bad_path(kind, tmp_path)
    _refused(capsys, "quality", tmp_path, "--reference", tmp_path, "--text", path, says=says)


def test_quality_json_that_cannot_be_written_is_one_line(tmp_path, capsys):
    afile = tmp_path / "afile"
    afile.write_text("x")
    for out, says in [
        (tmp_path, "is a folder; name a file to write"),
        (afile / "q.json", "afile is a file, not a folder"),
        (tmp_path / "no" / "q.json", "does not exist"),
        ("/dev/zero", "is a device file; name a file to write"),
    ]:
        _refused(capsys, "quality", tmp_path, "--reference", tmp_path, "--json", out, says=says)


@pytest.mark.parametrize("kind", ["folder", "fifo", "device"])
def test_quality_gguf_that_is_no_file_is_one_line(kind, tmp_path, capsys):
    path = tmp_path / "model.gguf"
    if kind == "folder":
        path.mkdir()
    elif kind == "fifo":
        os.mkfifo(path)
    else:
        path.symlink_to("/dev/zero")
    _refused(capsys, "quality", path, "--reference", tmp_path, says=f"model {path} is a")


def test_quality_reference_of_another_vocabulary_is_one_line(tiny_engine, tmp_path, capsys):
    pytest.importorskip("torch")
    from tiny import TINY_EXPORT, make_tiny

    from edgespec.export.target.exporter import ExportConfig, export

    src = make_tiny("llama", tmp_path / "src", vocab_size=320)
    kw = TINY_EXPORT | dict(trees=False, max_len=64, k=2)
    other = export(ExportConfig(target=str(src), out=str(tmp_path / "v320"), **kw))
    text = tmp_path / "text.txt"
    text.write_text("def add(a, b):\n    return a + b\n" * 10)
    line = _refused(
        capsys, "quality", other, "--reference", tiny_engine, "--text", text, says="a vocabulary of 320 ids"
    )
    assert "has 256" in line and "Hint:" in line


# ---- edgespec export-drafter -------------------------------------------------------------------------------


def test_export_drafter_out_under_a_file_is_one_line(tmp_path, capsys):
    afile = tmp_path / "afile"
    afile.write_text("x")
    args = ["export-drafter", tmp_path, "--format", "speculators"]
    _refused(capsys, *args, "--out", afile / "x", says="afile is a file, not a folder")
    _refused(capsys, *args, "--out", afile / "x" / "y", says="afile is a file, not a folder")
    _refused(capsys, *args, "--out", afile, says="already exists; choose a new folder")
