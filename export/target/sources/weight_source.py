"""The target's weights, from one of three sources behind one interface (WeightSource)."""

from __future__ import annotations

from edgespec.export.target.families import STREAMED


def why_not(cfg, src, shipping: dict, hf_cfg) -> str | None:
    """Why this export cannot stream its target (then it loads the model through transformers), or
    None when it can: a local safetensors folder of a streamed family or a local GGUF (its
    architecture and tensor types are checked when it opens: sources/gguf.open_gguf), no drafter
    that ships models (they read the target's PyTorch model and its whole weights), not a quantized
    safetensors checkpoint, not --stream-weights off."""
    if getattr(cfg, "stream_weights", "auto") == "off":
        return "--stream-weights off"
    if src.kind == "hub":
        return "a hub id (streamed from local safetensors and GGUF files only)"
    if shipping:
        return f"the drafters {', '.join(shipping)} read the target's PyTorch model"
    if src.kind != "hf":
        return None
    mt = getattr(hf_cfg, "model_type", None)
    if mt not in STREAMED:
        return f"model_type {mt!r} is not streamed yet ({', '.join(STREAMED)} are)"
    if getattr(hf_cfg, "quantization_config", None):
        return "a quantized checkpoint (quantization_config)"
    return None
