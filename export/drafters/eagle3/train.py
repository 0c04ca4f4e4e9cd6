"""Training an EAGLE-3 head by self-distillation: its batches, loss and held-out estimate.

The data are `eagle_data` shards made with `aux` (the target's low/mid/high residual streams per
token). Training-time test (EAGLE-3): each row is unrolled over n_steps draft steps, step 1 on
fc(aux) of the true position, every later step on the head's own output of the step before,
attending to the true rows before it and to its own chain (`Eagle3Head.forward`). Loss = sum over
steps of step_decay^(s-1) * CE(logits, the target's own next token), over answer positions whose
token is in the draft vocabulary (no feature regression). The loop, data split, schedule and
resuming are `train.train`'s (this module gives it `_start`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from edgespec.export.drafters.eagle3 import Eagle3TrainConfig
from edgespec.export.drafters.eagle3.head import (
    Eagle3Config,
    Eagle3Head,
    build_eagle3,
    init_arrays,
    read_eagle3,
    save_eagle3,
)
from edgespec.export.drafters.medusa.train import _target_spec
from edgespec.export.train import train_data, trainer


def _collate(group, data: train_data.TrainData, aux: np.ndarray, t2d: np.ndarray, label_ids: np.ndarray, n_steps: int):
    """Rows j = 0..n-2 of each sequence: input (token_{j+1}, a_j); step-s label token_{j+s+1}."""
    tok_in, labels, valid, pos = train_data.head_rows(group, data, t2d, label_ids, extra=n_steps)
    a_in = np.zeros((len(group), tok_in.shape[1], aux.shape[1]), np.float32)
    for r, s in enumerate(group):
        a_in[r, : data.starts[s + 1] - data.starts[s] - 1] = aux[data.starts[s] : data.starts[s + 1] - 1]
    return tuple(torch.from_numpy(x) for x in (tok_in, a_in, pos, valid, labels))


def _step_losses(head: Eagle3Head, batch, n_steps: int, decay: float, noise_std: torch.Tensor | None = None):
    """(weighted loss, [(ce, top-1, rows)] per step)."""
    tok_in, a_in, pos, valid, labels = batch
    L = tok_in.shape[1]
    if noise_std is not None:
        a_in = a_in + torch.randn_like(a_in) * noise_std
    outs = head(tok_in, a_in, pos, valid, n_steps)
    total, stats = 0.0, []
    for s, out in enumerate(outs, start=1):
        lab = labels[:, s - 1 : s - 1 + L]  # step s row j: token_{j+s+1}
        mask = (lab >= 0) & torch.roll(valid, -(s - 1), dims=1)
        if not mask.any():
            continue
        logits = head.logits(out[mask])
        ce = F.cross_entropy(logits, lab[mask])
        total = total + decay ** (s - 1) * ce
        stats.append((ce.item(), (logits.argmax(-1) == lab[mask]).float().mean().item(), int(mask.sum())))
    return total, stats


@torch.no_grad()
def estimate(
    head: Eagle3Head,
    data: train_data.TrainData,
    aux: np.ndarray,
    seqs: np.ndarray,
    t2d: np.ndarray,
    label_ids: np.ndarray,
    n_steps: int,
) -> dict:
    """Held-out teacher-forced acceptance by position: top-1 of step s where steps 1..s-1 were all
    right (the chain's acceptance rates under greedy drafting); keys as train_eagle's
    (top1_step1, top1_step2, ...) so the two heads compare directly."""
    n = np.zeros(n_steps, np.int64)
    ok = np.zeros(n_steps, np.int64)
    for s in seqs:
        tok_in, a_in, pos, valid, labels = _collate([s], data, aux, t2d, label_ids, n_steps)
        L = tok_in.shape[1]
        outs = head(tok_in, a_in, pos, valid, n_steps)
        chain = labels[:, :L] >= 0  # rows whose chain is still all right (and scored)
        for i, out in enumerate(outs):
            lab = labels[:, i : i + L]
            m = chain & (lab >= 0)
            right = head.logits(out).argmax(-1) == lab
            n[i] += int(m.sum())
            ok[i] += int((right & m).sum())
            chain = m & right
    est = {f"top1_step{i + 1}": float(ok[i] / max(n[i], 1)) for i in range(n_steps)}
    return est | {"tokens": int(n[0]), "expected_accepted": float(np.cumprod(ok / np.maximum(n, 1)).sum())}


@dataclass(frozen=True)
class _Eagle3Recipe(trainer.HeadRecipe):
    head: Eagle3Head  # the module being trained
    aux: np.ndarray  # [N, 3H] float16: the target's aux features, rows as data.tokens
    t2d: np.ndarray  # [V + 1] draft id of each target id (-100: none)
    label_ids: np.ndarray  # [N] the token, or V where it carries no loss (a copy)
    noise_std: torch.Tensor  # [3H] noise spread per aux dimension (feature_noise * its std)

    def loss(self, group):
        c = self.cfg
        batch = _collate(group, self.data, self.aux, self.t2d, self.label_ids, c.n_steps)
        loss, stats = _step_losses(
            self.head, batch, c.n_steps, c.step_decay, self.noise_std if c.feature_noise else None
        )
        return loss, [s[1] for s in stats], sum(s[2] for s in stats[:1])

    def estimate(self) -> dict:
        return estimate(self.head, self.data, self.aux, self.data.hold, self.t2d, self.label_ids, self.cfg.n_steps)

    def save(self, step: int, epoch: float, est: dict, training: dict) -> str:
        c = self.cfg
        record = self.record(step, epoch, est, training) | {
            "n_steps": c.n_steps,
            "lm_head": "trained (from the target's rows)",
            "target": _target_spec(c.target),  # export-drafter's default speculators verifier
        }
        save_eagle3(self.head, c.out, record | ({"init": str(c.init)} if c.init else {}))
        steps = ", ".join(f"{est[f'top1_step{i + 1}']:.3f}" for i in range(c.n_steps))
        return (
            f"held-out top-1 by position {steps} (each given the ones before right; "
            f"{est['expected_accepted']:.2f} accepted per chain); wrote {c.out}"
        )


def _start(run: trainer.Run) -> trainer.Start:
    """The head (from init, a checkpoint or the target), its recipe and schedule."""
    cfg, data, tt, state, aux = run.cfg, run.data, run.target, run.state, run.extra
    tokens, answer, arch = data.tokens, data.answer, tt.arch
    copied = run.copied()
    if state is None and cfg.init:  # fine-tuning an existing head: its weights and draft vocabulary
        ec, arrays, _ = read_eagle3(cfg.init, arch.hidden_size, arch.vocab_size, arch.n_layers)
    else:
        ec, arrays = init_arrays(arch, tt.state, tt.lm_head, run.d2t(), cfg.seed)
    if aux.shape[1] != ec.aux_width:
        raise train_data.TrainDataError(
            f"{cfg.data}: aux rows of width {aux.shape[1]}, the head fuses {ec.aux_width} "
            f"(layers {ec.aux_layers}); was the data made with another target?"
        )
    if state is not None:  # the checkpoint's d2t order is the one its lm_head rows were trained in
        ec = replace(ec, d2t_by_frequency=bool(state["head_config"]["d2t_by_frequency"]))
    elif ec.draft_vocab_size < arch.vocab_size:
        arrays, ec = _frequency_ordered(arrays, ec, tokens[answer], arch.vocab_size)
    head = build_eagle3(ec, arrays, tt.embed, tt.rope_cos, tt.rope_sin)
    coverage = run.coverage(head.d2t.numpy())
    t2d = train_data.target_to_draft(head.d2t.numpy(), arch.vocab_size)
    noise_std = torch.from_numpy(cfg.feature_noise * run.sample(aux).std(0))
    recipe = _Eagle3Recipe(run, coverage, head, aux, t2d, run.label_ids(copied), noise_std)
    answers = f"{int((answer & ~copied).sum())} answer tokens carry loss"
    return trainer.head_start(run, head, recipe, "[train-eagle3]", answers, f"; {cfg.n_steps} unrolled steps")


def train_eagle3(cfg: Eagle3TrainConfig, progress: bool = True) -> Path:
    """Train (or continue training) an EAGLE-3 head; writes the HF-layout head folder and checkpoint.pt."""
    if cfg.n_steps < 1:
        raise ValueError(f"n_steps must be >= 1 (got {cfg.n_steps})")
    return trainer.train(cfg, _start, progress, load=train_data.load_aux)


def _frequency_ordered(arrays: dict, ec: Eagle3Config, seen: np.ndarray, vocab: int) -> tuple[dict, Eagle3Config]:
    """d2t most frequent first (so a prefix is a smaller draft vocabulary), lm_head's rows moved
    along (they are the head's own: each follows its token)."""
    d2t = arrays["d2t"]
    ids = train_data.target_to_draft(d2t, vocab)[seen.astype(np.int64)]
    order = train_data.by_frequency(np.arange(len(d2t)), ids[ids >= 0], len(d2t))
    arrays = arrays | {"d2t": d2t[order], "lm_head.weight": arrays["lm_head.weight"][order]}
    return arrays, replace(ec, d2t_by_frequency=True)
