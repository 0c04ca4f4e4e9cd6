"""What a drafting head's call costs right after a target call (what each speculative step pays).

    python tools/head_call_cost.py [ENGINE] [--thread-pool shared|session] [--rounds 120]

Alternates a T=1 target call with a T=1 call of the folder's EAGLE head (and its Medusa heads),
then calls the head again at once ("warm"); prints the medians. The thread pool is process-wide,
so compare the two settings in two runs of this script.
"""

from __future__ import annotations

import argparse
import time

import numpy as np


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("engine", nargs="?", default="engines/smollm2-135m-instruct")
    ap.add_argument("--thread-pool", choices=["shared", "session"], default="shared")
    ap.add_argument("--rounds", type=int, default=120)
    a = ap.parse_args()
    from edgespec.engines.ort import share_thread_pool

    if a.thread_pool == "shared":
        share_thread_pool()
    from edgespec.runtime.config import RuntimeConfig
    from edgespec.runtime.generator import Generator

    g = Generator.load(a.engine, RuntimeConfig(drafter="none", adaptive=False))
    tgt = g.target
    feat = np.random.default_rng(0).standard_normal((1, tgt.hidden_size)).astype(np.float32)
    ids = np.array([100])
    calls = {}
    if g.engines.get("eagle").head is not None:
        calls["eagle"] = lambda: g.engines.get("eagle").head.forward(ids, 300, features=feat)
    if g.engines.get("medusa") is not None:
        calls["medusa"] = lambda: g.engines.get("medusa").forward(feat[0])
    times: dict[str, list[float]] = {"target": []}
    for name, call in calls.items():
        call()
        times[f"{name} after target"], times[f"{name} warm"] = [], []
    tgt.forward(ids, 300)
    for _ in range(a.rounds):
        for name, call in calls.items():
            t0 = time.perf_counter()
            tgt.forward(ids, 300)
            t1 = time.perf_counter()
            call()
            t2 = time.perf_counter()
            call()
            t3 = time.perf_counter()
            times["target"].append(t1 - t0)
            times[f"{name} after target"].append(t2 - t1)
            times[f"{name} warm"].append(t3 - t2)
    print(
        f"{a.engine}, thread pool {a.thread_pool}, {a.rounds} rounds, median ms: "
        + ", ".join(f"{k} {1000 * float(np.median(v)):.3f}" for k, v in times.items())
    )


if __name__ == "__main__":
    main()
