"""Width tables: what one target call of T tokens costs, per folder, side by side.

    python tools/width_table.py engines/int4 engines/int8 [--past 256] [--widths 1,2,3,5,9,16] [--repeats 15]

Every folder's target is loaded at once and the calls interleave (folder by folder, width by width,
round by round), so a busy moment hits all of them alike. Prints the median milliseconds of a call
of T tokens at `past` cached positions and its ratio to T=1: the cost table adaptive k and tree
sizes are chosen from (a verify row nearly free means wide verify calls pay).
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np


def width_table(folders: list[str], past: int, widths: list[int], repeats: int) -> dict[str, dict[int, float]]:
    import edgespec.runtime.drafters  # noqa: F401  (registers the drafter sections a folder ships)
    from edgespec.engines.base import EngineError
    from edgespec.engines.manifest import load_manifest
    from edgespec.engines.ort import OrtModel
    from edgespec.engines.session import share_thread_pool

    # One thread pool for every folder, as the CLI runs: with a pool per session, each target's
    # threads spin after its call and steal the cores of the next folder's call (up to 2x on 2 cores).
    try:
        share_thread_pool()
    except EngineError:  # sessions exist already (called from a process that made them): keep their pools
        pass
    engines = {}
    for f in folders:
        m = load_manifest(f)
        e = OrtModel(m, m.target)
        usable = [w for w in widths if w in e.widths or w <= max(e.widths)]
        e.load_widths(sorted({e.width_for(w) for w in usable}))
        ids = np.arange(past, dtype=np.int64) % 1000 + 10
        pos = 0
        while pos < past:  # a real context of `past` rows
            n = min(m.prefill_chunk, past - pos)
            e.forward(ids[pos : pos + n], pos)
            e.commit(pos, n)
            pos += n
        engines[f] = e
    times = {f: {w: [] for w in widths} for f in folders}
    probe = np.full(max(widths), 42, np.int64)
    for _ in range(repeats + 2):  # the first two rounds warm up
        for w in widths:
            for f, e in engines.items():
                t0 = time.perf_counter()
                e.forward(probe[:w], past)
                times[f][w].append(time.perf_counter() - t0)
    return {f: {w: float(np.median(ts[2:])) for w, ts in t.items()} for f, t in times.items()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("folders", nargs="+")
    p.add_argument("--past", type=int, default=256, help="cached positions before the call (default 256)")
    p.add_argument("--widths", default="1,2,3,5,9,16", help="tokens per call (default 1,2,3,5,9,16)")
    p.add_argument("--repeats", type=int, default=15, help="timed rounds (default 15)")
    p.add_argument("--json", help="also write the table as JSON here")
    a = p.parse_args()
    widths = [int(w) for w in a.widths.split(",")]
    table = width_table(a.folders, a.past, widths, a.repeats)
    print(f"median ms per target call at past {a.past} (ratio to T=1)")
    print(f"{'folder':34}" + "".join(f"{'T=' + str(w):>15}" for w in widths) + f"{'per extra row':>15}")
    lo, hi = widths[0], widths[-1]
    for f, row in table.items():
        extra = (row[hi] - row[lo]) / (hi - lo) * 1e3 if hi > lo else 0.0  # ms per row beyond the first
        cells = "".join(f"{row[w] * 1e3:8.2f} ({row[w] / row[widths[0]]:4.2f})" for w in widths)
        print(f"{f:34}" + cells + f"{extra:12.2f} ms")
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(
                {"past": a.past, "table_ms": {f: {w: v * 1e3 for w, v in r.items()} for f, r in table.items()}},
                fh,
                indent=1,
            )


if __name__ == "__main__":
    main()
