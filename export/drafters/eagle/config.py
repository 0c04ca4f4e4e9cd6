"""The EAGLE-1 head's configuration (`HeadConfig`) and checkpoint names, without torch: the checks
before the target loads (checkpoint.py) read heads into these; head.py builds the module from them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from edgespec.export.drafters._shape import HeadShape

# EagleHead attribute -> checkpoint name of the decoder layer's projections
LAYER_NAMES = {
    "q_proj": "layers.0.self_attn.q_proj.weight",
    "k_proj": "layers.0.self_attn.k_proj.weight",
    "v_proj": "layers.0.self_attn.v_proj.weight",
    "o_proj": "layers.0.self_attn.o_proj.weight",
    "gate_proj": "layers.0.mlp.gate_proj.weight",
    "up_proj": "layers.0.mlp.up_proj.weight",
    "down_proj": "layers.0.mlp.down_proj.weight",
}
# EagleHead attribute -> checkpoint name of the q/k/v biases (HeadConfig.qkv_bias)
BIAS_NAMES = {
    "q_proj": "layers.0.self_attn.q_proj.bias",
    "k_proj": "layers.0.self_attn.k_proj.bias",
    "v_proj": "layers.0.self_attn.v_proj.bias",
}


@dataclass(frozen=True)
class HeadConfig(HeadShape):
    input_layernorm: bool = False  # EAGLE-1 heads have none; True keeps a norm before attention
    final_norm: bool = False  # RMSNorm on the output (EAGLE-3's `norm`): predictions on the scale of
    #                           the target's post-norm features from the first step of training
    d2t_by_frequency: bool = False  # d2t lists the draft tokens most frequent first (heads trained here),
    #                                 so any prefix of it is a smaller draft vocabulary (prune_draft_vocab)
    qkv_bias: bool = False  # q/k/v projections carry biases (EAGLE's heads for Qwen2 targets: `qkv_bias`)
    fc_bias: bool = True  # fc has a bias (config `bias`; EAGLE-LLaMA3 heads have none: fc.bias stays zero)
    rope_theta: float | None = None  # the head's own RoPE base; None: its target's (heads trained here
    #                                  before config.json recorded it were trained on the target's tables)
    rope_type: str = "default"  # "default" | "linear" | "llama3" (ArchSpec's), with rope_params
    rope_params: tuple = ()  # sorted (key, value) pairs of the scaling parameters (linear: factor)

    def rope_tables(self, n_pos: int) -> tuple[np.ndarray, np.ndarray] | None:
        """The head's own cos, sin [n_pos, head_dim] (ArchSpec's formula); None: it uses its target's."""
        if self.rope_theta is None:
            return None
        from edgespec.export.drafters._shape import own_rope_tables

        return own_rope_tables(self, n_pos)
