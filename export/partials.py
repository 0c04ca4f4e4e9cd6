"""Folders written under a temporary name and renamed when whole (`.NAME.partial-PID` beside NAME),
and the cleanup of those a killed process left behind.

Each such folder holds a marker file (MARKER: edgespec's name, the writing process's pid and host)
from the moment it is created. A cleanup removes a folder only when that marker is there, names
this host and a pid that no longer runs: a folder of the user's that merely looks like a partial
(`.notes.partial-999999`) is never removed.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import sys
from pathlib import Path

MARKER = ".edgespec-partial"  # the file inside every partial folder edgespec creates
WRITER = "edgespec"  # the marker's "by": what wrote it


class PartialFolderError(ValueError):
    """A partial folder's name is taken by something edgespec did not create (the message says what to do)."""


def partial_path(out: Path) -> Path:
    """The temporary folder this process writes `out` into."""
    return out.parent / f".{out.name}.partial-{os.getpid()}"


def marker_pid(folder: Path) -> int | None:
    """The pid in `folder`'s edgespec marker, or None where there is no readable marker of this host."""
    try:
        rec = json.loads((folder / MARKER).read_text())
    except (OSError, ValueError, UnicodeDecodeError):
        return None
    if not isinstance(rec, dict) or rec.get("by") != WRITER or rec.get("host") != socket.gethostname():
        return None  # another host's pid cannot be checked here: left alone
    pid = rec.get("pid")
    return pid if isinstance(pid, int) and not isinstance(pid, bool) and pid > 0 else None


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):  # someone else's process (alive), or no such pid
        return True
    return True


def _stale(folder: Path) -> int | None:
    """The dead pid that left `folder` (edgespec's marker, a name ending in that pid), else None."""
    if folder.is_symlink() or not folder.is_dir():
        return None
    pid = marker_pid(folder)
    if pid is None or folder.name.rsplit("-", 1)[-1] != str(pid) or pid == os.getpid() or _pid_alive(pid):
        return None
    return pid


def make_partial(out: Path) -> Path:
    """A new, empty temporary folder for `out` (partial_path) holding edgespec's marker. A folder
    already there is replaced only where it carries the marker (this pid's earlier run, or a dead
    one's); anything else is refused (PartialFolderError), untouched."""
    tmp = partial_path(out)
    if tmp.exists() or tmp.is_symlink():
        if marker_pid(tmp) != os.getpid() and _stale(tmp) is None:
            raise PartialFolderError(
                f"{tmp} exists and is not edgespec's (no {MARKER} of this process in it); edgespec writes "
                f"{out} through that name. Hint: move it away, or choose another --out"
            )
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    mark(tmp)
    return tmp


def mark(folder: Path, pid: int | None = None) -> None:
    """Write edgespec's marker into `folder`: the writing process (pid, this one by default) and host."""
    rec = {"by": WRITER, "pid": os.getpid() if pid is None else pid, "host": socket.gethostname()}
    (folder / MARKER).write_text(json.dumps(rec) + "\n")


def finish_partial(tmp: Path, out: Path) -> Path:
    """Rename the whole folder `tmp` to `out` (its marker removed first: the folder is no partial now)."""
    (tmp / MARKER).unlink(missing_ok=True)
    tmp.rename(out)
    return out


def remove_partial(tmp: Path) -> None:
    """Remove this process's own partial folder (a failed or interrupted write), only if it carries
    this process's marker."""
    if marker_pid(tmp) == os.getpid() and not tmp.is_symlink():
        shutil.rmtree(tmp, ignore_errors=True)


def clean_stale_partials(parent: Path) -> list[Path]:
    """Remove the `.NAME.partial-PID` folders in `parent` that edgespec created (its marker inside)
    for a process that is gone (killed mid-way); says so on stderr. Returns what was removed."""
    removed = []
    if not parent.is_dir():
        return removed
    for p in sorted(parent.glob(".*.partial-*")):
        pid = _stale(p)
        if pid is None:
            continue
        size = sum(f.stat().st_size for f in p.rglob("*") if f.is_file() and not f.is_symlink()) / 2**20
        shutil.rmtree(p, ignore_errors=True)
        print(f"edgespec: removed {p} ({size:.0f} MiB), left by a run (pid {pid}) that did not finish", file=sys.stderr)
        removed.append(p)
    return removed
