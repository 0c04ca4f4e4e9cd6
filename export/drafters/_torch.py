"""What the drafters' PyTorch modules share (EAGLE, EAGLE-3, DFlash), for training and validation.

`TorchDrafter`: RMSNorm with the drafter's epsilon and the target's rotary tables; the target's
tensors it reads and never trains (`Frozen`: embedding, draft-vocabulary ids, rope tables, LM-head
rows) as buffers left out of its state_dict; its parameters under checkpoint names (`params`), to
numpy (`state`, what a checkpoint stores) and back (`load`). `HeadShape`: the fields of a one-layer
Llama head over a draft vocabulary (EAGLE, EAGLE-3), from the target (`of_target`), from a
checkpoint's config.json (`from_config`) and back into one (`llama_config`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn


def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rope(x: torch.Tensor, pos: torch.Tensor, cos_table: torch.Tensor, sin_table: torch.Tensor) -> torch.Tensor:
    """x [B, L, heads, D] rotated by positions pos [B, L] (HF rotate_half convention, the target's)."""
    cos, sin = cos_table[pos].unsqueeze(2), sin_table[pos].unsqueeze(2)
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin


@dataclass(frozen=True)
class Frozen:
    """The target's tensors a drafter reads and never trains."""

    embed: torch.Tensor  # [V, H] token embedding
    d2t: torch.Tensor  # [Vd] draft id -> target id
    rope_cos: torch.Tensor  # [max_pos, D]
    rope_sin: torch.Tensor  # [max_pos, D]
    lm_head: torch.Tensor | None = None  # [Vd, H] the LM head's rows of the draft tokens (a drafter that reads them)

    @classmethod
    def of(cls, arrays: dict, embed: np.ndarray, rope_cos: np.ndarray, rope_sin: np.ndarray, lm_head=None) -> Frozen:
        """From checkpoint arrays (their d2t) and the target's tables (lm_head [V, H]: gathered by d2t)."""
        d2t = torch.from_numpy(arrays["d2t"])
        rows = None if lm_head is None else torch.from_numpy(lm_head)[d2t].clone()
        return cls(torch.from_numpy(embed), d2t, torch.from_numpy(rope_cos), torch.from_numpy(rope_sin), rows)


class TorchDrafter(nn.Module):
    """A drafter module with a config `cfg` (rms_norm_eps among its fields) and the target's `Frozen`
    tensors as buffers left out of its state_dict; the subclass lists its parameters under their
    checkpoint names in `params`."""

    def __init__(self, cfg, frozen: Frozen) -> None:
        super().__init__()
        self.cfg = cfg
        self.register_buffer("embed", frozen.embed, persistent=False)
        if frozen.lm_head is not None:
            self.register_buffer("lm_head", frozen.lm_head, persistent=False)
        self.register_buffer("d2t", frozen.d2t, persistent=False)
        self.register_buffer("rope_cos", frozen.rope_cos, persistent=False)
        self.register_buffer("rope_sin", frozen.rope_sin, persistent=False)

    def _norm(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, w, self.cfg.rms_norm_eps)

    def _rope(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        return rope(x, pos, self.rope_cos, self.rope_sin)

    def params(self) -> dict[str, torch.Tensor]:
        """Its own (trained) parameters under their checkpoint names."""
        raise NotImplementedError

    def state(self) -> dict[str, np.ndarray]:
        """Its parameters under checkpoint names (float32 numpy) + d2t (absolute target ids): what
        `load` takes back and a checkpoint stores."""
        arrays = {k: v.detach().float().cpu().numpy() for k, v in self.params().items()}
        return arrays | {"d2t": self.d2t.cpu().numpy().astype(np.int64)}

    def load(self, arrays: dict[str, np.ndarray]) -> TorchDrafter:
        """Its parameters copied from checkpoint arrays (float32, by checkpoint name); returns itself."""
        with torch.no_grad():
            for name, t in self.params().items():
                t.copy_(torch.from_numpy(arrays[name]))
        return self


@dataclass(frozen=True)
class HeadShape:
    """A one-layer Llama head over a draft vocabulary; a head kind's config adds its own fields."""

    hidden_size: int  # H: the target's hidden size
    intermediate_size: int  # MLP width of the head's decoder layer
    num_attention_heads: int  # query heads
    num_key_value_heads: int  # key/value heads (GQA)
    head_dim: int  # per-head width
    rms_norm_eps: float  # RMSNorm epsilon
    vocab_size: int  # target vocabulary
    draft_vocab_size: int  # tokens the head can propose (<= vocab_size; the most frequent ones)

    @staticmethod
    def of_target(arch, draft_vocab: int) -> dict:
        """The fields of a new head with the target's layer shapes (arch: its ArchSpec)."""
        return dict(
            hidden_size=arch.hidden_size,
            intermediate_size=arch.intermediate_size,
            num_attention_heads=arch.n_heads,
            num_key_value_heads=arch.n_kv_heads,
            head_dim=arch.head_dim,
            rms_norm_eps=arch.rms_norm_eps,
            vocab_size=arch.vocab_size,
            draft_vocab_size=draft_vocab,
        )

    @staticmethod
    def from_config(cfg: dict, vocab_size: int) -> dict:
        """The fields a checkpoint's config.json states (LlamaConfig names; absent: Llama's defaults)."""
        H, n_h = int(cfg["hidden_size"]), int(cfg["num_attention_heads"])
        return dict(
            hidden_size=H,
            intermediate_size=int(cfg["intermediate_size"]),
            num_attention_heads=n_h,
            num_key_value_heads=int(cfg.get("num_key_value_heads", n_h)),
            head_dim=int(cfg.get("head_dim") or H // n_h),
            rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-5)),
            vocab_size=vocab_size,
            draft_vocab_size=int(cfg.get("draft_vocab_size") or vocab_size),
        )

    def llama_config(self) -> dict:
        """config.json's LlamaConfig fields of the head (one layer), in the order loaders print them."""
        shape = {f.name: getattr(self, f.name) for f in dataclasses.fields(HeadShape)}
        return {"model_type": "llama", "num_hidden_layers": 1} | shape


def own_rope_tables(c, n_pos: int) -> tuple[np.ndarray, np.ndarray]:
    """A head's own RoPE tables cos, sin [n_pos, head_dim] by ArchSpec's formula: c is a head config
    (HeadShape fields plus rope_theta, rope_type, rope_params), never the target's."""
    from edgespec.export.target.arch import ArchSpec

    return ArchSpec(
        model_type="llama",
        n_layers=1,
        n_heads=c.num_attention_heads,
        n_kv_heads=c.num_key_value_heads,
        head_dim=c.head_dim,
        hidden_size=c.hidden_size,
        intermediate_size=c.intermediate_size,
        vocab_size=c.vocab_size,
        rms_norm_eps=c.rms_norm_eps,
        rope_theta=c.rope_theta,
        rope_type=c.rope_type,
        rope_params=c.rope_params,
        tie_word_embeddings=False,
        qkv_bias=False,  # the tables do not depend on it
        qk_norm=False,
        max_len=n_pos,
    ).rope_tables()
