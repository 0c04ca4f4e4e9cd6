"""DFlash block drafter: the module (torch) and edgespec's checkpoint of it (`save_dflash`).

One non-causal forward pass drafts a whole block (DFlash, arXiv 2602.06036). With p the position
of the anchor (the last verified token, whose target features do not exist yet):

    ctx_j   = hidden_norm(fc([a_j^1 ; ... ; a_j^n]))               j < p   # target features -> [H]
    x_i     = s_e embed(block_i), block = [anchor, MASK, ..., MASK] i < b   # at positions p + i
    per layer ("KV injection": the context enters as keys/values of every layer, never as queries)
      h     = rms(x, ln1)
      q     = rope(q_norm(Wq h + bq))                                # block rows only
      k, v  = rope(k_norm(Wk [ctx ; h] + bk)), Wv [ctx ; h] + bv     # context rows + block rows
      x    += Wo attn(q, k, v) + bo                                  # every block row sees every row
      x    += mlp(rms(x, ln2))
    logits_i = softcap(s_l rms(x_i, norm) . lm_head_d^T),  i = 1..b-1  # drafts tokens p+1 .. p+b-1

(biases only with attention_bias; s_e, s_l and the soft-cap: z-lab's input_embedding_scale,
output_multiplier and final_logit_softcapping, 1 / 1 / none for edgespec's own drafters). rope is
the drafter's own (its config's theta and scaling). The embedding and the LM-head rows are the
target's (frozen, not stored). Features a_j are the residual streams entering the target layers
`DFlashConfig.aux_layers` (the graphs' `hidden_aux`, ascending); in DFlash's convention
(`target_layer_ids`: the layer whose output is read) they are those layers minus one (layout.py).

Checkpoint: z-lab's layout (config.py `zlab_config`, the tensor names of layout.py
`expected_shapes`) plus `draft_vocab_size` and `d2t` (draft-vocabulary offsets as `checkpoint`
stores them, most frequent first) and an `edgespec` section with the training record, in fp16.
"""

from __future__ import annotations

import math
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from edgespec.export.drafters._torch import Frozen, TorchDrafter
from edgespec.export.drafters.dflash.config import DFlashConfig, zlab_config
from edgespec.export.drafters.dflash.config import DFlashFormatError as DFlashFormatError  # imported from here too
from edgespec.export.drafters.dflash.layout import NORMS, PROJ
from edgespec.export.drafters.dflash.layout import read_dflash as read_dflash
from edgespec.export.train.checkpoint import write_checkpoint


class DFlashDrafter(TorchDrafter):
    def __init__(self, cfg: DFlashConfig, frozen: Frozen) -> None:
        super().__init__(cfg, frozen)  # the target's LM-head rows of the draft vocabulary among them
        H, d = cfg.hidden_size, cfg.head_dim
        self.fc = nn.Linear(len(cfg.target_layer_ids) * H, H, bias=False)
        self.hidden_norm = nn.Parameter(torch.ones(H))
        self.norm = nn.Parameter(torch.ones(H))
        self.layers = nn.ModuleList()
        for _ in range(cfg.n_layers):
            lay = nn.Module()
            bias = cfg.attention_bias
            lay.q = nn.Linear(H, cfg.n_heads * d, bias=bias)
            lay.k = nn.Linear(H, cfg.n_kv_heads * d, bias=bias)
            lay.v = nn.Linear(H, cfg.n_kv_heads * d, bias=bias)
            lay.o = nn.Linear(cfg.n_heads * d, H, bias=bias)
            lay.gate = nn.Linear(H, cfg.intermediate_size, bias=False)
            lay.up = nn.Linear(H, cfg.intermediate_size, bias=False)
            lay.down = nn.Linear(cfg.intermediate_size, H, bias=False)
            lay.ln1, lay.ln2 = nn.Parameter(torch.ones(H)), nn.Parameter(torch.ones(H))
            lay.q_norm, lay.k_norm = nn.Parameter(torch.ones(d)), nn.Parameter(torch.ones(d))
            self.layers.append(lay)

    def params(self) -> dict[str, torch.Tensor]:
        out = {"fc.weight": self.fc.weight, "hidden_norm.weight": self.hidden_norm, "norm.weight": self.norm}
        for i, lay in enumerate(self.layers):
            p = f"layers.{i}."
            mods = (lay.q, lay.k, lay.v, lay.o, lay.gate, lay.up, lay.down)
            out |= {p + n + ".weight": m.weight for n, m in zip(PROJ, mods, strict=True)}
            out |= {p + n + ".bias": m.bias for n, m in zip(PROJ, mods, strict=True) if m.bias is not None}
            out |= {
                p + n + ".weight": t for n, t in zip(NORMS, (lay.ln1, lay.ln2, lay.q_norm, lay.k_norm), strict=True)
            }
        return out

    def context(self, aux: torch.Tensor) -> torch.Tensor:
        """Target features [B, N, n*H] -> the injected context rows [B, N, H]."""
        return self._norm(self.fc(aux), self.hidden_norm)

    def context_kv(self, lay: nn.Module, ctx: torch.Tensor, ctx_pos: torch.Tensor):
        """One layer's K (rotated) and V [B, N, Hkv, D] of context rows: what the runtime caches."""
        c = self.cfg
        B, N, _ = ctx.shape
        k = self._rope(self._norm(lay.k(ctx).view(B, N, c.n_kv_heads, c.head_dim), lay.k_norm), ctx_pos)
        return k, lay.v(ctx).view(B, N, c.n_kv_heads, c.head_dim)

    def forward(
        self,
        ctx: torch.Tensor,
        ctx_pos: torch.Tensor,
        block_ids: torch.Tensor,
        block_pos: torch.Tensor,
        see_ctx: torch.Tensor,
        see_block: torch.Tensor,
    ) -> torch.Tensor:
        """ctx [B, N, H] (from `context`), ctx_pos [B, N]; block_ids / block_pos [B, Q]; see_ctx
        [B, Q, N] and see_block [B, Q, Q] bool: which rows each block row attends to (several
        blocks of one sequence train in one pass). Returns the normed outputs [B, Q, H]."""
        c = self.cfg
        B, Q = block_ids.shape
        rep = c.n_heads // c.n_kv_heads
        mask = torch.cat([see_ctx, see_block], dim=-1)[:, None]  # [B, 1, Q, N + Q]
        x = self.embed[block_ids] * c.embed_scale
        for lay in self.layers:
            h = self._norm(x, lay.ln1)
            q = self._rope(self._norm(lay.q(h).view(B, Q, c.n_heads, c.head_dim), lay.q_norm), block_pos)
            k_c, v_c = self.context_kv(lay, ctx, ctx_pos)
            k_b = self._rope(self._norm(lay.k(h).view(B, Q, c.n_kv_heads, c.head_dim), lay.k_norm), block_pos)
            v_b = lay.v(h).view(B, Q, c.n_kv_heads, c.head_dim)
            k = torch.cat([k_c, k_b], 1).repeat_interleave(rep, dim=2).transpose(1, 2)  # [B, Hq, N+Q, D]
            v = torch.cat([v_c, v_b], 1).repeat_interleave(rep, dim=2).transpose(1, 2)
            att = F.scaled_dot_product_attention(
                q.transpose(1, 2), k, v, attn_mask=mask, scale=1.0 / math.sqrt(c.head_dim)
            )
            x = x + lay.o(att.transpose(1, 2).reshape(B, Q, -1))
            h = self._norm(x, lay.ln2)
            x = x + lay.down(F.silu(lay.gate(h)) * lay.up(h))
        return self._norm(x, self.norm)

    def logits(self, out: torch.Tensor) -> torch.Tensor:
        c = self.cfg
        logits = (out @ self.lm_head.T) * c.logit_scale  # [.., Vd]
        return torch.tanh(logits / c.logit_softcap) * c.logit_softcap if c.logit_softcap > 0 else logits


def build_dflash(
    cfg: DFlashConfig,
    arrays: dict[str, np.ndarray],
    embed: np.ndarray,
    lm_head: np.ndarray,
    rope_cos: np.ndarray,
    rope_sin: np.ndarray,
) -> DFlashDrafter:
    """A DFlashDrafter from checkpoint arrays and the target's embedding / LM head [V, H] / rope tables."""
    return DFlashDrafter(cfg, Frozen.of(arrays, embed, rope_cos, rope_sin, lm_head)).load(arrays)


def init_arrays(arch, sd: dict, d2t: np.ndarray, cfg: DFlashConfig, seed: int) -> dict[str, np.ndarray]:
    """A new drafter: each layer copied from one of the target's last layers (q/k norms at 1); fc
    passes the highest feature layer through (identity there, small random elsewhere)."""
    H = cfg.hidden_size
    rng = np.random.default_rng(seed)
    n = len(cfg.target_layer_ids)
    fc = rng.normal(0, 0.02, (H, n * H)).astype(np.float32)
    fc[:, (n - 1) * H :] += np.eye(H, dtype=np.float32)
    arrays = {
        "fc.weight": fc,
        "hidden_norm.weight": np.ones(H, np.float32),
        "norm.weight": sd["model.norm.weight"].astype(np.float32),
        "d2t": d2t,
    }
    hf = (*PROJ, "input_layernorm", "post_attention_layernorm")  # copied; q/k norms start at 1
    for i in range(cfg.n_layers):
        src = f"model.layers.{arch.n_layers - cfg.n_layers + i}."
        for name in hf:
            arrays[f"layers.{i}.{name}.weight"] = sd[src + name + ".weight"].astype(np.float32)
        arrays[f"layers.{i}.self_attn.q_norm.weight"] = np.ones(cfg.head_dim, np.float32)
        arrays[f"layers.{i}.self_attn.k_norm.weight"] = np.ones(cfg.head_dim, np.float32)
    return arrays


def save_dflash(model: DFlashDrafter, folder: str | Path, record: dict | None = None) -> Path:
    """edgespec's layout: z-lab's config.json and tensor names (layout.zlab_config) + its draft
    vocabulary (draft_vocab_size, the d2t tensor) and training record (`edgespec`), fp16."""
    c = model.cfg
    config = zlab_config(c, "float16") | {
        "draft_vocab_size": c.draft_vocab_size,
        "edgespec": {"d2t_order": "frequency", "features": "aux_layers"} | (record or {}),
    }
    return write_checkpoint(folder, model.state(), config)


def config_record(c: DFlashConfig) -> dict:
    return asdict(c) | {"target_layer_ids": list(c.target_layer_ids)}
