"""`edgespec tune`: the practitioner's checklist, automated, on the user's own prompts.

1. Is the workload decode-heavy? (prefill vs decode time share of plain decoding)
2. Try every drafter the folder supports at several k, fixed and adaptive, side by side.
3. Keep the fastest setting whose greedy output is identical to plain decoding on every prompt,
   and record it in the folder's manifest as its default, with the table it was chosen from.
   When nothing beats plain decoding, the default becomes `none`: speculation is not forced.
"""

from __future__ import annotations

import datetime
import sys
from dataclasses import dataclass, field, replace

from edgespec.engines.manifest import Defaults, Manifest, Tuned, load_manifest
from edgespec.runtime.apps.bench import BenchConfig, run_bench
from edgespec.runtime.apps.bench_summary import format_table
from edgespec.runtime.config import RuntimeConfig
from edgespec.runtime.drafters import shipped


@dataclass(frozen=True)
class TuneConfig:
    """What `edgespec tune` runs; a field with a "help" is one of its flags (edgespec/cli_fields.py)."""

    engine: str  # engine folder (its manifest gets the chosen default)
    runtime: RuntimeConfig = RuntimeConfig()  # backend options the bench runs with (drafter / k: tried here)
    prompts: str | None = field(  # None = HumanEval, for a demo
        default=None, metadata={"help": "your prompts, JSONL as for bench (default: HumanEval)"}
    )
    limit: int = field(default=8, metadata={"help": "prompts used (default %(default)s)"})
    max_new_tokens: int = field(default=128, metadata={"help": "tokens generated per prompt (default %(default)s)"})
    ks: tuple[int, ...] = (2, 3, 4, 6, 8)  # fixed k values tried (those the folder supports)
    write: bool = field(  # record the decision in manifest.json
        default=True,
        metadata={"help": "report only; do not change the manifest", "flag": "--dry-run", "action": "store_false"},
    )


def tune(cfg: TuneConfig, out=sys.stdout) -> Defaults:
    """Bench the folder's drafters on the prompts; the fastest lossless setting (recorded as the
    folder's default unless cfg.write is False)."""
    man = load_manifest(cfg.engine)
    drafters = list(shipped(man, cfg.runtime))  # every drafter the folder can run (model-free ones included)
    ks = tuple(k for k in cfg.ks if k <= man.num_speculative_tokens) or (1,)
    bench = BenchConfig(
        engine=cfg.engine,
        runtime=cfg.runtime,
        prompts=cfg.prompts,
        drafters=tuple(drafters),
        ks=ks,
        max_new_tokens=cfg.max_new_tokens,
        limit=cfg.limit,
        adaptive=True,
    )
    report = run_bench(bench, out=out)
    runs = report["runs"]
    plain = next(r for r in runs if r["drafter"] == "none")["totals"]
    split = plain["time_split_s"]
    prefill_share = split["prefill"] / max(plain["seconds"], 1e-9)
    lossless = [r for r in runs if r["totals"]["identical_to_none"] == r["totals"]["n_prompts"]]
    best = max(lossless, key=lambda r: r["totals"]["tokens_per_s"])
    speedup = best["totals"]["tokens_per_s"] / max(plain["tokens_per_s"], 1e-9)
    tuned = Tuned(
        date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        prompts=report["config"]["prompts"],
        n_prompts=plain["n_prompts"],
        prefill_share=prefill_share,
        speedup_vs_none=speedup,
        tokens_per_s=best["totals"]["tokens_per_s"],
        machine=report["machine"]["cpu"],
        table=format_table(report),
    )
    decision = Defaults(
        drafter=best["drafter"], k=best["k"] or man.defaults.k, adaptive=bool(best.get("adaptive")), tuned=tuned
    )
    kind = "decode-heavy" if prefill_share < 0.5 else "prefill-heavy"
    print(f"\nworkload: {kind} (prefill {prefill_share:.0%} of plain decoding time)", file=out)
    if best["drafter"] == "none":
        print("decision: plain decoding; no lossless speculative setting was faster here", file=out)
    else:
        ad = " adaptive" if decision.adaptive else ""
        print(
            f"decision: drafter {best['drafter']} k={best['k']}{ad}, {speedup:.2f}x plain decoding, "
            "output identical to plain on every prompt",
            file=out,
        )
    if cfg.write:
        _write_defaults(cfg.engine, decision)
        print(f"recorded as the default of {cfg.engine}", file=out)
    return decision


def _write_defaults(folder: str, decision: Defaults) -> None:
    """The decision becomes the folder's defaults (read afresh: the bench ran for minutes)."""
    replace(load_manifest(folder), defaults=decision).save()


def describe_default(manifest: Manifest) -> str:
    d = manifest.defaults
    t = d.tuned
    ad = " adaptive" if d.adaptive else ""
    where = (
        f"tuned {t.date[:10]} on {t.n_prompts} prompts, {t.speedup_vs_none:.2f}x plain"
        if t
        else "export default; run `edgespec tune` to choose for your prompts"
    )
    return f"drafter {d.drafter} k={d.k}{ad} ({where})"
