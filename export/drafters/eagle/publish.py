"""An EAGLE-1/2 head (either layout checkpoint.py reads) written as the official EAGLE repo publishes
one (`edgespec export-drafter --format eagle1-official`), or what that layout cannot carry refused."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from edgespec.export.drafters.eagle.checkpoint import HeadFolder, inspect_head, load_head
from edgespec.export.drafters.eagle.config import HeadConfig
from edgespec.export.drafters.eagle.config_json import INERT, OFFICIAL, OFFICIAL_THETA, error
from edgespec.export.partials import clean_stale_partials, finish_partial, make_partial, remove_partial
from edgespec.export.train.checkpoint import CONFIG_FILE


def official_refusals(hc: HeadConfig) -> list[str]:
    """What of the head the official layout cannot carry (empty: all of it)."""
    out = []
    if hc.input_layernorm:
        out.append("layers.0.input_layernorm (the official class's layer 0 has no input norm; its loader drops it)")
    if hc.final_norm:
        out.append("norm.weight (an output norm; the official class has none)")
    if hc.draft_vocab_size < hc.vocab_size:
        out.append(
            f"a draft vocabulary of {hc.draft_vocab_size} of {hc.vocab_size} tokens (d2t; the official head drafts "
            "over the target's whole LM head)"
        )
    if hc.head_dim * hc.num_attention_heads != hc.hidden_size:
        out.append(
            f"head_dim {hc.head_dim} x {hc.num_attention_heads} heads != hidden_size {hc.hidden_size} (the official "
            "code's heads are hidden_size / heads wide)"
        )
    if hc.rope_theta is None:
        out.append(
            "its RoPE (config.json has no rope_theta: it was trained on its target's tables; add the target's "
            "rope_theta to its config.json)"
        )
    elif hc.rope_type == "linear" and hc.rope_theta != OFFICIAL_THETA:
        out.append(
            f"linear RoPE scaling over base {hc.rope_theta:g} (the official code scales base {OFFICIAL_THETA:g} only)"
        )
    elif hc.rope_type not in ("default", "linear"):
        out.append(f"RoPE type {hc.rope_type} (the official code knows linear and dynamic scaling only)")
    return out


def official_config(hf: HeadFolder) -> dict:
    """config.json of the head in the official layout: the fields its code reads, ids kept from an official source."""
    hc = hf.hc
    kept = {k: v for k, v in hf.config.items() if k in INERT and hf.layout == OFFICIAL}
    rope = (
        {"rope_scaling": {"type": "linear", "factor": dict(hc.rope_params)["factor"]}}
        if hc.rope_type == "linear"
        else {"rope_theta": hc.rope_theta}
    )
    qwen2 = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2"} if hc.qkv_bias else {}
    return (
        {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "max_position_embeddings": 2048}
        | qwen2
        | kept
        | {
            "hidden_act": "silu",
            "hidden_size": hc.hidden_size,
            "intermediate_size": hc.intermediate_size,
            "num_attention_heads": hc.num_attention_heads,
            "num_key_value_heads": hc.num_key_value_heads,
            "num_hidden_layers": 1,
            "rms_norm_eps": hc.rms_norm_eps,
            "vocab_size": hc.vocab_size,
            "torch_dtype": _TORCH_NAMES[hf.dtype],
        }
        | rope
        | {"bias": hc.fc_bias}
        | ({"qkv_bias": True} if hc.qkv_bias else {})
    )


_TORCH_NAMES = {
    "F32": "float32",
    "F16": "float16",
    "BF16": "bfloat16",
    "float32": "float32",
    "float16": "float16",
    "bfloat16": "bfloat16",
}


def publish_official(folder: str | Path, out: str | Path) -> Path:
    """The head at `folder` (either layout) as the official EAGLE repo publishes one, into the new
    folder `out`: config.json + pytorch_model.bin (torch.save of its state dict, in the dtype the
    head was stored in, exactly; no embed_tokens: the official loader takes the target's). What the
    layout cannot carry is refused (HeadFormatError), the whole list at once."""
    import torch

    hf = inspect_head(folder)
    refusals = official_refusals(hf.hc)
    if refusals:
        raise error(
            hf.folder,
            f"the {OFFICIAL} layout cannot carry " + "; ".join(refusals),
            "edgespec runs this head as it is (`edgespec export --eagle`); the official layout carries heads of "
            "EAGLE-1's own form (no layer-0 input norm, no output norm, the whole vocabulary), such as the EAGLE "
            "repo's",
        )
    arrays = load_head(hf)
    dtype = getattr(torch, _TORCH_NAMES[hf.dtype])
    state = {k: torch.from_numpy(np.ascontiguousarray(arrays[k])).to(dtype) for k in hf.names}
    out = Path(out)
    clean_stale_partials(out.parent)
    tmp = make_partial(out)  # an interrupted write leaves nothing under `out`
    try:
        torch.save(state, tmp / "pytorch_model.bin")
        (tmp / CONFIG_FILE).write_text(json.dumps(official_config(hf), indent=2) + "\n")
        return finish_partial(tmp, out)
    except BaseException:
        remove_partial(tmp)
        raise
