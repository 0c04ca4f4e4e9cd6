"""edgespec against the peers a user would pick instead, on the same prompts, in one run.

    python tools/bench_peers.py --engine engines/smollm2-135m-instruct --limit 20 --json peers.json --png peers.png

Every system runs the same raw prompts (first HumanEval prompts), greedy, the same number of new
tokens, one at a time, interleaved prompt by prompt. Per system: tokens/s of the whole generate
call, TTFT (a separate 1-token call on the same prompt), per-token latency after the first
((call - TTFT) / (tokens - 1), p50 / p99 over prompts). Peers that are not installed are skipped
with the reason. Peers: llama.cpp (llama-cpp-python: plain and its prompt-lookup drafter, on the
same GGUF the default model comes from), Hugging Face transformers (plain, prompt lookup, assisted
generation when --hf-draft is given), onnxruntime-genai (plain, on a folder built by its model
builder from the same weights: --ortgenai-model).
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from edgespec.runtime.apps.bench import load_prompts, machine_info


class System:
    def __init__(self, name: str, run: Callable[[str, int], list[int]], note: str = "") -> None:
        self.name, self.run, self.note = name, run, note
        self.calls: list[dict] = []


def edgespec_systems(engine: str, specs: list[str]) -> list[System]:
    from edgespec.runtime.config import RuntimeConfig
    from edgespec.runtime.generator import Generator

    g = Generator.load(engine, RuntimeConfig(drafter="none"))
    out, stores = [], {}
    for spec in specs:  # "none", "ngram:4", "ngram:8:adaptive"
        parts = spec.split(":")
        drafter, k, adaptive = parts[0], int(parts[1]) if len(parts) > 1 else None, "adaptive" in parts

        # each configuration its own drafter store (suffix cache, recycle table): the systems run the same
        # prompts, and one configuration's stored answer would be another's perfect draft
        def run(prompt, n, drafter=drafter, k=k, adaptive=adaptive, store=stores.setdefault(spec, {})):
            g.drafter_store = store
            g.reconfigure(drafter=drafter, k=k, adaptive=adaptive)
            g.forget()
            return [int(t) for c in g.generate_ids(g.codec.encode(prompt), n) for t in c]

        out.append(System(f"edgespec {spec}", run, f"{g.manifest.target.precision}, ORT {ort_version()}"))
    return out


def ort_version() -> str:
    import onnxruntime

    return onnxruntime.__version__


def llama_cpp_systems(gguf: str, threads: int) -> tuple[list[System], str]:
    try:
        from llama_cpp import Llama
        from llama_cpp.llama_speculative import LlamaPromptLookupDecoding
    except ImportError:
        return [], "llama-cpp-python not installed (pip install 'edgespec[peers]'; it compiles llama.cpp)"
    same = dict(model_path=gguf, n_ctx=2048, n_threads=threads, verbose=False, seed=0)  # plain and lookup alike
    plain = Llama(**same)
    lookup = Llama(**same, draft_model=LlamaPromptLookupDecoding(num_pred_tokens=10))

    def runner(llm):
        def run(prompt, n):
            llm.reset()
            out = llm.create_completion(prompt, max_tokens=n, temperature=0.0, top_k=1)
            return llm.tokenize(out["choices"][0]["text"].encode(), add_bos=False)

        return run

    return [
        System("llama.cpp plain", runner(plain), Path(gguf).name),
        System("llama.cpp prompt-lookup", runner(lookup), f"{Path(gguf).name}, num_pred_tokens=10"),
    ], ""


def transformers_systems(gguf: str, threads: int, hf_draft: str | None) -> tuple[list[System], str]:
    try:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer
    except ImportError:
        return [], "transformers/torch not installed (pip install 'edgespec[export]')"
    torch.set_num_threads(threads)

    p = Path(gguf)
    tok = AutoTokenizer.from_pretrained(p.parent, gguf_file=p.name)
    model = AutoModelForCausalLM.from_pretrained(p.parent, gguf_file=p.name, dtype=torch.float32).eval()
    draft = AutoModelForCausalLM.from_pretrained(hf_draft, dtype=torch.float32).eval() if hf_draft else None

    def runner(**kw):
        def run(prompt, n):
            ids = tok(prompt, return_tensors="pt")
            with torch.no_grad():
                out = model.generate(
                    **ids,
                    max_new_tokens=n,
                    min_new_tokens=n if n == 1 else 0,
                    do_sample=False,
                    pad_token_id=tok.eos_token_id,
                    **kw,
                )
            return out[0, ids["input_ids"].shape[1] :].tolist()

        return run

    systems = [
        System("transformers plain", runner(), "fp32 (dequantized GGUF)"),
        System("transformers prompt-lookup", runner(prompt_lookup_num_tokens=10), "fp32, 10 tokens"),
    ]
    if draft is not None:
        systems.append(System("transformers assisted", runner(assistant_model=draft), f"draft {hf_draft}"))
    return systems, ""


def ortgenai_systems(folder: str | None) -> tuple[list[System], str]:
    if not folder:
        return [], "no --ortgenai-model folder (build one with onnxruntime_genai.models.builder)"
    try:
        import onnxruntime_genai as og
    except ImportError:
        return [], "onnxruntime-genai not installed"
    model = og.Model(folder)
    tok = og.Tokenizer(model)

    def run(prompt, n, speculative=None):
        ids = tok.encode(prompt)
        params = og.GeneratorParams(model)
        params.set_search_options(do_sample=False, max_length=len(ids) + n)
        if speculative:
            params.set_speculative_options(**speculative)
        gen = og.Generator(model, params)
        gen.append_tokens(ids)
        out = []
        while not gen.is_done() and len(out) < n:
            gen.generate_next_token()
            out.append(int(gen.get_next_tokens()[0]))
        return out

    systems = [System("onnxruntime-genai plain", run, "its builder's int4 model")]
    if hasattr(og.GeneratorParams, "set_speculative_options"):  # 0.18+: n-gram speculation
        spec = {"ngram_size": 3, "max_draft_tokens": 8, "ngram_chained_lookup": True}
        systems.append(
            System(
                "onnxruntime-genai ngram", lambda p, n: run(p, n, spec), "ngram_size 3, chained lookup, k<=8 adaptive"
            )
        )
    return systems, ""


def measure(systems: list[System], prompts: list[dict], n_new: int) -> None:
    for s in systems:  # warm-up
        s.run(prompts[0]["prompt"], 4)
    for i, p in enumerate(prompts):
        for s in systems:
            t0 = time.perf_counter()
            s.run(p["prompt"], 1)
            ttft = time.perf_counter() - t0
            t0 = time.perf_counter()
            ids = s.run(p["prompt"], n_new)
            dt = time.perf_counter() - t0
            s.calls.append(
                {
                    "id": p["id"],
                    "tokens": len(ids),
                    "seconds": dt,
                    "ttft_s": ttft,
                    "itl_s": (dt - ttft) / max(len(ids) - 1, 1),
                    "output_ids": ids,
                }
            )
        print(f"  [{i + 1}/{len(prompts)}] {p['id']}", flush=True)


def summarize(systems: list[System]) -> list[dict]:
    rows = []
    for s in systems:
        tokens = sum(c["tokens"] for c in s.calls)
        secs = sum(c["seconds"] for c in s.calls)
        itl = np.array([c["itl_s"] for c in s.calls]) * 1e3
        rows.append(
            {
                "system": s.name,
                "note": s.note,
                "tokens": tokens,
                "seconds": secs,
                "tokens_per_s": tokens / secs,
                "itl_ms": {"p50": float(np.percentile(itl, 50)), "p99": float(np.percentile(itl, 99))},
                "ttft_ms": float(np.mean([c["ttft_s"] for c in s.calls]) * 1e3),
                "prompts": [{k: c[k] for k in ("id", "tokens", "seconds", "output_ids")} for c in s.calls],
            }
        )
    return rows


def mark_identity(rows: list[dict]) -> None:
    """For each speculative system, on how many prompts its output equals the same system's plain."""
    plain = {r["system"].rsplit(" ", 1)[0]: r for r in rows if r["system"].endswith((" plain", " none"))}
    for r in rows:
        base = plain.get(
            r["system"].split(" ")[0] if r["system"].startswith("edgespec") else r["system"].rsplit(" ", 1)[0]
        )
        if base is None or base is r:
            continue
        same = sum(a["output_ids"] == b["output_ids"] for a, b in zip(r["prompts"], base["prompts"], strict=True))
        r["identical_to_plain"] = f"{same}/{len(r['prompts'])}"


def table(rows: list[dict]) -> str:
    ref_llama = next((r["tokens_per_s"] for r in rows if r["system"] == "llama.cpp plain"), None)
    ref_none = next((r["tokens_per_s"] for r in rows if r["system"] == "edgespec none"), None)
    out = [
        "| system | tok/s | ITL p50 / p99 ms | TTFT ms | vs llama.cpp plain | vs edgespec none | "
        "output = its plain | note |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        a = f"{r['tokens_per_s'] / ref_llama:.2f}x" if ref_llama else "-"
        b = f"{r['tokens_per_s'] / ref_none:.2f}x" if ref_none else "-"
        out.append(
            f"| {r['system']} | {r['tokens_per_s']:.1f} | {r['itl_ms']['p50']:.1f} / {r['itl_ms']['p99']:.1f} "
            f"| {r['ttft_ms']:.0f} | {a} | {b} | {r.get('identical_to_plain', '-')} | {r['note']} |"
        )
    return "\n".join(out)


def plot(rows: list[dict], path: str, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 3.6))
    colors = ["#2a7" if r["system"].startswith("edgespec") else "#888" for r in rows]
    bars = ax.barh([r["system"] for r in rows][::-1], [r["tokens_per_s"] for r in rows][::-1], color=colors[::-1])
    ax.bar_label(bars, fmt="%.0f", fontsize=8)
    ax.set_xlabel("tokens / s (greedy, whole generate call)")
    ax.set_title(title, fontsize=9)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--engine", default="engines/smollm2-135m-instruct")
    ap.add_argument(
        "--edgespec",
        default="none,ngram:4,ngram:8:adaptive",
        help="edgespec configurations: drafter[:k[:adaptive]], comma-separated",
    )
    ap.add_argument("--gguf", help="GGUF for llama.cpp / transformers (default: the default model's)")
    ap.add_argument("--hf-draft", help="HF folder of a draft model for transformers' assisted generation")
    ap.add_argument("--ortgenai-model", help="onnxruntime-genai model folder (its builder's output)")
    ap.add_argument("--prompts", help="JSONL prompt file (runtime.bench.load_prompts; default: HumanEval)")
    ap.add_argument(
        "--raw-prompts",
        action="store_true",
        help="chat lines as raw text (their contents as paragraphs): every system then reads the same text",
    )
    ap.add_argument("--limit", type=int, default=20)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--skip", default="", help="comma-separated peers to skip: llama.cpp,transformers,ortgenai")
    ap.add_argument("--json")
    ap.add_argument("--png", help="bar chart of tokens/s (needs matplotlib: pip install 'edgespec[report]')")
    a = ap.parse_args(argv)
    if a.png:  # checked before minutes of benchmarks, not after them
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            ap.error(
                "--png needs matplotlib, which is not installed. Hint: pip install 'edgespec[report]', "
                "or leave out --png"
            )
    if a.gguf is None:
        from edgespec.export.target.sources.resolve import default_gguf

        a.gguf = str(default_gguf())
    prompts = load_prompts(a.prompts, a.limit, raw=a.raw_prompts)
    if any("prompt" not in p for p in prompts):
        ap.error("the peers read raw text only; pass --raw-prompts to run chat lines as raw text")
    systems = edgespec_systems(a.engine, a.edgespec.split(","))
    skipped = {}
    for name, make in (
        ("llama.cpp", lambda: llama_cpp_systems(a.gguf, a.threads)),
        ("transformers", lambda: transformers_systems(a.gguf, a.threads, a.hf_draft)),
        ("ortgenai", lambda: ortgenai_systems(a.ortgenai_model)),
    ):
        if name in a.skip.split(","):
            skipped[name] = "skipped by --skip"
            continue
        got, why = make()
        systems += got
        if why:
            skipped[name] = why
    print(f"{len(systems)} systems x {len(prompts)} prompts, {a.max_new_tokens} new tokens, greedy", flush=True)
    measure(systems, prompts, a.max_new_tokens)
    rows = summarize(systems)
    mark_identity(rows)
    print(table(rows))
    for k, v in skipped.items():
        print(f"skipped {k}: {v}")
    mach = machine_info("cpu")
    if a.json:
        with open(a.json, "w") as f:
            config = vars(a) | {"command": shlex.join(["python", "tools/bench_peers.py", *(argv or sys.argv[1:])])}
            json.dump({"config": config, "machine": mach, "skipped": skipped, "rows": rows}, f, indent=1)
    if a.png:
        plot(
            rows,
            a.png,
            f"{Path(a.engine).name}, {Path(a.prompts).stem if a.prompts else 'HumanEval'}[:{a.limit}], "
            f"{a.max_new_tokens} tokens, {mach['cpu']}, "
            f"{mach['logical_cpus']} CPUs",
        )


if __name__ == "__main__":
    main()
