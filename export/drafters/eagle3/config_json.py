"""Each project's EAGLE-3 config.json read into Eagle3Config's fields (`read_config`), by that project's
own rules (layouts.py says which project a folder is and reads its tensors).

The same config key means different things in different projects, so each is read by its own
project's code: SpecForge's norm_output (default true) is whether the logits see the final norm;
speculators' norm_output (default false) is whether the NORMED output is fed to the next step (the
logits see the norm either way). Keys no reader here knows are refused, not ignored (`_no_unknown`).
Aux layer ids come out as entering ids (layouts.py's docstring resolves each project's convention).
"""

from __future__ import annotations

from pathlib import Path

from edgespec.export.drafters._files import HF_INERT, unknown_keys
from edgespec.export.drafters.eagle3.config import Eagle3FormatError

ROPE_TYPES = ("default", "linear", "llama3")  # what the head's tables (ArchSpec.rope_tables) compute
ROPE_KEYS = {  # the numbers each RoPE type reads
    "default": (),
    "linear": ("factor",),
    "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"),
}
# config keys that do not change the head's computation (ids, bookkeeping, training-only switches)
HARMLESS = HF_INERT | {
    "max_position_embeddings",  # the tables are built over the export's max_len
    "pretraining_tp",  # the same matmuls, split for tensor parallel training
    "max_window_layers",
    "target_model_type",
    "embed_requires_grad",
    "speculators_version",
}
# the layer's config keys each reader interprets (a Llama decoder layer's config)
LAYER_KEYS = frozenset(
    {
        "model_type",
        "hidden_size",
        "intermediate_size",
        "num_attention_heads",
        "num_key_value_heads",
        "head_dim",
        "rms_norm_eps",
        "vocab_size",
        "num_hidden_layers",
        "hidden_act",
        "attention_bias",
        "mlp_bias",
        "rope_theta",
        "rope_scaling",
        "rope_parameters",
        "tie_word_embeddings",
        "sliding_window",
        "use_sliding_window",
        "layer_types",
        "draft_vocab_size",
    }
)
HINT = "Hint: re-save it with its project's own code, or open an issue with its config.json"


def refuse(folder: Path, what: str) -> Eagle3FormatError:
    """The one-line refusal of a head folder."""
    return Eagle3FormatError(f"{folder}: {what}")


def _no_unknown(folder: Path, cfg: dict, known: frozenset | set, where: str) -> None:
    """Refuse keys no reader here interprets: they may change the computation."""
    extra = sorted(unknown_keys(cfg, known, HARMLESS))
    if extra:
        raise refuse(
            folder,
            f"{where} has key(s) {', '.join(extra)}, which edgespec's EAGLE-3 reader does not interpret; as they "
            f"may change what the head computes, it is refused rather than run without them. {HINT}",
        )


def _rope(folder: Path, cfg: dict, official: bool) -> dict:
    """The head's own RoPE (Eagle3Config's rope_theta/rope_type/rope_params) from its layer config."""
    if official:  # cnets.LlamaAttention: config.rope_theta if set (else 10000), rope_scaling["type"] linear only
        theta = float(cfg.get("rope_theta") or 10000.0)
        sc = cfg.get("rope_scaling")
        params = cfg.get("rope_parameters")
        if params and (params.get("rope_type", "default") != "default" or params.get("rope_theta", theta) != theta):
            raise refuse(
                folder, f"rope_parameters {params}: the official EAGLE-3 code reads rope_theta and rope_scaling only"
            )
        if sc is None:
            return dict(rope_theta=theta, rope_type="default", rope_params=())
        if sc.get("type") == "linear" and "factor" in sc:
            return dict(rope_theta=theta, rope_type="linear", rope_params=(("factor", float(sc["factor"])),))
        raise refuse(
            folder,
            f"rope_scaling {sc}: of the official EAGLE-3 code's RoPE scalings edgespec computes 'linear' only "
            "('dynamic' rescales past max_position_embeddings at run time)",
        )
    params = dict(cfg.get("rope_parameters") or {})
    if "full_attention" in params or "sliding_attention" in params:
        raise refuse(folder, "per-layer-type rope_parameters: an EAGLE-3 head has one layer, one RoPE")
    params.update(cfg.get("rope_scaling") or {})
    theta = float(params.pop("rope_theta", None) or cfg.get("rope_theta") or 10000.0)
    kind = params.pop("rope_type", None) or params.pop("type", None) or "default"
    params.pop("type", None)
    if kind not in ROPE_TYPES:
        raise refuse(folder, f"RoPE type {kind!r}: the head's tables compute {', '.join(ROPE_TYPES)} only")
    partial = float(params.pop("partial_rotary_factor", None) or cfg.get("partial_rotary_factor") or 1.0)
    if partial != 1.0:
        raise refuse(folder, f"partial_rotary_factor {partial}: the head rotates whole heads only")
    missing = [k for k in ROPE_KEYS[kind] if not isinstance(params.get(k), int | float)]
    if missing:
        raise refuse(folder, f"RoPE type {kind!r} without {', '.join(missing)}")
    return dict(rope_theta=theta, rope_type=kind, rope_params=tuple(sorted((k, params[k]) for k in ROPE_KEYS[kind])))


def _layer(folder: Path, cfg: dict, where: str, official: bool = False) -> dict:
    """Eagle3Config's shape and RoPE fields from a Llama decoder layer's config (`where` names it)."""
    need = [k for k in ("hidden_size", "intermediate_size", "num_attention_heads", "vocab_size") if k not in cfg]
    if need:
        raise refuse(folder, f"{where} lacks {', '.join(need)}; {HINT}")
    if int(cfg.get("num_hidden_layers") or 1) != 1:
        raise refuse(
            folder,
            f"{where} has num_hidden_layers {cfg['num_hidden_layers']}: edgespec's EAGLE-3 head graph has one "
            "decoder layer (EAGLE-3's)",
        )
    if cfg.get("model_type", "llama") != "llama":
        raise refuse(
            folder,
            f"{where} has a {cfg['model_type']!r} decoder layer: edgespec's EAGLE-3 head graph computes a Llama "
            "layer (no q/k norms, no biases)",
        )
    if (cfg.get("hidden_act") or "silu") != "silu":
        raise refuse(folder, f"{where} has hidden_act {cfg['hidden_act']!r}: the head's MLP is SwiGLU (silu) only")
    for key in ("attention_bias", "mlp_bias"):
        if cfg.get(key):
            raise refuse(folder, f"{where} sets {key}: the head's projections have no biases")
    if cfg.get("tie_word_embeddings"):
        raise refuse(
            folder, f"{where} sets tie_word_embeddings: an EAGLE-3 head's lm_head is its own (draft vocabulary)"
        )
    kinds = list(cfg.get("layer_types") or [])
    if set(kinds) - {"full_attention", "sliding_attention"}:
        raise refuse(folder, f"{where} has layer_types {kinds}: the head's layer is full or sliding attention")
    # speculators' trainer marks its draft layers sliding by default (window 2048): a key window checked
    # against --max-len when the head is exported (Eagle3Checkpoint.check); no window: every position
    window = int(cfg.get("sliding_window") or 0) if "sliding_attention" in kinds else 0
    H, n_h = int(cfg["hidden_size"]), int(cfg["num_attention_heads"])
    return dict(
        hidden_size=H,
        intermediate_size=int(cfg["intermediate_size"]),
        num_attention_heads=n_h,
        num_key_value_heads=int(cfg.get("num_key_value_heads") or n_h),
        # the official attention computes head_dim = hidden_size / heads whatever the config says
        head_dim=H // n_h if official else int(cfg.get("head_dim") or H // n_h),
        rms_norm_eps=float(cfg.get("rms_norm_eps") or 1e-6),  # LlamaConfig's and EConfig's default
        vocab_size=int(cfg["vocab_size"]),
        sliding_window=window,
        **_rope(folder, cfg, official),
    )


def _eagle_config_ids(folder: Path, cfg: dict) -> tuple[int, ...] | None:
    """eagle_config's layer ids as written (None: none), its other keys checked."""
    ec = cfg.get("eagle_config")
    if ec is None:
        return None
    if not isinstance(ec, dict):
        raise refuse(folder, f"eagle_config {ec!r} is not a mapping; {HINT}")
    _no_unknown(folder, ec, {"eagle_aux_hidden_state_layer_ids", "use_aux_hidden_state"}, "eagle_config")
    if ec.get("use_aux_hidden_state") is False:
        raise refuse(
            folder,
            "eagle_config.use_aux_hidden_state is false: the head reads the target's last hidden state, not "
            "EAGLE-3's fused layer features. Hint: an EAGLE-1/2 head goes to --eagle",
        )
    ids = ec.get("eagle_aux_hidden_state_layer_ids")
    return None if ids is None else _ids(folder, ids)


def _ids(folder: Path, ids) -> tuple[int, ...]:
    if not isinstance(ids, list) or not ids or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
        raise refuse(folder, f"aux layer ids {ids!r} are not a list of layer numbers; {HINT}")
    twice = sorted({i for i in ids if ids.count(i) > 1})
    if twice:
        raise refuse(
            folder,
            f"aux layer ids {ids} name layer(s) {twice} more than once: the target graphs output each layer's "
            "features once, and a head trained on one layer's copies reads nothing the others do not. Hint: "
            "give each feature block its own layer",
        )
    return tuple(ids)


def read_config(folder: Path, layout: str, cfg: dict) -> tuple[dict, dict]:
    """(Eagle3Config fields but n_aux and the sizes the tensors say, variant flags) of a layout's config."""
    if layout == "eagle3-speculators":
        return _speculators_fields(folder, cfg), {}
    return _llama_fields(folder, layout, cfg)


def _speculators_fields(folder: Path, cfg: dict) -> dict:
    """Eagle3Config fields of a vLLM speculators config (its layer in transformer_layer_config)."""
    layer = cfg.get("transformer_layer_config")
    if not isinstance(layer, dict):
        raise refuse(folder, f"a speculators config without transformer_layer_config; {HINT}")
    top = {
        "speculators_model_type",
        "speculators_config",
        "transformer_layer_config",
        "draft_vocab_size",
        "norm_before_residual",
        "norm_before_fc",
        "fc_norm",
        "norm_output",
        "target_hidden_size",
        "eagle_aux_hidden_state_layer_ids",
        "tie_word_embeddings",
    }
    _no_unknown(folder, cfg, top, "config.json")
    _no_unknown(folder, layer, LAYER_KEYS, "transformer_layer_config")
    if cfg.get("tie_word_embeddings"):
        raise refuse(folder, "tie_word_embeddings: an EAGLE-3 head's lm_head is its own (draft vocabulary)")
    if cfg.get("speculators_model_type", "eagle3") != "eagle3":
        raise refuse(folder, f"speculators_model_type {cfg['speculators_model_type']!r} is not eagle3")
    if cfg.get("norm_before_fc") and cfg.get("fc_norm"):
        raise refuse(folder, "norm_before_fc and fc_norm both set (speculators refuses the pair too)")
    ids = cfg.get("eagle_aux_hidden_state_layer_ids")
    fields = _layer(folder, layer, "transformer_layer_config")
    fields |= dict(
        draft_vocab_size=int(cfg.get("draft_vocab_size") or 32000),  # Eagle3SpeculatorConfig's default
        aux_layers=() if ids is None else _ids(folder, ids),  # vLLM's: entering ids as they are
        fc_norm="whole" if cfg.get("norm_before_fc") else "per_layer" if cfg.get("fc_norm") else "none",
        norm_before_residual=bool(cfg.get("norm_before_residual", False)),
        feed_normed=bool(cfg.get("norm_output", False)),  # speculators: the normed output is fed back
        target_hidden_size=int(cfg.get("target_hidden_size") or 0),
    )
    return fields


def _llama_fields(folder: Path, layout: str, cfg: dict) -> tuple[dict, dict]:
    """(Eagle3Config fields, edgespec's training record) of a config that is a Llama layer's own
    (official EAGLE, SpecForge, `edgespec train-eagle3`)."""
    official = layout == "eagle3-official"
    extra = {"eagle_config", "draft_vocab_size", "target_hidden_size"}
    if layout == "eagle3-specforge":
        extra |= {"fc_norm", "norm_output"}
    if layout == "eagle3-edgespec":
        extra |= {"eagle3"}
    if official:
        extra |= {"bias"}  # EAGLE-1's fc bias switch, which the EAGLE-3 Model takes and does not use
    _no_unknown(folder, cfg, LAYER_KEYS | extra, "config.json")
    fields = _layer(folder, cfg, "config.json", official=official)
    ids = _eagle_config_ids(folder, cfg)
    if official and ids is not None:
        raise refuse(
            folder,
            f"eagle_config names layers {list(ids)}, which the official EAGLE-3 code never reads (its target "
            "code feeds the streams entering layers 2, L//2, L-3); whose convention they follow is unknown. "
            "Hint: a SpecForge head says LlamaForCausalLMEagle3 in architectures",
        )
    if layout == "eagle3-specforge" and ids is not None:
        ids = tuple(i + 1 for i in ids)  # SGLang's ids: layer outputs; entering the next layer
    fields |= dict(
        draft_vocab_size=int(cfg.get("draft_vocab_size") or fields["vocab_size"]),
        aux_layers=ids or (),
        target_hidden_size=int(cfg.get("target_hidden_size") or 0),
    )
    if layout == "eagle3-specforge":
        fields |= dict(
            fc_norm="per_layer" if cfg.get("fc_norm") else "none",
            logits_norm=bool(cfg.get("norm_output", True)),  # SpecForge: the final norm before lm_head
        )
    if layout == "eagle3-edgespec":
        fields["d2t_by_frequency"] = (cfg.get("eagle3") or {}).get("d2t_order") == "frequency"
    return fields, dict(cfg.get("eagle3") or {})
