"""One training entry for every drafter that ships models, by self-distillation (torch).

What every kind shares lives here: its config's common fields (`BaseTrainConfig`, from commands.py), the
self-distillation shards (`head_data`) loaded and split by sequence, the target's frozen
tensors, a resumed run's checkpoint and draft vocabulary, AdamW with a linear warm-up and a cosine
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
from edgespec.export.train.matmul_probe import Compute, autocast, choose, default_threads
from edgespec.export.train.text_data import EVAL_MARK

CHECKPOINT = "checkpoint.pt"
SAVE_EVERY_S = 300  # a running job writes checkpoint.pt this often (and at its end)


# ---- config, data and target ---------------------------------------------------------------------------
class TrainDataError(ValueError):
    """Training data without (or with misaligned) features a kind needs."""


@dataclass(frozen=True)
class SoftLabels:
    """The target's next-token distribution at each position of teacher-forced text (`text_data`)."""

    ids: np.ndarray  # [N, k] int32: its k most likely tokens after position i, most likely first
    probs: np.ndarray  # [N, k] float32: their probabilities
    has: np.ndarray  # [N] bool: the position has them (text data; self-distillation shards do not)

    def labels(self, tokens: np.ndarray, starts: np.ndarray) -> np.ndarray:
        """[N] what the target emits at each position: the token itself (its own greedy answers) or,
        in text, its argmax given the text before (the label of position i is row i - 1's top-1)."""
        prev = np.roll(self.ids[:, 0], 1).astype(tokens.dtype)
        has_prev = np.roll(self.has, 1)
        has_prev[starts[:-1]] = False  # a sequence's first token has no row before it
        return np.where(has_prev, prev, tokens)

    def shifted(self, starts: np.ndarray) -> SoftLabels:
        """The same, moved one position on: row i holds the distribution over token i (row i - 1's),
        so it lines up with the labels."""
        has = np.roll(self.has, 1)
        has[starts[:-1]] = False
        return SoftLabels(np.roll(self.ids, 1, axis=0), np.roll(self.probs, 1, axis=0), has)


@dataclass(frozen=True)
class TrainData:
    tokens: np.ndarray  # [N] int32: all sequences, back to back
    feats: np.ndarray  # [N, H] float16: the target's post-norm feature at each token
    starts: np.ndarray  # [S+1] int64: sequence boundaries in tokens
    n_prompt: np.ndarray  # [S] int64: prompt tokens at the start of each sequence
    hold: np.ndarray  # sequence ids held out for the acceptance estimate (sorted)
    train: np.ndarray  # sequence ids trained on (sorted)
    answer: np.ndarray  # [N] bool: the token is part of an answer (not of the prompt)
    soft: SoftLabels | None = None  # the target's next-token distributions (teacher-forced text data)
    emitted: np.ndarray | None = None  # [N] what the target emits at each position (None: tokens):
    #                                    SoftLabels.labels, the label a drafter learns

    def labels(self) -> np.ndarray:
        """[N] the token the target emits at each position: the token itself in its own answers,
        its argmax given the text before in teacher-forced text."""
        return self.tokens if self.emitted is None else self.emitted

    @property
    def train_tokens(self) -> int:
        """Tokens of the training sequences."""
        return int(sum(self.starts[s + 1] - self.starts[s] for s in self.train))


def prepare(cfg: BaseTrainConfig) -> tuple[Path, np.random.Generator, TrainData]:
    """Torch set up (threads, seed), the out folder made, the shards loaded and split by sequence.
    Returns (out folder, the numpy generator after the split, the data)."""
    from edgespec.export.train.head_data import load_shards, load_soft

    for folder in str(cfg.data).split(","):
        if (Path(folder) / EVAL_MARK).exists():
            raise TrainDataError(
                f"{folder} holds eval answers ({EVAL_MARK}: made by tools/head_accept.py); train on data "
                "made from training prompts (edgespec answer-data / text-data)"
            )
    torch.set_num_threads(cfg.threads or default_threads())
    torch.manual_seed(cfg.seed)
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    tokens, feats, starts, n_prompt = load_shards(cfg.data)
    n_seq = len(n_prompt)
    rng = np.random.default_rng(cfg.seed)
    perm = rng.permutation(n_seq)
    n_hold = max(1, int(n_seq * cfg.holdout))
    answer = np.zeros(len(tokens), bool)
    for s in range(n_seq):
        answer[starts[s] + n_prompt[s] : starts[s + 1]] = True
    soft = load_soft(cfg.data)
    if soft is not None and len(soft[0]) != len(tokens):  # a shard written between the two reads
        raise TrainDataError(f"{cfg.data}: {len(soft[0])} soft-label rows for {len(tokens)} tokens; still being made?")
    return (
        out,
        rng,
        TrainData(
            tokens=tokens,
            feats=feats,
            starts=starts,
            n_prompt=n_prompt,
            hold=np.sort(perm[:n_hold]),
            train=np.sort(perm[n_hold:]),
            answer=answer,
            soft=SoftLabels(*soft) if soft is not None else None,
            emitted=SoftLabels(*soft).labels(tokens, starts) if soft is not None else None,
        ),
    )


@dataclass(frozen=True)
class TargetTensors:
    arch: Any  # the target's ArchSpec (export.arch)
    embed: np.ndarray  # [V, H] token embedding
    lm_head: np.ndarray  # [V, H] LM head
    state: dict[str, np.ndarray]  # every parameter under its HF name, float32
    rope_cos: np.ndarray  # [max_pos, D] float32
    rope_sin: np.ndarray  # [max_pos, D] float32
    tokenizer: Any = None  # the target's HF tokenizer


def target_tensors(target: str | None) -> TargetTensors:
    """The target's frozen tensors as the int4 engine computes with them (dequantized)."""
    from edgespec.export.target.arch import arch_from_config
    from edgespec.export.train.head_data import load_target

    model, tok = load_target(target)
    arch = arch_from_config(model.config, 2048)
    sd = {k: v.detach().float().numpy() for k, v in model.state_dict().items()}
    cos, sin = arch.rope_tables()
    return TargetTensors(
        arch=arch,
        embed=sd["model.embed_tokens.weight"],
        lm_head=model.lm_head.weight.detach().float().numpy(),
        state=sd,
        rope_cos=cos.astype(np.float32),
        rope_sin=sin.astype(np.float32),
        tokenizer=tok,
    )


def load_aux(cfg: BaseTrainConfig, data: TrainData) -> np.ndarray:
    """The shards' aux features [N, n*H] (the target's low/mid/high residual streams), checked to
    line up with the tokens `prepare` read."""
    from edgespec.export.train.head_data import load_aux as read_aux

    try:
        aux = read_aux(cfg.data)
    except FileNotFoundError as e:
        raise TrainDataError(f"{e}. Hint: make the data with DataConfig(aux=True)") from e
    if len(aux) != len(data.tokens):  # a shard written between the two reads (data still being made)
        raise TrainDataError(
            f"{cfg.data}: {len(aux)} aux rows for {len(data.tokens)} tokens; the data changed while "
            "it was read (still being generated?). Hint: run again once the folder holds `done`"
        )
    return aux


def draft_vocab(tokens: np.ndarray, answer: np.ndarray, vocab: int, size: int) -> np.ndarray:
    """The `size` most frequent tokens of the answers, most frequent first (a prefix is then a
    smaller draft vocabulary), or the full vocabulary (ids in order)."""
    if size <= 0 or size >= vocab:
        return np.arange(vocab, dtype=np.int64)
    return by_frequency(np.arange(vocab, dtype=np.int64), tokens[answer], vocab)[:size]


def by_frequency(ids: np.ndarray, seen: np.ndarray, vocab: int) -> np.ndarray:
    """ids reordered by how often they occur in `seen`, most frequent first (ties: in given order)."""
    counts = np.bincount(seen.astype(np.int64), minlength=vocab)
    return ids[np.argsort(-counts[ids], kind="stable")].astype(np.int64)


def target_to_draft(d2t: np.ndarray, vocab: int) -> np.ndarray:
    """[vocab + 1] draft id of each target id, -100 (no loss) for tokens outside the draft
    vocabulary and for the extra id `vocab` (a label masked out on purpose)."""
    t2d = np.full(vocab + 1, -100, np.int64)
    t2d[d2t] = np.arange(len(d2t))
    return t2d


def copied_positions(tokens: np.ndarray, starts: np.ndarray, n: int = 8) -> np.ndarray:
    """[N] bool: the token ends an n-gram that already occurred earlier in its sequence. Greedy
    answers of a small model loop a lot; such copies are prompt lookup's job, and training on
    them teaches the head little and inflates its held-out score."""
    out = np.zeros(len(tokens), bool)
    for s in range(len(starts) - 1):
        a, b = int(starts[s]), int(starts[s + 1])
        seen: set = set()
        seq = tokens[a:b].tolist()
        for i in range(n - 1, len(seq)):
            key = tuple(seq[i - n + 1 : i + 1])
            out[a + i] = key in seen
            seen.add(key)
    return out


def length_groups(starts: np.ndarray, seqs: np.ndarray, batch_tokens: int, rng: np.random.Generator) -> list[list[int]]:
    """Groups of sequences of similar length whose padded size stays within batch_tokens."""
    lens = starts[seqs + 1] - starts[seqs]
    order = seqs[np.argsort(lens + rng.uniform(0, 8, len(lens)))]
    groups, cur, longest = [], [], 0
    for s in order:
        n = int(starts[s + 1] - starts[s])
        if cur and max(longest, n) * (len(cur) + 1) > batch_tokens:
            groups.append(cur)
            cur, longest = [], 0
        cur.append(s)
        longest = max(longest, n)
    if cur:
        groups.append(cur)
    rng.shuffle(groups)
    return groups


def head_rows(group, data: TrainData, t2d: np.ndarray, label_ids: np.ndarray, extra: int) -> tuple[np.ndarray, ...]:
    """The rows of a head's batch of sequences `group` (EAGLE, EAGLE-3): row j of a sequence (j = 0..n-2)
    is fed token_{j+1} beside the features of position j and learns token_{j+2}. Returns tok_in [B, L],
    labels [B, L + extra] (draft ids of label_ids[j+2]; -100: no loss: prompt tokens, padding, and the
    `extra` columns that later unrolled steps read past the end), valid [B, L] bool and pos [B, L] (= j)."""
    starts = data.starts
    L = max(int(starts[s + 1] - starts[s]) for s in group) - 1
    B = len(group)
    tok_in = np.zeros((B, L), np.int64)
    labels = np.full((B, L + extra), -100, np.int64)
    valid = np.zeros((B, L), bool)
    for r, s in enumerate(group):
        a, b = int(starts[s]), int(starts[s + 1])
        n = b - a
        tok_in[r, : n - 1] = data.tokens[a + 1 : b]
        valid[r, : n - 1] = True
        lab = t2d[label_ids[a + 2 : b]]  # row j predicts token_{j+2}
        lab[: max(0, int(data.n_prompt[s]) - 2)] = -100  # prompt tokens: context only, no loss
        labels[r, : n - 2] = lab
    pos = np.broadcast_to(np.arange(L), (B, L)).copy()
    return tok_in, labels, valid, pos


def epoch_groups(data: TrainData, cfg, epoch: float) -> list[list[int]]:
    """The training sequences of the epoch `epoch` is in, grouped by length_groups, in an order
    fixed by cfg.seed and the epoch (a resumed run sees the same batches)."""
    rng = np.random.default_rng(cfg.seed + int(epoch * 1000))
    return length_groups(data.starts, data.train, cfg.batch_tokens, rng)


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
            for g in opt.param_groups:
                g["lr"] = lr
            with autocast(compute) if compute is not None else contextlib.nullcontext():
                loss, accs, n_rows = recipe.loss(batches[bi])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            if plan.clip is not None:
                torch.nn.utils.clip_grad_norm_(model.parameters(), plan.clip)
            opt.step()
            step += 1
            epoch = int(epoch) + (bi + 1) / len(batches)
            ema = accs if ema is None else [plan.ema * e + (1 - plan.ema) * a for e, a in zip(ema, accs, strict=False)]
            prog.rows += n_rows
            prog.steps += 1
            elapsed = prog.elapsed
            if progress and prog.due(step):
                left = int(round((plan.epochs - epoch) * len(batches)))
                print(
                    f"{plan.tag} step {step}/{plan.total_steps} epoch {epoch:.2f} lr {lr:.2e} loss {loss.item():.3f} "
                    f"top-1 per {plan.unit} {' '.join(f'{a:.3f}' for a in ema)} {prog.rows_per_s():.0f} rows/s "
                    f"({prog.compute}, {prog.threads} threads) {elapsed / 60:.1f} min, "
                    f"ETA {prog.eta_s(left) / 60:.1f} min",
                    file=sys.stderr,
                    flush=True,
                )
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
