"""Medusa heads: the module, its checkpoint layout, and training by self-distillation (torch).

For the feature f_t (the target's post-norm hidden state at t; the target's own LM head on f_t
gives token_{t+1}), head i (0-based) predicts token_{t+2+i}:
    h_i      = f_t + SiLU(W_i f_t + b_i)          # `n_layers` such residual blocks; W_i = 0 at init
    logits_i = h_i . lm_head_d^T                   # [Vd]: the target's LM head rows of the draft vocab
At draft time f is the feature of the last verified token, whose own next token (the bonus) the
target has chosen already: d_1..d_K = the heads' top tokens, from one small call with no KV and no
sequence. Unlike EAGLE, head i never sees d_1..d_i: acceptance falls fast with depth, which is
what Medusa's trees (each head's top candidates, combined) are for.

Layout (Medusa's parameter names): config.json {"medusa_num_heads", "medusa_num_layers",
"hidden_size", "vocab_size", "draft_vocab_size", ...} + model.safetensors with
    "{i}.{j}.linear.weight" [H, H], "{i}.{j}.linear.bias" [H]   head i, block j
    "d2t" [Vd] int64 (target id = i + d2t[i], EAGLE-3's convention) when Vd < V
Medusa's published heads also carry a full LM head per head ("{i}.{n_layers}.weight" [V, H]);
these heads share the target's rows instead (4 heads of SmolLM2-135M: 2.7 MB in fp16), so such
checkpoints are refused by name.

Training: rows are positions, independent of each other (no attention), so a batch is a random
set of answer positions of the self-distillation data (`eagle_data` shards, the target's own
greedy answers): loss = sum_i decay^i CE_i (Medusa's 0.8^i) against the target's continuation.
"""

from __future__ import annotations

import json
import math
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

HEADS_WEIGHTS = "model.safetensors"
HEADS_CONFIG = "config.json"


class MedusaFormatError(ValueError):
    """A heads checkpoint that is not in the Medusa layout or does not fit the target."""


@dataclass(frozen=True)
class MedusaConfig:
    hidden_size: int  # H: the target's hidden size
    vocab_size: int  # target vocabulary
    draft_vocab_size: int  # tokens the heads can propose (<= vocab_size; the most frequent ones)
    n_heads: int = 4  # K: head i predicts the token i + 2 places past the feature's position
    n_layers: int = 1  # residual SiLU blocks per head


class MedusaHeads(nn.Module):
    def __init__(self, cfg: MedusaConfig, lm_head_d: torch.Tensor, d2t: torch.Tensor) -> None:
        super().__init__()
        self.cfg = cfg
        H = cfg.hidden_size
        self.blocks = nn.ModuleList(nn.ModuleList(nn.Linear(H, H) for _ in range(cfg.n_layers))
                                    for _ in range(cfg.n_heads))
        for lin in self.linears():  # every head starts as the target's own next-token head
            nn.init.zeros_(lin.weight)
            nn.init.zeros_(lin.bias)
        self.register_buffer("lm_head", lm_head_d, persistent=False)  # [Vd, H], frozen
        self.register_buffer("d2t", d2t, persistent=False)  # [Vd] draft id -> target id

    def linears(self):
        return [lin for head in self.blocks for lin in head]

    def forward(self, feats: torch.Tensor) -> torch.Tensor:
        """feats [N, H] -> each head's output [N, K, H]."""
        outs = []
        for head in self.blocks:
            h = feats
            for lin in head:
                h = h + F.silu(lin(h))
            outs.append(h)
        return torch.stack(outs, 1)

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        return h @ self.lm_head.T  # [.., Vd]


def heads_state(heads: MedusaHeads) -> dict[str, np.ndarray]:
    """Parameters under Medusa's names (float32) + d2t (relative) when the vocab is reduced."""
    out = {}
    for i, head in enumerate(heads.blocks):
        for j, lin in enumerate(head):
            out[f"{i}.{j}.linear.weight"] = lin.weight.detach().float().cpu().numpy()
            out[f"{i}.{j}.linear.bias"] = lin.bias.detach().float().cpu().numpy()
    c = heads.cfg
    if c.draft_vocab_size < c.vocab_size:
        d2t = heads.d2t.cpu().numpy().astype(np.int64)
        out["d2t"] = d2t - np.arange(len(d2t))
    return out


def save_heads(heads: MedusaHeads, folder: str | Path, extra: dict | None = None) -> Path:
    """config.json + model.safetensors (float16 weights), written so a crash leaves no half file."""
    from edgespec.export.eagle import write_checkpoint

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    c = heads.cfg
    config = {"medusa_num_heads": c.n_heads, "medusa_num_layers": c.n_layers, "hidden_size": c.hidden_size,
              "vocab_size": c.vocab_size, "draft_vocab_size": c.draft_vocab_size, "torch_dtype": "float16",
              "medusa": {"features": "final_norm", "lm_head": "target"} | (extra or {})}
    return write_checkpoint(folder, heads_state(heads), config)


def read_heads(folder: str | Path, hidden_size: int, vocab_size: int) -> tuple[MedusaConfig, dict[str, np.ndarray]]:
    """Read and check a heads folder against the target's sizes: float32 arrays + d2t (absolute)."""
    from safetensors.numpy import load_file

    folder = Path(folder)
    if not (folder / HEADS_CONFIG).exists() or not (folder / HEADS_WEIGHTS).exists():
        raise MedusaFormatError(f"{folder}: a Medusa heads folder holds {HEADS_CONFIG} + {HEADS_WEIGHTS} "
                                "(from `edgespec train-medusa`)")
    cfg = json.loads((folder / HEADS_CONFIG).read_text())
    if "medusa_num_heads" not in cfg:
        raise MedusaFormatError(f"{folder}/{HEADS_CONFIG} has no medusa_num_heads: not a Medusa heads folder")
    w = load_file(str(folder / HEADS_WEIGHTS))
    K, n_layers = int(cfg["medusa_num_heads"]), int(cfg.get("medusa_num_layers", 1))
    if any(k == f"{i}.{n_layers}.weight" for i in range(K) for k in w):
        raise MedusaFormatError(f"{folder}: heads with their own LM heads ({0}.{n_layers}.weight); these "
                                "heads share the target's LM head. Hint: train with `edgespec train-medusa`")
    H = int(cfg["hidden_size"])
    if H != hidden_size:
        raise MedusaFormatError(f"{folder}: heads of hidden size {H} do not fit the target's {hidden_size}; "
                                "were they trained for another model?")
    if int(cfg.get("vocab_size", vocab_size)) != vocab_size:
        raise MedusaFormatError(f"{folder}: heads vocab {cfg['vocab_size']} != target vocab {vocab_size}")
    need = [f"{i}.{j}.linear.{p}" for i in range(K) for j in range(n_layers) for p in ("weight", "bias")]
    missing = [k for k in need if k not in w]
    if missing:
        raise MedusaFormatError(f"{folder}: missing tensors {missing[:4]}; expected Medusa names i.j.linear.*")
    vd = int(cfg.get("draft_vocab_size") or vocab_size)
    if "d2t" in w:
        d2t = w["d2t"].astype(np.int64) + np.arange(len(w["d2t"]))
        if len(d2t) != vd or d2t.min() < 0 or d2t.max() >= vocab_size:
            raise MedusaFormatError(f"{folder}: d2t has {len(d2t)} entries (config: {vd}) or ids outside "
                                    f"0..{vocab_size - 1}")
    elif vd == vocab_size:
        d2t = np.arange(vocab_size, dtype=np.int64)
    else:
        raise MedusaFormatError(f"{folder}: draft_vocab_size {vd} < vocab but no d2t tensor")
    mc = MedusaConfig(hidden_size=H, vocab_size=vocab_size, draft_vocab_size=vd, n_heads=K, n_layers=n_layers)
    arrays = {k: w[k].astype(np.float32) for k in need}
    arrays["d2t"] = d2t
    return mc, arrays


def build_heads(mc: MedusaConfig, arrays: dict[str, np.ndarray], lm_head: np.ndarray) -> MedusaHeads:
    """MedusaHeads from checkpoint arrays and the target's LM head [V, H]."""
    d2t = torch.from_numpy(arrays["d2t"])
    heads = MedusaHeads(mc, torch.from_numpy(lm_head)[d2t].clone(), d2t)
    with torch.no_grad():
        for i, head in enumerate(heads.blocks):
            for j, lin in enumerate(head):
                lin.weight.copy_(torch.from_numpy(arrays[f"{i}.{j}.linear.weight"]))
                lin.bias.copy_(torch.from_numpy(arrays[f"{i}.{j}.linear.bias"]))
    return heads


def random_heads(mc: MedusaConfig, d2t: np.ndarray, seed: int = 0, scale: float = 0.5) -> dict[str, np.ndarray]:
    """Untrained heads with random blocks (tests: drafts that vary, some right, most wrong)."""
    rng = np.random.default_rng(seed)
    H = mc.hidden_size
    arrays = {}
    for i in range(mc.n_heads):
        for j in range(mc.n_layers):
            arrays[f"{i}.{j}.linear.weight"] = (rng.normal(0, scale / math.sqrt(H), (H, H))).astype(np.float32)
            arrays[f"{i}.{j}.linear.bias"] = np.zeros(H, np.float32)
    arrays["d2t"] = np.asarray(d2t, np.int64)
    return arrays


# ---- training --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class MedusaTrainConfig:
    data: str  # folder(s) of eagle_data shards ("DIR1,DIR2")
    out: str  # heads folder (config.json + model.safetensors) and checkpoint.pt
    target: str | None = None  # model source (None: default SmolLM2)
    n_heads: int = 4  # K heads: drafts of up to K tokens per step
    n_layers: int = 1  # residual blocks per head
    draft_vocab: int = 8192  # most frequent answer tokens the heads may propose (0: full vocab)
    minutes: float = 30.0  # wall-clock budget of this run (training resumes from checkpoint.pt)
    epochs: float = 2.0  # passes over the answer positions in total (across runs)
    lr: float = 1e-3  # AdamW peak learning rate (cosine decay over all epochs)
    batch_rows: int = 2048  # positions per optimizer step
    decay: float = 0.8  # loss weight of head i: decay**i (Medusa's)
    holdout: float = 0.05  # fraction of sequences kept out for the acceptance estimate
    threads: int | None = None  # torch threads
    seed: int = 0  # data order and split


def _rows(starts: np.ndarray, n_prompt: np.ndarray, seqs: np.ndarray, n_heads: int) -> tuple[np.ndarray, np.ndarray]:
    """(feature rows t [N], label positions [N, K]: t+2+i, -1 past the end of the sequence) for
    every t whose first label t+2 is an answer token of one of `seqs`."""
    rows, labels = [], []
    offs = 2 + np.arange(n_heads)
    for s in seqs:
        a, b = int(starts[s]), int(starts[s + 1])
        t = np.arange(max(a, a + int(n_prompt[s]) - 2), b - 2)
        lab = t[:, None] + offs
        lab[lab >= b] = -1
        rows.append(t)
        labels.append(lab)
    return np.concatenate(rows), np.concatenate(labels)


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
        total = total + decay ** i * F.cross_entropy(li, lab[m, i])
        accs.append(float((li.argmax(-1) == lab[m, i]).float().mean()))
    return total, accs


def train_medusa(cfg: MedusaTrainConfig, progress: bool = True) -> Path:
    """Train (or continue training) Medusa heads; writes the heads folder and checkpoint.pt."""
    from edgespec.export.eagle import _target_tensors, copied_positions, draft_vocab, training_data

    out, _, (tokens, feats, starts, n_prompt), hold, train_seqs, answer = training_data(cfg)
    n_seq, n_hold = len(n_prompt), len(hold)
    arch, _, lm_head, _, _, _ = _target_tensors(cfg.target)
    ckpt_path = out / "checkpoint.pt"
    ckpt = torch.load(ckpt_path, weights_only=False) if ckpt_path.exists() else None
    d2t = ckpt["d2t"] if ckpt is not None else draft_vocab(tokens, answer, arch.vocab_size, cfg.draft_vocab)
    mc = MedusaConfig(hidden_size=arch.hidden_size, vocab_size=arch.vocab_size, draft_vocab_size=len(d2t),
                      n_heads=cfg.n_heads, n_layers=cfg.n_layers)
    heads = MedusaHeads(mc, torch.from_numpy(lm_head)[torch.from_numpy(d2t)].clone(), torch.from_numpy(d2t))
    t2d = np.full(arch.vocab_size, -100, np.int64)
    t2d[d2t] = np.arange(len(d2t))
    opt = torch.optim.AdamW(heads.parameters(), lr=cfg.lr, weight_decay=0.0)
    step, epoch_f = 0, 0.0
    if ckpt is not None:
        heads.load_state_dict(ckpt["heads"])
        opt.load_state_dict(ckpt["opt"])
        step, epoch_f = ckpt["step"], ckpt["epoch"]
    rows, lab_pos = _rows(starts, n_prompt, train_seqs, cfg.n_heads)
    labels = np.where(lab_pos >= 0, t2d[tokens[np.maximum(lab_pos, 0)]], -100)  # [N, K] draft ids
    n_batches = max(1, len(rows) // cfg.batch_rows)
    total_steps = max(1, int(cfg.epochs * n_batches))
    print(f"[medusa] {n_seq} sequences, {len(rows)} training positions, {n_hold} sequences held out; "
          f"{cfg.n_heads} heads, draft vocab {len(d2t)}" + (f"; resuming at step {step}" if ckpt else ""),
          file=sys.stderr)
    t0 = last_save = time.perf_counter()
    heads.train()
    ema = None
    done = False
    while not done and epoch_f < cfg.epochs - 1e-9:
        order = np.random.default_rng(cfg.seed + int(epoch_f)).permutation(len(rows))
        first = int(round((epoch_f - int(epoch_f)) * n_batches))
        for bi in range(first, n_batches):
            lr = cfg.lr * min(1.0, (step + 1) / 30) * 0.5 * (1 + math.cos(math.pi * min(1.0, step / total_steps)))
            for g in opt.param_groups:
                g["lr"] = lr
            idx = order[bi * cfg.batch_rows:(bi + 1) * cfg.batch_rows]
            f = torch.from_numpy(feats[rows[idx]].astype(np.float32))
            loss, accs = _losses(heads, f, torch.from_numpy(labels[idx]), cfg.decay)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            step += 1
            epoch_f = int(epoch_f) + (bi + 1) / n_batches
            ema = accs if ema is None else [0.9 * e + 0.1 * a for e, a in zip(ema, accs, strict=True)]
            elapsed = time.perf_counter() - t0
            if progress and step % 10 == 0:
                print(f"[medusa] step {step}/{total_steps} epoch {epoch_f:.2f} loss {loss.item():.3f} top-1 per head "
                      f"{' '.join(f'{a:.3f}' for a in ema)} {elapsed / 60:.1f} min", file=sys.stderr, flush=True)
            if time.perf_counter() - last_save > 300:
                _save_ckpt(ckpt_path, heads, opt, step, epoch_f)
                last_save = time.perf_counter()
            if elapsed > cfg.minutes * 60:
                done = True
                break
        if not done:
            epoch_f = float(round(epoch_f))
    _save_ckpt(ckpt_path, heads, opt, step, epoch_f)
    heads.eval()
    copied = copied_positions(tokens, starts)
    est = estimate(heads, hold, tokens, feats, starts, n_prompt, t2d, copied)
    save_heads(heads, out, {"trained_steps": step, "epochs": round(epoch_f, 3), "train_positions": len(rows),
                            "data": str(cfg.data), "holdout": est})
    print(f"[medusa] held-out top-1 per head {est['top1']}, chain acceptance {est['chain']} "
          f"(fresh text only: {est['chain_fresh']}); wrote {out}", file=sys.stderr)
    return out


def _save_ckpt(path: Path, heads: MedusaHeads, opt, step: int, epoch: float) -> None:
    tmp = path.with_suffix(".tmp")
    torch.save({"heads": heads.state_dict(), "opt": opt.state_dict(), "step": step, "epoch": epoch,
                "config": asdict(heads.cfg), "d2t": heads.d2t.numpy()}, tmp)
    tmp.rename(path)


@torch.no_grad()
def estimate(heads: MedusaHeads, seqs: np.ndarray, tokens, feats, starts, n_prompt, t2d, copied) -> dict:
    """Held-out top-1 of each head, and the chain's acceptance: the fraction of positions where
    heads 0..i are all right (what a greedy chain of i+1 drafts keeps), over all answer positions
    and over those whose first label is not a copy of an earlier 8-gram (fresh text)."""
    K = heads.cfg.n_heads
    rows, lab_pos = _rows(starts, n_prompt, seqs, K)
    labels = np.where(lab_pos >= 0, t2d[tokens[np.maximum(lab_pos, 0)]], -100)
    ok = np.zeros((len(rows), K), bool)
    for a in range(0, len(rows), 4096):
        f = torch.from_numpy(feats[rows[a:a + 4096]].astype(np.float32))
        ok[a:a + 4096] = (heads.logits(heads(f)).argmax(-1).numpy() == labels[a:a + 4096])
    top1 = [round(float(ok[labels[:, i] >= 0, i].mean()), 3) for i in range(K)]
    chain = np.cumprod(ok, axis=1)
    fresh = ~copied[rows + 2]
    return {"top1": top1, "chain": [round(float(c), 3) for c in chain.mean(0)],
            "chain_fresh": [round(float(c), 3) for c in chain[fresh].mean(0)], "positions": len(rows)}
