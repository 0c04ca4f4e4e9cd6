"""One training entry for every drafter that ships models, by self-distillation (torch).

What every kind shares lives here: its config's common fields (`BaseTrainConfig`, from commands.py), the
data it reads (train_data.py: the shards split by sequence, the target's frozen tensors, the draft
vocabulary and a head's batches), a resumed run's checkpoint, AdamW with a linear warm-up and a cosine
decay over all epochs, a wall-clock budget per run and an epoch budget across runs,
`checkpoint.pt` for resuming, and the progress line. `train` runs that sequence; a kind
(export/drafters/<name>/train.py, run by its plugin's `train-<name>` command) gives it one
function, `start`: from the `Run` set up so far (with the labels and samples kinds take from it),
its module, its `Recipe` (its batches of one epoch, the loss of one batch, its held-out estimate,
how it writes its folder; `HeadRecipe` holds what the recipes of drafters over a draft vocabulary
share) and its `Plan`.
"""

from __future__ import annotations

import contextlib
import math
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch

from edgespec.export.train.commands import BaseTrainConfig
from edgespec.export.train.matmul_probe import Compute, autocast, choose
from edgespec.export.train.train_data import (
    TargetTensors,
    TrainData,
    copied_positions,
    draft_vocab,
    epoch_groups,
    prepare,
    target_tensors,
)

CHECKPOINT = "checkpoint.pt"
SAVE_EVERY_S = 300  # a running job writes checkpoint.pt this often (and at its end)


# ---- resumable state ----------------------------------------------------------------------------------
def load_checkpoint(out: Path) -> dict | None:
    """The training state an earlier run left in `out` (None: a fresh run)."""
    path = out / CHECKPOINT
    return torch.load(path, weights_only=False) if path.exists() else None


@dataclass(frozen=True)
class Checkpoint:
    path: Path  # checkpoint.pt; written through a temporary name
    key: str  # the module's state_dict is stored under this key
    meta: dict  # stored beside it: what a resumed run rebuilds the module from (config, d2t)

    def save(self, model: torch.nn.Module, opt: torch.optim.Optimizer, step: int, epoch: float) -> None:
        tmp = self.path.with_suffix(".tmp")
        torch.save(
            {self.key: model.state_dict(), "opt": opt.state_dict(), "step": step, "epoch": epoch} | self.meta, tmp
        )
        tmp.rename(self.path)

    def restore(self, state: dict, model: torch.nn.Module, opt: torch.optim.Optimizer) -> tuple[int, float]:
        """Weights and optimizer from `state`; returns (step, epoch) to continue from."""
        model.load_state_dict(state[self.key])
        opt.load_state_dict(state["opt"])
        return state["step"], state["epoch"]


# ---- the loop -------------------------------------------------------------------------------------------
class Recipe(Protocol):
    """What a head kind gives the loop."""

    def batches(self, epoch: float) -> Sequence:
        """The batches of the epoch `epoch` is in, in order (`fit` skips those already done)."""
        ...

    def loss(self, batch) -> tuple[torch.Tensor, list[float], int]:
        """(loss to minimize, top-1 accuracy per drafted position, rows that carried loss)."""
        ...

    def estimate(self) -> dict:
        """Held-out acceptance estimate of the trained module (eval mode, no grad)."""
        ...

    def save(self, step: int, epoch: float, est: dict, training: dict) -> str:
        """Write the head folder (`training`: how this run trained, `Progress.record`, kept in its
        config.json); returns the closing line of the run (what was reached, where)."""
        ...


@dataclass(frozen=True)
class HeadRecipe:
    """What the recipes of drafters over a draft vocabulary share (a kind's recipe adds its module and
    tensors): batches of similar-length sequences (`epoch_groups`) and the training record."""

    run: Run  # the kind's config (batch size, seed, data, out folder), the shards and split
    coverage: float  # fraction of answer tokens inside the draft vocabulary (recorded in config.json)

    cfg = property(lambda self: self.run.cfg)  # the kind's config (a BaseTrainConfig)
    data = property(lambda self: self.run.data)  # shards and split (TrainData)

    def batches(self, epoch: float) -> Sequence:
        return epoch_groups(self.data, self.cfg, epoch)

    def record(self, step: int, epoch: float, est: dict, training: dict) -> dict:
        """What the drafter's config.json keeps of its training (a kind adds its own fields after these)."""
        return {
            "trained_steps": step,
            "epochs": round(epoch, 3),
            "train_tokens": self.data.train_tokens,
            "data": str(self.cfg.data),
            "holdout": est,
            "training": training,
            "draft_vocab_coverage": round(self.coverage, 4),
        }


@dataclass(frozen=True)
class Plan:
    tag: str  # progress-line prefix, e.g. "[train]"
    unit: str  # what the top-1 list of the progress line is per ("step", "head")
    lr: float  # AdamW peak learning rate
    warmup: int  # steps of linear warm-up
    total_steps: int  # the cosine decays to 0 over these steps (all runs together)
    epochs: float  # passes over the data in total (all runs together)
    minutes: float  # wall-clock budget of this run
    clip: float | None = None  # gradient-norm clip (None: none)
    ema: float = 0.9  # weight of the past in the progress line's smoothed top-1

    def lr_at(self, step: int) -> float:
        warm = min(1.0, (step + 1) / self.warmup)
        return self.lr * warm * 0.5 * (1 + math.cos(math.pi * min(1.0, step / self.total_steps)))


@dataclass
class Progress:
    """Rows per second and the time left of one run, for the progress line and the training record."""

    plan: Plan  # the run's budgets (the ETA ends at the earlier one)
    compute: str  # "bf16" or "fp32"
    threads: int  # torch threads
    t0: float = 0.0  # perf_counter at the start of the run
    rows: int = 0  # rows that carried loss this run
    steps: int = 0  # optimizer steps this run
    last_line: float = 0.0  # perf_counter of the last progress line

    def __post_init__(self) -> None:
        self.t0 = self.last_line = time.perf_counter()

    @property
    def elapsed(self) -> float:
        return time.perf_counter() - self.t0

    def rows_per_s(self) -> float:
        return self.rows / max(self.elapsed, 1e-9)

    def eta_s(self, steps_left: int) -> float:
        """Seconds until the run ends: the epochs' remaining steps at this run's pace, or the
        wall-clock budget, whichever comes first."""
        per_step = self.elapsed / max(self.steps, 1)
        return max(0.0, min(steps_left * per_step, self.plan.minutes * 60 - self.elapsed))

    def due(self, step: int) -> bool:
        """A line every 10 steps, and at least every 30 s (large batches on few cores are slow)."""
        return step % 10 == 0 or time.perf_counter() - self.last_line > 30

    def line(
        self, step: int, epoch: float, lr: float, loss: float, top1: list[float], elapsed: float, left: int
    ) -> str:
        """The progress line after `step` (top1: the smoothed top-1 per drafted position; left: steps to go)."""
        p = self.plan
        return (
            f"{p.tag} step {step}/{p.total_steps} epoch {epoch:.2f} lr {lr:.2e} loss {loss:.3f} "
            f"top-1 per {p.unit} {' '.join(f'{a:.3f}' for a in top1)} {self.rows_per_s():.0f} rows/s "
            f"({self.compute}, {self.threads} threads) {elapsed / 60:.1f} min, "
            f"ETA {self.eta_s(left) / 60:.1f} min"
        )

    def record(self) -> dict:
        """What the head's config.json keeps of this run."""
        return {
            "compute": self.compute,
            "threads": self.threads,
            "rows_per_s": round(self.rows_per_s(), 1),
            "steps": self.steps,
            "seconds": round(self.elapsed, 1),
        }


def fit(
    model: torch.nn.Module,
    recipe: Recipe,
    plan: Plan,
    ckpt: Checkpoint,
    state: dict | None,
    progress: bool = True,
    compute: Compute | None = None,
) -> dict:
    """Train from `state` (a checkpoint.pt's content; None: from the start) until `plan.epochs` or
    `plan.minutes`, whichever comes first, saving the state every few minutes and at the end; then
    the held-out estimate, and the head folder written by the recipe. The loss's forward runs under
    `compute`'s autocast (bf16: the matmuls in bf16, weights and optimizer state fp32; None: fp32);
    backward, the optimizer and the held-out estimate in fp32. Returns the run's training record."""
    opt = torch.optim.AdamW(model.parameters(), lr=plan.lr, weight_decay=0.0)
    step, epoch = ckpt.restore(state, model, opt) if state is not None else (0, 0.0)
    last_save = time.perf_counter()
    prog = Progress(plan, compute.dtype if compute is not None else "fp32", torch.get_num_threads())
    model.train()
    ema, done = None, False
    while not done and epoch < plan.epochs - 1e-9:
        batches = recipe.batches(epoch)
        for bi in range(int(round((epoch - int(epoch)) * len(batches))), len(batches)):
            lr = plan.lr_at(step)
            loss, accs, n_rows = _optimizer_step(model, opt, recipe, batches[bi], lr, plan.clip, compute)
            step += 1
            epoch = int(epoch) + (bi + 1) / len(batches)
            ema = accs if ema is None else [plan.ema * e + (1 - plan.ema) * a for e, a in zip(ema, accs, strict=False)]
            prog.rows += n_rows
            prog.steps += 1
            elapsed = prog.elapsed
            if progress and prog.due(step):
                left = int(round((plan.epochs - epoch) * len(batches)))
                print(prog.line(step, epoch, lr, loss.item(), ema, elapsed, left), file=sys.stderr, flush=True)
                prog.last_line = time.perf_counter()
            if time.perf_counter() - last_save > SAVE_EVERY_S:
                ckpt.save(model, opt, step, epoch)
                last_save = time.perf_counter()
            if elapsed > plan.minutes * 60:
                done = True
                break
        if not done:
            epoch = float(round(epoch))
    ckpt.save(model, opt, step, epoch)
    record = prog.record() | ({"compute_reason": compute.reason} if compute is not None else {})
    model.eval()
    with torch.no_grad():
        est = recipe.estimate()
    print(f"{plan.tag} {recipe.save(step, epoch, est, record)}", file=sys.stderr)
    return record


def _optimizer_step(
    model: torch.nn.Module,
    opt: torch.optim.Optimizer,
    recipe: Recipe,
    batch,
    lr: float,
    clip: float | None,
    compute: Compute | None,
) -> tuple[torch.Tensor, list[float], int]:
    """One AdamW step on `batch` at learning rate lr, the loss's forward under compute's autocast, the
    gradient norm clipped to `clip` (None: not); returns the recipe's (loss, top-1s, rows)."""
    for g in opt.param_groups:
        g["lr"] = lr
    with autocast(compute) if compute is not None else contextlib.nullcontext():
        loss, accs, n_rows = recipe.loss(batch)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    if clip is not None:
        torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
    opt.step()
    return loss, accs, n_rows


# ---- the entry --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Run:
    """What `train` set up before a kind's `start`."""

    cfg: Any  # the kind's config (a BaseTrainConfig)
    out: Path  # the drafter's folder
    rng: np.random.Generator  # numpy generator after the split (feature samples)
    data: TrainData  # shards and split
    target: TargetTensors  # the target's frozen tensors
    state: dict | None  # checkpoint.pt's content (None: a fresh run)
    extra: Any = None  # what the kind's `load` read before the target (aux features)

    def d2t(self) -> np.ndarray:
        """The draft vocabulary: a resumed run's, else the cfg.draft_vocab most frequent answer tokens."""
        if self.state is not None:
            return self.state["d2t"]
        return draft_vocab(self.data.tokens, self.data.answer, self.target.arch.vocab_size, self.cfg.draft_vocab)

    def coverage(self, d2t: np.ndarray) -> float:
        """The fraction of answer tokens inside the draft vocabulary."""
        return float(np.isin(self.data.tokens[self.data.answer], d2t).mean())

    def copied(self) -> np.ndarray:
        """[N] bool: the positions left without loss as the target's copies of an earlier 8-gram of their
        sequence (`copied_positions`), where cfg.skip_copies; else none."""
        tokens = self.data.tokens
        return copied_positions(tokens, self.data.starts) if self.cfg.skip_copies else np.zeros(len(tokens), bool)

    def label_ids(self, copied: np.ndarray) -> np.ndarray:
        """[N] the label of each position: what the target emits there (its own answer's token; in text
        data its argmax), or vocab_size (-> -100: no loss) where it was copying."""
        return np.where(copied, self.target.arch.vocab_size, self.data.labels()).astype(np.int64)

    def sample(self, rows: np.ndarray, n: int = 20000) -> np.ndarray:
        """Up to n random rows (float32, drawn with `rng`): enough for a spread per dimension."""
        return rows[self.rng.choice(len(rows), min(len(rows), n), replace=False)].astype(np.float32)

    def token_steps(self) -> int:
        """Optimizer steps of all epochs in batches of cfg.batch_tokens (30% slack for padding)."""
        return max(1, int(self.cfg.epochs * self.data.train_tokens / self.cfg.batch_tokens * 1.3))

    def plan(
        self, tag: str, unit: str, total_steps: int, warmup: int = 50, clip: float | None = 1.0, ema: float = 0.95
    ) -> Plan:
        """The kind's schedule (Plan) at the config's learning rate and budgets."""
        c = self.cfg
        return Plan(
            tag=tag,
            unit=unit,
            lr=c.lr,
            warmup=warmup,
            total_steps=total_steps,
            epochs=c.epochs,
            minutes=c.minutes,
            clip=clip,
            ema=ema,
        )


@dataclass(frozen=True)
class Start:
    """What a kind's `start` gives `train`."""

    module: torch.nn.Module  # the drafter being trained
    recipe: Recipe  # its batches, loss, estimate and folder
    plan: Plan  # its schedule
    key: str  # checkpoint.pt stores the module's state_dict under this key
    meta: dict  # stored beside it: what a resumed run rebuilds the module from (config, d2t)
    summary: str  # the run's description, printed before training


def head_start(run: Run, head: torch.nn.Module, recipe: Recipe, tag: str, answers: str, more: str = "") -> Start:
    """The Start of a head (EAGLE, EAGLE-3): its schedule in token batches over the config's epochs, its
    config and draft vocabulary kept in checkpoint.pt beside its weights (under "head") to rebuild it
    from, and the run's summary (answers: what it says of the answer tokens; more: the kind's own)."""
    d, vocab = run.data, len(head.d2t)
    summary = (
        f"{len(d.n_prompt)} sequences ({len(d.tokens)} tokens, {answers}), {len(d.hold)} held out; draft vocab "
        f"{vocab} covers {recipe.coverage:.1%} of answer tokens{more}"
    )
    plan = run.plan(tag, "step", run.token_steps())
    return Start(head, recipe, plan, "head", {"head_config": asdict(head.cfg), "d2t": head.d2t.numpy()}, summary)


def train(
    cfg: BaseTrainConfig,
    start: Callable[[Run], Start],
    progress: bool = True,
    load: Callable[[Any, TrainData], Any] | None = None,
) -> Path:
    """Train (or continue training) a drafter: the shards split, `load`'s extra data (read before
    the target, so a data error comes first), the target's tensors, checkpoint.pt if any, then the
    kind's `start` and `fit`. Returns its folder."""
    out, rng, data = prepare(cfg)
    compute = choose(cfg.compute)
    extra = load(cfg, data) if load is not None else None
    tt = target_tensors(cfg.target)
    run = Run(cfg, out, rng, data, tt, load_checkpoint(out), extra)
    s = start(run)
    init = getattr(cfg, "init", None)
    note = (
        f"; resuming at step {run.state['step']}"
        if run.state is not None
        else f"; starting from {init}"
        if init
        else ""
    )
    print(f"{s.plan.tag} {s.summary}{note}", file=sys.stderr)
    print(f"{s.plan.tag} {torch.get_num_threads()} threads; {compute.reason}", file=sys.stderr)
    fit(s.module, s.recipe, s.plan, Checkpoint(out / CHECKPOINT, s.key, s.meta), run.state, progress, compute)
    return out
