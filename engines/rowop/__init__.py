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


def register(so) -> None:
    """Let sessions made with these onnxruntime.SessionOptions run the op (RowopUnavailable if not)."""
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
@dataclass(frozen=True)
class Packed:
    """One linear in the kernel's layout, and the values the kernel multiplies by (the reference's)."""

    data: np.ndarray  # [panels * blocks * record] uint8: the op's weight input
    attrs: dict  # the op's attributes: K, N, bits, block_size, zero_point, mins, f16
    codes: np.ndarray  # [N, K] uint8 codes
    scales: np.ndarray  # [N, K / bs] float32 d
    zero_points: np.ndarray  # [N, K / bs] int32 z (0 where none)
    mins: np.ndarray | None  # [N, K / bs] float32 m, or None


@dataclass(frozen=True)
class PackChoices:
    """What pack decides from the whole matrix's scales, zero points and minimums."""

    fold: bool  # zero points folded into the minimums (m - d z, exact in fp32 for every block)
    zero_point: int  # the zero point every block shares after folding (the op's attribute); -1: per output
    f16: bool  # scales and minimums stored as fp16 (every one exactly an fp16)


def pack_choices(scales: np.ndarray, zero_points: np.ndarray | None, mins: np.ndarray | None) -> PackChoices:
    """pack's decisions for blocks d (scales [N, nb]), z (zero points) and m (minimums, or None)."""
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
    return PackChoices(fold, zp, f16)


def pack(
    codes: np.ndarray,
    scales: np.ndarray,
    zero_points: np.ndarray | None,
    mins: np.ndarray | None,
    bits: int,
    block_size: int,
    choices: PackChoices | None = None,
) -> Packed:
    """w[n, k] = d (code - z) (+ m) per block of block_size inputs, in the kernel's layout.

    The zero point becomes an attribute where every block shares it (GGUF's Q4_0 8, Q8_0 128: one
    integer per row and block instead of one per output); with block minimums it is folded into
    them (m - d z) where that is exact in fp32, as GGUF's own Q4_1 minimums are, which saves the
    per-output zero points. Scales and minimums are stored as fp16 where every one is exactly an
    fp16 (GGUF's own are), a sixth less to stream at 4 bits. choices: those three decisions taken
    for the whole matrix (pack_choices) when these rows are a row block of it (a multiple of PANEL
    rows, but the last): the blocks then concatenate to the whole matrix's bytes."""
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
    ch = choices or pack_choices(d, z, m)
    if ch.fold and m is not None:
        m, z = (m.astype(np.float64) - d.astype(np.float64) * z).astype(np.float32), np.zeros_like(z)
    zp, f16 = ch.zero_point, ch.f16
    p = -(-n // PANEL)
    pad = p * PANEL - n

    def panels(a: np.ndarray) -> np.ndarray:  # [N, nb] -> [P, nb, 16]
        a = np.concatenate([a, np.zeros((pad, nb), a.dtype)]) if pad else a
        return a.reshape(p, PANEL, nb).transpose(0, 2, 1)

    g = block_size // 4
    c = np.concatenate([codes, np.zeros((pad, k), np.uint8)]) if pad else codes
    c = c.reshape(p, PANEL, nb, g, 4).transpose(0, 2, 3, 1, 4).reshape(p, nb, g, 64)  # byte 4n + j of group g
    if bits == 4:
        c = c[:, :, : g // 2] | (c[:, :, g // 2 :] << 4)  # chunk i: group i low, group i + g/2 high
    parts = [c.reshape(p, nb, -1)]
    for a in (d, m):
        if a is not None:
            parts.append(np.ascontiguousarray(panels(a).astype(np.float16 if f16 else np.float32)).view(np.uint8))
    if zp < 0:
        parts.append(np.ascontiguousarray(panels(z.astype(np.uint8))))
    data = np.ascontiguousarray(np.concatenate(parts, axis=-1)).reshape(-1)
    attrs = dict(K=k, N=n, bits=bits, block_size=block_size, zero_point=zp, mins=int(m is not None), f16=int(f16))
    return Packed(data, attrs, codes, d, z, m)


def unpack(data: np.ndarray, attrs: dict) -> Packed:
    """A packed linear read back (pack's inverse: the folder's weights, checked by the tests)."""
    k, n, bits, bs = attrs["K"], attrs["N"], attrs["bits"], attrs["block_size"]
    nb, g, p = k // bs, bs // 4, -(-n // PANEL)
    f16, has_mins, zp = bool(attrs["f16"]), bool(attrs["mins"]), attrs["zero_point"]
    code_bytes, scale_bytes = bs * PANEL // (2 if bits == 4 else 1), PANEL * (2 if f16 else 4)
    rec = np.asarray(data, np.uint8).reshape(p, nb, -1)
    c = rec[..., :code_bytes].reshape(p, nb, -1, 64)
    if bits == 4:
        c = np.concatenate([c & 0x0F, c >> 4], axis=2)  # groups 0..g/2-1 low, the rest high
    codes = c.reshape(p, nb, g, PANEL, 4).transpose(0, 3, 1, 2, 4).reshape(p * PANEL, k)[:n]

    def per_output(a: np.ndarray) -> np.ndarray:  # [P, nb, 16] -> [N, nb]
        return a.transpose(0, 2, 1).reshape(p * PANEL, nb)[:n]

    at = code_bytes
    scale_type = np.float16 if f16 else np.float32
    fields = []
    for _ in range(1 + has_mins):
        fields.append(per_output(np.ascontiguousarray(rec[..., at : at + scale_bytes]).view(scale_type)))
        at += scale_bytes
    z = per_output(rec[..., at : at + PANEL]).astype(np.int32) if zp < 0 else np.full((n, nb), zp, np.int32)
    mins = fields[1].astype(np.float32) if has_mins else None
    return Packed(np.asarray(data, np.uint8), dict(attrs), codes, fields[0].astype(np.float32), z, mins)


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
    attrs = np.array([p.attrs[a] for a in ("K", "N", "bits", "block_size", "zero_point", "mins", "f16")], np.int64)
    rc = _native().edgespec_rowop_gather(
        attrs.ctypes.data, ids.ctypes.data, ids.size, p.data.ctypes.data, y.ctypes.data
    )
    if rc:
        raise RowopUnavailable("rowop gather: a bad layout or an id outside the table")
    return y


def matmul(x: np.ndarray, p: Packed, path: str) -> np.ndarray:
    """The library's kernel on one thread with a named path, without ONNX Runtime (tests, benches)."""
    x = np.ascontiguousarray(x, np.float32)
    m = int(np.prod(x.shape[:-1]))
    y = np.empty((*x.shape[:-1], p.attrs["N"]), np.float32)
    attrs = np.array([p.attrs[a] for a in ("K", "N", "bits", "block_size", "zero_point", "mins", "f16")], np.int64)
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
