"""Setup of ONNX Runtime's C API header (the row kernel's build needs it): fetched from Debian's
libonnxruntime-dev into the build folder's include/ where this system has none."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from edgespec.engines.rowop.build import HEADER, RowopUnavailable, build_dir

DEB_PACKAGE = "libonnxruntime-dev"  # Debian's package with the header (trixie and later)
DEB_SUITE = "trixie"  # where setup looks for it when this system's own lists have none


def fetch_header(verbose: bool = True) -> Path:
    """Put onnxruntime_c_api.h (and its licence) into the build folder's include/ from Debian's
    libonnxruntime-dev: `apt-get download` from this system's lists, else from a private list of
    Debian trixie (nothing is installed; the system's apt configuration is not changed)."""
    dest = build_dir() / "include"
    if (dest / HEADER).is_file():
        return dest
    if not shutil.which("apt-get") or not shutil.which("dpkg-deb"):
        raise RowopUnavailable(f"no apt-get here to fetch {DEB_PACKAGE}; set EDGESPEC_ORT_INCLUDE")
    with tempfile.TemporaryDirectory() as tmp:
        t = Path(tmp)
        got = subprocess.run(["apt-get", "download", DEB_PACKAGE], cwd=t, capture_output=True, text=True)
        if got.returncode:
            opts = _private_apt(t)
            update = subprocess.run(["apt-get", *opts, "update"], capture_output=True, text=True)
            got = subprocess.run(["apt-get", *opts, "download", DEB_PACKAGE], cwd=t, capture_output=True, text=True)
            if got.returncode:
                why = (update.stderr + got.stderr)[-500:]
                raise RowopUnavailable(f"apt-get could not download {DEB_PACKAGE}: {why}")
        deb = next(t.glob(f"{DEB_PACKAGE}_*.deb"))
        subprocess.run(["dpkg-deb", "-x", str(deb), str(t / "x")], check=True)
        header = next((t / "x").rglob(HEADER))
        dest.mkdir(parents=True, exist_ok=True)
        shutil.copy(header, dest / HEADER)
        for doc in (t / "x").rglob("copyright"):
            shutil.copy(doc, dest / "LICENSE.onnxruntime")  # Microsoft's MIT licence, kept beside the header
        if verbose:
            print(f"edgespec: {HEADER} from {deb.name} -> {dest}", file=sys.stderr)
    return dest


def _private_apt(tmp: Path) -> list[str]:
    (tmp / "lists" / "partial").mkdir(parents=True)
    (tmp / "cache" / "archives" / "partial").mkdir(parents=True)
    keyring = "/usr/share/keyrings/debian-archive-keyring.gpg"
    (tmp / "sources.list").write_text(f"deb [signed-by={keyring}] http://deb.debian.org/debian {DEB_SUITE} main\n")
    return [
        "-o", f"Dir::Etc::SourceList={tmp / 'sources.list'}",
        "-o", "Dir::Etc::SourceParts=/nonexistent",
        "-o", f"Dir::State::Lists={tmp / 'lists'}",
        "-o", f"Dir::Cache={tmp / 'cache'}",
        "-o", "Dir::State::status=/dev/null",
    ]  # fmt: skip
