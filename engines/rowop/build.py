"""The row kernel's library: compiled on this machine with its C++ compiler and ONNX Runtime's C API
header into an ignored build folder (a key of the sources, the compiler and the header names it).

The build writes the library's size and sha256 beside it (librowop.so.json) and renames both into
place; a library is loaded only when they match (a truncated file would kill the process with
SIGBUS), else rebuilt once, else refused in one line (`damage()`). `library()` is the built library
of this process (RowopUnavailable says why there is none).

The header comes from EDGESPEC_ORT_INCLUDE, the build folder's include/ (header.py puts it there),
or the system (/usr/include/onnxruntime: Debian's libonnxruntime-dev). It is ONNX Runtime's
(MIT licence); any API version up to the installed runtime's works (the C API is versioned).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

from edgespec.engines.base import EngineError
from edgespec.engines.manifest import sha256_of_file

HEADER = "onnxruntime_c_api.h"
SRC = Path(__file__).parent
# the ops, their ONNX Runtime plumbing and registration, the path's choice: compiled without -m flags
SOURCES = ("registration.cc", "ops.cc", "cpu_features.cc", "matmul.cc", "gather.cc", "attention.cc", "swiglu.cc")
# one variant per op and instruction set, each compiled for its own (ISA_FLAGS; portable: none)
SOURCES += tuple(f"{op}_{isa}.cc" for op in ("matmul", "attention", "swiglu") for isa in ("portable", "avx2", "avx512"))
SOURCES += ("matmul_avxvnni.cc",)
HEADERS = ("matmul.h", "matmul_common.h", "matmul_ymm.h", "attention.h", "attention_impl.h", "swiglu.h")
HEADERS += ("swiglu_impl.h", "vec.h", "vec_x86.h", "half.h", "cpu_features.h", "ops.h")
_FMA_AVX2, _FMA_AVX512 = ("-mavx2", "-mfma", "-mf16c"), ("-mavx512f", "-mfma")  # the float ops' (vec.h)
ISA_FLAGS = {
    "matmul_avx2.cc": ("-mavx2", "-mf16c"),
    "matmul_avxvnni.cc": ("-mavx2", "-mf16c", "-mavxvnni"),
    "matmul_avx512.cc": ("-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512vnni"),
    "attention_avx2.cc": _FMA_AVX2,
    "attention_avx512.cc": _FMA_AVX512,
    "swiglu_avx2.cc": _FMA_AVX2,
    "swiglu_avx512.cc": _FMA_AVX512,
}
# -ffp-contract=off: no fused multiply-adds, so every path rounds where the NumPy reference does
CXXFLAGS = ("-O2", "-std=c++17", "-fPIC", "-ffp-contract=off", "-fno-strict-aliasing")
LIBRARY = "librowop.so"  # the library's name in its keyed build folder
RECORD_SUFFIX = ".json"  # beside it, LIBRARY + this: the size and sha256 the build wrote
SETUP = "python -m edgespec.engines.rowop setup"

# "path" -> Path of the loaded library, or "why" -> str; "damaged" -> the Path of a library found
# damaged in this process (rebuilt or refused)
_LIB: dict[str, object] = {}


class RowopUnavailable(EngineError):
    """The row kernel cannot be built or loaded here (the message says why and what to do)."""


def build_dir() -> Path:
    """Where the library is built: EDGESPEC_ROWOP_BUILD, the source's build/ (ignored by git) where
    writable, else ~/.cache/edgespec/rowop."""
    env = os.environ.get("EDGESPEC_ROWOP_BUILD")
    if env:
        return Path(env)
    local = SRC / "build"
    try:
        local.mkdir(exist_ok=True)
        if os.access(local, os.W_OK):
            return local
    except OSError:
        pass
    return Path.home() / ".cache" / "edgespec" / "rowop"


def find_header() -> Path | None:
    """The folder holding onnxruntime_c_api.h, or None."""
    env = os.environ.get("EDGESPEC_ORT_INCLUDE")
    dirs = ([Path(env)] if env else []) + [
        build_dir() / "include",
        Path("/usr/include/onnxruntime"),
        Path("/usr/local/include/onnxruntime"),
        Path("/usr/include"),
    ]
    return next((d for d in dirs if (d / HEADER).is_file()), None)


def find_compiler() -> str | None:
    return next((c for c in (os.environ.get("CXX"), "g++", "c++", "clang++") if c and shutil.which(c)), None)


def _key(cxx: str, include: Path) -> str:
    h = hashlib.sha256()
    for name in SOURCES + HEADERS:
        h.update((SRC / name).read_bytes())
    h.update((include / HEADER).read_bytes())
    version = subprocess.run([cxx, "--version"], capture_output=True, text=True).stdout
    h.update((version + repr(CXXFLAGS) + repr(ISA_FLAGS)).encode())
    return h.hexdigest()[:16]


def library_file(cxx: str, include: Path) -> Path:
    """Where the library of these sources, this compiler and this header is built (its keyed path)."""
    return build_dir() / _key(cxx, include) / LIBRARY


def record_file(lib: Path) -> Path:
    """The build's record of `lib`: its size and sha256 (JSON)."""
    return lib.with_name(lib.name + RECORD_SUFFIX)


def damage(lib: Path) -> str:
    """What is wrong with the library file `lib` ("" where its size and sha256 are the ones its build
    recorded; "is missing" where there is none): a truncated or foreign file must never be loaded."""
    try:
        st = lib.stat()
    except FileNotFoundError:
        return "is missing"
    except OSError as e:
        return f"cannot be read ({e.strerror})"
    if not stat.S_ISREG(st.st_mode):
        return "is not a regular file"
    rec_path = record_file(lib)
    try:
        rec = json.loads(rec_path.read_text())
    except FileNotFoundError:
        return f"has no checksum record ({rec_path.name}, written by the build)"
    except (OSError, ValueError, UnicodeDecodeError):
        return f"has an unreadable checksum record ({rec_path.name})"
    size, digest = (rec.get("size"), rec.get("sha256")) if isinstance(rec, dict) else (None, None)
    if not isinstance(size, int) or not isinstance(digest, str):
        return f"has an unreadable checksum record ({rec_path.name})"
    if st.st_size != size:
        what = "is empty" if st.st_size == 0 else f"is {st.st_size:,} bytes"
        return f"{what}, its build wrote {size:,} (truncated or replaced)"
    try:
        got = sha256_of_file(lib)
    except OSError as e:
        return f"cannot be read ({e.strerror})"
    if got != digest:
        return f"does not match its build's sha256 ({got[:16]}..., recorded {digest[:16]}...)"
    return ""


def build_library(verbose: bool = False) -> Path:
    """The library (compiled now where its keyed path holds none, or one whose size and sha256 are
    not its build's record: rebuilt once); returns its path. RowopUnavailable says why there is none,
    in one line naming the file and what to do."""
    cxx, include = find_compiler(), find_header()
    if cxx is None:
        raise RowopUnavailable("no C++ compiler (g++, c++, clang++ or $CXX). Hint: apt-get install g++")
    if include is None:
        from edgespec.engines.rowop.header import DEB_PACKAGE

        raise RowopUnavailable(
            f"no {HEADER} (ONNX Runtime's C API header). Hint: {SETUP} "
            f"(fetches Debian's {DEB_PACKAGE}), or set EDGESPEC_ORT_INCLUDE to a folder with it"
        )
    out = library_file(cxx, include)
    why = damage(out)
    if not why:
        return out
    found = why != "is missing"
    if found:
        _LIB["damaged"] = out
        print(f"edgespec: warning: the row kernel's library {out} {why}; rebuilding it", file=sys.stderr)
    try:
        _install(cxx, include, out, verbose)
    except (RowopUnavailable, OSError) as e:
        if not found and isinstance(e, RowopUnavailable):
            raise
        raise RowopUnavailable(
            f"the row kernel's library {out} {why}, and building it failed ({one_line(str(e), 300)}). "
            f"Hint: fix the build, then {SETUP} (or delete {out.parent})"
        ) from None
    why = damage(out)
    if why:  # another process replaced it mid-way, or the disk lost it
        raise RowopUnavailable(
            f"the row kernel's library {out} {why} right after its build. Hint: delete {out.parent}, then {SETUP}"
        )
    return out


def _compile(cxx: str, include: Path, folder: Path, verbose: bool) -> Path:
    """Compile and link the library into `folder` (a temporary one); returns its path there."""
    objs = []
    for name in SOURCES:
        obj = folder / (name + ".o")
        cmd = [cxx, *CXXFLAGS, *ISA_FLAGS.get(name, ()), "-I", str(SRC), "-I", str(include), "-c"]
        _run(cmd + [str(SRC / name), "-o", str(obj)], verbose)
        objs.append(str(obj))
    lib = folder / LIBRARY
    _run([cxx, "-shared", "-o", str(lib), *objs], verbose)
    return lib


def _install(cxx: str, include: Path, out: Path, verbose: bool) -> None:
    """Build into a temporary folder beside `out`, record the library's size and sha256, and rename
    both into place: a kill mid-build leaves nothing at `out` (a whole file or none), and a
    library renamed in without its record (or the other way round) is a mismatch, rebuilt."""
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent, prefix=".build-") as tmp:
        lib = _compile(cxx, include, Path(tmp), verbose)
        rec = Path(tmp) / (LIBRARY + RECORD_SUFFIX)
        rec.write_text(json.dumps({"file": LIBRARY, "size": lib.stat().st_size, "sha256": sha256_of_file(lib)}) + "\n")
        os.replace(lib, out)
        os.replace(rec, record_file(out))


def one_line(text: str, limit: int) -> str:
    """text on one line (its whitespace runs as single spaces), its last `limit` characters."""
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else "..." + flat[-limit:]


def _run(cmd: list[str], verbose: bool) -> None:
    if verbose:
        print(" ".join(cmd), file=sys.stderr)
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode:
        if verbose:
            print(r.stderr, file=sys.stderr)
        raise RowopUnavailable(f"the build failed: {' '.join(cmd[:2])} ...: {one_line(r.stderr, 600)}")


def library() -> Path:
    """The built library (built now if needed); RowopUnavailable says why there is none."""
    if "path" not in _LIB and "why" not in _LIB:
        try:
            _LIB["path"] = build_library()
        except (RowopUnavailable, OSError) as e:
            _LIB["why"] = str(e)
    if "why" in _LIB:
        raise RowopUnavailable(str(_LIB["why"]))
    return _LIB["path"]  # type: ignore[return-value]


def damaged() -> Path | None:
    """The library this process found damaged at its keyed path (then rebuilt, or refused), or None."""
    return _LIB.get("damaged")  # type: ignore[return-value]
