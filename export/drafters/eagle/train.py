"""Training an EAGLE head by self-distillation: its batches, loss and held-out estimate.

Teacher-forced pairs over the target's own answers (`eagle_data`), plus a second "training-time
test" step (EAGLE-3) in which each row is fed the head's own predicted feature, attending to the
true rows before it and to itself: what drafting does at depth 2. Loss per step =
SmoothL1(f^, f) + ce_weight * CE(logits, target's own next token), over the answer positions only.
The loop, data split, schedule and resuming are `train.train`'s (this module gives it `_start`).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from edgespec.export.drafters.eagle import TrainConfig
from edgespec.export.drafters.eagle.checkpoint import read_head, save_head
from edgespec.export.drafters.eagle.head import EagleHead, build_head, init_arrays
from edgespec.export.train import train_data, trainer


def _collate(group, data: train_data.TrainData, t2d: np.ndarray, label_ids: np.ndarray):
    """Rows j = 0..n-2 of each sequence: input (token_{j+1}, f_j); step-s targets f_{j+s}, token_{j+s+1}."""
    tok_in, labels, valid, pos = train_data.head_rows(group, data, t2d, label_ids, extra=2)
    f_in = np.zeros((len(group), tok_in.shape[1] + 2, data.feats.shape[1]), np.float32)
    for r, s in enumerate(group):
        f_in[r, : data.starts[s + 1] - data.starts[s]] = data.feats[data.starts[s] : data.starts[s + 1]]
    return tuple(torch.from_numpy(x) for x in (tok_in, f_in, pos, valid, labels))


def _collate_soft(group, data: train_data.TrainData, soft: train_data.SoftLabels):
    """The soft labels lined up with _collate's labels: (draft ids [B, L+2, k] (-100: none), probs
    [B, L+2, k]); `soft` is shifted (row i: the target's distribution over token i) and in draft ids."""
    starts = data.starts
    L = max(int(starts[s + 1] - starts[s]) for s in group) - 1
    k = soft.ids.shape[1]
    ids = np.full((len(group), L + 2, k), -100, np.int64)
    probs = np.zeros((len(group), L + 2, k), np.float32)
    for r, s in enumerate(group):
        a, b = int(starts[s]), int(starts[s + 1])
        has = soft.has[a + 2 : b, None]
        ids[r, : b - a - 2] = np.where(has, soft.ids[a + 2 : b], -100)
        probs[r, : b - a - 2] = np.where(has, soft.probs[a + 2 : b], 0.0)
    return torch.from_numpy(ids), torch.from_numpy(probs)


def _token_loss(logits: torch.Tensor, lab: torch.Tensor, soft=None) -> torch.Tensor:
    """Mean over rows, in fp32: KL(target || head) where a row has soft labels (the target's top-k
    renormalized over those in the draft vocabulary), else cross-entropy to the label."""
    logp = F.log_softmax(logits.float(), dim=-1)  # [M, Vd]
    rows = -logp.gather(-1, lab[:, None])[:, 0]
    if soft is not None:
        sid, sp = soft  # [M, k]
        p = sp * (sid >= 0)
        total = p.sum(-1, keepdim=True)
        p = p / total.clamp_min(1e-12)
        kl = (p * (torch.log(p.clamp_min(1e-12)) - logp.gather(-1, sid.clamp_min(0)))).sum(-1)
        rows = torch.where(total[:, 0] > 0, kl, rows)
    return rows.mean()


def _step_losses(
    head: EagleHead,
    batch,
    n_steps: int,
    ce_weight: float,
    inv_std: torch.Tensor,
    noise: float = 0.0,
    soft: tuple[torch.Tensor, torch.Tensor] | None = None,
):
    tok_in, f_in, pos, valid, labels = batch
    L = tok_in.shape[1]
    feats = f_in[:, :L]
    if noise:  # the runtime's features come from int8-activation kernels, not this fp32 model
        feats = feats + torch.randn_like(feats) * (noise / inv_std)
    preds = head(tok_in, feats, pos, valid, n_steps)
    total, stats = 0.0, []
    for s, pred in enumerate(preds, start=1):
        lab = labels[:, s - 1 : s - 1 + L]  # step s row j: token_{j+s+1}
        mask = lab >= 0
        if s > 1:
            mask = mask & torch.roll(valid, -(s - 1), dims=1)
        if not mask.any():
            continue
        target = f_in[:, s : s + L]
        # per-dimension scaled: a few feature dims are ~30x the others and would own the loss
        reg = F.smooth_l1_loss(pred[mask] * inv_std, target[mask] * inv_std)
        logits = head.logits(pred[mask])
        rows_soft = None if soft is None else tuple(x[:, s - 1 : s - 1 + L][mask] for x in soft)
        ce = _token_loss(logits, lab[mask], rows_soft)
        acc = (logits.argmax(-1) == lab[mask]).float().mean()
        total = total + reg + ce_weight * ce
        stats.append((reg.item(), ce.item(), acc.item(), int(mask.sum())))
    return total, stats


@torch.no_grad()
def estimate(
    head: EagleHead, data: train_data.TrainData, seqs: np.ndarray, t2d: np.ndarray, label_ids: np.ndarray
) -> dict:
    """Held-out top-1 of step 1 and of step 2 where step 1 was right (the chain's first two
    acceptance rates under greedy drafting, teacher-forced context)."""
    n1 = n1_ok = n2 = n2_ok = 0
    for s in seqs:
        tok_in, f_in, pos, valid, labels = _collate([s], data, t2d, label_ids)
        L = tok_in.shape[1]
        p1, p2 = head(tok_in, f_in[:, :L], pos, valid, 2)
        a1 = head.logits(p1).argmax(-1) == labels[:, :L]
        a2 = head.logits(p2).argmax(-1) == labels[:, 1 : 1 + L]
        m1 = labels[:, :L] >= 0
        m2 = (labels[:, 1 : 1 + L] >= 0) & a1
        n1 += int(m1.sum())
        n1_ok += int((a1 & m1).sum())
        n2 += int(m2.sum())
        n2_ok += int((a2 & m2).sum())
    return {"top1_step1": n1_ok / max(n1, 1), "top1_step2": n2_ok / max(n2, 1), "tokens": n1}


@dataclass(frozen=True)
class _EagleRecipe(trainer.HeadRecipe):
    head: EagleHead  # the module being trained
    t2d: np.ndarray  # [V + 1] draft id of each target id (-100: none)
    label_ids: np.ndarray  # [N] the token, or V where it carries no loss (a copy)
    inv_std: torch.Tensor  # [H] 1 / per-dimension feature spread
    soft: train_data.SoftLabels | None  # shifted soft labels in draft ids (text data; None: hard labels only)

    def loss(self, group):
        batch = _collate(group, self.data, self.t2d, self.label_ids)
        soft = _collate_soft(group, self.data, self.soft) if self.soft is not None else None
        c = self.cfg
        loss, stats = _step_losses(self.head, batch, c.n_steps, c.ce_weight, self.inv_std, c.feature_noise, soft)
        return loss, [s[2] for s in stats], sum(s[3] for s in stats[:1])

    def estimate(self) -> dict:
        return estimate(self.head, self.data, self.data.hold, self.t2d, self.label_ids)

    def save(self, step: int, epoch: float, est: dict, training: dict) -> str:
        c = self.cfg
        record = self.record(step, epoch, est, training)
        save_head(self.head, c.out, record | ({"init": str(c.init)} if c.init else {}))
        return (
            f"held-out top-1 step 1 {est['top1_step1']:.3f}, step 2 {est['top1_step2']:.3f} "
            f"(given step 1 right); wrote {c.out}"
        )


def _start(run: trainer.Run) -> trainer.Start:
    """The head (from init, a checkpoint or the target's last layer), its recipe and schedule."""
    cfg, data, tt = run.cfg, run.data, run.target
    tokens, answer, arch = data.tokens, data.answer, tt.arch
    copied = run.copied()
    # a resumed run keeps its draft vocabulary; its weights come from the checkpoint
    if run.state is None and cfg.init:  # fine-tuning an existing head: its weights and draft vocabulary
        hc, arrays = read_head(cfg.init, arch.hidden_size, arch.vocab_size)
    else:
        hc, arrays = init_arrays(arch, tt.state, run.d2t(), cfg.seed)
    if hc.draft_vocab_size < arch.vocab_size:  # most frequent first (also a resumed head's: the weights
        # do not depend on the order, the LM-head rows are gathered from the target by d2t)
        arrays["d2t"] = train_data.by_frequency(arrays["d2t"], tokens[answer], arch.vocab_size)
        hc = replace(hc, d2t_by_frequency=True)
    head = build_head(hc, arrays, tt.embed, tt.lm_head, tt.rope_cos, tt.rope_sin)
    coverage = run.coverage(head.d2t.numpy())
    soft = data.soft
    label_ids = run.label_ids(copied)
    t2d = train_data.target_to_draft(head.d2t.numpy(), arch.vocab_size)
    if soft is not None:  # row i: the distribution over token i, in draft ids (-100 outside the draft vocab)
        soft = soft.shifted(data.starts)
        soft = train_data.SoftLabels(t2d[soft.ids], soft.probs, soft.has & ~copied)
    inv_std = torch.from_numpy(1.0 / (run.sample(data.feats).std(0) + 1e-3))
    print(
        f"[train] {int((answer & ~copied).sum())} answer tokens carry loss "
        + (
            f"({int((answer & copied).sum())} repeat an earlier 8-gram of their sequence: left to prompt lookup)"
            if cfg.skip_copies
            else "(loops included: --no-skip-copies)"
        ),
        file=sys.stderr,
    )
    recipe = _EagleRecipe(run, coverage, head, t2d, label_ids, inv_std, soft)
    return trainer.head_start(run, head, recipe, "[train]", f"{int(answer.sum())} answer tokens")


def train(cfg: TrainConfig, progress: bool = True) -> Path:
    """Train (or continue training) a head; writes the HF-layout head folder and checkpoint.pt."""
    return trainer.train(cfg, _start, progress)
