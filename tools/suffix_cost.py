"""Per-step cost of the suffix drafter against the size of its cache of recent requests.

    python tools/suffix_cost.py [--tokens 1000000] [--steps 300]

Fills the cache with synthetic requests (Zipf-distributed ids over the default model's 49,152
vocabulary, 500 tokens each, every fourth request a near-repeat of an earlier one so that matches
are long and continuations many), then times `propose(k=8)` (the drafter's whole step: the longest
match by binary search over the index, the frequency-weighted walk) on a 1,000-token sequence that
repeats parts of cached requests. Prints the median and p95 per step and the time of one re-index.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from edgespec.runtime.drafters.suffix import SuffixCache, SuffixConfig, SuffixDrafter
from edgespec.runtime.state import SeqState

V = 49_152


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", type=int, default=1_000_000, help="cached tokens (default 1000000)")
    ap.add_argument("--steps", type=int, default=300, help="timed steps (default 300)")
    a = ap.parse_args()
    rng = np.random.default_rng(0)
    cache = SuffixCache(SuffixConfig(max_tokens=a.tokens + 1000, tail_tokens=a.tokens), vocab_size=V)
    requests = []
    while len(cache) < a.tokens:
        if requests and rng.random() < 0.25:  # a near-repeat: an earlier request with a few edits
            r = requests[rng.integers(len(requests))].copy()
            r[rng.integers(0, len(r), 5)] = rng.zipf(1.2, 5) % V
        else:
            r = (rng.zipf(1.2, 500) % V).astype(np.int64)
        requests.append(r)
        cache.tokens = np.concatenate([cache.tokens, r, [-1]])
    t0 = time.perf_counter()
    cache._reindex()
    t_index = time.perf_counter() - t0
    drafter = SuffixDrafter(cache)
    toks = np.zeros(2048, np.int64)
    parts = [requests[i][:100] for i in rng.integers(0, len(requests), 10)]
    toks[:1000] = np.concatenate(parts)
    times, drafted = [], 0
    for i in range(a.steps):
        n = 500 + i  # the sequence grows as it would while generating
        seq = SeqState(tokens=toks, n=n, n_prompt=400, tgt_past=n - 1)
        t0 = time.perf_counter()
        drafted += drafter.propose(seq, 8).n_drafted
        times.append(time.perf_counter() - t0)
    ms = np.array(times) * 1e3
    mib = (cache._keys.nbytes + cache._pos.nbytes + cache.tokens.nbytes) / 2**20
    print(f"cache {len(cache):,} tokens ({mib:.0f} MiB with its index); re-index {t_index:.2f} s")
    print(
        f"propose(k=8): median {np.median(ms):.3f} ms, p95 {np.percentile(ms, 95):.3f} ms over {a.steps} steps; "
        f"{drafted / a.steps:.2f} tokens drafted per step"
    )


if __name__ == "__main__":
    main()
