"""An EAGLE-1/2 head's config.json read by its layout's rules (checkpoint.py's docstring lists the two):
the keys honoured, those known inert, another drafter's keys named with the flag that reads them,
the head's RoPE and shape; any other key is refused with the reason."""

from __future__ import annotations

import json
from pathlib import Path

from edgespec.export.drafters import _files
from edgespec.export.drafters._shape import HeadShape
from edgespec.export.train.checkpoint import HeadFormatError

OFFICIAL = "eagle1-official"
EDGESPEC = "edgespec"
OFFICIAL_THETA = 10000.0  # the official code's RoPE base when config.json has no rope_theta, and under rope_scaling

# config.json keys that do not change what the head computes (the official code reads none of them
# for its computation; max_position_embeddings sizes a rotary cache it extends on demand;
# pretraining_tp splits matmuls into slices whose sum is the same product)
INERT = _files.HF_INERT | {
    "tie_word_embeddings",
    "max_position_embeddings",
    "pretraining_tp",
    "sliding_window",
    "max_window_layers",
}
# keys inert at the value given (what the official code computes anyway); any other value is refused
INERT_AT = {
    "use_sliding_window": False,
    "attention_bias": False,
    "mlp_bias": False,
}
HONOURED = {
    "hidden_size",
    "intermediate_size",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "num_hidden_layers",
    "rms_norm_eps",
    "vocab_size",
    "draft_vocab_size",
    "hidden_act",
    "bias",
    "qkv_bias",
    "rope_theta",
    "rope_scaling",
    "rope_parameters",
    "layer_types",
    "eagle",
}
# other drafters' layouts, told apart by a config key: (what it is, the flag that reads it)
FOREIGN_KEYS = {
    "eagle_config": ("an EAGLE-3 head", "--eagle3-head"),
    "speculators_config": ("a vLLM speculators checkpoint", "--eagle3-head"),
    "transformer_layer_config": ("a vLLM speculators checkpoint", "--eagle3-head"),
    "medusa_num_heads": ("a Medusa checkpoint", "--medusa"),
    "block_size": ("a DFlash drafter", "--dflash"),
    "dflash_config": ("a DFlash drafter", "--dflash"),
}


def error(folder: Path, what: str, hint: str = "") -> HeadFormatError:
    """The one-line refusal of a head folder, with its hint."""
    return HeadFormatError(f"{folder}: {what}" + (f". Hint: {hint}" if hint else ""))


def foreign(folder: Path, config: dict, names: set[str]) -> None:
    """Refuse another drafter's checkpoint, naming the flag that reads it."""
    archs = " ".join(config.get("architectures") or [])
    if any(k.startswith("midlayer.") for k in names) or "Eagle3" in archs:
        raise error(
            folder,
            "an EAGLE-3 checkpoint (midlayer.*, fused low/mid/high features), not an EAGLE-1/2 head (fc + layers.0)",
            "EAGLE-3 heads have an export flag and a training command of their own: --eagle3-head "
            "(`edgespec export --help`)",
        )
    for key, (what, flag) in FOREIGN_KEYS.items():
        if key in config:
            raise error(folder, f"config.json has `{key}`: {what}, not an EAGLE-1/2 head", f"pass it to {flag}")


def rope(folder: Path, config: dict, layout: str) -> tuple[float | None, str, tuple]:
    """(theta, type, params) of the head's own RoPE. Official: as its code computes (rope_theta,
    default 10000; rope_scaling {type: linear, factor}: base 10000, positions / factor; other kinds
    refused). Edgespec: rope_theta and rope_scaling ({rope_type, ...}, ArchSpec's kinds), or None
    (the target's) when config.json predates them."""
    theta = config.get("rope_theta")
    scaling = config.get("rope_scaling")
    if layout == EDGESPEC:
        if theta is None:
            return None, "default", ()
        kind = (scaling or {}).get("rope_type", "default")
        if kind not in ("default", "linear", "llama3"):
            raise error(folder, f"rope_scaling {scaling}: rope type {kind!r} is not one edgespec computes")
        params = tuple(sorted((k, v) for k, v in (scaling or {}).items() if k != "rope_type"))
        return float(theta), kind, params
    if scaling is None:
        theta, kind, params = float(theta if theta is not None else OFFICIAL_THETA), "default", ()
    elif not isinstance(scaling, dict) or "type" not in scaling:
        raise error(
            folder,
            f"rope_scaling {scaling} has no `type`: the official EAGLE code reads rope_scaling['type'] "
            "(linear or dynamic) and cannot load this head",
            "a head trained with the official code has rope_scaling null or {type: linear, factor: F}",
        )
    elif scaling["type"] == "linear" and set(scaling) <= {"type", "factor"}:
        if theta is not None and float(theta) != OFFICIAL_THETA:
            raise error(
                folder,
                f"rope_scaling {scaling} with rope_theta {theta}: the official EAGLE code rotates with base "
                f"{OFFICIAL_THETA:g} under rope_scaling and ignores rope_theta, so which base the head was "
                "trained with is unclear",
                f"set rope_theta to {OFFICIAL_THETA:g} (or remove it) if it was trained with the official code",
            )
        theta, kind, params = OFFICIAL_THETA, "linear", (("factor", float(scaling["factor"])),)
    elif scaling["type"] == "dynamic":
        raise error(
            folder,
            f"rope_scaling {scaling}: dynamic NTK scaling changes the RoPE base once a sequence passes "
            "max_position_embeddings; edgespec's graphs rotate by one fixed table",
        )
    else:
        raise error(folder, f"rope_scaling {scaling}: the official EAGLE code knows only linear and dynamic")
    given = config.get("rope_parameters")
    if given is not None and (
        float(given.get("rope_theta", theta)) != theta or given.get("rope_type", "default") != kind
    ):
        raise error(folder, f"rope_parameters {given} disagree with rope_theta / rope_scaling ({theta:g}, {kind})")
    return theta, kind, params


def check_keys(folder: Path, config: dict, layout: str) -> None:
    """Refuse config keys that would change the computation in a way not honoured here."""
    for key, value in config.items():
        if key in INERT_AT and value != INERT_AT[key]:
            raise error(
                folder,
                f"config.json has {key}: {json.dumps(value)}, which the official EAGLE head does not "
                f"compute (it has {json.dumps(INERT_AT[key])}); edgespec would run another head than "
                "the one trained",
            )
    unknown = _files.unknown_keys(config, HONOURED, INERT, INERT_AT)
    if unknown:
        raise error(
            folder,
            f"config.json has `{unknown[0]}` ({json.dumps(config[unknown[0]])[:60]}), a field edgespec's EAGLE-1 "
            "reader does not know: it may change what the head computes",
            "if it does not (a note, an id), remove it from config.json",
        )
    if config.get("hidden_act", "silu") != "silu":
        raise error(folder, f"hidden_act {config['hidden_act']!r}: edgespec's EAGLE heads compute SiLU MLPs only")
    kinds = set(config.get("layer_types") or ["full_attention"])
    if kinds != {"full_attention"}:
        raise error(folder, f"layer_types {sorted(kinds)}: the head's one layer attends over the full context")
    if layout == EDGESPEC:
        e = config["eagle"]
        if e.get("version", 1) != 1 or e.get("features", "final_norm") != "final_norm":
            raise error(
                folder,
                f"eagle section version {e.get('version')} / features {e.get('features')!r}: this edgespec reads "
                "version 1 heads over the target's final-norm features",
            )


def head_shape(folder: Path, config: dict, layout: str, vocab_size: int | None) -> dict:
    """HeadShape's fields from config.json (official: its code's defaults and head width H / heads)."""
    need = ("hidden_size", "intermediate_size", "num_attention_heads", "num_hidden_layers")
    missing = [k for k in need if k not in config]
    if missing:
        raise error(folder, f"config.json lacks {missing}", "an EAGLE head's config.json is a one-layer LlamaConfig")
    if int(config["num_hidden_layers"]) != 1:
        raise error(
            folder,
            f"num_hidden_layers {config['num_hidden_layers']}: edgespec's EAGLE-1 heads have one decoder layer",
        )
    V = vocab_size if vocab_size is not None else int(config.get("vocab_size") or 0)
    shape = HeadShape.from_config(config | {"rms_norm_eps": config.get("rms_norm_eps", 1e-6)}, V)
    if layout == OFFICIAL:
        H, n_h = shape["hidden_size"], shape["num_attention_heads"]
        if H % n_h or int(config.get("head_dim") or H // n_h) != H // n_h:
            raise error(
                folder,
                f"head_dim {config.get('head_dim')} with hidden_size {H} and {n_h} heads: the official EAGLE code's "
                "heads are hidden_size / heads wide",
            )
        shape["head_dim"] = H // n_h
    return shape
