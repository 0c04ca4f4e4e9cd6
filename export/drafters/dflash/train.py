"""Training a DFlash block drafter by self-distillation (torch), on `train.train`.

Data: the target's own greedy answers with its low/mid/high features (`eagle_data` shards made
with `aux`). Each sequence trains `anchors` blocks per pass, all in one forward: block m is the
anchor token at position p_m (an answer position) followed by b-1 mask tokens, sees the context
rows 0..p_m-1 and its own rows, and learns the target's tokens p_m+1..p_m+b-1 (cross-entropy over
the draft vocabulary, weighted decay^(i-1) at block row i: a draft only counts when every draft
before it was right). Anchors are drawn anew every epoch, so an epoch shows new blocks.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from edgespec.export.drafters.dflash import TrainConfig
from edgespec.export.drafters.dflash.model import (
    DFlashConfig,
    DFlashDrafter,
    build_dflash,
    config_record,
    init_arrays,
    save_dflash,
)
from edgespec.export.train import train_data, trainer


def mask_token(tok, vocab_size: int) -> int:
    """The token whose embedding fills the rows to draft: a special token chat text never holds
    (SmolLM2's <empty_output>), else the last id of the vocabulary."""
    vocab = tok.get_vocab() if tok is not None else {}
    for name in ("<empty_output>", "<|reserved_special_token_0|>", "<mask>"):
        if vocab.get(name, vocab_size) < vocab_size:
            return int(vocab[name])
    return vocab_size - 1


def collate(
    group,
    data: train_data.TrainData,
    aux: np.ndarray,
    t2d: np.ndarray,
    cfg: DFlashConfig,
    n_anchors: int,
    rng: np.random.Generator | None,
):
    """Tensors for `DFlashDrafter.forward` + labels [B, M*b] (draft ids, -100: no loss). rng None:
    anchors at every answer position (up to n_anchors, evenly spread) for a stable estimate."""
    b = cfg.block_size
    starts = data.starts
    N = max(int(starts[s + 1] - starts[s]) for s in group)
    B, M = len(group), n_anchors
    x_aux = np.zeros((B, N, aux.shape[1]), np.float32)
    ids = np.full((B, M * b), cfg.mask_token_id, np.int64)
    pos = np.zeros((B, M * b), np.int64)
    see_ctx = np.zeros((B, M * b, N), bool)
    blk = np.arange(M * b) // b
    see_block = np.broadcast_to(blk[:, None] == blk[None, :], (B, M * b, M * b)).copy()
    labels = np.full((B, M * b), -100, np.int64)
    for r, s in enumerate(group):
        a, e = int(starts[s]), int(starts[s + 1])
        n = e - a
        x_aux[r, :n] = aux[a:e]
        cand = np.arange(int(data.n_prompt[s]), n - 1)  # anchor positions with >= 1 token after them
        if len(cand) == 0:
            continue
        if rng is None:
            pick = cand[np.linspace(0, len(cand) - 1, min(M, len(cand))).astype(int)]
        else:
            pick = np.sort(rng.choice(cand, min(M, len(cand)), replace=False))
        toks, emitted = data.tokens[a:e], data.labels()[a:e]
        for m, p in enumerate(pick):
            rows = slice(m * b, (m + 1) * b)
            ids[r, m * b] = toks[p]
            pos[r, rows] = p + np.arange(b)
            see_ctx[r, rows, :p] = True
            follow = emitted[p + 1 : p + b]  # what the target emits there (its argmax, in text data)
            labels[r, m * b + 1 : m * b + 1 + len(follow)] = t2d[follow]
    ctx_pos = np.broadcast_to(np.arange(N), (B, N)).copy()
    t = torch.from_numpy
    return t(x_aux), t(ctx_pos), t(ids), t(pos), t(see_ctx), t(see_block), t(labels)


def block_losses(model: DFlashDrafter, batch, decay: float):
    """(weighted CE, top-1 per block row 1..b-1, labelled rows, leading-correct counts [b])."""
    x_aux, ctx_pos, ids, pos, see_ctx, see_block, labels = batch
    b = model.cfg.block_size
    out = model(model.context(x_aux), ctx_pos, ids, pos, see_ctx, see_block)  # [B, M*b, H]
    B, Q, _ = out.shape
    lab = labels.view(B, Q // b, b)[:, :, 1:]  # [B, M, b-1]
    keep = lab >= 0
    rows = out.view(B, Q // b, b, -1)[:, :, 1:][keep]
    logits = model.logits(rows)
    ce = F.cross_entropy(logits, lab[keep], reduction="none")
    w = (decay ** torch.arange(b - 1, dtype=torch.float32)).expand_as(lab)[keep]
    loss = (ce * w).sum() / w.sum()
    ok = torch.zeros_like(lab, dtype=torch.bool)
    ok[keep] = logits.argmax(-1) == lab[keep]
    accs = [float(ok[:, :, i][keep[:, :, i]].float().mean()) if keep[:, :, i].any() else 0.0 for i in range(b - 1)]
    # leading run of right drafts per block (what greedy verification keeps), among full blocks
    full = keep.all(-1)
    run = ok.int().cumprod(-1).sum(-1)[full]
    counts = torch.bincount(run, minlength=b)
    return loss, accs, int(keep.sum()), counts


@dataclass(frozen=True)
class _Recipe(trainer.HeadRecipe):
    model: DFlashDrafter  # the module being trained
    aux: np.ndarray  # [N, n*H] float16: the target's aux features, rows as data.tokens
    t2d: np.ndarray  # [V + 1] draft id of each target id (-100: none)

    def batches(self, epoch: float):
        rng = np.random.default_rng(self.cfg.seed + int(epoch * 1000))  # groups, then each group's anchor seed
        groups = train_data.length_groups(self.data.starts, self.data.train, self.cfg.batch_tokens, rng)
        return [(g, int(rng.integers(1 << 30))) for g in groups]

    def loss(self, item):
        group, seed = item
        batch = collate(
            group, self.data, self.aux, self.t2d, self.model.cfg, self.cfg.anchors, np.random.default_rng(seed)
        )
        loss, accs, n, _ = block_losses(self.model, batch, self.cfg.decay)
        return loss, accs, n

    def estimate(self) -> dict:
        return estimate(self.model, self.data, self.data.hold, self.aux, self.t2d)

    def save(self, step: int, epoch: float, est: dict, training: dict) -> str:
        c = self.cfg
        record = self.record(step, epoch, est, training) | {"decay": c.decay, "anchors": c.anchors}
        save_dflash(self.model, c.out, record)
        return (
            f"held-out mean accepted length {est['mean_accepted']:.3f} of {self.model.cfg.block_size - 1} "
            f"drafts per block (teacher-forced context); wrote {c.out}"
        )


@torch.no_grad()
def estimate(
    model: DFlashDrafter,
    data: train_data.TrainData,
    seqs: np.ndarray,
    aux: np.ndarray,
    t2d: np.ndarray,
    anchors: int = 32,
) -> dict:
    """Held-out, greedy: P(the first i drafts of a block are all right), i = 1..b-1, and the mean
    number of leading right drafts per block (accepted length minus the bonus token)."""
    b = model.cfg.block_size
    counts = torch.zeros(b, dtype=torch.long)
    for s in seqs:
        batch = collate([int(s)], data, aux, t2d, model.cfg, anchors, None)
        counts += block_losses(model, batch, 1.0)[3]
    n = int(counts.sum())
    at_least = [float(counts[i:].sum()) / max(n, 1) for i in range(1, b)]
    return {
        "blocks": n,
        "p_first_i_right": [round(x, 4) for x in at_least],
        "mean_accepted": round(float(sum(at_least)), 4),
    }


def _start(run: trainer.Run) -> trainer.Start:
    """The drafter (from a checkpoint, or the target's last layers), its recipe and schedule."""
    cfg, data, tt, state = run.cfg, run.data, run.target, run.state
    arch = tt.arch
    d2t = run.d2t()
    if state is not None:
        dc = DFlashConfig(
            **(state["dflash_config"] | {"target_layer_ids": tuple(state["dflash_config"]["target_layer_ids"])})
        )
    else:
        dc = DFlashConfig.of_target(
            arch, cfg.n_layers, len(d2t), cfg.block_size, mask_token(tt.tokenizer, arch.vocab_size)
        )
    model = build_dflash(
        dc, init_arrays(arch, tt.state, d2t, dc, cfg.seed), tt.embed, tt.lm_head, tt.rope_cos, tt.rope_sin
    )
    coverage = run.coverage(d2t)
    recipe = _Recipe(run, coverage, model, run.extra, train_data.target_to_draft(d2t, arch.vocab_size))
    meta = {
        "dflash_config": asdict(dc) | {"target_layer_ids": list(dc.target_layer_ids)},
        "d2t": d2t,
        "record": config_record(dc),
    }
    return trainer.Start(
        model,
        recipe,
        run.plan("[dflash]", "block row", run.token_steps()),
        "dflash",
        meta,
        f"{len(data.n_prompt)} sequences ({len(data.tokens)} tokens, {int(data.answer.sum())} answer "
        f"tokens), {len(data.hold)} held out; block {dc.block_size}, {dc.n_layers} layer(s), draft "
        f"vocab {dc.draft_vocab_size} covers {coverage:.1%} of answer tokens, features of target "
        f"layers {list(dc.target_layer_ids)}",
    )


def train(cfg: TrainConfig, progress: bool = True) -> Path:
    """Train (or continue training) a DFlash drafter; writes its folder and checkpoint.pt."""
    return trainer.train(cfg, _start, progress, load=train_data.load_aux)
