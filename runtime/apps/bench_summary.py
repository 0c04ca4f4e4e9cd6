"""A bench run's numbers: each configuration's totals over its prompts (throughput, acceptance,
latency percentiles and histograms, time split, grammar counts), its rows of the report's `runs`,
and the markdown table printed after a run (bench.py runs it; report.py and tune.py read it)."""

from __future__ import annotations

import numpy as np

from edgespec.runtime.stats import GenerationStats

ITL_EDGES_MS = [0, 2, 4, 6, 8, 10, 12, 15, 20, 25, 30, 40, 50, 75, 100, 150, 200, 300, 500, 1000, 1e9]


def totals(stats: list[GenerationStats]) -> dict:
    tokens = sum(s.n_output for s in stats)
    seconds = sum(s.total_s for s in stats)
    calls = sum(s.n_target_calls for s in stats)
    drafted = sum(s.n_drafted for s in stats)
    forced_rows = sum(s.n_forced_rows for s in stats)  # a grammar's forced tokens ride in the verify calls too
    itl = np.array([x for s in stats for x in s.itl_s]) * 1e3
    pct = {f"p{q}": float(np.percentile(itl, q)) if len(itl) else 0.0 for q in (50, 95, 99)}
    by_pos = np.zeros(64)
    den = np.zeros(64)
    for s in stats:
        by_pos += s.accepted_at
        den += s.drafted_at
    n_pos = int(np.count_nonzero(den))
    sources: dict[str, dict[str, int]] = {}  # hybrid: which drafter made the proposals
    for s in stats:
        for src, counts in s.sources.items():
            t = sources.setdefault(src, {"steps": 0, "drafted": 0, "accepted": 0})
            for key, n in zip(("steps", "drafted", "accepted"), counts, strict=True):
                t[key] += n
    # the decode phase: tokens after each prompt's first, over the time after its first token (TTFT)
    decode_tokens = sum(max(s.n_output - 1, 0) for s in stats)
    decode_s = sum(s.total_s - s.ttft_s for s in stats)
    return {
        "tokens": tokens,
        "seconds": seconds,
        "tokens_per_s": tokens / seconds if seconds else 0.0,
        "decode_tokens_per_s": decode_tokens / decode_s if decode_s > 0 else 0.0,
        "mean_accepted_length": sum(s.n_step_tokens for s in stats) / calls if calls else 0.0,
        # tokens per verify call incl. the pending one: the target's cost side (trees: nodes)
        "mean_verify_width": (drafted + forced_rows + calls) / calls if calls else 0.0,
        "acceptance_rate": sum(s.n_accepted for s in stats) / drafted if drafted else 0.0,
        "itl_ms": pct,
        "ttft_ms": float(np.mean([s.ttft_s for s in stats]) * 1e3),
        "acceptance_by_position": [float(by_pos[i] / den[i]) for i in range(n_pos)],
        "itl_ms_histogram": {"edges": ITL_EDGES_MS, "counts": np.histogram(itl, ITL_EDGES_MS)[0].tolist()},
        "time_split_s": {
            k: sum(s.to_dict()["time_split_s"][k] for s in stats)
            for k in ("prefill", "draft", "verify", "host", "grammar")
        },
        "target_calls": calls,
        "draft_sources": sources,
        "forced_tokens": sum(s.n_forced for s in stats),
        "grammar_cut": sum(s.n_grammar_cut for s in stats),
        "grammar_ms_per_token": sum(s.grammar_s for s in stats) * 1e3 / tokens if tokens else 0.0,
    }


def runs(results: dict, structured: bool) -> list[dict]:
    """The report's `runs`: one row per configuration (drafter, k, adaptive, tree, free: without the
    prompts' grammar) of results {config: {"stats", "prompts"}}, the plain configuration first."""
    base_ids = [r["output_ids"] for r in results[("none", 0, False, "", False)]["prompts"]]
    rows = []
    for (d, k, ad, tree, free), r in results.items():
        same = sum(a["output_ids"] == b for a, b in zip(r["prompts"], base_ids, strict=True))
        extra = {}
        if structured:  # valid: parses and validates against its schema
            extra = {"constrained": not free, "json_valid": sum(x["json"] == "valid" for x in r["prompts"])}
        rows.append(
            {
                "drafter": d,
                "k": k,
                "adaptive": ad,
                "totals": totals(r["stats"]) | {"identical_to_none": same, "n_prompts": len(base_ids)} | extra,
                "prompts": r["prompts"],
            }
            | ({"tree": tree} if tree else {})
            | ({"constrained": not free} if structured else {})
        )
    return rows


def format_table(report: dict) -> str:
    base = next(r for r in report["runs"] if r["drafter"] == "none")["totals"]["tokens_per_s"]
    greedy = report["config"]["temperature"] == 0
    structured = report["config"].get("structured", False)
    rows = [
        "| drafter | k | tok/s | speedup vs none | mean accepted length (incl. bonus) | mean verify width "
        "| acceptance rate | ITL p50 / p99 ms | TTFT ms |"
        + (" identical to none |" if greedy else "")
        + (" forced tokens | grammar ms/token | valid JSON |" if structured else ""),
        "|---|---|---|---|---|---|---|---|---|" + ("---|" if greedy else "") + ("---|---|---|" if structured else ""),
    ]
    for r in report["runs"]:
        t = r["totals"]
        k = f"<={r['k']} adaptive" if r.get("adaptive") else r["k"]
        if r.get("tree"):
            k = f"tree {r['tree']}" + (" adaptive" if r.get("adaptive") else "")
        name = r["drafter"] + (" (unconstrained)" if structured and not r.get("constrained", True) else "")
        row = (
            f"| {name} | {k} | {t['tokens_per_s']:.1f} | {t['tokens_per_s'] / base:.2f}x | "
            f"{t['mean_accepted_length']:.2f} | {t.get('mean_verify_width', 0):.2f} | {t['acceptance_rate']:.2f} | "
            f"{t['itl_ms']['p50']:.1f} / "
            f"{t['itl_ms']['p99']:.1f} | {t['ttft_ms']:.0f} |"
        )
        if greedy:
            row += f" {t['identical_to_none']}/{t['n_prompts']} |"
        if structured:
            row += (
                f" {t.get('forced_tokens', 0)} | {t.get('grammar_ms_per_token', 0.0):.3f} | "
                f"{t.get('json_valid', 0)}/{t['n_prompts']} |"
            )
        rows.append(row)
    return "\n".join(rows)
