"""The EAGLE-3 head's configuration (`Eagle3Config`) and checkpoint names, without torch: the checks
before the target loads (layouts.py) read heads into these; head.py builds the module from them.
"""

from __future__ import annotations

from dataclasses import dataclass

from edgespec.export.drafters._shape import HeadShape
from edgespec.export.train.checkpoint import CheckpointError

ARCHITECTURE = "LlamaForCausalLMEagle3"
# Eagle3Head attribute -> checkpoint name of the midlayer's weights
LAYER_NAMES = {
    "q_proj": "midlayer.self_attn.q_proj.weight",
    "k_proj": "midlayer.self_attn.k_proj.weight",
    "v_proj": "midlayer.self_attn.v_proj.weight",
    "o_proj": "midlayer.self_attn.o_proj.weight",
    "gate_proj": "midlayer.mlp.gate_proj.weight",
    "up_proj": "midlayer.mlp.up_proj.weight",
    "down_proj": "midlayer.mlp.down_proj.weight",
}
NORM_NAMES = {
    "input_ln": "midlayer.input_layernorm.weight",
    "hidden_ln": "midlayer.hidden_norm.weight",
    "post_ln": "midlayer.post_attention_layernorm.weight",
    "norm": "norm.weight",
}


class Eagle3FormatError(CheckpointError):
    """An EAGLE-3 head checkpoint that is not in the EAGLE-3 layout or does not fit the target."""


# what Eagle3Config.fc_norm may say: no norm before fc, one RMSNorm per aux block (SpecForge's and
# speculators' fc_norm), one over the whole concatenation (speculators' norm_before_fc)
FC_NORMS = ("none", "per_layer", "whole")


@dataclass(frozen=True)
class Eagle3Config(HeadShape):
    aux_layers: tuple[int, ...]  # target layers whose ENTERING residual streams fc fuses (low, mid, high), in
    #                              GraphOptions.aux_layers' convention; (): EAGLE-3's default for the target
    #                              (spec.aux_layers), resolved once its depth is known (layouts.resolve_aux)
    rope_theta: float = 10000.0  # the head's own RoPE base (its tables are built from it, not the target's)
    d2t_by_frequency: bool = False  # d2t lists the draft tokens most frequent first (heads trained here)
    rope_type: str = "default"  # the head's RoPE scaling: "default" | "linear" | "llama3" (ArchSpec's)
    rope_params: tuple = ()  # sorted (key, value) pairs of its scaling parameters (ArchSpec.rope_params)
    n_aux: int = 0  # feature blocks fc reads; 0: len(aux_layers)
    target_hidden_size: int = 0  # width of each feature block (the target's hidden size); 0: hidden_size
    fc_norm: str = "none"  # RMSNorm of the features before fc (FC_NORMS); its weight: checkpoint fc_norm.weight
    norm_before_residual: bool = False  # the attention's residual is hidden_norm(g), not g (speculators)
    logits_norm: bool = True  # logits = lm_head(norm(x)); False: lm_head(x) (SpecForge norm_output false)
    feed_normed: bool = False  # the output fed back to the next step is norm(x), not x (speculators norm_output)
    own_embed: bool = False  # tokens embedded by the head's own table (embed_tokens.weight [V, H]), not the target's
    layout: str = "eagle3-edgespec"  # the checkpoint layout it was read from (layouts.LAYOUTS)
    sliding_window: int = 0  # the layer's key window as its config states (a query at p sees keys j with
    #                          p - j < this); 0: none. Exported only where it spans --max-len (full attention)

    @property
    def feature_width(self) -> int:
        """The width of one feature block: the target's hidden size."""
        return self.target_hidden_size or self.hidden_size

    @property
    def n_blocks(self) -> int:
        return self.n_aux or len(self.aux_layers)

    @property
    def aux_width(self) -> int:
        return self.n_blocks * self.feature_width


# the variant fields of Eagle3Config (their values in an EAGLE-3 head of the paper's plain form: PLAIN)
VARIANTS = ("fc_norm", "norm_before_residual", "logits_norm", "feed_normed", "own_embed", "target_hidden_size")
PLAIN = Eagle3Config(0, 0, 0, 0, 0, 0.0, 0, 0, aux_layers=())
