"""EAGLE with the fused target+head graph vs separate head calls, side by side in one process.

    python tools/ab_fused_head.py [--engine E] [--prompts tools/prompts/chat_eval.jsonl] [--k 1,2,3]
                                  [--drafter eagle] [--rounds 1] [--limit 20]

Two generators on one folder (same weights mapping, one shared ONNX Runtime pool as the CLI
uses): `fuse_head=True` (the verify call also runs the head, so greedy d_1 comes free) and
`fuse_head=False` (a catch-up head call after each verify). Every prompt runs on both at each
k, the order alternating so neither always runs first. Prints decode tok/s (prefill excluded),
head calls per output token, the ratio, and whether both wrote the same tokens (they must: the
target's numbers do not depend on it, and neither do the drafts).
"""

from __future__ import annotations

import argparse

from edgespec.engines.ort import share_thread_pool
from edgespec.runtime.apps.bench import load_prompts
from edgespec.runtime.config import RuntimeConfig
from edgespec.runtime.generator import Generator


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--engine", default="engines/smollm2-135m-instruct")
    p.add_argument("--prompts", default="tools/prompts/chat_eval.jsonl", help="JSONL prompts (bench format)")
    p.add_argument("--limit", type=int, default=20)
    p.add_argument("--k", default="1,2,3", help="comma-separated k values")
    p.add_argument("--drafter", default="eagle", help="eagle or hybrid")
    p.add_argument("--rounds", type=int, default=1, help="passes over the prompts")
    p.add_argument("--max-new-tokens", type=int, default=128)
    a = p.parse_args()
    share_thread_pool()
    ks = [int(x) for x in a.k.split(",")]
    gens = {
        fused: Generator.load(a.engine, RuntimeConfig(drafter=a.drafter, k=max(ks), adaptive=False, fuse_head=fused))
        for fused in (True, False)
    }
    if gens[True].engines.get("eagle").fused is None:
        raise SystemExit(f"{a.engine} has no fused target+EAGLE graph; re-export it with this edgespec")
    prompts = load_prompts(a.prompts, a.limit)
    ids = [gens[True].codec.encode(x.get("messages", x.get("prompt"))) for x in prompts]
    totals = {(f, k): [0, 0.0, 0] for f in gens for k in ks}  # tokens, decode seconds, head calls
    same = {k: 0 for k in ks}
    for r in range(a.rounds):
        for i, prompt in enumerate(ids):
            for k in ks:
                outs = {}
                for f in (True, False) if (i + r + k) % 2 == 0 else (False, True):
                    g = gens[f]
                    g.set_drafter(a.drafter, k)
                    g.forget()
                    outs[f] = [int(t) for x in g.generate_ids(prompt, a.max_new_tokens) for t in x]
                    st = g.last_stats
                    t = totals[f, k]
                    t[0] += len(outs[f])
                    t[1] += st.total_s - st.prefill_s
                    t[2] += st.n_draft_calls
                same[k] += outs[True] == outs[False]
    print(f"{a.drafter} on {len(ids)} prompts x {a.rounds} round(s), {a.max_new_tokens} new tokens, {a.engine}")
    print(
        "| k | fused tok/s | separate tok/s | fused / separate | head calls per token fused / separate | same tokens |"
    )
    print("|---|---|---|---|---|---|")
    for k in ks:
        (nf, sf, cf), (ns, ss, cs) = totals[True, k], totals[False, k]
        print(
            f"| {k} | {nf / sf:.1f} | {ns / ss:.1f} | {nf / sf / (ns / ss):.3f}x | {cf / nf:.2f} / {cs / ns:.2f} "
            f"| {same[k]}/{len(ids) * a.rounds} |"
        )


if __name__ == "__main__":
    main()
