"""edgespec's row kernel: an ONNX Runtime custom op library (C++, built on this machine) for y = x W
with 4- to 8-bit block-quantized W, the activations quantized to int8 per row and per block, exact
int32 sums and one float scale per block and row (the arithmetic: matmul.h). Every factor of a row's
result depends on that row alone, so its bits do not depend on how many rows share the call. The
same library holds the exact attention (attention.h), the gated MLP's activation (swiglu.h) and an
embedding read from its tied LM head's blocks (gather.cc).

Where each part lives:
- build.py: the library compiled into an ignored build folder keyed by its sources, compiler and
  header, its size and sha256 recorded and checked before every load (`library()`, `damage()`);
- header.py: ONNX Runtime's C API header fetched from Debian's libonnxruntime-dev (setup);
- layout.py: `pack()` / `unpack()` of a linear's blocks in the kernel's records, and the NumPy
  `reference()` / `gather_reference()` the tests compare the library with bitwise;
- native.py: the library loaded (ctypes): `unavailable()` says why the op cannot run here,
  `register(so)` lets ONNX Runtime sessions run it, `matmul()` / `gather()` run it without them;
- attention.py: the attention op's NumPy reference and test entry point;
- __main__.py: `python -m edgespec.engines.rowop setup | info`;
- the C++: registration.cc (ONNX Runtime's entry point: the domain and its ops), ops.cc (what the
  ops share), cpu_features.cc (the cpuid probe and the path a session gets), one file per op
  (matmul.cc, gather.cc, attention.cc, swiglu.cc: its attributes, checks, threads and test entry
  point), and one per op and instruction set (matmul_avx512.cc, matmul_avxvnni.cc, matmul_avx2.cc,
  matmul_portable.cc, attention_avx512.cc, ..., swiglu_portable.cc) over the code they share
  (matmul_common.h, matmul_ymm.h; attention_impl.h, swiglu_impl.h over the vector policies of
  vec.h and vec_x86.h; half.h).

    python -m edgespec.engines.rowop setup   # fetch the header if missing (Debian's libonnxruntime-dev), build
    python -m edgespec.engines.rowop info    # the library, the header, the path this CPU runs
"""

from __future__ import annotations

from edgespec.engines.rowop.build import (  # noqa: F401 (the package's public face)
    HEADER,
    LIBRARY,
    SETUP,
    RowopUnavailable,
    damage,
    damaged,
    find_compiler,
    find_header,
    library,
    library_file,
    record_file,
)
from edgespec.engines.rowop.layout import (  # noqa: F401 (the package's public face)
    ATTRS,
    DEFAULTS,
    LAYOUT_VERSION,
    PANEL,
    SUPER,
    PackChoices,
    Packed,
    SubScales,
    dequantized,
    gather_reference,
    pack,
    pack_choices,
    reference,
    unpack,
)
from edgespec.engines.rowop.native import cpu_path, cpu_runs, gather, matmul, register, unavailable  # noqa: F401

DOMAIN = "edgespec.rowop"  # the ops' ONNX domain
OP_TYPE = "RowMatMul"
GATHER_TYPE = "RowGather"  # rows of a packed linear as floats (an embedding read from its tied LM head)
WEIGHT_SUFFIX = ".rowop"  # a linear's packed weights are stored as "<name>.rowop"
PATHS = ("avx512vnni", "avxvnni", "avx2", "portable")  # instruction-set paths, best first
ISA_ENV = "EDGESPEC_ROWOP_ISA"  # forces a path (tests); read when a session registers the library


def needs(weight_names) -> bool:
    """A model whose weights include packed row-kernel weights (its graph calls the op)."""
    return any(n.endswith(WEIGHT_SUFFIX) for n in weight_names)
