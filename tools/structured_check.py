"""Structured output with every drafter against constrained plain decoding on a real folder: the
json_eval prompts (each with its JSON Schema) plus regex / Lark requests, greedy and seeded; reports
per drafter how many requests equal plain (ids and streamed text) and how many validate.

    .venv/bin/python tools/structured_check.py --engine engines/smollm2-135m-instruct [--limit 30]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from edgespec.runtime.config import RuntimeConfig
from edgespec.runtime.generator import Generator
from edgespec.runtime.grammar import grammar_from
from edgespec.runtime.sampling import SamplingConfig

COLOURS = "(red|green|blue|yellow|black|white)"


def _strict_object(**types: str) -> dict:
    """The JSON Schema of an object with exactly these fields, each of its JSON type, all required."""
    props = {name: {"type": t} for name, t in types.items()}
    return {"type": "object", "properties": props, "required": list(types), "additionalProperties": False}


EXTRA = [  # (messages, kind, grammar text): the cases and a few more shapes
    ("How old is Ann?", "regex", r"[A-Z][a-z]+ (is|was) [0-9]{1,3} years old\."),
    ("Where does Ann live?", "json_schema", _strict_object(name="string", age="integer", city="string")),
    (
        "Name a French city and its population.",
        "json_schema",
        _strict_object(name="string", population="integer", city="string"),
    ),
    ("List three colours.", "regex", COLOURS + r"(, " + COLOURS + r"){2}\."),
    ("Write a date.", "regex", r"20[0-9]{2}-(0[1-9]|1[0-2])-[0-3][0-9]"),
    ("Say yes or no, then why.", "lark", 'start: ("yes" | "no") ". " /[a-z ]{5,40}/ "."'),
]


def requests(limit: int):
    rows = [json.loads(x) for x in Path("tools/prompts/json_eval.jsonl").read_text().splitlines() if x.strip()]
    out = [(r["messages"], "json_schema", r["schema"]) for r in rows]
    out += [([{"role": "user", "content": m}], kind, g) for m, kind, g in EXTRA]
    return out[:limit]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--engine", default="engines/smollm2-135m-instruct")
    ap.add_argument("--limit", type=int, default=30)
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--drafters", default="ngram,suffix,eagle,hybrid,medusa,recycle,merged")
    ap.add_argument("--sampling", default="greedy,t0.7_seeded", help="greedy, t0.7_seeded or both")
    ap.add_argument("--settings", default="2:fixed,4:adaptive", help="k:fixed|adaptive pairs")
    ap.add_argument("--json", default="")
    a = ap.parse_args()
    g = Generator.load(a.engine, RuntimeConfig(drafter="none", k=4))
    reqs = requests(a.limit)
    samplings = {"greedy": SamplingConfig(), "t0.7_seeded": SamplingConfig(temperature=0.7, seed=1)}
    report = {}
    settings = [(int(k), mode == "adaptive") for k, mode in (x.split(":") for x in a.settings.split(","))]
    for sname, sampling in samplings.items():
        if sname not in a.sampling.split(","):
            continue
        g.reconfigure(drafter="none", k=None, adaptive=False)
        ref = []
        for msgs, kind, gram in reqs:
            grammar = grammar_from(**{kind if kind != "lark" else "grammar": gram})
            ids = g.codec.encode(msgs)
            text = "".join(g.stream_text(ids, a.max_new_tokens, sampling, grammar=grammar))
            ref.append((ids, grammar, text, g.last_output_ids()))
        for d in a.drafters.split(","):
            for k, adaptive in settings:
                g.reconfigure(drafter=d, k=k, adaptive=adaptive)
                same = valid = kept = 0
                t0 = time.perf_counter()
                for (ids, grammar, text, out_ids), (_, kind, gram) in zip(ref, reqs, strict=True):
                    got = "".join(g.stream_text(ids, a.max_new_tokens, sampling, grammar=grammar))
                    same += got == text and np.array_equal(g.last_output_ids(), out_ids)
                    kept += g.last_stats.n_accepted
                    if kind == "json_schema" and g.last_stats.finish_reason == "stop":
                        try:
                            import jsonschema

                            jsonschema.validate(json.loads(got), gram)
                            valid += 1
                        except Exception:
                            pass
                    else:
                        valid += 1
                row = {
                    "same": same,
                    "valid": valid,
                    "n": len(reqs),
                    "kept": kept,
                    "s": round(time.perf_counter() - t0, 1),
                }
                report[f"{sname} {d} k={k} adaptive={adaptive}"] = row
                print(
                    f"{sname:12} {d:8} k={k} adaptive={adaptive!s:5} same {same}/{len(reqs)} valid {valid}/{len(reqs)} "
                    f"drafts kept {kept} ({row['s']} s)",
                    flush=True,
                )
    if a.json:
        Path(a.json).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
