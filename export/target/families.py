"""The model families edgespec exports: ONE table (FAMILIES), read by everything that lists them
(arch.arch_from_config, the streaming readers, the GGUF config reader, `edgespec export --help`).

Adding a family: a row here (its HF model_type, its GGUF architecture, whether its checkpoints
stream) and, where its layers differ from Llama's, a function giving its own ArchSpec fields."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

GEMMA_ROPE_TYPES = ("default", "linear")  # what Gemma 3's layer kinds may use
GELU_TANH = ("gelu_pytorch_tanh", "gelu_new")  # HF activations computing 0.5x(1 + tanh(sqrt(2/pi)(x + 0.044715x^3)))


class UnsupportedModelError(ValueError):
    """The model is outside what the graph writer knows how to build."""


def rope_entry(params: dict, default_theta: float) -> tuple[float, str, dict]:
    """(theta, type, the other parameters) of one rope parameter dict."""
    theta = float(params.get("rope_theta", default_theta))
    rope_type = params.get("rope_type", params.get("type", "default")) or "default"
    extra = {k: v for k, v in params.items() if k not in ("rope_theta", "rope_type", "type")}
    return theta, rope_type, extra


def rope_numbers(extra: dict) -> tuple:
    """The numeric rope parameters as sorted (key, value) pairs (ArchSpec.rope_params)."""
    return tuple(sorted((k, v) for k, v in extra.items() if isinstance(v, (int, float))))


def _gemma3_checks(cfg) -> None:
    """What a Gemma 3 text config may hold that the graphs do not compute (soft-capping,
    bidirectional attention, other activations), refused."""
    for k in ("attn_logit_softcapping", "final_logit_softcapping"):
        if getattr(cfg, k, None) is not None:
            raise UnsupportedModelError(
                f"{k}={getattr(cfg, k)} is not supported (tanh soft-capping is not in the graphs); "
                f"Hint: export a Gemma 3 model whose config has {k}: null"
            )
    if getattr(cfg, "use_bidirectional_attention", False):
        raise UnsupportedModelError(
            "use_bidirectional_attention=True is not supported (an encoder: edgespec decodes causally)"
        )
    act = getattr(cfg, "hidden_activation", None) or getattr(cfg, "hidden_act", None)
    if act not in GELU_TANH:
        raise UnsupportedModelError(
            f"hidden_activation {act!r} is not supported on gemma3_text (only {', '.join(GELU_TANH)})"
        )


def _gemma3_layer_kinds(cfg) -> tuple[int, ...]:
    """The sliding (local) layers of a Gemma 3 text config: layer_types, or the older pattern."""
    n = cfg.num_hidden_layers
    pattern = getattr(cfg, "sliding_window_pattern", None) or 6  # configs before layer_types
    kinds = list(getattr(cfg, "layer_types", None) or [])
    kinds = kinds or ["full_attention" if (i + 1) % pattern == 0 else "sliding_attention" for i in range(n)]
    unknown = sorted(set(kinds[:n]) - {"sliding_attention", "full_attention"})
    if unknown or len(kinds) < n:
        raise UnsupportedModelError(
            f"layer_types {unknown or kinds} are not supported (one of sliding_attention / full_attention "
            f"per layer, {n} layers)"
        )
    return tuple(i for i in range(n) if kinds[i] == "sliding_attention")


def _gemma3(cfg, max_len: int) -> dict:
    """The ArchSpec fields of a Gemma 3 text config (gemma3_text) that differ from Llama's (with
    "rope": its global rope entry); refuses what the graphs do not compute (_gemma3_checks, rope types)."""
    _gemma3_checks(cfg)
    sliding = _gemma3_layer_kinds(cfg)
    params = getattr(cfg, "rope_parameters", None) or {}
    if "full_attention" in params:  # transformers >= 5: one entry per layer kind
        full = rope_entry(dict(params["full_attention"] or {}), 1e6)
        local = rope_entry(dict(params.get("sliding_attention") or {}), 10000.0)
    else:  # 4.x: rope_theta (+ rope_scaling) for the full layers, rope_local_base_freq for the sliding ones
        full = rope_entry(dict(getattr(cfg, "rope_scaling", None) or {}), getattr(cfg, "rope_theta", 1e6))
        local = rope_entry({}, getattr(cfg, "rope_local_base_freq", 10000.0))
    for kind, (_, rope_type, _) in (("full_attention", full), ("sliding_attention", local)):
        if rope_type not in GEMMA_ROPE_TYPES:
            raise UnsupportedModelError(
                f"rope type {rope_type!r} of the {kind} layers is not supported (only {', '.join(GEMMA_ROPE_TYPES)})"
            )
    local_rope = (local[0], local[1], rope_numbers(local[2]))
    window = getattr(cfg, "sliding_window", None)
    return dict(
        rope=full,
        qk_norm=True,
        embedding_multiplier=float(cfg.hidden_size**0.5),
        attention_multiplier=float(cfg.query_pre_attn_scalar) ** -0.5,
        norm_weight_offset=1.0,
        sandwich_norms=True,
        mlp_act="gelu_tanh",
        sliding_layers=sliding,
        sliding_window=int(window) if sliding and window and window < max_len else None,
        local_rope=local_rope if sliding and local_rope != (full[0], full[1], rope_numbers(full[2])) else (),
    )


def _granite(cfg, max_len: int) -> dict:
    """Granite's multipliers on the embedding, residual, attention scores and logits."""
    return dict(
        embedding_multiplier=float(getattr(cfg, "embedding_multiplier", 1.0)),
        residual_multiplier=float(getattr(cfg, "residual_multiplier", 1.0)),
        attention_multiplier=float(cfg.attention_multiplier),
        logits_scaling=float(getattr(cfg, "logits_scaling", 1.0)),
    )


def _smollm3(cfg, max_len: int) -> dict:
    """SmolLM3's NoPE layers (no_rope_layers: 0 = the layer's q/k are not rotated)."""
    flags = getattr(cfg, "no_rope_layers", None) or []
    return dict(nope_layers=tuple(i for i in range(cfg.num_hidden_layers) if i < len(flags) and not flags[i]))


@dataclass(frozen=True)
class Family:
    """One model family: how its checkpoints are named and read, and its layers' own fields."""

    model_type: str  # the HF config's model_type
    gguf_arch: str  # the GGUF general.architecture of its files (transformers' GGUF loader's key)
    streams: bool = False  # safetensors checkpoints read one tensor at a time (sources/safetensors.py)
    streams_gguf: bool = False  # GGUF files read one tensor at a time (sources/gguf.py)
    qkv_bias: bool = False  # q/k/v projections carry a bias (attention_bias=True accepted)
    qk_norm: bool = False  # per-head RMSNorm on q and k before RoPE
    fields: Callable[..., dict] | None = None  # (cfg, max_len) -> its own ArchSpec fields (arch_from_config)


FAMILIES = (
    Family("llama", "llama", streams=True, streams_gguf=True),
    Family("mistral", "mistral", streams=True),  # llama.cpp's Mistral GGUFs say llama (gguf_model_type)
    Family("qwen2", "qwen2", streams=True, streams_gguf=True, qkv_bias=True),
    Family("qwen3", "qwen3", streams=True, streams_gguf=True, qk_norm=True),
    Family("granite", "granite", fields=_granite),
    Family("phi3", "phi3"),
    Family("smollm3", "smollm3", fields=_smollm3),
    Family("gemma3_text", "gemma3", streams=True, streams_gguf=True, fields=_gemma3),
)
BY_MODEL_TYPE = {f.model_type: f for f in FAMILIES}
MODEL_TYPES = tuple(BY_MODEL_TYPE)  # every model_type edgespec exports
STREAMED = tuple(f.model_type for f in FAMILIES if f.streams)  # model types whose safetensors stream
GGUF_STREAMED = {f.gguf_arch: f.model_type for f in FAMILIES if f.streams_gguf}  # GGUF arch -> model_type


def gguf_family(arch: str, name: str = "") -> Family | None:
    """The family of a GGUF of general.architecture `arch` and general.name `name` (llama.cpp names
    Mistral models' architecture llama), or None."""
    if arch == "llama" and "mistral" in name.lower():
        return BY_MODEL_TYPE["mistral"]
    return next((f for f in FAMILIES if f.gguf_arch == arch), None)


def listed(names, last: str = "or") -> str:
    """'a, b, c or d': names for a message or a help text."""
    names = list(names)
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} {last} {names[-1]}"
