"""Training Medusa heads by self-distillation: their batches, loss and held-out estimate.

Rows are positions, independent of each other (no attention), so a batch is a random set of
answer positions of the self-distillation data (`eagle_data` shards, the target's own greedy
answers): loss = sum_i decay^i CE_i (Medusa's 0.8^i) against the target's continuation. The loop,
data split, schedule and resuming are `train.train`'s (this module gives it `_start`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from edgespec.export.drafters.medusa import MedusaTrainConfig
from edgespec.export.drafters.medusa.checkpoint import read_heads, save_heads
from edgespec.export.drafters.medusa.head import MedusaConfig, MedusaHeads, build_heads
from edgespec.export.train import train_data, trainer


def _rows(data: train_data.TrainData, seqs: np.ndarray, n_heads: int) -> tuple[np.ndarray, np.ndarray]:
    """(feature rows t [N], label positions [N, K]: t+2+i, -1 past the end of the sequence) for
    every t whose first label t+2 is an answer token of one of `seqs`."""
    rows, labels = [], []
    offs = 2 + np.arange(n_heads)
    for s in seqs:
        a, b = int(data.starts[s]), int(data.starts[s + 1])
        t = np.arange(max(a, a + int(data.n_prompt[s]) - 2), b - 2)
        lab = t[:, None] + offs
        lab[lab >= b] = -1
        rows.append(t)
        labels.append(lab)
    return np.concatenate(rows), np.concatenate(labels)


def _draft_labels(data: train_data.TrainData, lab_pos: np.ndarray, t2d: np.ndarray) -> np.ndarray:
    """[N, K] draft ids of the tokens at the label positions (-100: none)."""
    return np.where(lab_pos >= 0, t2d[data.labels()[np.maximum(lab_pos, 0)]], -100)


def _losses(heads: MedusaHeads, f: torch.Tensor, lab: torch.Tensor, decay: float):
    """f [N, H], lab [N, K] draft ids (-100: none) -> (weighted loss, top-1 per head)."""
    logits = heads.logits(heads(f))  # [N, K, Vd]
    total, accs = 0.0, []
    for i in range(heads.cfg.n_heads):
        m = lab[:, i] >= 0
        if not m.any():
            accs.append(0.0)
            continue
        li = logits[m, i]
        total = total + decay**i * F.cross_entropy(li, lab[m, i])
        accs.append(float((li.argmax(-1) == lab[m, i]).float().mean()))
    return total, accs


@torch.no_grad()
def estimate(
    heads: MedusaHeads, data: train_data.TrainData, seqs: np.ndarray, t2d: np.ndarray, copied: np.ndarray
) -> dict:
    """Held-out top-1 of each head, and the chain's acceptance: the fraction of positions where
    heads 0..i are all right (what a greedy chain of i+1 drafts keeps), over all answer positions
    and over those whose first label is not a copy of an earlier 8-gram (fresh text)."""
    K = heads.cfg.n_heads
    rows, lab_pos = _rows(data, seqs, K)
    labels = _draft_labels(data, lab_pos, t2d)
    ok = np.zeros((len(rows), K), bool)
    for a in range(0, len(rows), 4096):
        f = torch.from_numpy(data.feats[rows[a : a + 4096]].astype(np.float32))
        ok[a : a + 4096] = heads.logits(heads(f)).argmax(-1).numpy() == labels[a : a + 4096]
    top1 = [round(float(ok[labels[:, i] >= 0, i].mean()), 3) for i in range(K)]
    chain = np.cumprod(ok, axis=1)
    fresh = ~copied[rows + 2]
    return {
        "top1": top1,
        "chain": [round(float(c), 3) for c in chain.mean(0)],
        "chain_fresh": [round(float(c), 3) for c in chain[fresh].mean(0)],
        "positions": len(rows),
    }


@dataclass(frozen=True)
class _MedusaRecipe:
    heads: MedusaHeads  # the module being trained
    cfg: MedusaTrainConfig  # batch size, loss decay, seed, out folder
    data: train_data.TrainData  # shards and split
    t2d: np.ndarray  # [V + 1] draft id of each target id (-100: none)
    rows: np.ndarray  # [R] training positions
    labels: np.ndarray  # [R, K] their draft-id labels

    @property
    def n_batches(self) -> int:
        return max(1, len(self.rows) // self.cfg.batch_rows)

    def batches(self, epoch: float):
        order = np.random.default_rng(self.cfg.seed + int(epoch)).permutation(len(self.rows))
        b = self.cfg.batch_rows
        return [order[i * b : (i + 1) * b] for i in range(self.n_batches)]

    def loss(self, idx):
        f = torch.from_numpy(self.data.feats[self.rows[idx]].astype(np.float32))
        loss, accs = _losses(self.heads, f, torch.from_numpy(self.labels[idx]), self.cfg.decay)
        return loss, accs, len(idx)

    def estimate(self) -> dict:
        copied = train_data.copied_positions(self.data.tokens, self.data.starts)
        return estimate(self.heads, self.data, self.data.hold, self.t2d, copied)

    def save(self, step: int, epoch: float, est: dict, training: dict) -> str:
        save_heads(
            self.heads,
            self.cfg.out,
            {
                "trained_steps": step,
                "epochs": round(epoch, 3),
                "train_positions": len(self.rows),
                "data": str(self.cfg.data),
                "target": _target_spec(self.cfg.target),
                "holdout": est,
                "training": training,
            }
            | ({"init": str(self.cfg.init)} if self.cfg.init else {}),
        )
        return (
            f"held-out top-1 per head {est['top1']}, chain acceptance {est['chain']} "
            f"(fresh text only: {est['chain_fresh']}); wrote {self.cfg.out}"
        )


def _target_spec(target: str | None) -> str:
    """The model trained for, as a --target spec that still names it from elsewhere (a local path made
    absolute): `export-drafter` reads its LM head from there."""
    from edgespec.export.target.sources.resolve import DEFAULT_NAME

    if target in (None, "default"):
        return DEFAULT_NAME
    return str(Path(target).resolve()) if Path(target).exists() else target


def _start(run: trainer.Run) -> trainer.Start:
    """The heads (random blocks, the target's LM-head rows), their recipe and schedule."""
    cfg, data, tt = run.cfg, run.data, run.target
    arch = tt.arch
    if run.state is None and cfg.init:  # fine-tuning existing heads: their weights, sizes and draft vocabulary
        mc, arrays = read_heads(cfg.init, arch.hidden_size, arch.vocab_size)
        heads = build_heads(mc, arrays, tt.lm_head)
        d2t = arrays["d2t"]
    else:  # a resumed run keeps its draft vocabulary (run.d2t); its weights come from the checkpoint
        d2t = run.d2t()
        mc = MedusaConfig(
            hidden_size=arch.hidden_size,
            vocab_size=arch.vocab_size,
            draft_vocab_size=len(d2t),
            n_heads=cfg.n_heads,
            n_layers=cfg.n_layers,
        )
        heads = MedusaHeads(mc, torch.from_numpy(tt.lm_head)[torch.from_numpy(d2t)].clone(), torch.from_numpy(d2t))
    t2d = train_data.target_to_draft(d2t, arch.vocab_size)
    rows, lab_pos = _rows(data, data.train, mc.n_heads)
    recipe = _MedusaRecipe(heads, cfg, data, t2d, rows, _draft_labels(data, lab_pos, t2d))
    plan = run.plan("[medusa]", "head", max(1, int(cfg.epochs * recipe.n_batches)), warmup=30, clip=None, ema=0.9)
    return trainer.Start(
        heads,
        recipe,
        plan,
        "heads",
        {"config": asdict(mc), "d2t": heads.d2t.numpy()},
        f"{len(data.n_prompt)} sequences, {len(rows)} training positions, {len(data.hold)} "
        f"sequences held out; {mc.n_heads} heads, draft vocab {len(d2t)}",
    )


def train_medusa(cfg: MedusaTrainConfig, progress: bool = True) -> Path:
    """Train (or continue training) Medusa heads; writes the heads folder and checkpoint.pt."""
    return trainer.train(cfg, _start, progress)
