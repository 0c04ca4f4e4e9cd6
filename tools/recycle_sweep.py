"""Tokens per target call against mean verify width for drafter settings, greedy, fixed k: one
folder loaded once, each setting from the same base config with a fresh drafter store (its recycle
table and suffix cache learn over the prompts in order, as in `edgespec bench`), every output checked
against the first setting's (greedy speculative output is plain output, so they must all agree).

    python tools/recycle_sweep.py FOLDER PROMPTS.jsonl [PROMPTS2.jsonl ...] --k 4 \\
        --set drafter=ngram --set drafter=recycle,recycle_min_prob=0.3 [--json out.json]

Each --set is a comma-separated list of RuntimeConfig fields (drafter=..., recycle_every_row=...,
tree=9:4:2:2). Counts only (no timings): fine to run on a loaded machine. Tune on non-eval prompts
(chat_eval, repeated_tasks); the eval sets are for reporting once.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from edgespec.runtime.apps.bench import load_prompts
from edgespec.runtime.config import RuntimeConfig
from edgespec.runtime.generator import Generator
from edgespec.runtime.tree import TreeConfig


def parse_set(text: str) -> dict:
    """'drafter=recycle,recycle_min_prob=0.3' -> {'drafter': 'recycle', 'recycle_min_prob': 0.3}."""
    out = {}
    for part in text.split(","):
        key, _, value = part.partition("=")
        if key == "tree":
            out[key] = TreeConfig.parse(value) if value else TreeConfig()
            continue
        default = RuntimeConfig.__dataclass_fields__[key].default
        if isinstance(default, bool):
            out[key] = value.lower() in ("1", "true", "yes")
        else:  # (typed as the field's default)
            out[key] = type(default)(value) if default is not None and value else value
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("folder")
    ap.add_argument("prompts", nargs="+")
    ap.add_argument("--set", action="append", required=True, help="drafter settings (repeatable)")
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--limit", type=int, default=1000, help="prompts per file")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json", help="write the rows here too")
    a = ap.parse_args()
    prompts = [p for f in a.prompts for p in load_prompts(f, a.limit)]
    g = Generator.load(a.folder, RuntimeConfig(drafter="none", k=a.k, adaptive=False, threads=a.threads))
    encoded = [g.codec.encode(p.get("messages", p.get("prompt"))) for p in prompts]
    rows, ref, base = [], None, g.cfg
    for spec in a.set:
        changes = parse_set(spec)
        g.drafter_store = {}  # a fresh table / suffix cache: nothing learned from another setting
        g.cfg = base  # (reconfigure keeps what it is not told: no setting may inherit the one before)
        g.reconfigure(**({"k": a.k, "adaptive": False, "tree": TreeConfig()} | changes))
        calls = steps_tokens = drafted = 0
        outs = []
        t0 = time.perf_counter()
        for ids in encoded:
            g.forget()
            outs.append([int(t) for c in g.generate_ids(ids, a.max_new_tokens) for t in c])
            st = g.last_stats
            calls += st.n_target_calls
            steps_tokens += st.n_step_tokens
            drafted += st.n_drafted
        ref = ref if ref is not None else outs
        same = sum(x == y for x, y in zip(outs, ref, strict=True))
        row = {
            "set": spec,
            "tokens_per_call": round(steps_tokens / calls, 4),
            "mean_verify_width": round((drafted + calls) / calls, 4),
            "target_calls": calls,
            "identical": f"{same}/{len(outs)}",
            "seconds": round(time.perf_counter() - t0, 1),
        }
        rows.append(row)
        print(json.dumps(row), flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"folder": a.folder, "prompts": a.prompts, "k": a.k, "rows": rows}, f, indent=1)
    if any(r["identical"] != rows[0]["identical"] for r in rows):
        print("outputs differ between settings", file=sys.stderr)


if __name__ == "__main__":
    main()
