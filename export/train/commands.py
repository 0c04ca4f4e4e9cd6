"""What every `edgespec train-<name>` command shares: the fields every drafter's training config has
(`BaseTrainConfig`), the self-distillation data the command makes first when the folder holds none
(`DataFlags`, `ready_data`) and the command's flags, made from those fields' metadata
(`add_train_flags`, edgespec/cli_fields.py). Imports nothing heavy: the CLI builds its parsers from
here, and each drafter's own training config (a subclass of BaseTrainConfig) sits beside its plugin.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from edgespec.cli_fields import add_fields

# the metadata of the fields a kind gives its own default ("{default:g}", "{what}": add_train_flags fills them)
MINUTES = {"help": "training time budget of this run (default {default:g})"}
EPOCHS = {"help": "passes over the data in total (default {default:g})"}


@dataclass(frozen=True)
class BaseTrainConfig:
    """The fields every kind's training config has (each kind's config adds its own); a field with a
    "help" is a flag of every train-<name> command ("{what}": what the kind writes)."""

    data: str  # folder(s) of eagle_data shards ("DIR1,DIR2")
    out: str = field(  # the drafter's folder (config.json + model.safetensors) and checkpoint.pt
        metadata={"help": "{what} folder to write (and resume from)"}
    )
    target: str | None = field(  # model source (None: default SmolLM2)
        default=None, metadata={"help": "HF folder, .gguf or hub id (default: SmolLM2-135M-Instruct)"}
    )
    draft_vocab: int = field(  # most frequent answer tokens the drafter may propose (0: full vocab)
        default=8192,
        metadata={
            "help": "most frequent answer tokens the {what} may propose; 0 = full vocabulary (default {default})"
        },
    )
    minutes: float = field(default=30.0, metadata=MINUTES)  # wall-clock budget of this run (resumes from checkpoint.pt)
    epochs: float = field(default=3.0, metadata=EPOCHS)  # passes over the data in total (across runs)
    lr: float = field(  # AdamW peak learning rate (cosine decay over all epochs)
        default=1e-3, metadata={"help": "peak learning rate (default 1e-3)"}
    )
    holdout: float = 0.05  # fraction of sequences kept out for the acceptance estimate
    threads: int | None = field(  # None: every core this process may use
        default=None, metadata={"help": "torch threads (default: every core this process may use)"}
    )
    seed: int = 0  # data order, split and init
    compute: str = field(  # forward matmuls: "bf16" autocast (fp32 master weights, fp32 loss), "fp32",
        #                    or "auto": bf16 where the CPU's matrix units make it faster (matmul_probe)
        default="auto",
        metadata={
            "help": "dtype of the matmuls when making data and training: bf16 autocast (the drafter keeps fp32 "
            "master weights, the loss is fp32) or fp32; auto (default): bf16 where the CPU has bf16 matrix "
            "units (avx512_bf16, amx_bf16) and a timed probe matmul runs >= 1.3x faster in it, else fp32",
            "choices": ("auto", "bf16", "fp32"),
        },
    )


@dataclass(frozen=True)
class DataFlags:
    """The self-distillation data a train-<name> command trains on, made first when its folder holds
    none (`ready_data`); each field is a flag of every such command."""

    data: str | None = field(  # None: <out>/data
        default=None,
        metadata={
            "help": "self-distillation data folder (default: <out>/data, made first); several "
            "folders made earlier: DIR1,DIR2 (trained on together, nothing generated)"
        },
    )
    prompts: int = field(
        default=3600,
        metadata={
            "help": "prompts the target answers when making data "
            "(default %(default)s: 18%% general chat, 20%% everyday chat, 22%% instruction-taxonomy tasks, 10%% "
            "questions the target writes itself, 14%% programming chat, 16%% code completion)"
        },
    )
    wide_prompts: int = field(
        default=0,
        metadata={
            "help": "also N prompts of the wide mix when making data (given passages to summarize / extract from "
            "/ translate, multi-turn follow-ups, step-by-step math, role play, code in ten languages, short and "
            "long answers, JSON extraction; export/train/wide_prompts.py). Default %(default)s",
            "metavar": "N",
        },
    )
    text_data: str | None = field(
        default=None,
        metadata={
            "help": "also train on teacher-forced text data made by `edgespec text-data` (this machine's text "
            "labelled by the engine's target graph: exact features, soft labels)",
            "metavar": "DIR",
        },
    )
    max_new_tokens: int = field(
        default=192, metadata={"help": "answer length cap when making data (default %(default)s)"}
    )
    gen_batch: int = field(default=48, metadata={"help": "prompts generated together (default %(default)s)"})


def add_train_flags(p, cfg: type, what: str, own: Sequence[str] = ()) -> None:
    """The flags of a train-<name> command whose training config is `cfg` (a BaseTrainConfig), writing
    a `what` ("head"): the common ones, the data's, then the kind's `own` fields."""
    fill = {"what": what}
    add_fields(p, cfg, ["target", "out"], fill=fill)
    add_fields(p, DataFlags)
    add_fields(p, cfg, ["minutes", "epochs", "draft_vocab", "lr", "threads", "compute", *own], fill=fill)


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
    """Self-distillation data (the prompt mix of DataFlags.prompts) into folder; resumes a partial run."""
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
