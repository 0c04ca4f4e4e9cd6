"""Memory soak: many short generations in one process over every drafter a folder ships, with the
resident set size sampled after a warm-up and every --every generations.

    nice -n 10 python tools/soak.py --engine engines/smollm2-135m-instruct --n 2000 --json soak.json

Generations cycle through the drafters (and greedy / sampled, raw / chat prompts), the way a
server's requests would. At each sample the process is collected (gc) and its RSS read (psutil);
with --trim, glibc's malloc_trim(0) runs first, and the RSS is read before and after: what the
trim gives back was freed memory the allocator kept (fragmentation), not a leak. The Python heap
is tracked too (sys.getallocatedblocks), so native growth (ONNX Runtime, the allocator) can be
told from Python objects piling up. --no-arena runs every session without ONNX Runtime's CPU
memory arena (a diagnostic: the arena keeps the largest intermediate buffers any call needed).
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import json
import sys
import time

PROMPTS = [
    "def add(a, b):",
    "The capital of France is",
    "List three colours:",
    "import numpy as np\n",
    "Write a haiku about the sea.",
    "for i in range(10):",
    "Explain recursion in one sentence.",
    "class Stack:\n    def __init__(self):",
    "2 + 2 =",
    "Translate 'good morning' to Spanish.",
]


def _rss_mb(proc) -> float:
    return proc.memory_info().rss / 2**20


def _rss_split_mb() -> dict[str, float]:
    """Linux: the RSS split into anonymous memory (heaps, arenas) and mapped files (the weights)."""
    try:
        lines = open("/proc/self/status").read().splitlines()
    except OSError:
        return {}
    kb = {ln.split(":")[0]: int(ln.split()[1]) for ln in lines if ln.startswith(("RssAnon", "RssFile"))}
    return {"anon_mb": round(kb.get("RssAnon", 0) / 1024, 1), "file_mb": round(kb.get("RssFile", 0) / 1024, 1)}


def _mapped_weights_mb() -> dict[str, float]:
    """Linux: resident MB of each mapped *.weights file (/proc/self/smaps): pages of the weights
    that calls have touched (an embedding row is read only when its token comes up)."""
    out: dict[str, float] = {}
    name = None
    try:
        with open("/proc/self/smaps") as f:
            for line in f:
                head = line.split()
                if "-" in head[0] and len(head) >= 5 and not head[0].endswith(":"):  # a mapping's header
                    name = head[5].rsplit("/", 1)[-1] if len(head) > 5 and head[5].endswith(".weights") else None
                elif name and head[0] == "Rss:":
                    out[name] = round(out.get(name, 0.0) + int(head[1]) / 1024, 1)
    except OSError:
        pass
    return out


def _trim() -> bool:
    """glibc: give freed heap pages back to the system; False where there is no glibc."""
    try:
        return bool(ctypes.CDLL("libc.so.6").malloc_trim(0))
    except (OSError, AttributeError):
        return False


def _without_arena() -> None:
    """Diagnostic: every session this process makes from now on runs without the CPU arena."""
    from edgespec.engines import session as es

    make = es.session_options

    def options(*args, **kwargs):
        so, initializers = make(*args, **kwargs)
        so.enable_cpu_mem_arena = False
        return so, initializers

    es.session_options = options


def soak(
    engine: str,
    n: int,
    every: int,
    warmup: int,
    max_new_tokens: int,
    k: int,
    trim: bool,
    arena: bool = True,
    only: tuple[str, ...] = (),
) -> dict:
    import psutil

    from edgespec.runtime.config import RuntimeConfig
    from edgespec.runtime.drafters import shipped
    from edgespec.runtime.generator import Generator

    proc = psutil.Process()
    rss_start = _rss_mb(proc)
    if not arena:
        _without_arena()
    g = Generator.load(engine, RuntimeConfig(drafter="none"))
    drafters = []
    for d in only or shipped(g.manifest, g.cfg):
        try:
            g.set_drafter(d, None if d == "none" else k)  # refuses what this folder / backend cannot serve
            drafters.append(d)
        except ValueError as e:
            print(f"soak: skipping drafter {d}: {e}", file=sys.stderr)
    rss_loaded = _rss_mb(proc)
    print(
        f"soak: {engine}, drafters {', '.join(drafters)}, {n} generations of <= {max_new_tokens} tokens "
        f"after {warmup} warm-up ones; RSS {rss_start:.0f} MB before load, {rss_loaded:.0f} MB loaded",
        file=sys.stderr,
    )
    samples, tokens, t0 = [], 0, time.perf_counter()

    def sample(i: int) -> None:
        gc.collect()
        row = {
            "generations": i,
            "rss_mb": round(_rss_mb(proc), 1),
            **_rss_split_mb(),
            "weights_mapped_mb": _mapped_weights_mb(),
            "py_blocks": sys.getallocatedblocks(),
            "seconds": round(time.perf_counter() - t0, 1),
        }
        if trim:
            row["trimmed"] = _trim()
            row["rss_after_trim_mb"] = round(_rss_mb(proc), 1)
        samples.append(row)
        extra = f", after malloc_trim {row['rss_after_trim_mb']:.1f} MB" if trim else ""
        mapped = ", ".join(f"{k} {v:.1f}" for k, v in row["weights_mapped_mb"].items())
        split = f" (anon {row['anon_mb']:.1f}, file {row['file_mb']:.1f}: {mapped})" if "anon_mb" in row else ""
        print(
            f"  {i:5d} generations: RSS {row['rss_mb']:.1f} MB{split}{extra}, Python blocks {row['py_blocks']}",
            file=sys.stderr,
        )

    for i in range(warmup + n):
        if i == warmup:
            sample(0)
        d = drafters[i % len(drafters)]
        g.set_drafter(d, None if d == "none" else k)
        text = PROMPTS[(i // len(drafters)) % len(PROMPTS)]
        prompt = [{"role": "user", "content": text}] if (i // 2) % 2 else text
        sampled = i % 2 == 1
        g.generate(
            prompt, max_new_tokens=max_new_tokens, temperature=0.8 if sampled else 0.0, seed=i if sampled else None
        )
        tokens += g.last_stats.n_output
        done = i + 1 - warmup
        if done > 0 and done % every == 0:
            sample(done)
    if samples[-1]["generations"] != n:
        sample(n)
    base, last = samples[0], samples[-1]
    half = next((s for s in samples if s["generations"] >= n // 2), base)
    key = "rss_after_trim_mb" if trim else "rss_mb"
    summary = {
        "rss_loaded_mb": round(rss_loaded, 1),
        "rss_after_warmup_mb": base["rss_mb"],
        "rss_end_mb": last["rss_mb"],
        "growth_mb": round(last["rss_mb"] - base["rss_mb"], 1),
        "growth_second_half_mb": round(last["rss_mb"] - half["rss_mb"], 1),
        "growth_after_trim_mb": round(last[key] - base[key], 1) if trim else None,
        "py_blocks_growth": last["py_blocks"] - base["py_blocks"],
        "anon_growth_mb": round(last.get("anon_mb", 0) - base.get("anon_mb", 0), 1),
        "file_growth_mb": round(last.get("file_mb", 0) - base.get("file_mb", 0), 1),
        "tokens": tokens,
        "seconds": round(time.perf_counter() - t0, 1),
    }
    print(
        f"soak: RSS {base['rss_mb']:.1f} -> {last['rss_mb']:.1f} MB after warm-up ({summary['growth_mb']:+.1f} MB; "
        f"second half {summary['growth_second_half_mb']:+.1f} MB"
        + (f"; after malloc_trim {summary['growth_after_trim_mb']:+.1f} MB" if trim else "")
        + f"; anonymous {summary['anon_growth_mb']:+.1f} MB, mapped files {summary['file_growth_mb']:+.1f} MB), "
        f"Python blocks {summary['py_blocks_growth']:+d}, {tokens} tokens in {summary['seconds']:.0f} s",
        file=sys.stderr,
    )
    config = {
        "engine": engine,
        "n": n,
        "every": every,
        "warmup": warmup,
        "max_new_tokens": max_new_tokens,
        "k": k,
        "trim": trim,
        "arena": arena,
        "drafters": drafters,
    }
    return {"config": config, "samples": samples, "summary": summary}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--engine", default="engines/smollm2-135m-instruct")
    ap.add_argument("--n", type=int, default=2000, help="generations after the warm-up (default 2000)")
    ap.add_argument("--every", type=int, default=100, help="sample RSS every this many generations (default 100)")
    ap.add_argument(
        "--warmup",
        type=int,
        default=0,
        help="generations before the baseline sample (default: 4 rounds over the drafters)",
    )
    ap.add_argument("--max-new-tokens", type=int, default=24)
    ap.add_argument("--k", type=int, default=4, help="num_speculative_tokens of every drafter (default 4)")
    ap.add_argument(
        "--trim",
        action="store_true",
        help="run glibc malloc_trim(0) at each sample, RSS read "
        "before and after (tells allocator-retained memory from a leak)",
    )
    ap.add_argument(
        "--no-arena",
        action="store_true",
        help="diagnostic: sessions without ONNX Runtime's CPU "
        "memory arena (slower; shows how much of the growth is the arena)",
    )
    ap.add_argument(
        "--drafters", help="comma-separated drafters to cycle through (default: every one the folder ships)"
    )
    ap.add_argument("--json", help="write samples and summary here")
    a = ap.parse_args(argv)
    if a.n < 1 or a.every < 1 or a.max_new_tokens < 1 or a.warmup < 0:
        ap.error("--n, --every and --max-new-tokens must be >= 1, --warmup >= 0")
    try:
        import psutil  # noqa: F401
    except ImportError:
        ap.error("needs psutil. Hint: pip install psutil (in the dev extra)")
    from edgespec.engines.manifest import load_manifest

    only = tuple(a.drafters.split(",")) if a.drafters else ()
    warmup = a.warmup or 4 * len(only or load_manifest(a.engine).drafters)
    report = soak(a.engine, a.n, a.every, warmup, a.max_new_tokens, a.k, a.trim, arena=not a.no_arena, only=only)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(report, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
