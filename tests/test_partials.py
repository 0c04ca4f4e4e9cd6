"""Partial folders (export/partials.py): a cleanup removes only what edgespec created (its marker
inside, the pid gone), never a folder merely named like a partial; the write path never removes
a foreign folder at its own temporary name."""

import json
import os
import socket
import subprocess
import sys

import pytest

from edgespec.export import partials


@pytest.fixture(scope="module")
def dead_pid():
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def _folder(path, marker_pid=None):
    path.mkdir()
    (path / "data.bin").write_bytes(b"x" * 100)
    if marker_pid is not None:
        partials.mark(path, marker_pid)
    return path


def test_only_marked_partials_of_dead_pids_are_removed(tmp_path, dead_pid, capsys):
    ours = _folder(tmp_path / f".e.partial-{dead_pid}", dead_pid)
    users = _folder(tmp_path / ".NAME.partial-999999")  # the case: a user's folder, no marker
    users_dead = _folder(tmp_path / f".notes.partial-{dead_pid}")  # no marker, the pid dead: kept
    alive = _folder(tmp_path / f".busy.partial-{os.getppid()}", os.getppid())
    other_pid = _folder(tmp_path / f".x.partial-{dead_pid}", os.getppid())  # marker names another pid
    other_host = _folder(tmp_path / f".h.partial-{dead_pid}")
    (other_host / partials.MARKER).write_text(json.dumps({"by": "edgespec", "pid": dead_pid, "host": "elsewhere"}))
    garbage = _folder(tmp_path / f".g.partial-{dead_pid}")
    (garbage / partials.MARKER).write_text("not json")
    link = tmp_path / f".l.partial-{dead_pid}"
    link.symlink_to(ours, target_is_directory=True)  # a link to a marked folder: not followed

    assert partials.clean_stale_partials(tmp_path) == [ours]
    assert not ours.exists()
    for kept in (users, users_dead, alive, other_pid, other_host, garbage):
        assert (kept / "data.bin").is_file(), kept
    assert link.is_symlink()
    err = capsys.readouterr().err
    assert f"removed {ours}" in err and f"pid {dead_pid}" in err and err.count("\n") == 1


def test_make_partial_refuses_a_foreign_folder_at_its_name(tmp_path):
    out = tmp_path / "e"
    foreign = _folder(partials.partial_path(out))  # a folder of the user's at this process's temporary name
    with pytest.raises(partials.PartialFolderError, match="move it away") as e:
        partials.make_partial(out)
    assert "\n" not in str(e.value) and (foreign / "data.bin").is_file()


def test_make_partial_marks_replaces_its_own_and_finishes_clean(tmp_path, dead_pid):
    out = tmp_path / "e"
    tmp = partials.make_partial(out)
    assert partials.marker_pid(tmp) == os.getpid()
    rec = json.loads((tmp / partials.MARKER).read_text())
    assert rec == {"by": "edgespec", "pid": os.getpid(), "host": socket.gethostname()}
    (tmp / "old").write_text("left by an earlier try in this process")
    tmp = partials.make_partial(out)  # its own earlier folder: replaced
    assert not (tmp / "old").exists()
    (tmp / "model").write_text("m")
    assert partials.finish_partial(tmp, out) == out
    assert sorted(p.name for p in out.iterdir()) == ["model"] and not tmp.exists()


def test_remove_partial_removes_only_its_own(tmp_path, dead_pid):
    foreign = _folder(tmp_path / "x")
    partials.remove_partial(foreign)
    dead = _folder(tmp_path / "y", dead_pid)
    partials.remove_partial(dead)  # another process's: the cleanup's to judge, not this
    assert (foreign / "data.bin").is_file() and (dead / "data.bin").is_file()
    own = partials.make_partial(tmp_path / "z")
    partials.remove_partial(own)
    assert not own.exists()
