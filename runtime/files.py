"""Files a command reads or writes, checked before any heavy work, and state files written whole.

A path a user names may be missing, a folder, a FIFO (reading it blocks until a writer comes), a
device (/dev/zero never ends), unreadable, empty, too big or not text: `input_file` / `read_text`
say which in one line (`InputFileError`, a ValueError: the CLI's `edgespec CMD: error: ...`, exit 2)
from `os.stat` alone, which neither opens nor blocks. `output_file` / `new_folder` do the same for
what a command will write. `write_atomic` writes a state file under a temporary name in its folder
and renames it over the old one, so a kill or a failed write leaves the old file or none, never half
of one; `set_aside` moves a damaged one out of the way (NAME.bad) so the next start is quiet.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

MAX_TEXT_BYTES = 64 << 20  # a text input read whole (warm / quality corpora): past it, cut the file first


class InputFileError(ValueError):
    """A path given on the command line that cannot be read or written as asked."""


def _kind(mode: int) -> str:
    """What a path that is not a regular file is, in words."""
    if stat.S_ISDIR(mode):
        return "a folder"
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device file"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def input_file(path: str | Path, what: str, max_bytes: int | None = None) -> Path:
    """`path` as a regular, readable, non-empty file of at most max_bytes; else InputFileError naming
    `what` (the flag, e.g. "--text") and the fix."""
    p = Path(path)
    try:
        st = p.stat()
    except FileNotFoundError:
        raise InputFileError(f"{what} {p}: no such file") from None
    except OSError as e:
        raise InputFileError(f"{what} {p}: cannot be read ({e.strerror})") from None
    if not stat.S_ISREG(st.st_mode):
        raise InputFileError(f"{what} {p} is {_kind(st.st_mode)}, not a file. Hint: name a regular file")
    if not os.access(p, os.R_OK):
        raise InputFileError(f"{what} {p}: permission denied (not readable by this user)")
    if st.st_size == 0:
        raise InputFileError(f"{what} {p} is empty")
    if max_bytes is not None and st.st_size > max_bytes:
        raise InputFileError(
            f"{what} {p} is {st.st_size / 2**20:,.1f} MiB, over the {max_bytes / 2**20:,.0f} MiB read whole. "
            "Hint: give a part of it (e.g. head -c 10M FILE > part.txt)"
        )
    return p


def read_text(path: str | Path, what: str, max_bytes: int = MAX_TEXT_BYTES) -> str:
    """The UTF-8 text of a checked input file (`input_file`); binary or other encodings are refused."""
    p = input_file(path, what, max_bytes)
    try:
        data = p.read_bytes()
    except OSError as e:
        raise InputFileError(f"{what} {p}: cannot be read ({e.strerror})") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InputFileError(
            f"{what} {p} is not UTF-8 text (byte 0x{data[e.start]:02x} at offset {e.start}). "
            "Hint: convert it (iconv -t UTF-8) or give a text file"
        ) from None


def output_file(path: str | Path, what: str) -> Path:
    """`path` as a file this command may (over)write: its folder exists and it is no folder, FIFO or device."""
    p = Path(path)
    if p.exists() and not p.is_file():
        raise InputFileError(f"{what} {p} is {_kind(p.stat().st_mode)}; name a file to write")
    parent = p.parent
    if not parent.is_dir():
        found = "is a file, not a folder" if parent.exists() else "does not exist"
        raise InputFileError(f"{what} {p}: its folder {parent} {found}")
    if not os.access(parent, os.W_OK) or p.exists() and not os.access(p, os.W_OK):
        raise InputFileError(f"{what} {p}: permission denied (not writable by this user)")
    return p


def new_folder(path: str | Path, what: str) -> Path:
    """`path` as a folder to create: it does not exist yet, and its nearest existing ancestor is a
    writable folder (not a file, which would be a NotADirectoryError midway)."""
    p = Path(path)
    if p.exists() or p.is_symlink():
        raise InputFileError(f"{what} {p} already exists; choose a new folder")
    up = p.parent
    while not up.exists() and up != up.parent:
        up = up.parent
    if not up.is_dir():
        raise InputFileError(f"{what} {p}: {up} is a file, not a folder. Hint: choose a path under a folder")
    if not os.access(up, os.W_OK):
        raise InputFileError(f"{what} {p}: permission denied (cannot create folders in {up})")
    return p


def write_atomic(path: str | Path, write: Callable[[BinaryIO], None]) -> None:
    """`write(f)` into a temporary file beside `path`, then renamed over it (os.replace): a reader
    sees the old file or the new one whole. A failed write removes the temporary file and raises."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_name(f".{p.name}.{os.getpid()}.tmp")  # (per process: two writers never share one)
    try:
        with open(tmp, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, p)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def set_aside(path: str | Path) -> Path | None:
    """Rename a damaged state file to NAME.bad (kept for a look, out of the next start's way); the
    new name, or None where it cannot be renamed (a read-only folder: it is then only ignored)."""
    p = Path(path)
    bad = p.with_name(p.name + ".bad")
    try:
        os.replace(p, bad)
    except OSError:
        return None
    return bad
