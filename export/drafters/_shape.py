"""The shape of a one-layer Llama head over a draft vocabulary (EAGLE, EAGLE-3): `HeadShape`, its
fields from the target, a checkpoint's config.json and back, and a head's own RoPE tables. No torch:
the checks before the target loads read heads' configs into these (_torch.py re-exports them).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

# HeadShape's field -> the target's ArchSpec field of the same quantity (a new head takes the target's)
ARCH_NAMES = {
    "hidden_size": "hidden_size",
    "intermediate_size": "intermediate_size",
    "num_attention_heads": "n_heads",
    "num_key_value_heads": "n_kv_heads",
    "head_dim": "head_dim",
    "rms_norm_eps": "rms_norm_eps",
    "vocab_size": "vocab_size",
}


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
        return {ours: getattr(arch, theirs) for ours, theirs in ARCH_NAMES.items()} | {"draft_vocab_size": draft_vocab}

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
        **{theirs: getattr(c, ours) for ours, theirs in ARCH_NAMES.items()},
        rope_theta=c.rope_theta,
        rope_type=c.rope_type,
        rope_params=c.rope_params,
        tie_word_embeddings=False,
        qkv_bias=False,  # the tables do not depend on it
        qk_norm=False,
        max_len=n_pos,
    ).rope_tables()
