"""Running `edgespec` in this process and reading its one-line refusals."""

import shutil
from pathlib import Path

from edgespec.cli import main


def run_cli(capsys, *argv) -> tuple[int, str]:
    """Run `edgespec ARGV` in this process: (exit status, stderr). argparse's own errors exit too."""
    try:
        rc = main([str(a) for a in argv])
    except SystemExit as e:
        rc = e.code
    return rc, capsys.readouterr().err


def one_line_error(err: str, cmd: str) -> str:
    """The `edgespec CMD: error: ...` line of stderr (the only line that is not usage or a warning)."""
    assert "Traceback" not in err, err
    lines = [ln for ln in err.splitlines() if ln.startswith(f"edgespec {cmd}: error: ")]
    assert len(lines) == 1, err
    return lines[0]


def copy_folder(folder: Path, to: Path) -> Path:
    """A copy of an engine folder to break on purpose."""
    shutil.copytree(folder, to)
    return to
