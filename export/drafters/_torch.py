"""What the drafters' PyTorch modules share (EAGLE, EAGLE-3, DFlash), for training and validation.

`TorchDrafter`: RMSNorm with the drafter's epsilon and the target's rotary tables; the target's
tensors it reads and never trains (`Frozen`: embedding, draft-vocabulary ids, rope tables, LM-head
rows) as buffers left out of its state_dict; its parameters under checkpoint names (`params`), to
numpy (`state`, what a checkpoint stores) and back (`load`). `HeadShape`: the fields of a one-layer
Llama head over a draft vocabulary (EAGLE, EAGLE-3), from the target (`of_target`), from a
checkpoint's config.json (`from_config`) and back into one (`llama_config`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from edgespec.export.drafters._shape import HeadShape, own_rope_tables  # noqa: F401 - re-exported


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
