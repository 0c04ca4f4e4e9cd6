"""What every `edgespec train-<name>` command shares: its data, budget and optimizer flags
(`add_common`) and its self-distillation data, made first when the folder holds none
(`ready_data`). Imports nothing heavy: the CLI builds its parsers from here."""

from __future__ import annotations

import sys
from pathlib import Path


def add_common(p, what: str, minutes: float, epochs: float) -> None:
    """The flags of every training command (data, budget, optimizer); `what` is what it writes."""
    p.add_argument("--target", help="HF folder, .gguf or hub id (default: SmolLM2-135M-Instruct)")
    p.add_argument("--out", required=True, help=f"{what} folder to write (and resume from)")
    p.add_argument(
        "--data",
        help="self-distillation data folder (default: <out>/data, made first); several "
        "folders made earlier: DIR1,DIR2 (trained on together, nothing generated)",
    )
    p.add_argument(
        "--prompts",
        type=int,
        default=3600,
        help="prompts the target answers when making data "
        "(default 3600: 18%% general chat, 20%% everyday chat, 22%% instruction-taxonomy tasks, 10%% "
        "questions the target writes itself, 14%% programming chat, 16%% code completion)",
    )
    p.add_argument(
        "--wide-prompts",
        type=int,
        default=0,
        metavar="N",
        help="also N prompts of the wide mix when making data (given passages to summarize / extract from / "
        "translate, multi-turn follow-ups, step-by-step math, role play, code in ten languages, short and "
        "long answers, JSON extraction; export/train/wide_prompts.py). Default 0",
    )
    p.add_argument(
        "--text-data",
        metavar="DIR",
        help="also train on teacher-forced text data made by `edgespec text-data` (this machine's text "
        "labelled by the engine's target graph: exact features, soft labels)",
    )
    p.add_argument("--max-new-tokens", type=int, default=192, help="answer length cap when making data (default 192)")
    p.add_argument("--gen-batch", type=int, default=48, help="prompts generated together (default 48)")
    p.add_argument(
        "--minutes", type=float, default=minutes, help=f"training time budget of this run (default {minutes:g})"
    )
    p.add_argument("--epochs", type=float, default=epochs, help=f"passes over the data in total (default {epochs:g})")
    p.add_argument(
        "--draft-vocab",
        type=int,
        default=8192,
        help=f"most frequent answer tokens the {what} may propose; 0 = full vocabulary (default 8192)",
    )
    p.add_argument("--lr", type=float, default=1e-3, help="peak learning rate (default 1e-3)")
    p.add_argument("--threads", type=int, help="torch threads (default: every core this process may use)")
    p.add_argument(
        "--compute",
        choices=("auto", "bf16", "fp32"),
        default="auto",
        help="dtype of the matmuls when making data and training: bf16 autocast (the drafter keeps fp32 "
        "master weights, the loss is fp32) or fp32; auto (default): bf16 where the CPU has bf16 matrix "
        "units (avx512_bf16, amx_bf16) and a timed probe matmul runs >= 1.3x faster in it, else fp32",
    )


def ready_data(a, aux: bool = False) -> str | None:
    """The training data folder(s) of `a`, made first when one folder holds none (with `aux`: with
    the aux layers' features too); None (after a one-line error) when several are named and some
    are unfinished."""
    data = a.data or str(Path(a.out) / "data")
    missing = [d for d in data.split(",") if not (Path(d) / "done").exists()]
    if missing and "," in data:
        print(f"--data {data}: {missing} hold no finished data; make each with its own run first", file=sys.stderr)
        return None
    if missing:
        _make_data(data, a, aux)
    text = getattr(a, "text_data", None)
    if text:
        if not (Path(text) / "done").exists():
            print(f"--text-data {text}: no finished data; make it with `edgespec text-data` first", file=sys.stderr)
            return None
        data = f"{data},{text}"
    return data


def _make_data(folder: str, a, aux: bool = False) -> None:
    """Self-distillation data (the prompt mix of `add_common`'s --prompts) into folder; resumes a partial run."""
    from edgespec.export.train.head_data import DataConfig, generate_data

    n = a.prompts
    mix = {
        "n_general": n * 18 // 100,
        "n_everyday": n * 20 // 100,
        "n_tasks": n * 22 // 100,
        "n_self_instruct": n * 10 // 100,
        "n_code_chat": n * 14 // 100,
    }
    generate_data(
        DataConfig(
            out=folder,
            target=a.target,
            n_completion=n - sum(mix.values()),
            max_new_tokens=a.max_new_tokens,
            batch=a.gen_batch,
            threads=a.threads,
            compute=a.compute,
            aux=aux,
            n_wide=a.wide_prompts,
            **mix,
        )
    )


def common_fields(a, data: str) -> dict:
    """The BaseTrainConfig fields every train-<name> command takes from its flags (add_common)."""
    return {
        "data": data,
        "out": a.out,
        "target": a.target,
        "draft_vocab": a.draft_vocab,
        "minutes": a.minutes,
        "epochs": a.epochs,
        "lr": a.lr,
        "threads": a.threads,
        "compute": a.compute,
    }
