"""Medusa heads: the module (torch) and its parameters under Medusa's checkpoint names.

For the feature f_t (the target's post-norm hidden state at t; the target's own LM head on f_t
gives token_{t+1}), head i (0-based) predicts token_{t+2+i}:
    h_i      = f_t + SiLU(W_i f_t + b_i)          # `n_layers` such residual blocks; W_i = 0 at init
    logits_i = h_i . lm_head_d^T                   # [Vd]: the target's LM head rows of the draft vocab
At draft time f is the feature of the last verified token, whose own next token (the bonus) the
target has chosen already: d_1..d_K = the heads' top tokens, from one small call with no KV and no
sequence. Unlike EAGLE, head i never sees d_1..d_i: acceptance falls fast with depth, which is
what Medusa's trees (each head's top candidates, combined) are for.

Parameter names (Medusa's): "{i}.{j}.linear.weight" [H, H], "{i}.{j}.linear.bias" [H] for head i,
block j; checkpoint.py reads and writes edgespec's files, official.py Medusa's. Heads published by
Medusa carry their own trained LM head each ("{i}.lm_head" [V, H] among the arrays here,
`own_lm_heads`): logits_i = h_i . lm_head_i^T over the same draft rows.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from edgespec.export.drafters.medusa.config import MedusaConfig, param_names  # noqa: F401 - re-exported


class MedusaHeads(nn.Module):
    def __init__(self, cfg: MedusaConfig, lm_head_d: torch.Tensor, d2t: torch.Tensor) -> None:
        super().__init__()
        self.cfg = cfg
        H = cfg.hidden_size
        self.blocks = nn.ModuleList(
            nn.ModuleList(nn.Linear(H, H) for _ in range(cfg.n_layers)) for _ in range(cfg.n_heads)
        )
        for lin in self.linears():  # every head starts as the target's own next-token head
            nn.init.zeros_(lin.weight)
            nn.init.zeros_(lin.bias)
        self.register_buffer("lm_head", lm_head_d, persistent=False)  # [Vd, H] or own: [K, Vd, H], frozen
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
        """h [.., K, H] -> [.., K, Vd]."""
        if self.lm_head.dim() == 3:  # each head its own rows
            return torch.einsum("...kh,kvh->...kv", h, self.lm_head)
        return h @ self.lm_head.T


def heads_state(heads: MedusaHeads) -> dict[str, np.ndarray]:
    """Parameters under Medusa's names (float32 numpy) + d2t (target ids of the draft tokens):
    what `build_heads` takes back."""
    out = {}
    for i, head in enumerate(heads.blocks):
        for j, lin in enumerate(head):
            out[f"{i}.{j}.linear.weight"] = lin.weight.detach().float().cpu().numpy()
            out[f"{i}.{j}.linear.bias"] = lin.bias.detach().float().cpu().numpy()
    return out | {"d2t": heads.d2t.cpu().numpy().astype(np.int64)}


def build_heads(mc: MedusaConfig, arrays: dict[str, np.ndarray], lm_head: np.ndarray) -> MedusaHeads:
    """MedusaHeads from checkpoint arrays and the target's LM head [V, H] (the heads' own when they have them)."""
    d2t = torch.from_numpy(arrays["d2t"])
    if mc.own_lm_heads:
        lm_rows = torch.stack([torch.from_numpy(arrays[f"{i}.lm_head"])[d2t] for i in range(mc.n_heads)])
    else:
        lm_rows = torch.from_numpy(lm_head)[d2t].clone()
    heads = MedusaHeads(mc, lm_rows, d2t)
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
