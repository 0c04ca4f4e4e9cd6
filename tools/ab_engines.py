"""Plain-decoding A/B of two engine folders (e.g. chain-only vs tree graphs), side by side.

    python tools/ab_engines.py engines/a engines/b [--prompts 10] [--rounds 4] [--drafter none]
    python tools/ab_engines.py engines/a engines/b --calls    # per-call costs instead

Both folders are loaded at once; every prompt runs on both, the order alternating ABBA so that
neither folder always runs first (on a shared 2-core box the second run of a pair is often the
faster one). Prints decode tok/s (prefill excluded) per folder, the ratio, and on how many prompts
the two folders wrote the same text (differently built graphs may round differently).
"""

from __future__ import annotations

import argparse

from edgespec.runtime.apps.bench import load_prompts
from edgespec.runtime.config import RuntimeConfig
from edgespec.runtime.generator import Generator


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("a")
    p.add_argument("b")
    p.add_argument("--prompts", type=int, default=10, help="first N HumanEval prompts (default 10)")
    p.add_argument("--rounds", type=int, default=4, help="passes over the prompts (default 4)")
    p.add_argument("--drafter", default="none", help="drafter for both (default none: plain decoding)")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument(
        "--calls",
        action="store_true",
        help="instead: median seconds of single target calls (256-token prefill, then width 1 and 2 "
        "at past 256), the folders alternating, 30 rounds",
    )
    a = p.parse_args()
    gens = [(f, Generator.load(f, RuntimeConfig(drafter=a.drafter, adaptive=False))) for f in (a.a, a.b)]
    if a.calls:
        return call_costs(gens)
    ids = [gens[0][1].codec.encode(x["prompt"]) for x in load_prompts(None, a.prompts)]
    totals = {f: [0, 0.0] for f, _ in gens}
    outputs: dict[tuple[str, int], list[int]] = {}
    for r in range(a.rounds):
        for i, prompt in enumerate(ids):
            for f, g in gens if (i + r) % 2 == 0 else gens[::-1]:
                out = [int(t) for x in g.generate_ids(prompt, a.max_new_tokens) for t in x]
                outputs[f, i] = out
                n = len(out)
                totals[f][0] += n
                totals[f][1] += g.last_stats.total_s - g.last_stats.prefill_s
    rates = {f: n / s for f, (n, s) in totals.items()}
    for f, rate in rates.items():
        print(f"{f}: {rate:.1f} tok/s decode ({a.drafter})")
    print(f"b / a = {rates[a.b] / rates[a.a]:.3f}")
    same = sum(outputs[a.a, i] == outputs[a.b, i] for i in range(len(ids)))
    print(f"same output on {same}/{len(ids)} prompts")


def call_costs(gens, rounds: int = 30) -> None:
    import time

    import numpy as np

    from edgespec.runtime.prefill import prefill

    ids = np.arange(100, 356)
    res = {f: {"prefill 256": [], "decode T=1": [], "verify T=2": []} for f, _ in gens}
    for r in range(rounds):
        for f, g in gens if r % 2 else gens[::-1]:
            t0 = time.perf_counter()
            prefill(g.target, ids, 0)
            times = [time.perf_counter()]
            for w in (1, 2):
                for _ in range(5):
                    g.target.forward(ids[:w], 256)
                times.append(time.perf_counter())
            res[f]["prefill 256"].append(times[0] - t0)
            res[f]["decode T=1"].append((times[1] - times[0]) / 5)
            res[f]["verify T=2"].append((times[2] - times[1]) / 5)
    for f, d in res.items():
        print(f"{f}: " + ", ".join(f"{k} {np.median(v) * 1e3:.2f} ms" for k, v in d.items()))


if __name__ == "__main__":
    main()
