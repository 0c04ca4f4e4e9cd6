"""EAGLE head: the module (torch) and its parameters under EAGLE checkpoint names.

The head (EAGLE-1 form) drafts from the target's own features. For the pair at position j:
    x_j   = fc([embed(token_{j+1}) ; f_j])            # [2H] -> [H]; f_j = target hidden at j
    f^_{j+1} = DecoderLayer(x_j)                         # one Llama layer, its own KV
    logits   = f^_{j+1} . lm_head_d^T                    # the target's LM head rows of the draft vocab
so the head predicts the target's next feature, and from it token_{j+2}. At draft time the
predicted feature stands in for the unknown true one, step after step. Features are the target's
post-final-norm hidden states (what the ONNX graphs output as `hidden`).

The embedding and the LM-head rows are the target's (frozen buffers); the head's own parameters
are fc, the decoder layer (q/k/v biases on heads for Qwen2 targets) and optional norms; its RoPE
is its own (`HeadConfig.rope_theta`: a published head may be trained with another base than its
target's). `EagleHead.params` / `build_head` map them to and from the checkpoint names
(`checkpoint.py` reads and writes the files).
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from edgespec.export.drafters._torch import Frozen, HeadShape, TorchDrafter
from edgespec.export.drafters.eagle.config import BIAS_NAMES, LAYER_NAMES, HeadConfig  # noqa: F401 - re-exported


class EagleHead(TorchDrafter):
    def __init__(self, cfg: HeadConfig, frozen: Frozen) -> None:
        super().__init__(cfg, frozen)  # the target's LM-head rows of the draft vocab among them
        H, I, d = cfg.hidden_size, cfg.intermediate_size, cfg.head_dim
        self.fc = nn.Linear(2 * H, H, bias=True)
        self.q_proj = nn.Linear(H, cfg.num_attention_heads * d, bias=cfg.qkv_bias)
        self.k_proj = nn.Linear(H, cfg.num_key_value_heads * d, bias=cfg.qkv_bias)
        self.v_proj = nn.Linear(H, cfg.num_key_value_heads * d, bias=cfg.qkv_bias)
        self.o_proj = nn.Linear(cfg.num_attention_heads * d, H, bias=False)
        self.gate_proj = nn.Linear(H, I, bias=False)
        self.up_proj = nn.Linear(H, I, bias=False)
        self.down_proj = nn.Linear(I, H, bias=False)
        self.post_ln = nn.Parameter(torch.ones(H))
        self.input_ln = nn.Parameter(torch.ones(H)) if cfg.input_layernorm else None
        self.norm = nn.Parameter(torch.ones(H)) if cfg.final_norm else None

    def params(self) -> dict[str, torch.Tensor]:
        out = {
            "fc.weight": self.fc.weight,
            "fc.bias": self.fc.bias,
            "layers.0.post_attention_layernorm.weight": self.post_ln,
        }
        out |= {hf: getattr(self, attr).weight for attr, hf in LAYER_NAMES.items()}
        if self.cfg.qkv_bias:
            out |= {hf: getattr(self, attr).bias for attr, hf in BIAS_NAMES.items()}
        if self.input_ln is not None:
            out["layers.0.input_layernorm.weight"] = self.input_ln
        if self.norm is not None:
            out["norm.weight"] = self.norm
        return out

    # ---- pieces ----------------------------------------------------------------------------------

    def qkv(self, tokens: torch.Tensor, feats: torch.Tensor, pos: torch.Tensor):
        """Input rows -> (residual x, rotated q [B,L,Hq,D], k, v [B,L,Hkv,D])."""
        c = self.cfg
        x = self.fc(torch.cat([self.embed[tokens], feats], dim=-1))
        h = self._norm(x, self.input_ln) if self.input_ln is not None else x
        B, L, _ = x.shape
        q = self._rope(self.q_proj(h).view(B, L, c.num_attention_heads, c.head_dim), pos)
        k = self._rope(self.k_proj(h).view(B, L, c.num_key_value_heads, c.head_dim), pos)
        v = self.v_proj(h).view(B, L, c.num_key_value_heads, c.head_dim)
        return x, q, k, v

    def finish(self, x: torch.Tensor, ctx: torch.Tensor) -> torch.Tensor:
        """Attention context [B, L, Hq*D] -> the layer's output (predicted feature) [B, L, H]."""
        x = x + self.o_proj(ctx)
        h = self._norm(x, self.post_ln)
        x = x + self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h))
        return self._norm(x, self.norm) if self.norm is not None else x

    def logits(self, pred: torch.Tensor) -> torch.Tensor:
        return pred @ self.lm_head.T  # [.., Vd]

    def _expand(self, t: torch.Tensor) -> torch.Tensor:  # [B, L, Hkv, D] -> [B, Hq, L, D]
        rep = self.cfg.num_attention_heads // self.cfg.num_key_value_heads
        return t.repeat_interleave(rep, dim=2).transpose(1, 2)

    # ---- training forward: step 1 teacher-forced, step 2 on its own features ---------------------
    def forward(self, tokens, feats, pos, valid, n_steps: int = 2) -> list[torch.Tensor]:
        """tokens [B, L] (token_{j+1}), feats [B, L, H] (f_j), pos [B, L] (= j), valid [B, L] bool.
        Returns the predicted features of each step: step s row j predicts f_{j+s}."""
        B, L = tokens.shape
        scale = 1.0 / math.sqrt(self.cfg.head_dim)
        causal = torch.ones(L, L, dtype=torch.bool).tril()
        key_ok = causal[None, None] & valid[:, None, None, :]  # [B, 1, L, L]
        x, q, k, v = self.qkv(tokens, feats, pos)
        K, V = self._expand(k), self._expand(v)  # true rows, [B, Hq, L, D]
        ctx = F.scaled_dot_product_attention(q.transpose(1, 2), K, V, attn_mask=key_ok, scale=scale)
        pred = self.finish(x, ctx.transpose(1, 2).reshape(B, L, -1))
        preds = [pred]
        for s in range(1, n_steps):
            # row j: pair (f^_{j+s}, token_{j+s+1}) at position j+s; it sees the true rows
            # 0..j (EAGLE: the accepted context) and its own speculative chain j+1..j+s-1 is
            # approximated by itself only (2 steps: exact)
            nxt = torch.roll(tokens, -s, dims=1)
            xs, qs, ks, vs = self.qkv(nxt, preds[-1], pos + s)
            Qs = qs.transpose(1, 2)  # [B, Hq, L, D]
            s_true = (Qs @ K.transpose(-1, -2)) * scale  # [B, Hq, L, L]
            s_true = s_true.masked_fill(~key_ok, float("-inf"))  # true rows 0..j
            s_self = (Qs * self._expand(ks)).sum(-1, keepdim=True) * scale  # [B, Hq, L, 1]
            w = torch.softmax(torch.cat([s_true, s_self], dim=-1), dim=-1)
            ctx = w[..., :L] @ V + w[..., L:] * self._expand(vs)
            preds.append(self.finish(xs, ctx.transpose(1, 2).reshape(B, L, -1)))
        return preds


def build_head(
    hc: HeadConfig,
    arrays: dict[str, np.ndarray],
    embed: np.ndarray,
    lm_head: np.ndarray,
    rope_cos: np.ndarray,
    rope_sin: np.ndarray,
) -> EagleHead:
    """An EagleHead from checkpoint arrays and the target's embedding / LM head [V, H] / rope tables
    (a head with its own RoPE, hc.rope_theta, rotates by its own tables over as many positions)."""
    own = hc.rope_tables(len(rope_cos))
    if own is not None:
        rope_cos, rope_sin = own
    return EagleHead(hc, Frozen.of(arrays, embed, rope_cos, rope_sin, lm_head)).load(arrays)


def init_arrays(arch, sd: dict, d2t: np.ndarray, seed: int) -> tuple[HeadConfig, dict[str, np.ndarray]]:
    """A new head: decoder layer copied from the target's last layer; fc passes the feature through
    (identity on the feature half, small random on the embedding half)."""
    H = arch.hidden_size
    rng = np.random.default_rng(seed)
    last = f"model.layers.{arch.n_layers - 1}."
    hc = HeadConfig(
        **HeadShape.of_target(arch, len(d2t)),
        input_layernorm=True,
        final_norm=True,
        rope_theta=arch.rope_theta,
        rope_type=arch.rope_type,
        rope_params=arch.rope_params,
    )
    fc = np.concatenate([rng.normal(0, 0.02, (H, H)), np.eye(H)], axis=1).astype(np.float32)
    arrays = {
        "fc.weight": fc,
        "fc.bias": np.zeros(H, np.float32),
        "d2t": d2t,
        "layers.0.post_attention_layernorm.weight": sd[last + "post_attention_layernorm.weight"],
        "layers.0.input_layernorm.weight": sd[last + "input_layernorm.weight"],
        "norm.weight": sd["model.norm.weight"],
    }
    for hf in LAYER_NAMES.values():
        arrays[hf] = sd[last + hf.split("layers.0.", 1)[1]]
    return hc, arrays
