"""`--precision auto`: the export times the candidate target graphs on this CPU and keeps the one
that speculates fastest, then exports it once.

Which linear kernel makes verify rows cheap depends on the CPU, not on the model: ONNX Runtime's
int4 MatMulNBits pays per row on some CPUs; its integer GEMM (the int8 precision, the integer
graph) streams the weights once for many rows where the CPU has VNNI / AMX matrix units, and may
not elsewhere. So nothing is assumed: each candidate's width table is timed at a real context
(interleaved with the other candidates', median of several rounds), and the winner is the one
with the highest expected speculative throughput

    score = max over k of E_k / c(k + 1),   E_k = (1 - a^(k+1)) / (1 - a)   (tokens per call)

c(T) the median seconds of a T-token call and a = ACCEPTANCE a typical per-token acceptance of
this project's drafters (k = 0, plain decoding, is a candidate too). A candidate replaces the
first one (int4, the default before the probe) only when it wins by MARGIN, so timing noise does
not flip the choice. The table lands in the manifest (`export_probe`).

What is timed is a sampled model, not the whole one (a whole export per candidate cost a 1B GGUF
7.6 GB and 13 min against 1.95 GB and 2.3 min for the export kept). Where the target streams
(sources/weight_source.py: a local GGUF or safetensors folder), each candidate's writer (the export's own, on
the checkpoint's own tensors: GGUF blocks kept as the export keeps them) stores the first DEPTH
layers and about HEAD_WEIGHTS / hidden vocabulary rows, evenly spread (every row of a smaller
head), into a scratch folder, with two graphs on those weights: one layer and DEPTH layers. Per
width T, a layer costs L(T) = (c_DEPTH(T) - c_1(T)) / (DEPTH - 1); the rest of the one-layer call,
c_1(T) - L(T), is the LM head on the sampled rows (with the embedding lookup, the final norm and
the call's overhead, a few percent, counted with it) and scales with the rows; so the whole model

    c(T) = n_layers * L(T) + (vocab / rows) * (c_1(T) - L(T))

(`whole_model_costs` per timed round, whose graphs run one after the other under the same load;
the median over the rounds). The recorded ms_by_width are those whole-model estimates, in
milliseconds of this CPU (so the runtime's cost table in decodes, c(T) / c(1), is the whole
model's); the measured tables are beside them (`sampled`). Every candidate is written before any
is loaded (the float32 tensors read once for all: sampled.SharedReads), so the probe's memory is the
larger of one candidate's writer (the export's own peak, on a fraction of the head) and the
timed graphs (two layers and a fraction of the head per candidate); what it freed is given back
before the export. A target that does not stream (a hub id, --stream-weights off, a family not
streamed) has each candidate exported whole, as before (`method`: "whole").

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

from edgespec.export.target.checks.probe_costs import (
    PAST,
    medians,
    paired_whole_model_costs,
    prefilled,
    time_widths,
)
from edgespec.runtime.adaptive import width_line

CANDIDATES = ("int4", "int8")  # the first is kept unless another wins by MARGIN
ROWOP = "int4-rowop"  # the int4 precision on the row kernel (engines/rowop), a candidate where it runs
ACCEPTANCE = 0.6  # per-token acceptance the score assumes (drafts eval: ~2 tokens per call at k=4)
MARGIN = 1.05  # a challenger must score this much higher
TIMING_S = 10.0  # the sampled models' timing stops at MIN_ROUNDS past this (1B, quiet: 12 rounds in ~6 s)
DEPTH = 2  # layers of the sampled model the probe times (and a graph of its first one)
HEAD_WEIGHTS = 2**26  # about this many LM-head weights in the sampled model (rows x hidden; 1B: 32,768 rows)


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


def candidates(cfg) -> tuple[dict[str, dict], str]:
    """(name -> the ExportConfig changes of each candidate, why the row kernel is not one: "" where
    it is). --int4-kernel rowop leaves it alone; nbits leaves it out."""
    from edgespec.engines import rowop

    kernel = getattr(cfg, "int4_kernel", "auto")
    if kernel == "rowop":  # ExportConfig.check made sure it runs here
        return {ROWOP: dict(precision="int4", int4_kernel="rowop")}, ""
    out = {p: dict(precision=p, int4_kernel="nbits") for p in CANDIDATES}
    if _keeps_quantized_blocks(cfg):  # int8 would re-quantize them: less faithful, 2-3x the bytes
        out.pop("int8")
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


FLOAT_TYPES = (0, 1, 30)  # GGML tensor types of float weights: F32, F16, BF16


def _keeps_quantized_blocks(cfg) -> bool:
    """A quantized GGUF whose blocks the int4 candidates keep (--gguf-blocks keep): int8 is then no
    candidate, since it would re-quantize the file's weights (the synthetic Llama-3.2-1B Q4_K_M: a
    2.29 GB folder for a 0.80 GB file, chosen by a noisy 5% margin of the sampled probe)."""
    from edgespec.export.target import sources
    from edgespec.export.target.sources.gguf_header import read_header

    if getattr(cfg, "gguf_blocks", "keep") != "keep":
        return False
    try:
        src = sources.resolve(cfg.target)
        if src.kind not in sources.GGUF_KINDS:
            return False
        layers = [t for t in read_header(src.path).tensors if t.name.startswith("blk.") and len(t.dims) == 2]
        return any(t.type_id not in FLOAT_TYPES for t in layers)
    except Exception:  # noqa: BLE001 - a source it cannot read: the export says what is wrong with it
        return False


# below this many bytes of checkpoint the candidates are exported whole and timed (the default 135M model:
# about a minute more, 3 GB): a sampled model's layer is then too cheap to time against the LM head
# (on 2 cores its 1- and 2-layer graphs differ by ~0.2 ms under ~1 ms of noise, and the extrapolation
# to 30 layers picked int8 or MatMulNBits over the row kernel, which decodes 1.4x faster here)
WHOLE_BELOW = 400 << 20


def _source_bytes(cfg) -> int:
    """The target checkpoint's size on disk (a GGUF file or a folder's files; 0 where unknown: a hub id)."""
    from edgespec.export.target import sources

    try:
        p = Path(sources.resolve(cfg.target).path)
        return p.stat().st_size if p.is_file() else sum(f.stat().st_size for f in p.glob("*.safetensors"))
    except (OSError, ValueError):
        return 0


def choose_precision(cfg, progress: bool = True) -> tuple[str, dict]:
    """(the precision to export, the probe's record for the manifest) for an ExportConfig whose
    precision is "auto"; the record's int4_kernel is the int4 linears' kernel to export with."""
    from edgespec.engines import rowop

    t0 = time.perf_counter()
    widths = list(range(1, cfg.k + 2))
    cands, why_not_rowop = candidates(cfg)
    costs: dict[str, dict[int, float]] = {}
    how: dict = {}
    if len(cands) > 1:
        scratch = Path(tempfile.mkdtemp(prefix="edgespec-probe-"))
        try:
            costs, how = {}, {"why": "a small model: timed whole"}
            if _source_bytes(cfg) >= WHOLE_BELOW:
                costs, how = _sampled_costs(cfg, cands, widths, scratch)
            if not costs:
                costs, how = _whole_costs(cfg, cands, widths, scratch, how.get("why", ""))
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
            _give_back_freed_memory()
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
    if costs:
        record |= how | {"probe_s": round(time.perf_counter() - t0, 1)}
    flat = [p for p, c in costs.items() if len(c) > 1 and not width_line(c)[0] > 0]
    if flat:  # (adaptive k reads the chosen table's line; a falling one it does not trust)
        record["width_table_falls"] = flat
        print(
            f"edgespec: warning: the probe's width table of {', '.join(flat)} falls with width (a busy machine?): "
            "the precision choice may be off and adaptive k prices verify rows by its defaults; "
            "re-export on a quiet machine",
            file=sys.stderr,
        )
    if progress and costs:
        table = ", ".join(
            f"{p}: T=1 {c[1] * 1e3:.1f} ms, T={widths[-1]} {c[widths[-1]] * 1e3:.1f} ms, {scores[p]:.0f} tok/s"
            for p, c in costs.items()
        )
        rowop_note = f" (row kernel: {why_not_rowop})" if why_not_rowop else ""
        print(
            f"edgespec: precision probe on {record['cpu']} ({_describe(how)}, {record['probe_s']:.0f} s): "
            f"{table} -> {chosen}{rowop_note}",
            file=sys.stderr,
        )
    return cands[chosen]["precision"], record


def _give_back_freed_memory() -> None:
    """The probe's freed buffers returned to the system: glibc keeps them for reuse (0.5 GB after a
    1B's probe), and the export's own peak would come on top of them."""
    import ctypes
    import gc

    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: its allocator keeps what it keeps
        pass


def _describe(how: dict) -> str:
    """How the probe's costs were measured, in a few words."""
    if how.get("method") != "sampled":
        return "each candidate exported whole"
    s = how["sampled"]
    if len(s["ms_by_layers"][next(iter(s["ms_by_layers"]))]) == 1:
        return f"the whole model: {s['of_layers']} layers, {s['of_vocab']:,} vocabulary rows"
    return (
        f"graphs of its first 1 and {s['layers']} of {s['of_layers']} layers, {s['vocab_rows']:,} of "
        f"{s['of_vocab']:,} vocabulary rows, scaled to the whole model"
    )


def _sampled_costs(cfg, cands: dict[str, dict], widths: list[int], scratch: Path) -> tuple[dict, dict]:
    """(candidate -> whole-model seconds by width, the record's method fields) timed on sampled
    models (the module's doc); ({}, {"why": ...}) where the target does not stream."""
    from edgespec.engines.context import for_checks
    from edgespec.engines.ort import OrtModel
    from edgespec.export.target import sources

    src = sources.resolve(cfg.target)
    written, cache = {}, {}
    for name, changes in cands.items():  # all written before any is loaded
        c = dataclasses.replace(cfg, **changes, **_no_drafters(cfg))
        written[name] = _write_sampled(c, src, scratch / name, DEPTH, cache)
        if isinstance(written[name], str):
            return {}, {"why": written[name]}
    cache.clear()
    _, specs, n_layers, rows, vocab = next(iter(written.values()))  # the same model in every candidate
    depth = max(specs)
    engines = {}
    try:
        for name, (man, specs, *_) in written.items():
            for d, spec in specs.items():
                e = OrtModel(for_checks(man), spec)
                e.load_widths(widths)
                engines[name, d] = e
        past = min(PAST, cfg.max_len // 2)  # a small context window: half of it (a zero cache: its values
        measured = time_widths(engines, widths, past, TIMING_S)  # do not change the time of a call)
    finally:
        for e in engines.values():
            e.close()
    by_cand: dict[str, dict[int, dict[int, list[float]]]] = {}
    for (name, d), t in measured.items():
        by_cand.setdefault(name, {})[d] = t
    costs = {name: paired_whole_model_costs(t, n_layers, vocab / rows) for name, t in by_cand.items()}
    rounds = len(next(iter(next(iter(measured.values())).values())))
    how = {
        "method": "sampled",
        "sampled": {
            "layers": depth,
            "of_layers": n_layers,
            "vocab_rows": rows,
            "of_vocab": vocab,
            "rounds": rounds,
            "ms_by_layers": {  # the medians of each graph's rounds
                name: {str(d): {str(w): round(s * 1e3, 3) for w, s in t.items()} for d, t in sorted(ts.items())}
                for name, ts in ((n, medians(t)) for n, t in by_cand.items())
            },
        },
    }
    return costs, how


def sampled_rows(vocab: int, hidden: int, n_layers: int) -> np.ndarray | None:
    """The vocabulary rows a sampled model keeps, evenly spread: about HEAD_WEIGHTS / hidden of them,
    so its LM head is as large as one that spills the CPU's caches but a fraction of a big-vocabulary
    head to write; None (every row) where the whole head is no larger, or the model has one layer
    (nothing to tell a layer's cost from the head's)."""
    n = HEAD_WEIGHTS // hidden
    if n >= vocab or n_layers < 2:
        return None
    return np.arange(n, dtype=np.int64) * vocab // n


def _write_sampled(cfg, src, folder: Path, depth: int, cache: dict):
    """A candidate's sampled model in `folder`: its first `depth` layers (all, for a shallower model)
    and the vocabulary rows `sampled_rows` keeps, stored by the export's own writer from the streamed
    checkpoint, and the graphs of 1 and of `depth` layers on those weights. (a manifest for them,
    depth -> its target spec, the model's layers, the rows kept, the model's vocabulary; a model no
    deeper than `depth` with every row: its own graph alone); a string saying why where the target
    does not stream."""
    import copy

    from edgespec.engines import manifest as mf
    from edgespec.export.target.arch import arch_from_config
    from edgespec.export.target.checks.sampled import SampledWeights, SharedReads, sampled_arch
    from edgespec.export.target.exporter import graph_options, new_manifest
    from edgespec.export.target.graph.streaming import StreamingWriter
    from edgespec.export.target.sources.weight_source import StreamedSource, weight_source
    from edgespec.export.target.write import host_prologue_entry, write_model

    source = weight_source(cfg, src, {})
    if not isinstance(source, StreamedSource):
        return source.why
    weights, hf_cfg = source.weights, source.hf_cfg
    arch = arch_from_config(hf_cfg, cfg.max_len)
    layers = tuple(range(min(depth, arch.n_layers)))
    rows = sampled_rows(arch.vocab_size, arch.hidden_size, arch.n_layers)
    n_rows = arch.vocab_size if rows is None else len(rows)
    folder.mkdir(parents=True)
    v_arch = sampled_arch(arch, layers, n_rows)
    view = SampledWeights(SharedReads(weights, cache), layers, rows)
    writer = StreamingWriter(v_arch, view, graph_options(cfg), folder / "spool")
    index = writer.write_weights(folder / "target.weights")
    specs = {}
    whole = len(layers) == arch.n_layers and rows is None
    for d in [len(layers)] if whole else sorted({1, len(layers)}):
        w = copy.copy(writer)  # the same stored weights, a graph of the first d layers
        w.n_layers = d
        spec = write_model(w, folder, f"target{d}", "target", cfg.widths(), cfg.prefill_chunk, "target.weights", index)
        specs[d] = dataclasses.replace(host_prologue_entry(spec, w), role="target")
    man = new_manifest(
        cfg,
        folder,
        folder.name,
        mf.Source(kind=src.kind, path=src.path, draft=None, sha256=None),
        writer.opts.two_row_matmuls,
        specs[len(layers)],
        tokenizer_file="",
        chat_template_file=None,
        eos_token_ids=(),
        bos_token_id=None,
        defaults=mf.Defaults(k=cfg.k, adaptive=False),
    )
    return man, specs, arch.n_layers, n_rows, arch.vocab_size


def _whole_costs(cfg, cands: dict[str, dict], widths: list[int], scratch: Path, why: str) -> tuple[dict, dict]:
    """(candidate -> seconds by width, the record's method fields), each candidate's target graph
    exported whole (no heads, no validation) and timed after a prefill of PAST positions."""
    from edgespec.export.target.exporter import export

    folders = {}
    for name, changes in cands.items():
        target_only = dataclasses.replace(
            cfg, out=str(scratch / name), validate=False, progress=False, force=False, **changes
        )
        folders[name] = export(dataclasses.replace(target_only, **_no_drafters(cfg)))
    engines, past = prefilled(folders, widths)
    try:
        costs = medians(time_widths(engines, widths, past))
    finally:
        for e in engines.values():
            e.close()
    return costs, {"method": "whole", "why_not_sampled": why}


def _no_drafters(cfg) -> dict:
    """ExportConfig fields that leave every drafter's models out (the probe times the target alone):
    each plugin's source option (named as the plugin) set to None."""
    from edgespec.export.drafters import registry

    fields = {f.name for f in dataclasses.fields(cfg)}
    return {name: None for name in registry() if name in fields}
