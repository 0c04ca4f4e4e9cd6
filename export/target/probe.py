"""`--precision auto`: the export times the candidate target graphs on this CPU and keeps the one
that speculates fastest.

Which linear kernel makes verify rows cheap depends on the CPU, not on the model: ONNX Runtime's
int4 MatMulNBits pays per row on some CPUs; its integer GEMM (the int8 precision, the integer
graph) streams the weights once for many rows where the CPU has VNNI / AMX matrix units, and may
not elsewhere. So nothing is assumed: each candidate's target graph (no heads, no validation) is
exported into a scratch folder, its width table is timed at a real context (interleaved with the
other candidates', median of several rounds), and the winner is the one with the highest
expected speculative throughput

    score = max over k of E_k / c(k + 1),   E_k = (1 - a^(k+1)) / (1 - a)   (tokens per call)

c(T) the median seconds of a T-token call and a = ACCEPTANCE a typical per-token acceptance of
this project's drafters (k = 0, plain decoding, is a candidate too). A candidate replaces the
first one (int4, the default before the probe) only when it wins by MARGIN, so timing noise does
not flip the choice. The table lands in the manifest (`export_probe`).

A third candidate, int4-rowop, is the int4 precision on edgespec's row kernel (engines/rowop: an
ONNX Runtime custom op compiled on this machine) wherever it builds and runs here; where it does
not (no compiler, no header, a CPU path refused, --int4-kernel nbits) the record says why.
"""

from __future__ import annotations

import dataclasses
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

CANDIDATES = ("int4", "int8")  # the first is kept unless another wins by MARGIN
ROWOP = "int4-rowop"  # the int4 precision on the row kernel (engines/rowop), a candidate where it runs
ACCEPTANCE = 0.6  # per-token acceptance the score assumes (drafts eval: ~2 tokens per call at k=4)
MARGIN = 1.05  # a challenger must score this much higher
PAST = 256  # cached positions before the timed calls
ROUNDS = 12  # timed rounds per width (after two warm-up rounds)


def speculation_score(costs: dict[int, float], acceptance: float = ACCEPTANCE) -> float:
    """Expected tokens per second of the best k given call costs (seconds) by width."""
    a = acceptance
    return max((1 - a**w) / (1 - a) / c for w, c in costs.items())


def _cpu() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _time_widths(folders: dict[str, Path], widths: list[int]) -> dict[str, dict[int, float]]:
    from edgespec.engines.manifest import load_manifest
    from edgespec.engines.ort import OrtModel

    engines = {}
    for name, folder in folders.items():
        m = load_manifest(folder)
        past = min(PAST, m.max_len // 2)  # a small context window: half of it
        e = OrtModel(m, m.target)
        e.load_widths(widths)
        ids = (np.arange(past, dtype=np.int64) * 7919) % (m.target.vocab_size - 2) + 1
        for pos in range(0, past, m.prefill_chunk):
            n = min(m.prefill_chunk, past - pos)
            e.forward(ids[pos : pos + n], pos)
            e.commit(pos, n)
        engines[name] = e
    probe = np.full(max(widths), 42, np.int64)
    times: dict[str, dict[int, list[float]]] = {n: {w: [] for w in widths} for n in engines}
    for _ in range(ROUNDS + 2):
        for w in widths:
            for name, e in engines.items():
                t0 = time.perf_counter()
                e.forward(probe[:w], past)
                times[name][w].append(time.perf_counter() - t0)
    return {n: {w: float(np.median(ts[2:])) for w, ts in t.items()} for n, t in times.items()}


def candidates(cfg) -> tuple[dict[str, dict], str]:
    """(name -> the ExportConfig changes of each candidate, why the row kernel is not one: "" where
    it is). --int4-kernel rowop leaves it alone; nbits leaves it out."""
    from edgespec.engines import rowop

    kernel = getattr(cfg, "int4_kernel", "auto")
    if kernel == "rowop":  # ExportConfig.check made sure it runs here
        return {ROWOP: dict(precision="int4", int4_kernel="rowop")}, ""
    out = {p: dict(precision=p, int4_kernel="nbits") for p in CANDIDATES}
    if kernel == "nbits":
        why = "--int4-kernel nbits"
    elif cfg.int4_accuracy_level != 4:
        why = f"--int4-accuracy-level {cfg.int4_accuracy_level} (the row kernel's activations are int8)"
    else:
        why = rowop.unavailable()
        if why and rowop.damaged():  # a damaged build that could not be rebuilt: said even without progress
            print(f"edgespec: warning: {why}; the int4 linears use MatMulNBits instead", file=sys.stderr)
    if not why:
        out[ROWOP] = dict(precision="int4", int4_kernel="rowop")
    return out, why


def choose_precision(cfg, progress: bool = True) -> tuple[str, dict]:
    """(the precision to export, the probe's record for the manifest) for an ExportConfig whose
    precision is "auto"; the record's int4_kernel is the int4 linears' kernel to export with."""
    from edgespec.engines import rowop
    from edgespec.export.target.exporter import export

    widths = list(range(1, cfg.k + 2))
    cands, why_not_rowop = candidates(cfg)
    costs: dict[str, dict[int, float]] = {}
    if len(cands) > 1:
        scratch = Path(tempfile.mkdtemp(prefix="edgespec-probe-"))
        try:
            folders = {}
            for name, changes in cands.items():
                target_only = dataclasses.replace(
                    cfg, out=str(scratch / name), validate=False, progress=False, force=False, **changes
                )
                target_only = dataclasses.replace(target_only, **_no_drafters(cfg))
                folders[name] = export(target_only)
            costs = _time_widths(folders, widths)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
    scores = {p: speculation_score(c) for p, c in costs.items()}
    first = next(iter(cands))
    best = max(scores, key=scores.get) if scores else first
    chosen = best if not scores or scores[best] > MARGIN * scores[first] else first
    record = {
        "cpu": _cpu(),
        "past": PAST,
        "acceptance": ACCEPTANCE,
        "margin": MARGIN,
        "chosen": chosen,
        "int4_kernel": cands[chosen]["int4_kernel"],
        "rowop": {"unavailable": why_not_rowop} if why_not_rowop else {"path": rowop.cpu_path()},
        "ms_by_width": {p: {str(w): round(s * 1e3, 3) for w, s in c.items()} for p, c in costs.items()},
        "score_tokens_per_s": {p: round(s, 2) for p, s in scores.items()},
    }
    if progress:
        table = ", ".join(
            f"{p}: T=1 {c[1] * 1e3:.1f} ms, T={widths[-1]} {c[widths[-1]] * 1e3:.1f} ms, {scores[p]:.0f} tok/s"
            for p, c in costs.items()
        )
        rowop_note = f" (row kernel: {why_not_rowop})" if why_not_rowop else ""
        print(f"edgespec: precision probe on {record['cpu']}: {table} -> {chosen}{rowop_note}", file=sys.stderr)
    return cands[chosen]["precision"], record


def _no_drafters(cfg) -> dict:
    """ExportConfig fields that leave every drafter's models out (the probe times the target alone):
    each plugin's source option (named as the plugin) set to None."""
    from edgespec.export.drafters import registry

    fields = {f.name for f in dataclasses.fields(cfg)}
    return {name: None for name in registry() if name in fields}
