"""What an extra verify row costs in ONNX Runtime's own GEMM kernels on this CPU, with no model around them.

Times a chain of L independent [M, K] x [K, N] matmuls (default 30 of [M, 576] x [576, 3072], about
one SmolLM2-135M's worth of MLP weights) for each row count M, in two kernels:
  nbits    MatMulNBits, int4 weights in blocks of 32, accuracy level 4 (int8 activations): the
           default target's linears
  integer  MatMulInteger, u8 rows x s8 weights, int32 sums: the integer flavour's GEMM without its
           row quantization
  rowop    edgespec's row kernel (engines/rowop, --int4-kernel rowop): 4-bit codes in blocks of 32
           with fp16 scales and block minimums (GGUF's Q4_1, the default model's), rows quantized to
           int8 per block inside the op, exact int32 sums; EDGESPEC_ROWOP_ISA forces a path
  rowop8   the same op on 8-bit codes, zero point 128 (GGUF's Q8_0: the default model's LM head)
Prints median ms per M and the ratio to M = 1, and, for the integer kernel, the rate of the extra
rows in GMAC/s (what the CPU's int8 units deliver once the weights stream anyway). The integer
flavour's goals (T = 9 <= 1.3x T = 1) need that ratio near 1 at M = 9: this shows whether the CPU
can get there before any graph is built.

    python tools/gemm_rows.py                 # nbits and integer, M = 1..64
    python tools/gemm_rows.py --kernels nbits,rowop,integer
    python tools/gemm_rows.py --rows 1,9,16 --repeats 30
"""

from __future__ import annotations

import argparse
import platform
import time
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class GemmConfig:
    k: int = 576  # input features of each matmul
    n: int = 3072  # output features of each matmul
    layers: int = 30  # independent matmuls per call (weights that stream once per call)
    rows: tuple[int, ...] = (1, 2, 4, 8, 9, 16, 32, 64)  # M values timed
    repeats: int = 15  # timed calls per M (median), after 5 warm-up calls
    threads: int = 2  # ORT intra-op threads


def _session(kind: str, cfg: GemmConfig):
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    integer = kind == "integer"
    nodes, inits, outs = [], [], []
    for i in range(cfg.layers):
        if kind.startswith("rowop"):
            from edgespec.engines import rowop

            bits, nb = (8 if kind == "rowop8" else 4), cfg.k // 32
            codes = rng.integers(0, 1 << bits, (cfg.n, cfg.k), dtype=np.uint8)
            scales = (rng.random((cfg.n, nb), np.float32) * 0.01).astype(np.float16).astype(np.float32)
            zp = np.full((cfg.n, nb), 128, np.uint8) if bits == 8 else None
            mins = None if bits == 8 else -8 * scales
            p = rowop.pack(codes, scales, zp, mins, bits, 32)
            inits.append(numpy_helper.from_array(p.data, f"r{i}"))
            nodes.append(helper.make_node(rowop.OP_TYPE, ["x", f"r{i}"], [f"y{i}"], domain=rowop.DOMAIN, **p.attrs))
        elif integer:
            inits.append(numpy_helper.from_array(rng.integers(-127, 128, (cfg.k, cfg.n), dtype=np.int8), f"w{i}"))
            nodes.append(helper.make_node("MatMulInteger", ["x", f"w{i}"], [f"y{i}"]))
        else:
            blocks = cfg.k // 32
            packed = rng.integers(0, 255, (cfg.n, blocks, 16), dtype=np.uint8)  # two 4-bit weights a byte
            scales = rng.random(cfg.n * blocks, np.float32)
            inits += [numpy_helper.from_array(packed, f"b{i}"), numpy_helper.from_array(scales, f"s{i}")]
            nodes.append(
                helper.make_node(
                    "MatMulNBits",
                    ["x", f"b{i}", f"s{i}"],
                    [f"y{i}"],
                    domain="com.microsoft",
                    K=cfg.k,
                    N=cfg.n,
                    bits=4,
                    block_size=32,
                    accuracy_level=4,
                )
            )
        outs.append(helper.make_tensor_value_info(f"y{i}", TensorProto.INT32 if integer else TensorProto.FLOAT, None))
    x = helper.make_tensor_value_info("x", TensorProto.UINT8 if integer else TensorProto.FLOAT, ["M", cfg.k])
    model = helper.make_model(
        helper.make_graph(nodes, kind, [x], outs, inits),
        opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
        + ([helper.make_opsetid("edgespec.rowop", 1)] if kind.startswith("rowop") else []),
    )
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = cfg.threads
    if kind.startswith("rowop"):
        from edgespec.engines import rowop

        rowop.register(opts)
    return ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])


def time_rows(kind: str, cfg: GemmConfig) -> dict[int, float]:
    """Median ms of one call per row count M."""
    sess, rng, out = _session(kind, cfg), np.random.default_rng(1), {}
    for m in cfg.rows:
        if kind == "integer":
            x = rng.integers(0, 255, (m, cfg.k), dtype=np.uint8)
        else:
            x = rng.standard_normal((m, cfg.k), dtype=np.float32)
        for _ in range(5):
            sess.run(None, {"x": x})
        times = []
        for _ in range(cfg.repeats):
            t0 = time.perf_counter()
            sess.run(None, {"x": x})
            times.append(time.perf_counter() - t0)
        out[m] = float(np.median(times)) * 1e3
    return out


def cpu_name() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", default="1,2,4,8,9,16,32,64", help="row counts M, comma-separated")
    p.add_argument("--repeats", type=int, default=15, help="timed calls per M (default 15)")
    p.add_argument("--threads", type=int, default=2, help="ORT intra-op threads (default 2)")
    p.add_argument(
        "--kernels", default="nbits,integer", help="any of nbits, integer, rowop, rowop8 (default nbits,integer)"
    )
    a = p.parse_args(argv)
    cfg = GemmConfig(rows=tuple(int(x) for x in a.rows.split(",")), repeats=a.repeats, threads=a.threads)
    print(f"{cfg.layers} x [M, {cfg.k}] x [{cfg.k}, {cfg.n}], {cfg.threads} threads, {cpu_name()}")
    print("| kernel | " + " | ".join(f"M={m}" for m in cfg.rows) + " | extra rows |")
    print("|---|" + "---:|" * (len(cfg.rows) + 1))
    for kind in a.kernels.split(","):
        ms = time_rows(kind, cfg)
        base, top = ms[cfg.rows[0]], cfg.rows[-1]
        cells = " | ".join(f"{ms[m]:.2f} ({ms[m] / base:.2f}x)" for m in cfg.rows)
        macs = (top - cfg.rows[0]) * cfg.layers * cfg.k * cfg.n  # multiply-adds the extra rows add
        rate = macs / max(ms[top] - base, 1e-6) / 1e6  # GMAC/s
        print(f"| {kind} | {cells} | {(ms[top] - base) / (top - cfg.rows[0]):.3f} ms/row, {rate:.0f} GMAC/s |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
