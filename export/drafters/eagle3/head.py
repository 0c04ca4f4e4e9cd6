"""EAGLE-3 head: the module (torch) and its checkpoint in the public Hugging Face EAGLE-3 layout.

The head drafts from the target's multi-layer features: a = [low ; mid ; high] [3H], the residual
stream entering layers `spec.aux_layers(L)` (the target graphs' `hidden_aux`). For the pair at
position j (token_{j+1} follows position j):
    step 1:  g_j = fc(a_j)                                   # [3H] -> [H], no bias
    later:   g   = the head's own output of the step before (pre-norm), fed back
    u = [input_layernorm(embed(token_{j+1})) ; hidden_norm(g)]   # [2H]: q/k/v read both
    x = g + o_proj(attention(u))                              # residual on g
    x = x + mlp(post_attention_layernorm(x))                  # the head's output (fed back)
    logits = norm(x) . lm_head^T                              # [Vd] predicts token_{j+2}
The embedding is the target's (frozen, not stored); lm_head [Vd, H] is the head's own, started from
the target's LM-head rows of the draft vocabulary and trained (as EAGLE-3 does). Unlike EAGLE-1 there
is no feature regression: only the tokens count.

Published heads add variants (Eagle3Config; export/drafters/eagle3/layouts.py reads each project's
layout): an RMSNorm of the aux features before fc (`fc_norm`: per target layer, or over the whole
concatenation), fc over the target's width when the head is narrower (`target_hidden_size`, the
head's own embedding table then), the attention's residual taken after hidden_norm
(`norm_before_residual`), logits without the final norm (`logits_norm` False) or the normed output
fed back (`feed_normed`), and the head's own RoPE (theta and scaling from its config: the tables
are built from it, never copied from the target's).

Checkpoint (`save_eagle3` / `read_eagle3`): config.json of a LlamaConfig with
architectures ["LlamaForCausalLMEagle3"], num_hidden_layers 1, draft_vocab_size and
eagle_config.eagle_aux_hidden_state_layer_ids; model.safetensors with fc.weight [H, 3H],
midlayer.{input_layernorm,hidden_norm,post_attention_layernorm}.weight,
midlayer.self_attn.{q,k,v}_proj.weight [*, 2H], midlayer.self_attn.o_proj.weight,
midlayer.mlp.{gate,up,down}_proj.weight, norm.weight, lm_head.weight [Vd, H], d2t [Vd] int64
(target id = i + d2t[i]) and t2d [V] bool: what vLLM and SGLang load.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from edgespec.export.drafters._torch import Frozen, HeadShape, TorchDrafter, own_rope_tables, rms_norm
from edgespec.export.drafters.eagle3.config import (  # noqa: F401 - re-exported
    ARCHITECTURE,
    FC_NORMS,
    LAYER_NAMES,
    NORM_NAMES,
    PLAIN,
    VARIANTS,
    Eagle3Config,
    Eagle3FormatError,
)
from edgespec.export.train.checkpoint import write_checkpoint


class Eagle3Head(TorchDrafter):
    def __init__(self, cfg: Eagle3Config, frozen: Frozen) -> None:
        super().__init__(cfg, frozen)
        H, I, d = cfg.hidden_size, cfg.intermediate_size, cfg.head_dim
        self.fc = nn.Linear(cfg.aux_width, H, bias=False)
        # the features' RMSNorm weight before fc (fc_norm "none": absent)
        self.fc_ln = nn.Parameter(torch.ones(cfg.aux_width)) if cfg.fc_norm != "none" else None
        self.q_proj = nn.Linear(2 * H, cfg.num_attention_heads * d, bias=False)
        self.k_proj = nn.Linear(2 * H, cfg.num_key_value_heads * d, bias=False)
        self.v_proj = nn.Linear(2 * H, cfg.num_key_value_heads * d, bias=False)
        self.o_proj = nn.Linear(cfg.num_attention_heads * d, H, bias=False)
        self.gate_proj = nn.Linear(H, I, bias=False)
        self.up_proj = nn.Linear(H, I, bias=False)
        self.down_proj = nn.Linear(I, H, bias=False)
        self.input_ln = nn.Parameter(torch.ones(H))
        self.hidden_ln = nn.Parameter(torch.ones(H))
        self.post_ln = nn.Parameter(torch.ones(H))
        self.norm = nn.Parameter(torch.ones(H))
        self.lm_head = nn.Parameter(torch.zeros(cfg.draft_vocab_size, H))  # its own

    def params(self) -> dict[str, torch.Tensor]:
        out = {"fc.weight": self.fc.weight, "lm_head.weight": self.lm_head}
        if self.fc_ln is not None:
            out["fc_norm.weight"] = self.fc_ln
        out |= {hf: getattr(self, attr).weight for attr, hf in LAYER_NAMES.items()}
        return out | {hf: getattr(self, attr) for attr, hf in NORM_NAMES.items()}

    # ---- pieces ----------------------------------------------------------------------------------
    def features(self, aux: torch.Tensor) -> torch.Tensor:
        """The target's aux rows [.., n*Ht] -> g [.., H]: fc, after the features' norm when the head has one."""
        c = self.cfg
        if c.fc_norm == "per_layer":  # each target layer's block normed on its own (eps: the head's)
            blocks = aux.unflatten(-1, (c.n_blocks, c.feature_width))
            aux = rms_norm(blocks, self.fc_ln.view(c.n_blocks, c.feature_width), c.rms_norm_eps).flatten(-2)
        elif c.fc_norm == "whole":
            aux = self._norm(aux, self.fc_ln)
        return self.fc(aux)

    def fed(self, out: torch.Tensor) -> torch.Tensor:
        """What the next draft step is fed of a step's output (its hidden input)."""
        return self._norm(out, self.norm) if self.cfg.feed_normed else out

    def qkv(self, tokens: torch.Tensor, hidden: torch.Tensor, pos: torch.Tensor):
        """Input rows (token_{j+1}, g_j) -> rotated q [B,L,Hq,D], k, v [B,L,Hkv,D]."""
        c = self.cfg
        u = torch.cat([self._norm(self.embed[tokens], self.input_ln), self._norm(hidden, self.hidden_ln)], dim=-1)
        B, L, _ = u.shape
        q = self._rope(self.q_proj(u).view(B, L, c.num_attention_heads, c.head_dim), pos)
        k = self._rope(self.k_proj(u).view(B, L, c.num_key_value_heads, c.head_dim), pos)
        v = self.v_proj(u).view(B, L, c.num_key_value_heads, c.head_dim)
        return q, k, v

    def finish(self, hidden: torch.Tensor, ctx: torch.Tensor) -> torch.Tensor:
        """Attention context [B, L, Hq*D] -> the layer's output [B, L, H] (pre-norm; `fed` says what is fed back)."""
        residual = self._norm(hidden, self.hidden_ln) if self.cfg.norm_before_residual else hidden
        x = residual + self.o_proj(ctx)
        h = self._norm(x, self.post_ln)
        return x + self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h))

    def logits(self, out: torch.Tensor) -> torch.Tensor:
        x = self._norm(out, self.norm) if self.cfg.logits_norm else out
        return x @ self.lm_head.T  # [.., Vd]

    def _expand(self, t: torch.Tensor) -> torch.Tensor:  # [B, L, Hkv, D] -> [B, Hq, L, D]
        rep = self.cfg.num_attention_heads // self.cfg.num_key_value_heads
        return t.repeat_interleave(rep, dim=2).transpose(1, 2)

    # ---- training forward: training-time test over n_steps unrolled draft steps -------------------
    def forward(self, tokens, aux, pos, valid, n_steps: int = 3) -> list[torch.Tensor]:
        """tokens [B, L] (token_{j+1}), aux [B, L, 3H] (a_j), pos [B, L] (= j), valid [B, L] bool.
        Returns each step's output [B, L, H]: step s row j drafts token_{j+s+1}, having been fed
        token_{j+s} and (s > 1) its own output of step s-1. As in drafting, row j of step s sees the
        true rows 0..j (step 1's keys) and its own chain's rows of steps 2..s (one key each)."""
        B, L = tokens.shape
        scale = 1.0 / math.sqrt(self.cfg.head_dim)
        causal = torch.ones(L, L, dtype=torch.bool, device=tokens.device).tril()
        key_ok = causal[None, None] & valid[:, None, None, :]  # [B, 1, L, L]
        hidden = self.features(aux)
        q, k, v = self.qkv(tokens, hidden, pos)
        K, V = self._expand(k), self._expand(v)  # true rows, [B, Hq, L, D]
        ctx = F.scaled_dot_product_attention(q.transpose(1, 2), K, V, attn_mask=key_ok, scale=scale)
        outs = [self.finish(hidden, ctx.transpose(1, 2).reshape(B, L, -1))]
        chain_k, chain_v = [], []  # the chain's own keys/values of steps 2.. (one per row)
        for s in range(1, n_steps):
            hidden = self.fed(outs[-1])
            qs, ks, vs = self.qkv(torch.roll(tokens, -s, dims=1), hidden, pos + s)
            chain_k.append(self._expand(ks))
            chain_v.append(self._expand(vs))
            Qs = qs.transpose(1, 2)  # [B, Hq, L, D]
            s_true = ((Qs @ K.transpose(-1, -2)) * scale).masked_fill(~key_ok, float("-inf"))  # [B, Hq, L, L]
            s_own = [(Qs * kc).sum(-1, keepdim=True) * scale for kc in chain_k]  # each [B, Hq, L, 1]
            w = torch.softmax(torch.cat([s_true, *s_own], dim=-1), dim=-1)
            ctx = w[..., :L] @ V
            for t, vc in enumerate(chain_v):
                ctx = ctx + w[..., L + t : L + t + 1] * vc
            outs.append(self.finish(hidden, ctx.transpose(1, 2).reshape(B, L, -1)))
        return outs


# ---- checkpoint --------------------------------------------------------------------------------------
def config_json(c: Eagle3Config, extra: dict | None = None) -> dict:
    """config.json as EAGLE-3 loaders read it; `extra` joins the edgespec-only `eagle3` section (whose
    `features` says the layer ids are those of the streams ENTERING the layers: layouts.py)."""
    rope = {"rope_scaling": {"rope_type": c.rope_type, **dict(c.rope_params)}} if c.rope_type != "default" else {}
    return {
        "architectures": [ARCHITECTURE],
        **c.llama_config(),
        "rope_theta": c.rope_theta,
        **rope,
        "hidden_act": "silu",
        "tie_word_embeddings": False,
        "torch_dtype": "float16",
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": list(c.aux_layers), "use_aux_hidden_state": True},
        "eagle3": {"features": "residual stream entering the aux layers"}
        | ({"d2t_order": "frequency"} if c.d2t_by_frequency else {})
        | (extra or {}),
    }


def save_eagle3(head: Eagle3Head, folder: str | Path, extra: dict | None = None) -> Path:
    """config.json + model.safetensors (float16 weights, d2t relative int64 even over the whole
    vocabulary, t2d bool: what EAGLE-3 loaders read)."""
    c = head.cfg
    variants = [name for name in VARIANTS if getattr(c, name) != getattr(PLAIN, name)]
    if variants or not c.aux_layers:
        raise Eagle3FormatError(
            f"edgespec's own EAGLE-3 layout carries neither {', '.join(variants) or 'unresolved aux layers'} of this "
            f"head ({c.layout}); Hint: fine-tune it for a target (its aux layers resolved) without these variants, or "
            "keep it in its published layout"
        )
    arrays = head.state()
    t2d = np.zeros(head.cfg.vocab_size, bool)
    t2d[arrays["d2t"]] = True
    return write_checkpoint(folder, arrays | {"t2d": t2d}, config_json(head.cfg, extra), d2t="always")


def is_eagle3_folder(folder: str | Path) -> bool:
    """Is the folder an EAGLE-3 head in a layout edgespec reads (from its config.json and tensor names)?"""
    from edgespec.export.drafters.eagle3.layouts import detect

    return detect(Path(folder)) is not None


def read_eagle3(
    folder: str | Path, hidden_size: int, vocab_size: int, n_layers: int | None = None
) -> tuple[Eagle3Config, dict[str, np.ndarray], dict]:
    """Read and check an EAGLE-3 head (any layout: layouts.py) against the target's sizes: (config,
    float32 arrays under edgespec's names + d2t absolute, config.json's `eagle3` training record).
    n_layers: the target's depth, to resolve and check the aux layers the head reads."""
    from edgespec.export.drafters.eagle3.layouts import read

    return read(Path(folder), hidden_size, vocab_size, n_layers)


def rope_tables(ec: Eagle3Config, max_len: int) -> tuple[np.ndarray, np.ndarray]:
    """The head's own RoPE tables cos, sin [max_len, head_dim] (its theta and scaling, never the target's)."""
    return own_rope_tables(ec, max_len)


def build_eagle3(
    ec: Eagle3Config, arrays: dict[str, np.ndarray], embed: np.ndarray, rope_cos: np.ndarray, rope_sin: np.ndarray
) -> Eagle3Head:
    """An Eagle3Head from checkpoint arrays and the target's embedding [V, H] (a head with its own
    table, ec.own_embed, reads arrays["embed_tokens.weight"] instead) and the rope tables to use."""
    if ec.own_embed:
        embed = arrays["embed_tokens.weight"]
    return Eagle3Head(ec, Frozen.of(arrays, embed, rope_cos, rope_sin)).load(arrays)


def init_arrays(
    arch, sd: dict, lm_head: np.ndarray, d2t: np.ndarray, seed: int
) -> tuple[Eagle3Config, dict[str, np.ndarray]]:
    """A new head. fc passes the highest aux layer's stream through (identity on that block, small
    random on the others); the midlayer starts as the target's layer that stream enters (its q/k/v
    on the hidden half, small random on the embedding half); norm and lm_head are the target's final
    norm and LM-head rows (lm_head [V, H]: the target's) of the draft vocabulary."""
    from edgespec.export.target.spec import aux_layers

    H = arch.hidden_size
    rng = np.random.default_rng(seed)
    layers = aux_layers(arch.n_layers)
    src = f"model.layers.{layers[-1]}."
    ec = Eagle3Config(
        **HeadShape.of_target(arch, len(d2t)),
        aux_layers=layers,
        rope_theta=arch.rope_theta,
        rope_type=arch.rope_type,
        rope_params=arch.rope_params,
    )
    blocks = [rng.normal(0, 0.02, (H, H)) for _ in layers[:-1]] + [np.eye(H)]
    arrays = {
        "fc.weight": np.concatenate(blocks, axis=1).astype(np.float32),
        "d2t": d2t,
        "lm_head.weight": lm_head[d2t].astype(np.float32),
        "norm.weight": sd["model.norm.weight"],
        "midlayer.input_layernorm.weight": np.ones(H, np.float32),
        "midlayer.hidden_norm.weight": sd[src + "input_layernorm.weight"],
        "midlayer.post_attention_layernorm.weight": sd[src + "post_attention_layernorm.weight"],
    }
    for hf in LAYER_NAMES.values():
        wt = sd[src + hf.split("midlayer.", 1)[1]]
        if hf.split(".")[-2] in ("q_proj", "k_proj", "v_proj"):  # [out, H] -> [out, 2H]: [embed ; hidden]
            wt = np.concatenate([rng.normal(0, 0.02, wt.shape), wt], axis=1)
        arrays[hf] = wt.astype(np.float32)
    return ec, arrays
