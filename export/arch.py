"""Architecture numbers of the Llama family, read from a Hugging Face config."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

SUPPORTED = ("llama", "mistral", "qwen2", "qwen3", "granite", "phi3", "smollm3")
ROPE_TYPES = ("default", "llama3", "linear")


# A drafter head's layers are plain Llama layers whatever the target's family (dataclasses.replace
# an ArchSpec with these).
PLAIN_LAYERS = dict(
    embedding_multiplier=1.0, residual_multiplier=1.0, attention_multiplier=None, logits_scaling=1.0, nope_layers=()
)


class UnsupportedModelError(ValueError):
    """The model is outside what the graph writer knows how to build."""


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

    @property
    def attn_scale(self) -> float:
        """The factor of q.k in attention."""
        if self.attention_multiplier is not None:
            return float(self.attention_multiplier)
        return 1.0 / float(np.sqrt(self.head_dim))

    def rope_tables(self) -> tuple[np.ndarray, np.ndarray]:
        """cos, sin [max_len, head_dim] in HF's rotate_half layout (halves duplicated)."""
        d = self.head_dim
        inv_freq = 1.0 / (self.rope_theta ** (np.arange(0, d, 2, dtype=np.float64) / d))
        params = dict(self.rope_params)
        if self.rope_type == "linear":
            inv_freq = inv_freq / params["factor"]
        elif self.rope_type == "llama3":
            factor, lo, hi = params["factor"], params["low_freq_factor"], params["high_freq_factor"]
            old_len = params["original_max_position_embeddings"]
            wavelen = 2 * math.pi / inv_freq
            scaled = np.where(wavelen > old_len / lo, inv_freq / factor, inv_freq)
            smooth = (old_len / wavelen - lo) / (hi - lo)
            smoothed = (1 - smooth) * scaled / factor + smooth * scaled
            medium = (wavelen >= old_len / hi) & (wavelen <= old_len / lo)
            inv_freq = np.where(medium, smoothed, scaled)
        freqs = np.outer(np.arange(self.max_len, dtype=np.float64), inv_freq)  # [max_len, D/2]
        emb = np.concatenate([freqs, freqs], axis=-1)
        return np.cos(emb).astype(np.float32), np.sin(emb).astype(np.float32)

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
        }


def _rope_from_config(cfg) -> tuple[float, str, dict]:
    params = dict(getattr(cfg, "rope_parameters", None) or {})  # transformers >= 5
    scaling = getattr(cfg, "rope_scaling", None)  # transformers 4.x
    if scaling:
        params.update(scaling)
    theta = float(params.get("rope_theta", getattr(cfg, "rope_theta", 10000.0)))
    rope_type = params.get("rope_type", params.get("type", "default")) or "default"
    extra = {k: v for k, v in params.items() if k not in ("rope_theta", "rope_type", "type")}
    return theta, rope_type, extra


def arch_from_config(cfg, max_len: int) -> ArchSpec:
    """Read and check an HF config; refuse what the graph writer would get wrong."""
    mt = getattr(cfg, "model_type", None)
    if mt not in SUPPORTED:
        raise UnsupportedModelError(
            f"model_type {mt!r} is not supported; edgespec exports {', '.join(SUPPORTED)} "
            "(Llama-family decoders). Hint: convert the model to one of these or open an issue."
        )
    missing = [
        k
        for k in ("num_hidden_layers", "num_attention_heads", "hidden_size", "intermediate_size", "vocab_size")
        if getattr(cfg, k, None) is None
    ]
    if missing:
        raise UnsupportedModelError(f"config of {mt!r} lacks {', '.join(missing)}")
    act = getattr(cfg, "hidden_act", "silu")
    if act != "silu":
        raise UnsupportedModelError(f"hidden_act {act!r} is not supported (only 'silu' SwiGLU MLPs)")
    if getattr(cfg, "mlp_bias", False):
        raise UnsupportedModelError("mlp_bias=True is not supported (bias-free MLPs only)")
    n_heads = cfg.num_attention_heads
    n_kv = getattr(cfg, "num_key_value_heads", None) or n_heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // n_heads
    theta, rope_type, extra = _rope_from_config(cfg)
    if rope_type not in ROPE_TYPES:
        raise UnsupportedModelError(f"rope type {rope_type!r} is not supported (only {', '.join(ROPE_TYPES)})")
    window = getattr(cfg, "sliding_window", None)
    if window and getattr(cfg, "use_sliding_window", True) and max_len > window:
        raise UnsupportedModelError(
            f"sliding_window={window} is smaller than --max-len {max_len}; export with --max-len <= {window}"
        )
    if getattr(cfg, "attention_bias", False) and mt != "qwen2":
        raise UnsupportedModelError(f"attention_bias=True on {mt!r} (biased o_proj) is not supported")
    partial = float(extra.get("partial_rotary_factor", getattr(cfg, "partial_rotary_factor", 1.0)) or 1.0)
    if partial != 1.0:
        raise UnsupportedModelError(
            f"partial_rotary_factor={partial} is not supported (rotary over the whole head only); "
            "Hint: export a model with partial_rotary_factor=1.0"
        )
    nope = ()
    if mt == "smollm3":
        flags = getattr(cfg, "no_rope_layers", None) or []
        nope = tuple(i for i in range(cfg.num_hidden_layers) if i < len(flags) and not flags[i])
    if n_heads % n_kv:
        raise UnsupportedModelError(f"num_attention_heads={n_heads} is not a multiple of num_key_value_heads={n_kv}")
    return ArchSpec(
        model_type=mt,
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
        rope_params=tuple(sorted((k, v) for k, v in extra.items() if isinstance(v, (int, float)))),
        tie_word_embeddings=bool(getattr(cfg, "tie_word_embeddings", False)),
        qkv_bias=mt == "qwen2",
        qk_norm=mt == "qwen3",
        max_len=max_len,
        embedding_multiplier=float(getattr(cfg, "embedding_multiplier", 1.0)) if mt == "granite" else 1.0,
        residual_multiplier=float(getattr(cfg, "residual_multiplier", 1.0)) if mt == "granite" else 1.0,
        attention_multiplier=float(cfg.attention_multiplier) if mt == "granite" else None,
        logits_scaling=float(getattr(cfg, "logits_scaling", 1.0)) if mt == "granite" else 1.0,
        nope_layers=nope,
    )
