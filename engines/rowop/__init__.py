"""edgespec's row kernel: an ONNX Runtime custom op (C++, built on this machine) for y = x W with
4- or 8-bit block-quantized W, the activations quantized to int8 per row and per block, exact
int32 sums and one float scale per block and row (the arithmetic: rowop.h). Every factor of a row's
result depends on that row alone, so its bits do not depend on how many rows share the call.

- `library()`: the compiled library, built on first use into an ignored build folder (the source's
  hash names it) with the machine's C++ compiler and ONNX Runtime's C API header; `unavailable()`
  says why there is none (no compiler, no header, a failed build) instead of raising. The build
  writes the library's size and sha256 beside it (librowop.so.json) and renames both into place;
  a library is loaded only when they match (a truncated file would kill the process with SIGBUS),
  else rebuilt once, else refused in one line (`damage()`).
- `pack()`: a linear's blocks in the kernel's layout (panels of 16 outputs, one record per block),
  written by the export; `reference()`: the same arithmetic in NumPy (the tests compare bitwise).
- `register(so)`: ONNX Runtime session options that can run the op.

    python -m edgespec.engines.rowop setup   # fetch the header if missing (Debian's libonnxruntime-dev), build
    python -m edgespec.engines.rowop info    # the library, the header, the path this CPU runs

The header comes from EDGESPEC_ORT_INCLUDE, the build folder's include/ (setup puts it there),
or the system (/usr/include/onnxruntime: Debian's libonnxruntime-dev). It is ONNX Runtime's
(MIT licence); any API version up to the installed runtime's works (the C API is versioned).
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from edgespec.engines.base import EngineError

DOMAIN = "edgespec.rowop"  # the op's ONNX domain
OP_TYPE = "RowMatMul"
GATHER_TYPE = "RowGather"  # rows of a packed linear as floats (an embedding read from its tied LM head)
WEIGHT_SUFFIX = ".rowop"  # a linear's packed weights are stored as "<name>.rowop"
PANEL = 16  # outputs per panel (rowop.h kPanel)
PATHS = ("avx512vnni", "avxvnni", "avx2", "portable")  # instruction-set paths, best first
ISA_ENV = "EDGESPEC_ROWOP_ISA"  # forces a path (tests); read when a session registers the library
HEADER = "onnxruntime_c_api.h"

SRC = Path(__file__).parent
SOURCES = ("op.cc", "k_portable.cc", "k_avx2.cc", "k_avxvnni.cc", "k_avx512.cc", "a_portable.cc", "a_avx2.cc")
SOURCES += ("a_avx512.cc",)  # a_*: the attention op (attention.h)
HEADERS = ("rowop.h", "common.h", "ymm.h", "attention.h", "attention_impl.h")
# per source: the instruction sets it is compiled for (op.cc and the portable path: none)
ISA_FLAGS = {
    "k_avx2.cc": ("-mavx2", "-mf16c"),
    "k_avxvnni.cc": ("-mavx2", "-mf16c", "-mavxvnni"),
    "k_avx512.cc": ("-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512vnni"),
    "a_avx2.cc": ("-mavx2", "-mfma", "-mf16c"),
    "a_avx512.cc": ("-mavx512f", "-mfma"),
}
# -ffp-contract=off: no fused multiply-adds, so every path rounds where the NumPy reference does
CXXFLAGS = ("-O2", "-std=c++17", "-fPIC", "-ffp-contract=off", "-fno-strict-aliasing")
DEB_PACKAGE = "libonnxruntime-dev"  # Debian's package with the header (trixie and later)
DEB_SUITE = "trixie"  # where setup looks for it when this system's own lists have none

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


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


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
        got = _sha256(lib)
    except OSError as e:
        return f"cannot be read ({e.strerror})"
    if got != digest:
        return f"does not match its build's sha256 ({got[:16]}..., recorded {digest[:16]}...)"
    return ""


def build(verbose: bool = False) -> Path:
    """The library (compiled now where its keyed path holds none, or one whose size and sha256 are
    not its build's record: rebuilt once); returns its path. RowopUnavailable says why there is none,
    in one line naming the file and what to do."""
    cxx, include = find_compiler(), find_header()
    if cxx is None:
        raise RowopUnavailable("no C++ compiler (g++, c++, clang++ or $CXX). Hint: apt-get install g++")
    if include is None:
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
            f"the row kernel's library {out} {why}, and building it failed ({_one_line(str(e), 300)}). "
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
        rec.write_text(json.dumps({"file": LIBRARY, "size": lib.stat().st_size, "sha256": _sha256(lib)}) + "\n")
        os.replace(lib, out)
        os.replace(rec, record_file(out))


def _one_line(text: str, limit: int) -> str:
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
        raise RowopUnavailable(f"the build failed: {' '.join(cmd[:2])} ...: {_one_line(r.stderr, 600)}")


def library() -> Path:
    """The built library (built now if needed); RowopUnavailable says why there is none."""
    if "path" not in _LIB and "why" not in _LIB:
        try:
            _LIB["path"] = build()
        except (RowopUnavailable, OSError) as e:
            _LIB["why"] = str(e)
    if "why" in _LIB:
        raise RowopUnavailable(str(_LIB["why"]))
    return _LIB["path"]  # type: ignore[return-value]


def damaged() -> Path | None:
    """The library this process found damaged at its keyed path (then rebuilt, or refused), or None."""
    return _LIB.get("damaged")  # type: ignore[return-value]


def unavailable() -> str:
    """Why the op cannot run in this process ("" where it can): no library, or a refused path."""
    try:
        path, why = _native().edgespec_rowop_path, ctypes.c_char_p()
    except RowopUnavailable as e:
        return str(e)
    name = path(ctypes.byref(why))
    return "" if name else why.value.decode()


def _native() -> ctypes.CDLL:
    path = library()  # its size and sha256 checked: a truncated file is never mapped
    try:
        lib = ctypes.CDLL(str(path))
    except OSError as e:
        raise RowopUnavailable(
            f"the row kernel's library {path} does not load ({_one_line(str(e), 300)}). Hint: delete "
            f"{path.parent}, then {SETUP}"
        ) from None
    lib.edgespec_rowop_path.restype = ctypes.c_char_p
    lib.edgespec_rowop_path.argtypes = [ctypes.POINTER(ctypes.c_char_p)]
    lib.edgespec_rowop_runs.argtypes = [ctypes.c_char_p]
    lib.edgespec_rowop_matmul.argtypes = [ctypes.c_char_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
    lib.edgespec_rowop_matmul.argtypes += [ctypes.c_void_p, ctypes.c_void_p]
    lib.edgespec_rowop_gather.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p]
    lib.edgespec_rowop_gather.argtypes += [ctypes.c_void_p]
    return lib


def cpu_path() -> str:
    """The instruction-set path a session gets now ("" where none: unavailable() says why)."""
    try:
        return _native().edgespec_rowop_path(ctypes.byref(ctypes.c_char_p())).decode()
    except RowopUnavailable:
        return ""


def cpu_runs(path: str) -> bool:
    """This CPU runs the named path (PATHS)."""
    return bool(_native().edgespec_rowop_runs(path.encode()))


def register(so, layout: int = 0) -> None:
    """Let sessions made with these onnxruntime.SessionOptions run the op (RowopUnavailable if not).
    layout: the record layout the folder's manifest states (ModelSpec.rowop_layout; 0: not stated)."""
    if layout > LAYOUT_VERSION:
        raise RowopUnavailable(
            f"this folder's linears are packed in the row kernel's record layout {layout}, and this edgespec "
            f"reads layouts 1..{LAYOUT_VERSION}. Hint: update edgespec, or re-export the folder with this one"
        )
    why = unavailable()
    if why:
        raise RowopUnavailable(
            f"this folder's linears run edgespec's row kernel (exported with --int4-kernel rowop), which is not "
            f"available here: {why}. Hint: {SETUP}, or re-export with --int4-kernel nbits"
        )
    so.register_custom_ops_library(str(library()))


def needs(weight_names) -> bool:
    """A model whose weights include packed row-kernel weights (its graph calls the op)."""
    return any(n.endswith(WEIGHT_SUFFIX) for n in weight_names)


# ---- the layout ---------------------------------------------------------------------------------
SUPER = 256  # inputs per super-block of sub-scale records (rowop.h Layout::kSuper: GGUF's K-quants)
ATTRS = ("K", "N", "bits", "block_size", "zero_point", "mins", "f16", "sub")  # the op's attributes, in order
DEFAULTS = {"sub": 0}  # attributes a folder exported before them lacks (the op reads these then)
LAYOUT_VERSION = 2  # the records this edgespec writes: 1 = 4/8-bit codes, fp16/fp32 scales per block;
#                     2 adds 5/6-bit codes and K-quant sub-scale codes (the op still reads 1's records)


@dataclass(frozen=True)
class SubScales:
    """A K-quant's block scales and minimums as GGUF stores them: per block of the linear
    d = D * sc and m = -(Dmin * mn) in fp32 (exact: an fp16 times an integer of at most 8 bits),
    D and Dmin fp16 per super-block of 256 inputs."""

    d: np.ndarray  # [N, K / 256] float32, every one an fp16: the super-block scales D
    sc: np.ndarray  # [N, K / block_size] int8: the sub-scale codes (Q4_K/Q5_K 0..63, Q6_K signed)
    dmin: np.ndarray | None  # [N, K / 256] float32 fp16 values: Dmin; None without minimums
    mn: np.ndarray | None  # [N, K / block_size] int8 (0..63): the sub-minimum codes; None without minimums

    def scales(self) -> np.ndarray:
        """[N, K / bs] float32 d = D * sc, as the kernel computes it."""
        r = self.sc.shape[1] // self.d.shape[1]
        return np.repeat(self.d.astype(np.float32), r, axis=1) * self.sc.astype(np.float32)

    def mins(self) -> np.ndarray | None:
        """[N, K / bs] float32 m = -(Dmin * mn), as the kernel computes it; None without minimums."""
        if self.mn is None or self.dmin is None:
            return None
        r = self.mn.shape[1] // self.dmin.shape[1]
        return -(np.repeat(self.dmin.astype(np.float32), r, axis=1) * self.mn.astype(np.float32))

    def fields(self) -> tuple:
        return (self.d, self.sc, self.dmin, self.mn)

    def rows(self, r0: int, r1: int) -> SubScales:
        return SubScales(*(None if a is None else a[r0:r1] for a in self.fields()))

    def taken(self, index) -> SubScales:
        """Rows in another order (index: a row permutation)."""
        return SubScales(*(None if a is None else np.ascontiguousarray(a[index]) for a in self.fields()))

    @staticmethod
    def concat(parts: list[SubScales]) -> SubScales | None:
        """Row-wise concatenation; None where the parts differ in minimums or block size."""
        if len({p.mn is None for p in parts}) > 1 or len({p.sc.shape[1] for p in parts}) > 1:
            return None
        cols = zip(*(p.fields() for p in parts), strict=True)
        return SubScales(*(None if c[0] is None else np.concatenate(c) for c in cols))


@dataclass(frozen=True)
class Packed:
    """One linear in the kernel's layout, and the values the kernel multiplies by (the reference's)."""

    data: np.ndarray  # [panels * blocks * record] uint8: the op's weight input
    attrs: dict  # the op's attributes (ATTRS)
    codes: np.ndarray  # [N, K] uint8 codes
    scales: np.ndarray  # [N, K / bs] float32 d
    zero_points: np.ndarray  # [N, K / bs] int32 z (0 where none)
    mins: np.ndarray | None  # [N, K / bs] float32 m, or None
    sub: SubScales | None = None  # the sub-scale codes d and m were computed from (attrs sub 1), else None


@dataclass(frozen=True)
class PackChoices:
    """What pack decides from the whole matrix's scales, zero points, minimums and codes."""

    fold: bool  # zero points folded into the minimums (m - d z, exact in fp32 for every block)
    zero_point: int  # the zero point every block shares after folding (the op's attribute); -1: per output
    f16: bool  # scales and minimums stored as fp16 (every one exactly an fp16)
    bits: int = 0  # the records' code width (4, 5, 6, 8: the narrowest the codes fit); 0: pack's bits
    sub: bool = False  # scales and minimums stored as their sub-scale codes (SubScales reproduce them)


def _narrowest(bits: int, codes_max: int | None, block_size: int, zp: int) -> int:
    """The record width for codes < 2**bits whose largest is codes_max (5 only in blocks of 32)."""
    if codes_max is None or bits == 4:
        return bits
    for w in (4, 5, 6):
        if w < bits and codes_max < 1 << w and zp < 1 << w and (w != 5 or block_size == 32):
            return w
    return bits


def _sub_fits(sub: SubScales, d: np.ndarray, z: np.ndarray, m: np.ndarray | None) -> bool:
    """The sub-scale codes reproduce the blocks' d and (folded) m, with no per-block zero point."""
    n, nb = d.shape
    if sub.sc.shape != (n, nb) or sub.d.shape[0] != n or nb % max(1, sub.d.shape[1]) or not sub.d.shape[1]:
        return False
    if (sub.mn is None) != (m is None) or not (z == z.flat[0]).all():
        return False
    halves = [a for a in (sub.d, sub.dmin) if a is not None]
    if not all(np.array_equal(a.astype(np.float16).astype(np.float32), a) for a in halves):
        return False
    if not np.array_equal(sub.scales(), d):
        return False
    return m is None or np.array_equal(sub.mins(), m)


def pack_choices(
    scales: np.ndarray,
    zero_points: np.ndarray | None,
    mins: np.ndarray | None,
    bits: int = 0,
    block_size: int = 32,
    codes_max: int | None = None,
    sub: SubScales | None = None,
) -> PackChoices:
    """pack's decisions for blocks d (scales [N, nb]), z (zero points) and m (minimums, or None);
    with bits (the blocks' width) and codes_max (their largest code) the narrowest record width,
    with sub (the K-quant's own codes) whether they are stored instead of d and m."""
    d = np.asarray(scales, np.float32)
    z = np.zeros(d.shape, np.int32) if zero_points is None else np.asarray(zero_points, np.int32).reshape(d.shape)
    m = None if mins is None else np.asarray(mins, np.float32).reshape(d.shape)
    fold = False
    if m is not None and z.any():
        folded = m.astype(np.float64) - d.astype(np.float64) * z
        if np.array_equal(folded.astype(np.float32).astype(np.float64), folded):
            m, z, fold = folded.astype(np.float32), np.zeros_like(z), True
    zp = 0 if not z.any() else (int(z.flat[0]) if (z == z.flat[0]).all() else -1)
    f16 = all(np.array_equal(a.astype(np.float16).astype(np.float32), a) for a in (d, m) if a is not None)
    k = d.shape[1] * block_size
    use_sub = sub is not None and bits > 0 and k % SUPER == 0 and zp >= 0 and _sub_fits(sub, d, z, m)
    width = _narrowest(bits, codes_max, block_size, zp) if bits else 0
    return PackChoices(fold, zp, f16, width, use_sub)


def _code_bytes(codes: np.ndarray, bits: int, p: int, nb: int, g: int) -> np.ndarray:
    """Codes [P, nb, g, 64] (byte 4n + j of group g) -> the records' code bytes [P, nb, bs * 16 * bits / 8]."""
    if bits == 8:
        return codes.reshape(p, nb, -1)
    low = codes & 0x0F
    parts = [(low[:, :, : g // 2] | (low[:, :, g // 2 :] << 4)).reshape(p, nb, -1)]  # chunk i: group i, i + g/2
    high = codes >> 4
    if bits == 6:  # chunk c, bits 2i..2i+1: group c + i g/4
        h = high.reshape(p, nb, 4, g // 4, 64)
        parts.append((h[:, :, 0] | (h[:, :, 1] << 2) | (h[:, :, 2] << 4) | (h[:, :, 3] << 6)).reshape(p, nb, -1))
    elif bits == 5:  # bit i: group i (blocks of 32)
        acc = np.zeros((p, nb, 64), np.uint8)
        for i in range(8):
            acc |= high[:, :, i] << i
        parts.append(acc)
    return np.concatenate(parts, axis=-1)


def _codes_of(c: np.ndarray, bits: int, p: int, nb: int, g: int) -> np.ndarray:
    """_code_bytes' inverse: [P, nb, code bytes] -> [P, nb, g, 64]."""
    if bits == 8:
        return c.reshape(p, nb, g, 64)
    low = c[..., : g * 32].reshape(p, nb, g // 2, 64)
    codes = np.concatenate([low & 0x0F, low >> 4], axis=2)
    if bits == 6:
        h = c[..., g * 32 :].reshape(p, nb, 1, g // 4, 64)
        codes = codes | ((np.concatenate([(h >> (2 * i)) & 3 for i in range(4)], axis=2).reshape(p, nb, g, 64)) << 4)
    elif bits == 5:
        h = c[..., g * 32 :].reshape(p, nb, 1, 64)
        codes = codes | (np.concatenate([(h >> i) & 1 for i in range(8)], axis=2) << 4)
    return codes


def pack(
    codes: np.ndarray,
    scales: np.ndarray,
    zero_points: np.ndarray | None,
    mins: np.ndarray | None,
    bits: int,
    block_size: int,
    choices: PackChoices | None = None,
    sub: SubScales | None = None,
) -> Packed:
    """w[n, k] = d (code - z) (+ m) per block of block_size inputs, in the kernel's layout.

    The zero point becomes an attribute where every block shares it (GGUF's Q4_0 8, Q8_0 128: one
    integer per row and block instead of one per output); with block minimums it is folded into
    them (m - d z) where that is exact in fp32, as GGUF's own Q4_1 minimums are, which saves the
    per-output zero points. Scales and minimums are stored as fp16 where every one is exactly an
    fp16 (GGUF's own are), a sixth less to stream at 4 bits. Codes are stored in the narrowest of
    4, 5, 6 and 8 bits they fit (Q5_x: 5, Q6_K: 6), and a K-quant's scales and minimums as its own
    sub-scale codes under fp16 super-block scales (sub, where they reproduce d and m exactly).
    choices: those decisions taken for the whole matrix (pack_choices) when these rows are a row
    block of it (a multiple of PANEL rows, but the last): the blocks then concatenate to the whole
    matrix's bytes."""
    codes = np.asarray(codes, np.uint8)
    n, k = codes.shape
    nb = k // block_size
    if k % block_size or block_size not in (16, 32) or bits not in (4, 8):
        raise ValueError(f"rowop.pack: K={k}, block_size={block_size}, bits={bits} (16 or 32; 4 or 8)")
    if codes.max(initial=0) >= 1 << bits:
        raise ValueError(f"rowop.pack: codes above {bits} bits")
    d = np.asarray(scales, np.float32).reshape(n, nb)
    z = np.zeros((n, nb), np.int32) if zero_points is None else np.asarray(zero_points, np.int32).reshape(n, nb)
    m = None if mins is None else np.asarray(mins, np.float32).reshape(n, nb)
    ch = choices or pack_choices(d, z, m, bits, block_size, int(codes.max(initial=0)), sub)
    if ch.fold and m is not None:
        m, z = (m.astype(np.float64) - d.astype(np.float64) * z).astype(np.float32), np.zeros_like(z)
    zp, f16, width = ch.zero_point, ch.f16, ch.bits or bits
    if codes.max(initial=0) >= 1 << width:
        raise ValueError(f"rowop.pack: codes above the chosen {width} bits")
    use_sub = ch.sub and sub is not None
    if ch.sub and not use_sub:
        raise ValueError("rowop.pack: the choices store sub-scale codes, and none were given")
    if use_sub:
        d, m = sub.scales(), sub.mins()  # the same values (pack_choices checked), with the kernel's bits
    p = -(-n // PANEL)
    pad = p * PANEL - n

    def panels(a: np.ndarray) -> np.ndarray:  # [N, cols] -> [P, cols, 16]
        cols = a.shape[1]
        a = np.concatenate([a, np.zeros((pad, cols), a.dtype)]) if pad else a
        return a.reshape(p, PANEL, cols).transpose(0, 2, 1)

    g = block_size // 4
    c = np.concatenate([codes, np.zeros((pad, k), np.uint8)]) if pad else codes
    c = c.reshape(p, PANEL, nb, g, 4).transpose(0, 2, 3, 1, 4).reshape(p, nb, g, 64)  # byte 4n + j of group g
    parts = [_code_bytes(c, width, p, nb, g)]
    if use_sub:

        def stored(a: np.ndarray, dtype) -> np.ndarray:
            return np.ascontiguousarray(panels(a.astype(dtype))).view(np.uint8)

        parts += [stored(a, np.int8) for a in (sub.sc, sub.mn) if a is not None]
        recs = np.concatenate(parts, axis=-1).reshape(p, k // SUPER, -1)  # a super-block's records
        head = [stored(a, np.float16) for a in (sub.d, sub.dmin) if a is not None]
        data = np.ascontiguousarray(np.concatenate([*head, recs], axis=-1)).reshape(-1)
    else:
        for a in (d, m):
            if a is not None:
                parts.append(np.ascontiguousarray(panels(a.astype(np.float16 if f16 else np.float32))).view(np.uint8))
        if zp < 0:
            parts.append(np.ascontiguousarray(panels(z.astype(np.uint8))))
        data = np.ascontiguousarray(np.concatenate(parts, axis=-1)).reshape(-1)
    attrs = dict(K=k, N=n, bits=width, block_size=block_size, zero_point=zp, mins=int(m is not None), f16=int(f16))
    attrs["sub"] = int(use_sub)
    if use_sub:
        z = np.full((n, nb), zp, np.int32)
    return Packed(data, attrs, codes, d, z, m, sub if use_sub else None)


def unpack(data: np.ndarray, attrs: dict) -> Packed:
    """A packed linear read back (pack's inverse: the folder's weights, checked by the tests)."""
    k, n, bits, bs = attrs["K"], attrs["N"], attrs["bits"], attrs["block_size"]
    nb, g, p = k // bs, bs // 4, -(-n // PANEL)
    f16, has_mins, zp, sub = bool(attrs["f16"]), bool(attrs["mins"]), attrs["zero_point"], bool(attrs.get("sub", 0))
    code_bytes, scale_bytes = bs * PANEL * bits // 8, PANEL * (2 if f16 else 4)

    def per_output(a: np.ndarray) -> np.ndarray:  # [P, cols, 16] -> [N, cols]
        return a.transpose(0, 2, 1).reshape(p * PANEL, a.shape[1])[:n]

    raw = np.asarray(data, np.uint8)
    if sub:
        nh = 1 + has_mins
        sup = raw.reshape(p, k // SUPER, -1)
        head = sup[..., : nh * 2 * PANEL]
        rec = sup[..., nh * 2 * PANEL :].reshape(p, nb, -1)

        def field(a: np.ndarray, at: int, size: int, dtype) -> np.ndarray:
            return per_output(np.ascontiguousarray(a[..., at : at + size]).view(dtype))

        halves = [field(head, 2 * PANEL * i, 2 * PANEL, np.float16) for i in range(nh)]
        codes8 = [field(rec, code_bytes + PANEL * i, PANEL, np.int8) for i in range(nh)]
        s = SubScales(halves[0].astype(np.float32), codes8[0], halves[1].astype(np.float32) if has_mins else None,
                      codes8[1] if has_mins else None)  # fmt: skip
        scales, mins, z = s.scales(), s.mins(), np.full((n, nb), zp, np.int32)
    else:
        rec = raw.reshape(p, nb, -1)
        at = code_bytes
        scale_type = np.float16 if f16 else np.float32
        fields = []
        for _ in range(1 + has_mins):
            fields.append(per_output(np.ascontiguousarray(rec[..., at : at + scale_bytes]).view(scale_type)))
            at += scale_bytes
        z = per_output(rec[..., at : at + PANEL]).astype(np.int32) if zp < 0 else np.full((n, nb), zp, np.int32)
        scales, mins, s = fields[0].astype(np.float32), fields[1].astype(np.float32) if has_mins else None, None
    c = _codes_of(rec[..., :code_bytes], bits, p, nb, g)
    codes = c.reshape(p, nb, g, PANEL, 4).transpose(0, 3, 1, 2, 4).reshape(p * PANEL, k)[:n]
    return Packed(raw, dict(attrs), codes, scales, z, mins, s)


def dequantized(p: Packed) -> np.ndarray:
    """[N, K] float32: the weights the kernel multiplies by, d (code - z) (+ m) rounded once."""
    n, k = p.codes.shape
    bs = p.attrs["block_size"]
    q = p.codes.reshape(n, -1, bs).astype(np.float64) - p.zero_points[..., None]
    w = q * p.scales[..., None].astype(np.float64)
    if p.mins is not None:
        w = w + p.mins[..., None]
    return w.astype(np.float32).reshape(n, k)


def reference(x: np.ndarray, p: Packed) -> np.ndarray:
    """The op's result in NumPy, the same float32 operations in the same order (rowop.h)."""
    x = np.asarray(x, np.float32)
    k, n, bs = p.attrs["K"], p.attrs["N"], p.attrs["block_size"]
    nb = k // bs
    rows = x.reshape(-1, nb, bs)  # [M, nb, bs]
    a = np.abs(rows).max(axis=-1)  # [M, nb]
    inv = np.divide(np.float32(127), a, out=np.zeros_like(a), where=a > 0)
    s = a / np.float32(127)
    xq = np.clip(np.rint(rows * inv[..., None]), -127, 127).astype(np.int64)
    xsum = xq.sum(axis=-1)  # [M, nb]
    codes = p.codes.astype(np.int64).reshape(n, nb, bs)
    dot = np.einsum("mbk,nbk->mbn", xq, codes) - xsum[..., None] * p.zero_points.T[None]  # [M, nb, N]
    f = dot.astype(np.float32) * p.scales.T[None]
    if p.mins is not None:
        f = f + p.mins.T[None] * xsum.astype(np.float32)[..., None]
    f = f * s[..., None]
    acc = np.zeros((len(rows), n), np.float32)
    for b in range(nb):
        acc = acc + f[:, b]
    return acc.reshape(*x.shape[:-1], n)


def gather_reference(ids: np.ndarray, p: Packed) -> np.ndarray:
    """RowGather in NumPy: rows `ids` of the packed linear as floats [..., K], d (code - z) (+ m) in
    float32, one rounding per operation (as gguf_blocks.Blocks.dequantized computes a GGUF's rows)."""
    ids = np.asarray(ids, np.int64)
    n, k = p.codes.shape
    bs = p.attrs["block_size"]
    q = p.codes[ids].reshape(*ids.shape, k // bs, bs).astype(np.int32) - p.zero_points[ids][..., None]
    w = q.astype(np.float32) * p.scales[ids][..., None]
    if p.mins is not None:
        w = w + p.mins[ids][..., None]
    return w.reshape(*ids.shape, k)


def gather(ids: np.ndarray, p: Packed) -> np.ndarray:
    """The library's RowGather without ONNX Runtime (tests)."""
    ids = np.ascontiguousarray(ids, np.int64)
    y = np.empty((*ids.shape, p.attrs["K"]), np.float32)
    attrs = _attr_array(p.attrs)
    rc = _native().edgespec_rowop_gather(
        attrs.ctypes.data, ids.ctypes.data, ids.size, p.data.ctypes.data, y.ctypes.data
    )
    if rc:
        raise RowopUnavailable("rowop gather: a bad layout or an id outside the table")
    return y


def _attr_array(attrs: dict) -> np.ndarray:
    """The op's attributes as the library's C entry points read them (ATTRS, absent ones defaulted)."""
    return np.array([attrs.get(a, DEFAULTS.get(a, 0)) for a in ATTRS], np.int64)


def matmul(x: np.ndarray, p: Packed, path: str) -> np.ndarray:
    """The library's kernel on one thread with a named path, without ONNX Runtime (tests, benches)."""
    x = np.ascontiguousarray(x, np.float32)
    m = int(np.prod(x.shape[:-1]))
    y = np.empty((*x.shape[:-1], p.attrs["N"]), np.float32)
    attrs = _attr_array(p.attrs)
    ptrs = (attrs.ctypes.data, x.ctypes.data, m, p.data.ctypes.data, y.ctypes.data)
    rc = _native().edgespec_rowop_matmul(path.encode(), *ptrs)
    if rc:
        raise RowopUnavailable(f"rowop path {path!r} does not run on this CPU (or a bad layout)")
    return y


# ---- setup: the header from Debian's package ------------------------------------------------------
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


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    what = args[0] if args else "info"
    if what == "setup":
        try:
            if find_header() is None:
                fetch_header()
            print(f"edgespec: row kernel built: {build(verbose=False)} (this CPU: {cpu_path() or unavailable()})")
        except (RowopUnavailable, OSError, subprocess.CalledProcessError) as e:
            print(f"edgespec: row kernel not built ({e}); the export will not offer it", file=sys.stderr)
            return 1
        return 0
    why = unavailable()
    print(f"header: {find_header()}\ncompiler: {find_compiler()}")
    print(f"library: {_LIB.get('path')}\npath: {cpu_path() or '-'}{'  (' + why + ')' if why else ''}")
    return 0
