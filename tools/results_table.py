"""Write the README's results table from a bench JSON (`edgespec bench --json`).

    python tools/results_table.py docs/data/bench_drafts_eval.json --drafters none,ngram,suffix,eagle,hybrid
    python tools/results_table.py            # again, from the file and options the README names
    python tools/results_table.py --check    # exit 1 when the README's table is not what its JSON gives

The table goes between `<!-- results:begin OPTIONS -->` and `<!-- results:end -->` in README.md;
OPTIONS (JSON: the bench file, --drafters, --note) are kept there, so a bare run or --check
regenerates every block of the file from its own JSON (a JSON given on the command line replaces the
block that names it, else the first). A `tools/bench_peers.py --json` file gives the table against
the peers instead (each system's speed against llama.cpp's plain decoding on the same GGUF). The caption says
what the JSON records: the prompts and settings, the folder's defaults and graph, the machine, the
date and the command. What an older JSON does not record is said to be unrecorded, and its command
is rebuilt from its config; --note adds what is known from elsewhere (a result page).
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BEGIN = re.compile(r"<!-- results:begin ?(?P<options>[^\n]*?) -->\n.*?<!-- results:end -->", re.S)
NOT_RECORDED = "not recorded in the JSON"


def _k(run: dict) -> str:
    if run.get("tree"):
        return f"tree {run['tree']}"
    return f"<={run['k']} adaptive" if run.get("adaptive") else str(run["k"])


def table(report: dict, drafters: list[str] | None = None, adaptive_only: bool = False) -> str:
    """Markdown rows of the runs of `drafters` (all when None), in the JSON's order; adaptive_only: plain's
    run and the adaptive-k runs (a bench with --k K --adaptive also runs each drafter at a fixed K)."""
    runs = report["runs"]
    missing = sorted(set(drafters or ()) - {r["drafter"] for r in runs})
    if missing:
        have = ", ".join(dict.fromkeys(r["drafter"] for r in runs))
        raise ValueError(f"the JSON has no runs of {', '.join(missing)} (it has {have}). Hint: fix --drafters")
    base = next(r for r in runs if r["drafter"] == "none")["totals"]["tokens_per_s"]
    greedy = report["config"]["temperature"] == 0
    head = ["drafter", "k", "tok/s", "speedup vs none", "mean accepted length (incl. bonus)", "mean verify width"]
    head += ["identical to none"] if greedy else []
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in runs:
        if (drafters and r["drafter"] not in drafters) or (adaptive_only and r["k"] and not r.get("adaptive")):
            continue
        t = r["totals"]
        cells = [
            r["drafter"],
            _k(r),
            f"{t['tokens_per_s']:.1f}",
            f"{t['tokens_per_s'] / base:.2f}x",
            f"{t['mean_accepted_length']:.2f}",
            f"{t['mean_verify_width']:.2f}" if "mean_verify_width" in t else "-",
        ]
        cells += [f"{t['identical_to_none']}/{t['n_prompts']}"] if greedy else []
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)


def n_prompts(report: dict) -> int:
    t = report["runs"][0]["totals"]
    return t["n_prompts"] if "n_prompts" in t else len(report["runs"][0]["prompts"])


def command(report: dict, json_path: str) -> tuple[str, bool]:
    """(the bench command, whether the JSON recorded it); an older JSON's is rebuilt from its config
    (the same prompts, drafters, k, trees and settings; runtime flags left at their defaults)."""
    c = report["config"]
    if c.get("command"):
        return c["command"], True
    args = ["edgespec", "bench", "--engine", c["engine"]]
    humaneval = re.fullmatch(r"HumanEval\[:(\d+)\]", c["prompts"])
    args += [] if humaneval else ["--prompts", c["prompts"]]
    limit = int(humaneval.group(1)) if humaneval else c.get("limit", n_prompts(report))
    args += ["--limit", str(limit)] if limit != 20 else []
    args += ["--drafter", ",".join(c["drafters"]), "--k", ",".join(map(str, c["k"]))]
    args += ["--adaptive"] if c.get("adaptive") else []
    args += ["--tree", ",".join(c["trees"])] if c.get("trees") else []
    args += ["--max-new-tokens", str(c["max_new_tokens"])] if c["max_new_tokens"] != 128 else []
    args += ["--temperature", str(c["temperature"]), "--seed", str(c["seed"])] if c["temperature"] else []
    args += ["--hybrid-lookup", c["hybrid_lookup"]] if c.get("hybrid_lookup", "suffix") != "suffix" else []
    return shlex.join(args + ["--json", json_path]), False


def _machine(m: dict) -> str:
    cores = f"{m['cpu_cores']} cores, " if "cpu_cores" in m else ""
    isa = m.get("cpu_isa")
    if isa is None:
        isa_text = f"ISA extensions {NOT_RECORDED}"
    else:
        isa_text = ", ".join(isa) if isa else "no AVX2, AVX-512 or AMX flags"
        isa_text += "" if not isa or any(f.startswith("amx") for f in isa) else ", no AMX"
    version = f"edgespec {m['edgespec']}" if "edgespec" in m else f"edgespec version {NOT_RECORDED}"
    return (
        f"{m['cpu']} ({isa_text}), {cores}{m['logical_cpus']} logical CPUs, {m['provider']} provider, "
        f"onnxruntime {m['onnxruntime']}, {version}"
    )


def _folder(c: dict) -> str:
    f = c.get("folder")
    if f is None:
        return f"folder defaults and graph flavour {NOT_RECORDED}"
    d = f["defaults"]
    adaptive = "adaptive" if d["adaptive"] else "fixed"
    tuned = f", chosen by `edgespec tune` on {d['tuned']}" if d.get("tuned") else ""
    graph = f"{f['graph_flavour']} graph"
    graph += f" (kept portable: {', '.join(f['portable_ops'])})" if f["portable_ops"] else ""
    graph += ", host prologue" if f["host_prologue"] else ""
    graph += ", two-row int4 decode" if f["two_row_matmuls"] else ""
    return (
        f"folder defaults drafter {d['drafter']}, k {d['k']} {adaptive}{tuned}; {graph}; exported "
        f"{f['exported'][:10]} by edgespec {f['exported_by']}"
    )


def caption(report: dict, json_path: str, note: str = "") -> str:
    c = report["config"]
    prompts = "HumanEval prompts" if c["prompts"].startswith("HumanEval") else f"prompts of `{c['prompts']}`"
    sampling = "greedy" if c["temperature"] == 0 else f"temperature {c['temperature']}, seed {c['seed']}"
    extras = [f"precision {c['precision']}"] if "precision" in c else []
    extras += ["EAGLE head inside the verify call"] if c.get("fused_head") else []
    lookup = {"suffix": "suffix decoding", "ngram": "prompt lookup"}.get(c.get("hybrid_lookup"), c.get("hybrid_lookup"))
    extras += [f"hybrid pairs the EAGLE head with {lookup}"] if "hybrid" in c["drafters"] and lookup else []
    date = f"Run on {c['date'][:10]} (UTC)" if c.get("date") else f"Date {NOT_RECORDED}"
    engine = f"Engine `{c['engine']}`" + (f" ({', '.join(extras)})" if extras else "")
    cmd, recorded = command(report, json_path)
    text = (
        f"{n_prompts(report)} {prompts}, {sampling}, {c['max_new_tokens']} new tokens, every configuration "
        f"interleaved prompt by prompt. {engine}; {_folder(c)}. Machine: {_machine(report['machine'])}. "
        f"{date}. Data: [{json_path}]({json_path}). {note} Made by"
        + ("" if recorded else " (rebuilt from the JSON's config, which records no command)")
        + ":"
    )
    return "\n".join(
        [
            textwrap.fill(" ".join(text.split()), 100, break_on_hyphens=False, break_long_words=False),
            "",
            "```bash",
            cmd,
            "```",
        ]
    )


PEERS_BASE = "llama.cpp plain"  # the row the peers table divides by (plain decoding, same GGUF)


def peers_table(report: dict) -> str:
    """Markdown rows of a tools/bench_peers.py JSON: tok/s end to end, the decode phase (per-token latency
    after the first, p50), TTFT, each against llama.cpp's plain run when the JSON has one."""
    rows_in = report["rows"]
    base = next((r for r in rows_in if r["system"] == PEERS_BASE), None)
    head = ["system", "tok/s", f"vs {PEERS_BASE}", "decode ms/token p50", "TTFT ms", "note"]
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows_in:
        ratio = f"{r['tokens_per_s'] / base['tokens_per_s']:.2f}x" if base else "-"
        cells = [r["system"], f"{r['tokens_per_s']:.1f}", ratio, f"{r['itl_ms']['p50']:.2f}", f"{r['ttft_ms']:.0f}"]
        rows.append("| " + " | ".join(cells + [r.get("note", "")]) + " |")
    return "\n".join(rows)


def peers_caption(report: dict, json_path: str, note: str = "") -> str:
    c, m = report["config"], report["machine"]
    skipped = "; ".join(f"{k}: {v}" for k, v in report.get("skipped", {}).items())
    text = (
        f"The first {c['limit']} HumanEval prompts, raw, greedy, {c['max_new_tokens']} new tokens, {c['threads']} "
        f"threads, every system interleaved prompt by prompt; llama.cpp reads the GGUF the default folder is "
        f"exported from ({Path(c['gguf']).name}). Machine: {m['cpu']}, {m['logical_cpus']} logical CPUs, "
        f"onnxruntime {m['onnxruntime']}. Data: [{json_path}]({json_path}). "
        + (f"Skipped: {skipped}. " if skipped else "")
        + f"{note} Made by:"
    )
    cmd = c.get("command") or shlex.join(
        ["python", "tools/bench_peers.py", "--engine", c["engine"], "--edgespec", c["edgespec"]]
        + ["--limit", str(c["limit"]), "--json", json_path]
    )
    wrapped = textwrap.fill(" ".join(text.split()), 100, break_on_hyphens=False, break_long_words=False)
    return "\n".join([wrapped, "", "```bash", cmd, "```"])


def block(report: dict, json_path: str, drafters: list[str] | None, note: str, adaptive_only: bool = False) -> str:
    options = (
        {"json": json_path}
        | ({"drafters": ",".join(drafters)} if drafters else {})
        | ({"adaptive_only": True} if adaptive_only else {})
        | ({"note": note} if note else {})
    )
    if "rows" in report:  # tools/bench_peers.py
        body = peers_caption(report, json_path, note) + "\n\n" + peers_table(report)
    else:
        body = caption(report, json_path, note) + "\n\n" + table(report, drafters, adaptive_only)
    return f"<!-- results:begin {json.dumps(options, ensure_ascii=False)} -->\n" + body + "\n<!-- results:end -->"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument(
        "json",
        nargs="?",
        help="bench JSON, relative to the repository root (default: the one the "
        "README's begin marker names, with its options)",
    )
    p.add_argument("--drafters", help="comma-separated drafters whose rows to show (default: every row)")
    p.add_argument("--adaptive-only", action="store_true", help="show plain's row and the adaptive-k rows only")
    p.add_argument("--note", default="", help="a sentence for the caption: what the JSON does not record")
    p.add_argument("--readme", default=str(ROOT / "README.md"), help="the file holding the markers")
    p.add_argument("--check", action="store_true", help="write nothing; exit 1 when the file's table differs")
    return p


def _regenerated(found: re.Match, readme: Path) -> str:
    """A block again, from the JSON and options its begin marker names."""
    saved = json.loads(found.group("options") or "{}")
    if "json" not in saved:
        raise SystemExit(f"{readme}: a begin marker names no JSON. Hint: run once with the JSON's path")
    drafters = saved["drafters"].split(",") if saved.get("drafters") else None
    report = json.loads((ROOT / saved["json"]).read_text())
    return block(report, saved["json"], drafters, saved.get("note", ""), saved.get("adaptive_only", False))


def main(argv: list[str] | None = None) -> int:
    a = _parser().parse_args(argv)
    readme = Path(a.readme)
    text = readme.read_text()
    blocks = list(BEGIN.finditer(text))
    if not blocks:
        raise SystemExit(
            f"{readme}: no <!-- results:begin --> ... <!-- results:end --> markers. Hint: add both "
            "lines where the table belongs"
        )
    named = [json.loads(f.group("options") or "{}").get("json") for f in blocks]
    target = named.index(a.json) if a.json in named else 0
    new, end = "", 0
    for i, found in enumerate(blocks):
        if i == target and a.json is not None:  # a table from the JSON given, with the options given
            drafters = a.drafters.split(",") if a.drafters else None
            fresh = block(json.loads((ROOT / a.json).read_text()), a.json, drafters, a.note, a.adaptive_only)
        else:
            fresh = _regenerated(found, readme)
        new, end = new + text[end : found.start()] + fresh, found.end()
    new += text[end:]
    if a.check:
        if new != text:
            print(
                f"{readme}: a results table differs from its JSON. Hint: python tools/results_table.py", file=sys.stderr
            )
            return 1
        return 0
    readme.write_text(new)
    print(f"wrote {len(blocks)} results table(s) into {readme}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
