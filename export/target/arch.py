"""Architecture numbers of the Llama family, read from a Hugging Face config (the families and
their own fields: families.py)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from edgespec.engines import rope
from edgespec.export.target.families import BY_MODEL_TYPE, MODEL_TYPES, UnsupportedModelError, rope_entry, rope_numbers

ROPE_TYPES = ("default", "llama3", "linear")
HF_SIZES = {  # an HF config's size keys -> the ArchSpec field of each
    "num_hidden_layers": "n_layers",
    "num_attention_heads": "n_heads",
    "num_key_value_heads": "n_kv_heads",
    "head_dim": "head_dim",
    "hidden_size": "hidden_size",
    "intermediate_size": "intermediate_size",
    "vocab_size": "vocab_size",
}


# A drafter head's layers are plain Llama layers whatever the target's family (dataclasses.replace
# an ArchSpec with these).
PLAIN_LAYERS = dict(
    embedding_multiplier=1.0,
    residual_multiplier=1.0,
    attention_multiplier=None,
    logits_scaling=1.0,
    nope_layers=(),
    norm_weight_offset=0.0,
    sandwich_norms=False,
    mlp_act="silu",
    sliding_layers=(),
    sliding_window=None,
    local_rope=(),
)


@dataclass(frozen=True)
class ArchSpec:
    model_type: str  # HF model_type ("llama", "qwen2", ...)
    n_layers: int  # decoder layers
    n_heads: int  # query heads
    n_kv_heads: int  # key/value heads (GQA when < n_heads)
    head_dim: int  # per-head width
    hidden_size: int  # residual stream width
    intermediate_size: int  # MLP inner width
    vocab_size: int  # LM head rows
    rms_norm_eps: float  # RMSNorm epsilon
    rope_theta: float  # RoPE base
    rope_type: str  # "default" | "llama3" | "linear"
    rope_params: tuple  # sorted (key, value) pairs of the scaling parameters
    tie_word_embeddings: bool  # LM head shares the embedding table
    qkv_bias: bool  # q/k/v projections carry a bias (Qwen2)
    qk_norm: bool  # per-head RMSNorm on q and k before RoPE (Qwen3)
    max_len: int  # positions the rope tables cover (the export's max context)
    embedding_multiplier: float = 1.0  # embedding rows times this (Granite)
    residual_multiplier: float = 1.0  # each sublayer's output times this before the residual add (Granite)
    attention_multiplier: float | None = None  # attention scores' scale (Granite); None: 1/sqrt(head_dim)
    logits_scaling: float = 1.0  # logits divided by this (Granite)
    nope_layers: tuple[int, ...] = ()  # layers whose q/k are not rotated (SmolLM3's NoPE layers)
    norm_weight_offset: float = 0.0  # added to every RMSNorm weight when stored (Gemma's x * (1 + w))
    sandwich_norms: bool = False  # each sublayer's output normed before the residual add (Gemma 3)
    mlp_act: str = "silu"  # the MLP gate's activation: "silu" | "gelu_tanh" (Gemma)
    sliding_layers: tuple[int, ...] = ()  # layers of the local kind (Gemma 3's sliding_attention): local_rope
    #                                       and the key window apply to them
    sliding_window: int | None = None  # a sliding layer's query at position p sees keys j with p - j < this;
    #                                    None: the window covers max_len (no mask of its own)
    local_rope: tuple = ()  # (theta, type, params) of the sliding layers' RoPE; (): the global one

    @property
    def attn_scale(self) -> float:
        """The factor of q.k in attention."""
        if self.attention_multiplier is not None:
            return float(self.attention_multiplier)
        return 1.0 / float(np.sqrt(self.head_dim))

    def rope_tables(self, local: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """cos, sin [max_len, head_dim] in HF's rotate_half layout (halves duplicated); local: the
        sliding layers' (local_rope)."""
        return rope.tables(self.max_len, self.head_dim, *self.rope_entry(local))

    def rope_entry(self, local: bool = False) -> tuple[float, str, dict]:
        """(theta, type, scaling numbers) of the global RoPE or (local) the sliding layers'."""
        theta, rope_type, params = (
            self.local_rope if local and self.local_rope else (self.rope_theta, self.rope_type, self.rope_params)
        )
        return theta, rope_type, dict(params)

    def rope_table(self, table: np.ndarray, part: str, half: bool, local: bool = False) -> np.ndarray:
        """A table of rope_tables() (cast, or its first half) marked as computed at load: the folder
        stores its parameters, not its bytes (engines/rope.py)."""
        return rope.computed(table, part, self.head_dim, half, *self.rope_entry(local))

    def to_manifest(self) -> dict:
        return {
            "model_type": self.model_type,
            "n_layers": self.n_layers,
            "n_heads": self.n_heads,
            "n_kv_heads": self.n_kv_heads,
            "head_dim": self.head_dim,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "vocab_size": self.vocab_size,
            "sliding_window": self.sliding_window,
        }


def hf_sizes(shape) -> dict:
    """The HF config size keys of `shape`: an ArchSpec, or anything naming its sizes as ArchSpec
    does (tools/synthetic_model.py's configs)."""
    return {hf: getattr(shape, ours) for hf, ours in HF_SIZES.items()}


def _rope_from_config(cfg) -> tuple[float, str, dict]:
    params = dict(getattr(cfg, "rope_parameters", None) or {})  # transformers >= 5
    scaling = getattr(cfg, "rope_scaling", None)  # transformers 4.x
    if scaling:
        params.update(scaling)
    return rope_entry(params, getattr(cfg, "rope_theta", 10000.0))


def _family(cfg):
    """The config's family (families.FAMILIES), its sizes present; refuses any other model_type."""
    mt = getattr(cfg, "model_type", None)
    if mt == "gemma3":
        raise UnsupportedModelError(
            "model_type 'gemma3' is the multimodal Gemma 3 (a vision tower and a text decoder under "
            "Gemma3ForConditionalGeneration); edgespec exports text-only checkpoints (model_type 'gemma3_text', "
            "e.g. Gemma 3 270M and 1B). Hint: save its language model alone as a Gemma3ForCausalLM "
            "checkpoint and export that"
        )
    if mt not in BY_MODEL_TYPE:
        raise UnsupportedModelError(
            f"model_type {mt!r} is not supported; edgespec exports {', '.join(MODEL_TYPES)} "
            "(Llama-family decoders). Hint: convert the model to one of these or open an issue."
        )
    missing = [
        k
        for k in ("num_hidden_layers", "num_attention_heads", "hidden_size", "intermediate_size", "vocab_size")
        if getattr(cfg, k, None) is None
    ]
    if missing:
        raise UnsupportedModelError(f"config of {mt!r} lacks {', '.join(missing)}")
    return BY_MODEL_TYPE[mt]


def _check_layers(cfg, fam, own: dict, rope_type: str, extra: dict, max_len: int) -> None:
    """The layer options the graphs do not compute, refused (own: the family's own fields, which
    check their activation and window themselves where they set them)."""
    act = getattr(cfg, "hidden_act", "silu")
    if act != "silu" and "mlp_act" not in own:
        raise UnsupportedModelError(f"hidden_act {act!r} is not supported (only 'silu' SwiGLU MLPs)")
    if getattr(cfg, "mlp_bias", False):
        raise UnsupportedModelError("mlp_bias=True is not supported (bias-free MLPs only)")
    if rope_type not in ROPE_TYPES:
        raise UnsupportedModelError(f"rope type {rope_type!r} is not supported (only {', '.join(ROPE_TYPES)})")
    window = getattr(cfg, "sliding_window", None)
    if window and getattr(cfg, "use_sliding_window", True) and max_len > window and "sliding_layers" not in own:
        raise UnsupportedModelError(
            f"sliding_window={window} is smaller than --max-len {max_len}; export with --max-len <= {window}"
        )
    if getattr(cfg, "attention_bias", False) and not fam.qkv_bias:
        raise UnsupportedModelError(f"attention_bias=True on {fam.model_type!r} (biased o_proj) is not supported")
    partial = float(extra.get("partial_rotary_factor", getattr(cfg, "partial_rotary_factor", 1.0)) or 1.0)
    if partial != 1.0:
        raise UnsupportedModelError(
            f"partial_rotary_factor={partial} is not supported (rotary over the whole head only); "
            "Hint: export a model with partial_rotary_factor=1.0"
        )


def arch_from_config(cfg, max_len: int) -> ArchSpec:
    """Read and check an HF config; refuse what the graph writer would get wrong."""
    fam = _family(cfg)
    own = fam.fields(cfg, max_len) if fam.fields else {}  # the family's own fields (families.py)
    n_heads = cfg.num_attention_heads
    n_kv = getattr(cfg, "num_key_value_heads", None) or n_heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // n_heads
    theta, rope_type, extra = own.pop("rope") if "rope" in own else _rope_from_config(cfg)
    _check_layers(cfg, fam, own, rope_type, extra, max_len)
    if n_heads % n_kv:
        raise UnsupportedModelError(f"num_attention_heads={n_heads} is not a multiple of num_key_value_heads={n_kv}")
    fields = dict(
        model_type=fam.model_type,
        n_layers=cfg.num_hidden_layers,
        n_heads=n_heads,
        n_kv_heads=n_kv,
        head_dim=head_dim,
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        vocab_size=cfg.vocab_size,
        rms_norm_eps=float(cfg.rms_norm_eps),
        rope_theta=theta,
        rope_type=rope_type,
        rope_params=rope_numbers(extra),
        tie_word_embeddings=bool(getattr(cfg, "tie_word_embeddings", False)),
        qkv_bias=fam.qkv_bias,
        qk_norm=fam.qk_norm,
        max_len=max_len,
    )
    return ArchSpec(**(fields | own))
