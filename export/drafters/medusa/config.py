"""Medusa heads' configuration (`MedusaConfig`) and parameter names, without torch: the checks
before the target loads read heads into these; head.py builds the module from them.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class MedusaConfig:
    hidden_size: int  # H: the target's hidden size
    vocab_size: int  # target vocabulary
    draft_vocab_size: int  # tokens the heads can propose (<= vocab_size; the most frequent ones)
    n_heads: int = 4  # K: head i predicts the token i + 2 places past the feature's position
    n_layers: int = 1  # residual SiLU blocks per head (0: the LM head on the feature itself)
    own_lm_heads: bool = False  # each head has its own LM head ("{i}.lm_head" [V, H], Medusa's published
    #                             heads); False: every head uses the target's rows


def param_names(mc: MedusaConfig) -> list[str]:
    """Every parameter's checkpoint name, head by head, block by block (weight, bias)."""
    return [f"{i}.{j}.linear.{p}" for i in range(mc.n_heads) for j in range(mc.n_layers) for p in ("weight", "bias")]
