"""Timing the precision probe's candidate graphs (checks/probe.py decides): each width's calls
after a prefill, the candidates' rounds interleaved so they share the machine's load, and the
sampled models' times scaled to the whole model's (whole_model_costs)."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

PAST = 256  # cached positions before the timed calls
ROUNDS = 12  # timed rounds per width (after a warm-up round)
MIN_ROUNDS = 3  # timed rounds of the sampled models' probe past TIMING_S
# rest before an engine's widths: the engine timed before it leaves its ORT pool threads spinning, and
# on 2 cores they take the next engine's cores (Zen 4, quiet, the default folder twice, rowop: without
# it T = 1..9 read 8.3-15.9 ms in no order, with it 6.2 ... 11.2 ms, rising by ~0.6 ms a row)
SWITCH_REST_S = 0.05


def prefilled(folders: dict[str, Path], widths: list[int]) -> tuple[dict, int]:
    """(name -> the engine of each whole folder with PAST positions prefilled, the past)."""
    from edgespec.engines.context import for_checks
    from edgespec.engines.manifest import load_manifest
    from edgespec.engines.ort import OrtModel

    engines, past = {}, PAST
    for name, folder in folders.items():
        m = for_checks(load_manifest(folder))
        past = min(PAST, m.max_len // 2)  # a small context window: half of it
        e = OrtModel(m, m.target)
        e.load_widths(widths)
        ids = (np.arange(past, dtype=np.int64) * 7919) % (m.target.vocab_size - 2) + 1
        for pos in range(0, past, m.prefill_chunk):
            n = min(m.prefill_chunk, past - pos)
            e.forward(ids[pos : pos + n], pos)
            e.commit(pos, n)
        engines[name] = e
    return engines, past


def time_widths(engines: dict, widths: list[int], past: int, budget_s: float | None = None) -> dict:
    """key -> width -> the seconds of a call at `past` cached positions in each timed round, the
    engines taken in turn within each round (a load that comes and goes hits them alike): ROUNDS
    timed rounds after a warm-up one (each width ran once at load), or MIN_ROUNDS once budget_s
    seconds have passed (a loaded machine)."""
    probe = np.full(max(widths), 42, np.int64)
    times = {n: {w: [] for w in widths} for n in engines}
    start, done = time.perf_counter(), 0
    while done < ROUNDS + 1:
        if budget_s is not None and done > MIN_ROUNDS and time.perf_counter() - start > budget_s:
            break
        for name, e in engines.items():  # engine by engine: the last engine's pool threads spin on for a
            time.sleep(SWITCH_REST_S)  # while after its call, so a rest lets them sleep, an untimed call
            e.forward(probe[:1], past, logits=False)  # wakes this engine's and its widths run back to back
            for w in widths:
                t0 = time.perf_counter()
                e.forward(probe[:w], past, logits=False)
                times[name][w].append(time.perf_counter() - t0)
        done += 1
    return {n: {w: ts[1:] for w, ts in t.items()} for n, t in times.items()}


def medians(times: dict) -> dict:
    """key -> width -> the median of its rounds' seconds."""
    return {n: {w: float(np.median(ts)) for w, ts in t.items()} for n, t in times.items()}


def whole_model_costs(
    by_depth: dict[int, dict[int, float]], n_layers: int, vocab_scale: float = 1.0
) -> dict[int, float]:
    """A model's call costs by width from its sampled graphs' (depth -> width -> seconds; depths 1
    and d, or the model's own depth alone): a layer's cost L the slope between them; the rest of the
    one-layer call (the LM head on the sampled vocabulary rows, plus the embedding, final norm and
    call overhead, counted with the head) times vocab_scale (the whole vocabulary's rows over the
    sampled ones); plus n_layers * L."""
    d = max(by_depth)
    if len(by_depth) == 1:  # the model itself, every vocabulary row
        return dict(by_depth[d])
    one = by_depth[1]
    out = {}
    for w, c in by_depth[d].items():
        layer = (c - one[w]) / (d - 1)
        out[w] = n_layers * layer + vocab_scale * (one[w] - layer)
    return out


def paired_whole_model_costs(
    by_depth: dict[int, dict[int, list[float]]], n_layers: int, vocab_scale: float = 1.0
) -> dict[int, float]:
    """whole_model_costs of each timed round (a round's graphs ran one after the other, under the
    same load: their difference is steadier than the difference of medians), the median over the
    rounds; never below the deepest graph's median (the whole model holds it)."""
    d = max(by_depth)
    widths = list(by_depth[d])
    rounds = len(by_depth[d][widths[0]])
    per_round = [
        whole_model_costs({k: {w: t[w][i] for w in widths} for k, t in by_depth.items()}, n_layers, vocab_scale)
        for i in range(rounds)
    ]
    return {w: max(float(np.median([r[w] for r in per_round])), float(np.median(by_depth[d][w]))) for w in widths}
