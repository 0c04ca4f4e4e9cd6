"""The `edgespec` command: generate, bench, demo, chat, serve, tune here; export, build-trt and
head training in cli_offline. argparse only builds configs."""

from __future__ import annotations

import argparse
import importlib
import json
import shlex
import sys
from pathlib import Path

from edgespec import cli_offline as offline
from edgespec.cli_args import add_apps, add_bench, add_choice, add_generate, add_runtime_args, add_tune
from edgespec.cli_fields import config_from
from edgespec.cli_offline import DEFAULT_ENGINE

DEMO_PROMPT = [
    {
        "role": "user",
        "content": "Write a Python function that returns the n-th Fibonacci number, "
        "then show how to call it for n = 10.",
    }
]


def _check_sampling(a) -> None:
    """Sampling flags and --max-new-tokens, refused before a model is loaded (ValueError: main's
    one-line `edgespec CMD: error: ...`)."""
    from edgespec.runtime.sampling import SamplingConfig, check_max_new_tokens

    check_max_new_tokens(a.max_new_tokens)
    config_from(SamplingConfig, a).check()


def _grammar(a):
    """The constraint the --json-schema / --grammar / --regex flags give (None: free text)."""
    from edgespec.runtime.grammar import grammar_from

    def read(path):
        try:
            return Path(path).read_text()
        except OSError as e:
            raise FileNotFoundError(f"{path}: {e.strerror}") from None

    schema = read(a.json_schema) if a.json_schema else None
    return grammar_from(json_schema=schema, grammar=read(a.grammar) if a.grammar else None, regex=a.regex)


def _cmd_tune(a) -> int:
    from edgespec.runtime.apps.tune import TuneConfig, tune
    from edgespec.runtime.config import RuntimeConfig

    _check_sampling(a)
    tune(config_from(TuneConfig, a, runtime=RuntimeConfig.from_args(a)))
    return 0


def _cmd_chat(a) -> int:
    from edgespec.runtime.apps.chat import ChatSettings, chat_loop

    settings = config_from(ChatSettings, a)
    settings.check()
    if not _default_engine_ready(a, "chat"):
        return 2
    g = _load(a)
    chat_loop(g, settings)
    return 0


def _cmd_serve(a) -> int:
    try:
        from edgespec.runtime.apps.server import ServeConfig, serve
    except ImportError as e:
        print(
            f"edgespec serve needs the serve extra ({e.name} missing): pip install 'edgespec[serve]'", file=sys.stderr
        )
        return 2

    cfg = config_from(ServeConfig, a)
    cfg.check()  # before the model loads
    if not _default_engine_ready(a, "serve"):
        return 2
    serve(_load(a), cfg)
    return 0


def _default_engine_ready(a, cmd: str, always: bool = False) -> bool:
    """Export the default model into a.engine first when that folder has no engine yet (the
    default folder, or any folder for `demo`); False when it cannot be built (no export extra)."""
    if (Path(a.engine) / "manifest.json").exists() or not (always or a.engine == DEFAULT_ENGINE):
        return True
    print(
        f"edgespec {cmd}: no engine at {a.engine}; exporting the default model first (about a minute)", file=sys.stderr
    )
    try:
        from edgespec.export.target.exporter import ExportConfig, export
    except ImportError:
        print(
            f"edgespec {cmd} needs the export extra to build the engine: pip install 'edgespec[export]'",
            file=sys.stderr,
        )
        return False
    export(ExportConfig(out=a.engine))
    return True


def _load(a, **override):
    """The Generator the runtime flags of `a` describe (folder defaults where a flag is unset)."""
    from edgespec.runtime.config import RuntimeConfig
    from edgespec.runtime.generator import Generator

    return Generator.load(a.engine, RuntimeConfig.from_args(a, **override))


def _cmd_generate(a) -> int:
    _check_sampling(a)
    grammar = _grammar(a)  # a bad schema fails before the model loads
    g = _load(a)
    load = g.footprint()
    print(
        f"edgespec: loaded in {load['load_s']:.1f} s (weights {load['weights_bytes'] / 1e9:.2f} GB mapped, "
        f"KV cache {load['kv_bytes'] / 1e9:.2f} GB)",
        file=sys.stderr,
    )
    if a.drafter is None:
        from edgespec.runtime.apps.tune import describe_default

        print(f"edgespec: {describe_default(g.manifest)}", file=sys.stderr)
    prompt = [{"role": "user", "content": a.prompt}] if a.chat else a.prompt
    if a.show_acceptance:
        from edgespec.runtime.text import show_acceptance

        show_acceptance(g, prompt, a.max_new_tokens, a.temperature, a.seed, sys.stdout, grammar)
        print(g.last_stats.line(), file=sys.stderr)
        return 0
    from edgespec.runtime.sampling import SamplingConfig

    sampling = config_from(SamplingConfig, a)
    g.constraint(grammar)  # a grammar this vocabulary cannot run fails before anything streams
    for piece in g.stream_text(g.codec.encode(prompt), a.max_new_tokens, sampling, a.stop, grammar):
        sys.stdout.write(piece)
        sys.stdout.flush()
    sys.stdout.write("\n")
    print(g.last_stats.line(), file=sys.stderr)
    if a.json:
        Path(a.json).write_text(json.dumps(g.last_stats.to_dict() | {"load": load}, indent=1))
    return 0


def _cmd_bench(a) -> int:
    from edgespec.runtime.apps.bench import BenchConfig, run_bench
    from edgespec.runtime.config import RuntimeConfig

    _check_sampling(a)
    if a.adaptive_only and not a.adaptive:
        raise ValueError("--adaptive-only runs the adaptive rows alone: add --adaptive")
    try:
        ks = tuple(int(x) for x in (a.k or "4").split(","))
    except ValueError:
        raise ValueError(f"--k {a.k!r}: give a whole number or comma-separated ones, e.g. 2,4") from None
    if a.sweep_k:
        from edgespec.engines.manifest import load_manifest

        top = max(ks) if a.k else load_manifest(a.engine).num_speculative_tokens
        ks = tuple(range(1, top + 1))
    runtime = RuntimeConfig.from_args(a, drafter="none", k=max(ks), adaptive=False)
    trees = tuple(a.tree.split(",")) if a.tree else ()
    cfg = config_from(BenchConfig, a, runtime=runtime, ks=ks, trees=trees, command=a.command_line)
    report = run_bench(cfg)
    if a.json:
        Path(a.json).write_text(json.dumps(report, indent=1))
        print(f"wrote {a.json}", file=sys.stderr)
    if a.sweep_k:
        from edgespec.runtime.apps.report import sweep_plot

        sweep_plot(report, a.plot)
        print(f"wrote {a.plot}", file=sys.stderr)
    if a.html:
        from edgespec.runtime.apps.report import write_html

        write_html(report, a.html)
        print(f"wrote {a.html}", file=sys.stderr)
    return 0


def _cmd_demo(a) -> int:
    _check_sampling(a)
    if not _default_engine_ready(a, "demo", always=True):
        return 2

    g = _load(a, drafter="none")
    print(f"prompt: {DEMO_PROMPT[0]['content']}\n", file=sys.stderr)
    plain = "".join(g.stream(DEMO_PROMPT, max_new_tokens=a.max_new_tokens))
    plain_stats = g.last_stats
    from edgespec.runtime.apps.tune import describe_default

    drafter = a.drafter or g.manifest.defaults.drafter
    if drafter == "none":
        drafter = "ngram"  # the demo shows speculation; `tune` found it does not pay: say so below
    k = a.k or g.manifest.defaults.k
    g.set_drafter(drafter, k)
    print(f"folder default: {describe_default(g.manifest)}", file=sys.stderr)
    adaptive = " adaptive" if g.adaptive or g.chain_budget else ""
    print(f"--- speculative ({drafter}, k={k}{adaptive}) ---", file=sys.stderr)
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
    bad = any(what not in ("ok", "not recorded") for what in status.values())
    from edgespec.export.fit import fit_check, head_names, print_report

    if a.fit_check and not bad and head_names(m):
        recorded = m.head_fit
        print_report(fit_check(a.folder), a.folder, file=sys.stdout)
        if recorded.get("positions"):  # what the export measured, for comparison
            heads = ", ".join(f"{n} {h['step1']:.3f}" for n, h in recorded["heads"].items() if "step1" in h)
            print(f"  (at export: prompt lookup {recorded['ngram']:.3f}, {heads})")
    return 1 if bad else 0


def build_parser() -> argparse.ArgumentParser:
    """The `edgespec` parser: every command and its flags."""
    parser = argparse.ArgumentParser(
        prog="edgespec",
        description="Speculative decoding for LLMs on one edge "
        "device: export once (ONNX), run a lean NumPy + ONNX Runtime loop.",
    )
    sub = parser.add_subparsers(dest="cmd", required=True)
    add_generate(sub)
    add_bench(sub)
    add_apps(sub)
    add_tune(sub)
    offline.add_parsers(sub)
    d = sub.add_parser(
        "demo",
        help="export the default model if needed, run one prompt plain and speculative",
        description="The quick start: fetches and exports SmolLM2-135M-Instruct if not cached, "
        "then runs one chat prompt plain and with speculation, side by side.",
    )
    add_runtime_args(d)
    add_choice(d, drafter="default: the folder's default (ngram when it is none)", k="default: the folder's default")
    d.add_argument("--max-new-tokens", type=int, default=200)
    c = sub.add_parser(
        "check",
        help="check an engine folder's files against the sizes and sha256 its manifest records, and its heads "
        "against its target",
        description="Prints one line per file (ok, missing, size mismatch, hash mismatch, "
        "not recorded); exit status 1 when any file is bad. Reads every file (a few seconds). Then the fit "
        "check of the folder's heads (EAGLE, EAGLE-3, Medusa, DFlash): each one's step-1 acceptance against "
        "the folder's own target and prompt lookup's, on built-in prompts (a few seconds; the export records "
        "the same in the manifest); a head below prompt lookup is named with the fine-tune that fits it.",
    )
    c.add_argument("folder", help="engine folder")
    c.add_argument("--no-fit-check", dest="fit_check", action="store_false", help="the files only")
    q = sub.add_parser(
        "quality",
        help="top-1 agreement, KL and perplexity of engine folders (or GGUFs on llama.cpp) against a reference",
        description="Teacher-forced over held-out text, each model's next-token distributions against "
        "the reference's: top-1 agreement, mean KL(reference || model), perplexity. A .gguf runs on "
        "llama.cpp (needs llama-cpp-python). E.g. edgespec quality engines/int4 --reference engines/fp32",
    )
    from edgespec.runtime.apps.quality import add_arguments

    add_arguments(q)
    from edgespec.runtime.drafters import commands

    for c in commands():  # the drafters' own commands (recycle's `warm`), as the export plugins' train-<name>
        importlib.import_module(c.module).add_arguments(sub.add_parser(c.name, help=c.help, description=c.description))
    return parser


def _cmd_quality(a) -> int:
    from edgespec.runtime.apps.quality import run_command

    return run_command(a)


def main(argv: list[str] | None = None) -> int:
    a = build_parser().parse_args(argv)
    a.command_line = shlex.join(["edgespec", *map(str, sys.argv[1:] if argv is None else argv)])  # bench records it
    from edgespec.engines.base import EngineError
    from edgespec.engines.manifest import ManifestError
    from edgespec.runtime.drafters import commands

    # ValueError covers Generator.load's FolderLoadError too: the ImportError, OverflowError, TypeError or
    # MemoryError of loading an engine folder, named with the folder (anywhere else they stay tracebacks)
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
            "quality": _cmd_quality,
        } | offline.COMMANDS
        cmds |= {c.name: importlib.import_module(c.module).run_command for c in commands()}
        return cmds[a.cmd](a)
    except errors as e:
        print(f"edgespec {a.cmd}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
