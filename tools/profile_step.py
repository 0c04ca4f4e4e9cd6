"""Where a target call's time goes: ONNX Runtime's profiler over a decode and a verify call.

    python tools/profile_step.py engines/smollm2-135m-instruct [--past 256] [--width 5] [--calls 20]
    python tools/profile_step.py A B --width-table 1,2,3,5,9,64 [--no-profile]    # A/B by width

Prefills `past` tokens, then times width-1 (decode) and width-W (verify) calls at that past
length, nothing committed: first plainly (wall time, median), then in a profiled session (ORT's
per-node kernel times). Prints markdown: the graph's nodes (in the file and as ORT runs them after
its own fusions, per layer and outside the layers), the median wall time of each call, and per op
class the kernel time of each call, so that an extra verify row can be set against what its
matmuls alone cost. In the profiled session: host = wall - ORT's model_run (Python, binding);
ORT overhead = model_run - the kernels' sum (the executor between nodes). The profiler itself
slows every node a little: compare the two wall columns.
"""

from __future__ import annotations

import argparse
import bisect
import collections
import json
import re
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx

import edgespec.runtime.drafters  # noqa: F401  (registers the drafter sections a manifest names)
from edgespec.engines.manifest import load_manifest
from edgespec.engines.ort import OrtModel
from edgespec.runtime.prefill import prefill

MATMULS = ("MatMulNBits", "MatMul", "Gemm", "FusedMatMul", "RowMatMul")  # op classes that are the layers' math
#                                                                      (RowMatMul: the row kernel's, engines/rowop)
_LAYER = re.compile(r"(?:^|/)layers\.(\d+)/|^l(\d+)\.")


def layer_of(node_name: str) -> int | None:
    """The decoder layer a node's name places it in (the writer names nodes /layers.i/... and its
    matmuls li.<weight>/...), None outside the layers."""
    m = _LAYER.search(node_name)
    return None if m is None else int(m.group(1) or m.group(2))


def node_counts(nodes, n_layers: int) -> tuple[int, float, int]:
    """(nodes, nodes per layer, nodes outside the layers) of a graph's node names."""
    inside = sum(layer_of(n) is not None for n in nodes)
    return len(nodes), inside / n_layers, len(nodes) - inside


def _engine(folder: Path, profile_dir: str | None, threads: int | None) -> OrtModel:
    man = load_manifest(folder)
    engine = OrtModel(man, man.target, threads=threads)
    if profile_dir is not None:
        engine._session_options.enable_profiling = True
        engine._session_options.profile_file_prefix = str(Path(profile_dir) / "step")
    else:
        engine._session_options.optimized_model_filepath = str(Path(tempfile.mkdtemp()) / "optimized.onnx")
    return engine


def _calls(engine: OrtModel, past: int, widths: tuple[int, ...], n: int) -> dict[int, list[float]]:
    ids = (np.arange(past + max(widths)) % 1000 + 100).astype(np.int64)
    prefill(engine, ids[:past], 0)
    for w in widths:  # warm-up: bindings, first-run allocations
        for _ in range(3):
            engine.forward(ids[past : past + w], past)
    times: dict[int, list[float]] = {w: [] for w in widths}
    for w in widths:
        for _ in range(n):
            t0 = time.perf_counter()
            engine.forward(ids[past : past + w], past)
            times[w].append(time.perf_counter() - t0)
    return times


def _kernel_times(trace: list[dict], widths: tuple[int, ...], n: int) -> dict[int, dict]:
    """Per width: {"run": model_run µs per call, "ops": op -> (µs per call, nodes per call)} of its
    n timed calls (the trace ends with n calls per width, in `widths` order)."""
    runs = [e for e in trace if e.get("cat") == "Session" and e.get("name") == "model_run"]
    kernels = sorted(
        (e for e in trace if e.get("cat") == "Node" and e["name"].endswith("_kernel_time")), key=lambda e: e["ts"]
    )
    starts = [e["ts"] for e in kernels]
    out, end = {}, len(runs)
    for w in reversed(widths):
        mine, end = runs[end - n : end], end - n
        ops: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0])
        for r in mine:
            for e in kernels[bisect.bisect_left(starts, r["ts"]) : bisect.bisect_right(starts, r["ts"] + r["dur"])]:
                ops[e["args"]["op_name"]][0] += e["dur"] / n
                ops[e["args"]["op_name"]][1] += 1 / n
        out[w] = {"run": statistics.median(r["dur"] for r in mine), "ops": dict(ops)}
    return out


def width_table(folders: list[Path], widths: list[int], past: int, rounds: int, threads: int | None) -> None:
    """Median wall time of one call per width at `past`, the folders alternating call by call
    (on a busy machine neither folder always runs first)."""
    engines = [_engine(f, None, threads) for f in folders]
    ids = (np.arange(past + max(widths)) % 1000 + 100).astype(np.int64)
    for e in engines:
        prefill(e, ids[:past], 0)
        for w in widths:
            e.forward(ids[past : past + w], past)
    times = {(i, w): [] for i in range(len(engines)) for w in widths}
    for r in range(rounds):
        for w in widths:
            order = range(len(engines)) if r % 2 else reversed(range(len(engines)))
            for i in order:
                t0 = time.perf_counter()
                engines[i].forward(ids[past : past + w], past)
                times[i, w].append(time.perf_counter() - t0)
    print(f"One call by width, past {past}, median of {rounds} (ms):\n")
    print("| folder | " + " | ".join(f"T={w}" for w in widths) + " |\n|---|" + "---:|" * len(widths))
    for i, f in enumerate(folders):
        print(f"| {f.name} | " + " | ".join(f"{statistics.median(times[i, w]) * 1e3:.2f}" for w in widths) + " |")
    print()


def profile(folder: Path, past: int, width: int, calls: int, threads: int | None) -> None:
    """The node counts, call times and per-op kernel table of one folder."""
    widths = (1, width)
    man = load_manifest(folder)
    L = man.target.n_layers
    plain = _engine(folder, None, threads)
    wall = {w: statistics.median(v) * 1e6 for w, v in _calls(plain, past, widths, calls).items()}
    optimized = onnx.load(plain._session_options.optimized_model_filepath, load_external_data=False).graph
    del plain
    with tempfile.TemporaryDirectory() as d:
        prof = _engine(folder, d, threads)
        prof_wall = {w: statistics.median(v) * 1e6 for w, v in _calls(prof, past, widths, calls).items()}
        trace = json.loads(Path(prof.session().end_profiling()).read_text())
    k = _kernel_times(trace, widths, calls)

    g = onnx.load(folder / man.target.graph.file, load_external_data=False).graph
    spec = man.target.graph
    print(
        f"## {folder.name}: target graph `{spec.file}`, flavour {spec.flavour}"
        + (f" (portable: {', '.join(spec.portable_ops)})" if spec.portable_ops else "")
        + f", {L} layers, past {past}\n"
    )
    print("| graph | nodes | per layer | outside layers |\n|---|---:|---:|---:|")
    for what, nodes in (("file", [n.name for n in g.node]), ("as ORT runs it", [n.name for n in optimized.node])):
        n, per, out = node_counts(nodes, L)
        print(f"| {what} | {n} | {per:.1f} | {out} |")
    print()
    print(
        "| call | wall ms | profiled: wall ms | model_run ms | kernels ms | ORT overhead ms | host ms | nodes run |\n"
        "|---|---:|---:|---:|---:|---:|---:|---:|"
    )
    for w in widths:
        kern = sum(t for t, _ in k[w]["ops"].values())
        nodes = sum(c for _, c in k[w]["ops"].values())
        run = k[w]["run"]
        print(
            f"| T={w} | {wall[w] / 1e3:.2f} | {prof_wall[w] / 1e3:.2f} | {run / 1e3:.2f} | {kern / 1e3:.2f} | "
            f"{(run - kern) / 1e3:.2f} | {(prof_wall[w] - run) / 1e3:.2f} | {nodes:.0f} |"
        )
    print()
    W = width
    print(f"| op | nodes | T=1 µs | T={W} µs | extra row µs |\n|---|---:|---:|---:|---:|")
    ops = sorted(set(k[1]["ops"]) | set(k[W]["ops"]), key=lambda o: -k[W]["ops"].get(o, (0, 0))[0])
    for op in ops:
        t1, n1 = k[1]["ops"].get(op, (0.0, 0))
        tw, _ = k[W]["ops"].get(op, (0.0, 0))
        print(f"| {op} | {n1:.0f} | {t1:.0f} | {tw:.0f} | {(tw - t1) / (W - 1):.0f} |")
    mm = {w: sum(k[w]["ops"].get(o, (0.0, 0))[0] for o in MATMULS) for w in widths}
    row_wall = (wall[W] - wall[1]) / (W - 1)
    row_mm = (mm[W] - mm[1]) / (W - 1)
    print(
        f"\nAn extra verify row: {row_wall:.0f} µs of wall time, {row_mm:.0f} µs of it in the matmuls "
        f"({', '.join(MATMULS)}): "
        + (f"{row_wall / row_mm:.2f}x what its matmuls cost. " if row_mm > 0 else "no matmul time measured. ")
        + f"A decode: {wall[1] / 1e3:.2f} ms, {mm[1] / 1e3:.2f} ms of it in the matmuls.\n"
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("folders", nargs="+", help="engine folders (several: each profiled, the width table alternates)")
    p.add_argument("--past", type=int, default=256, help="tokens in the cache before the timed calls (default 256)")
    p.add_argument("--width", type=int, default=5, help="verify width (default 5)")
    p.add_argument("--calls", type=int, default=20, help="timed calls per width (default 20)")
    p.add_argument("--threads", type=int, default=None, help="intra-op threads (default: physical cores)")
    p.add_argument(
        "--width-table",
        default="",
        metavar="W,W,..",
        help="also time one call of each of these widths (e.g. 1,2,3,5,9,64), folders alternating",
    )
    p.add_argument("--no-profile", action="store_true", help="only the width table")
    a = p.parse_args()
    folders = [Path(f) for f in a.folders]
    if a.width_table:
        width_table(folders, [int(w) for w in a.width_table.split(",")], a.past, a.calls, a.threads)
    if not a.no_profile:
        for f in folders:
            profile(f, a.past, a.width, a.calls, a.threads)


if __name__ == "__main__":
    main()
