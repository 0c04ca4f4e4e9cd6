"""The row kernel's library loaded (ctypes): the path this CPU runs, ONNX Runtime's registration,
and the ops' arithmetic on one thread without ONNX Runtime (the library's test entry points: the
tests compare them with layout.reference bitwise)."""

from __future__ import annotations

import ctypes

import numpy as np

from edgespec.engines.rowop.build import SETUP, RowopUnavailable, library, one_line
from edgespec.engines.rowop.layout import ATTRS, DEFAULTS, LAYOUT_VERSION, Packed


def load() -> ctypes.CDLL:
    """The library, loaded (built first where needed), its entry points typed."""
    path = library()  # its size and sha256 checked: a truncated file is never mapped
    try:
        lib = ctypes.CDLL(str(path))
    except OSError as e:
        raise RowopUnavailable(
            f"the row kernel's library {path} does not load ({one_line(str(e), 300)}). Hint: delete "
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


def unavailable() -> str:
    """Why the op cannot run in this process ("" where it can): no library, or a refused path."""
    try:
        path, why = load().edgespec_rowop_path, ctypes.c_char_p()
    except RowopUnavailable as e:
        return str(e)
    name = path(ctypes.byref(why))
    return "" if name else why.value.decode()


def cpu_path() -> str:
    """The instruction-set path a session gets now ("" where none: unavailable() says why)."""
    try:
        return load().edgespec_rowop_path(ctypes.byref(ctypes.c_char_p())).decode()
    except RowopUnavailable:
        return ""


def cpu_runs(path: str) -> bool:
    """This CPU runs the named path (PATHS)."""
    return bool(load().edgespec_rowop_runs(path.encode()))


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


def gather(ids: np.ndarray, p: Packed) -> np.ndarray:
    """The library's RowGather without ONNX Runtime (tests)."""
    ids = np.ascontiguousarray(ids, np.int64)
    y = np.empty((*ids.shape, p.attrs["K"]), np.float32)
    attrs = _attr_array(p.attrs)
    rc = load().edgespec_rowop_gather(attrs.ctypes.data, ids.ctypes.data, ids.size, p.data.ctypes.data, y.ctypes.data)
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
    rc = load().edgespec_rowop_matmul(path.encode(), *ptrs)
    if rc:
        raise RowopUnavailable(f"rowop path {path!r} does not run on this CPU (or a bad layout)")
    return y
