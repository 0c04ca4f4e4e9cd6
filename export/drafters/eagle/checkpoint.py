"""EAGLE-1/2 head checkpoints: the two layouts `--eagle` reads, checked before any weight loads
(`inspect_head`), read (`read_head`), and written (`save_head`: edgespec's; `publish_official`:
the official one, for `edgespec export-drafter --format eagle1-official`).

  eagle1-official  SafeAILab/EAGLE's (EAGLE-LLaMA3-Instruct-8B, EAGLE-Qwen2-7B-Instruct, ...):
                   pytorch_model.bin (fp16/bf16/fp32; model.safetensors is read too) of its model
                   class's state_dict: fc.weight [H, 2H] (+ fc.bias when `bias`, default true),
                   layers.0.self_attn.{q,k,v,o}_proj.weight (+ q/k/v biases when `qkv_bias`),
                   layers.0.post_attention_layernorm.weight, layers.0.mlp.*, embed_tokens.weight
                   (the target's, a copy), no input norm on layer 0, no output norm; config.json a
                   one-layer LlamaConfig-like EConfig whose fields its code reads: hidden_size,
                   intermediate_size, num_attention_heads, num_key_value_heads (default: heads),
                   rms_norm_eps (default 1e-6), hidden_act, rope_theta (default 10000),
                   rope_scaling ({type: linear, factor}: base 10000, positions / factor), bias, qkv_bias.
                   Its head width is hidden_size / heads; it drafts through the target's LM head.
  edgespec         what `edgespec train-eagle` writes (and the shipped head): config.json with an
                   `eagle` section, model.safetensors in fp16, optional layers.0.input_layernorm and
                   norm.weight, a reduced draft vocabulary as EAGLE-3 stores it (d2t, draft_vocab_size),
                   head_dim, the head's RoPE (rope_theta, rope_scaling; absent on heads written before
                   it was recorded: those were trained on their target's tables).

Every config key either changes what the head computes and is honoured, or is known not to (ids,
dtype, cache length, ...): any other key, and any tensor the head would not use, is refused with
the reason, so nothing is dropped in silence (the official loader's strict=False drops what it
does not know; edgespec refuses instead).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from edgespec.export.drafters import _files
from edgespec.export.drafters._files import (
    WeightsFileError,
    eps_problem,
    load_tensors,
    read_json,
    tensor_infos,
    weights_file,
)
from edgespec.export.drafters._shape import HeadShape
from edgespec.export.drafters.eagle.config import BIAS_NAMES, HeadConfig
from edgespec.export.partials import clean_stale_partials, finish_partial, make_partial, remove_partial
from edgespec.export.train.checkpoint import CONFIG_FILE, HeadFormatError, _read_d2t, write_checkpoint

if TYPE_CHECKING:  # the module needs torch; reading and checking heads does not
    from edgespec.export.drafters.eagle.head import EagleHead

OFFICIAL = "eagle1-official"
EDGESPEC = "edgespec"
OFFICIAL_THETA = 10000.0  # the official code's RoPE base when config.json has no rope_theta, and under rope_scaling
EMBED = "embed_tokens.weight"  # the official checkpoints' copy of the target's embedding
_FLOATS = {"F32", "F16", "BF16", "float32", "float16", "bfloat16"}
_INTS = {"I64", "I32", "int64", "int32"}

# config.json keys that do not change what the head computes (the official code reads none of them
# for its computation; max_position_embeddings sizes a rotary cache it extends on demand;
# pretraining_tp splits matmuls into slices whose sum is the same product)
_INERT = _files.HF_INERT | {
    "tie_word_embeddings",
    "max_position_embeddings",
    "pretraining_tp",
    "sliding_window",
    "max_window_layers",
}
# keys inert at the value given (what the official code computes anyway); any other value is refused
_INERT_AT = {
    "use_sliding_window": False,
    "attention_bias": False,
    "mlp_bias": False,
}
_HONOURED = {
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
_FOREIGN_KEYS = {
    "eagle_config": ("an EAGLE-3 head", "--eagle3-head"),
    "speculators_config": ("a vLLM speculators checkpoint", "--eagle3-head"),
    "transformer_layer_config": ("a vLLM speculators checkpoint", "--eagle3-head"),
    "medusa_num_heads": ("a Medusa checkpoint", "--medusa"),
    "block_size": ("a DFlash drafter", "--dflash"),
    "dflash_config": ("a DFlash drafter", "--dflash"),
}


@dataclass(frozen=True)
class HeadFolder:
    """An EAGLE-1 head folder as read before its weights: checked config and tensor shapes."""

    folder: Path  # the checkpoint folder
    layout: str  # OFFICIAL or EDGESPEC
    config: dict  # its config.json
    weights: Path  # its weights file (pytorch_model.bin, model.safetensors, a sharded index)
    dtype: str  # the stored float dtype of fc.weight ("F16", "bfloat16", ...)
    names: tuple[str, ...]  # the tensors the head computes with (its embedding copy and t2d not among them)
    has_embed: bool  # it holds a copy of the target's embedding (checked against the target's by `check_embedding`)
    hc: HeadConfig  # the head, as it computes


def _error(folder: Path, what: str, hint: str = "") -> HeadFormatError:
    return HeadFormatError(f"{folder}: {what}" + (f". Hint: {hint}" if hint else ""))


def _foreign(folder: Path, config: dict, names: set[str]) -> None:
    """Refuse another drafter's checkpoint, naming the flag that reads it."""
    archs = " ".join(config.get("architectures") or [])
    if any(k.startswith("midlayer.") for k in names) or "Eagle3" in archs:
        raise _error(
            folder,
            "an EAGLE-3 checkpoint (midlayer.*, fused low/mid/high features), not an EAGLE-1/2 head (fc + layers.0)",
            "EAGLE-3 heads have an export flag and a training command of their own: --eagle3-head "
            "(`edgespec export --help`)",
        )
    for key, (what, flag) in _FOREIGN_KEYS.items():
        if key in config:
            raise _error(folder, f"config.json has `{key}`: {what}, not an EAGLE-1/2 head", f"pass it to {flag}")


def _rope(folder: Path, config: dict, layout: str) -> tuple[float | None, str, tuple]:
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
            raise _error(folder, f"rope_scaling {scaling}: rope type {kind!r} is not one edgespec computes")
        params = tuple(sorted((k, v) for k, v in (scaling or {}).items() if k != "rope_type"))
        return float(theta), kind, params
    if scaling is None:
        theta, kind, params = float(theta if theta is not None else OFFICIAL_THETA), "default", ()
    elif not isinstance(scaling, dict) or "type" not in scaling:
        raise _error(
            folder,
            f"rope_scaling {scaling} has no `type`: the official EAGLE code reads rope_scaling['type'] "
            "(linear or dynamic) and cannot load this head",
            "a head trained with the official code has rope_scaling null or {type: linear, factor: F}",
        )
    elif scaling["type"] == "linear" and set(scaling) <= {"type", "factor"}:
        if theta is not None and float(theta) != OFFICIAL_THETA:
            raise _error(
                folder,
                f"rope_scaling {scaling} with rope_theta {theta}: the official EAGLE code rotates with base "
                f"{OFFICIAL_THETA:g} under rope_scaling and ignores rope_theta, so which base the head was "
                "trained with is unclear",
                f"set rope_theta to {OFFICIAL_THETA:g} (or remove it) if it was trained with the official code",
            )
        theta, kind, params = OFFICIAL_THETA, "linear", (("factor", float(scaling["factor"])),)
    elif scaling["type"] == "dynamic":
        raise _error(
            folder,
            f"rope_scaling {scaling}: dynamic NTK scaling changes the RoPE base once a sequence passes "
            "max_position_embeddings; edgespec's graphs rotate by one fixed table",
        )
    else:
        raise _error(folder, f"rope_scaling {scaling}: the official EAGLE code knows only linear and dynamic")
    given = config.get("rope_parameters")
    if given is not None and (
        float(given.get("rope_theta", theta)) != theta or given.get("rope_type", "default") != kind
    ):
        raise _error(folder, f"rope_parameters {given} disagree with rope_theta / rope_scaling ({theta:g}, {kind})")
    return theta, kind, params


def _check_keys(folder: Path, config: dict, layout: str) -> None:
    """Refuse config keys that would change the computation in a way not honoured here."""
    for key, value in config.items():
        if key in _INERT_AT and value != _INERT_AT[key]:
            raise _error(
                folder,
                f"config.json has {key}: {json.dumps(value)}, which the official EAGLE head does not "
                f"compute (it has {json.dumps(_INERT_AT[key])}); edgespec would run another head than "
                "the one trained",
            )
    unknown = _files.unknown_keys(config, _HONOURED, _INERT, _INERT_AT)
    if unknown:
        raise _error(
            folder,
            f"config.json has `{unknown[0]}` ({json.dumps(config[unknown[0]])[:60]}), a field edgespec's EAGLE-1 "
            "reader does not know: it may change what the head computes",
            "if it does not (a note, an id), remove it from config.json",
        )
    if config.get("hidden_act", "silu") != "silu":
        raise _error(folder, f"hidden_act {config['hidden_act']!r}: edgespec's EAGLE heads compute SiLU MLPs only")
    kinds = set(config.get("layer_types") or ["full_attention"])
    if kinds != {"full_attention"}:
        raise _error(folder, f"layer_types {sorted(kinds)}: the head's one layer attends over the full context")
    if layout == EDGESPEC:
        e = config["eagle"]
        if e.get("version", 1) != 1 or e.get("features", "final_norm") != "final_norm":
            raise _error(
                folder,
                f"eagle section version {e.get('version')} / features {e.get('features')!r}: this edgespec reads "
                "version 1 heads over the target's final-norm features",
            )


def _shape(folder: Path, config: dict, layout: str, vocab_size: int | None) -> dict:
    """HeadShape's fields from config.json (official: its code's defaults and head width H / heads)."""
    need = ("hidden_size", "intermediate_size", "num_attention_heads", "num_hidden_layers")
    missing = [k for k in need if k not in config]
    if missing:
        raise _error(folder, f"config.json lacks {missing}", "an EAGLE head's config.json is a one-layer LlamaConfig")
    if int(config["num_hidden_layers"]) != 1:
        raise _error(
            folder,
            f"num_hidden_layers {config['num_hidden_layers']}: edgespec's EAGLE-1 heads have one decoder layer",
        )
    V = vocab_size if vocab_size is not None else int(config.get("vocab_size") or 0)
    shape = HeadShape.from_config(config | {"rms_norm_eps": config.get("rms_norm_eps", 1e-6)}, V)
    if layout == OFFICIAL:
        H, n_h = shape["hidden_size"], shape["num_attention_heads"]
        if H % n_h or int(config.get("head_dim") or H // n_h) != H // n_h:
            raise _error(
                folder,
                f"head_dim {config.get('head_dim')} with hidden_size {H} and {n_h} heads: the official EAGLE code's "
                "heads are hidden_size / heads wide",
            )
        shape["head_dim"] = H // n_h
    return shape


def _expected(hc: HeadConfig) -> dict[str, tuple[int, ...]]:
    """The float tensors the head computes with and their shapes."""
    H, I, d = hc.hidden_size, hc.intermediate_size, hc.head_dim
    q, kv = hc.num_attention_heads * d, hc.num_key_value_heads * d
    shapes = {
        "fc.weight": (H, 2 * H),
        "layers.0.self_attn.q_proj.weight": (q, H),
        "layers.0.self_attn.k_proj.weight": (kv, H),
        "layers.0.self_attn.v_proj.weight": (kv, H),
        "layers.0.self_attn.o_proj.weight": (H, q),
        "layers.0.mlp.gate_proj.weight": (I, H),
        "layers.0.mlp.up_proj.weight": (I, H),
        "layers.0.mlp.down_proj.weight": (H, I),
        "layers.0.post_attention_layernorm.weight": (H,),
    }
    if hc.fc_bias:
        shapes["fc.bias"] = (H,)
    if hc.qkv_bias:
        shapes |= {BIAS_NAMES["q_proj"]: (q,), BIAS_NAMES["k_proj"]: (kv,), BIAS_NAMES["v_proj"]: (kv,)}
    if hc.input_layernorm:
        shapes["layers.0.input_layernorm.weight"] = (H,)
    if hc.final_norm:
        shapes["norm.weight"] = (H,)
    return shapes


def _unknown(folder: Path, name: str) -> HeadFormatError:
    """Why a tensor the head would not compute with is refused."""
    if name == "layers.0.self_attn.o_proj.bias":
        return _error(
            folder,
            "holds layers.0.self_attn.o_proj.bias: the official EAGLE class has no o_proj bias (its loader "
            "drops it), so which head was trained is unclear",
        )
    if name in BIAS_NAMES.values():
        return _error(
            folder,
            f"holds {name} but config.json has no `qkv_bias: true`: the official EAGLE code then builds q/k/v "
            "without biases and its loader drops them",
            'add "qkv_bias": true to config.json if the head was trained with them (EAGLE heads for Qwen2 are)',
        )
    if name == "fc.bias":
        return _error(
            folder,
            "holds fc.bias but config.json says `bias: false` (fc without bias; the official loader drops it)",
            "set bias to true if the head was trained with it",
        )
    if name.startswith("layers.") and not name.startswith("layers.0."):
        return _error(folder, f"holds {name}: a second decoder layer; edgespec's EAGLE-1 heads have one")
    if name == "lm_head.weight":
        return _error(
            folder,
            "holds lm_head.weight: an LM head of its own, which EAGLE-1/2 heads do not have (they draft "
            "through the target's)",
            "EAGLE-3 heads carry one: --eagle3-head",
        )
    return _error(folder, f"holds {name}, a tensor an EAGLE-1 head does not compute with")


def inspect_head(folder: str | Path, hidden_size: int | None = None, vocab_size: int | None = None) -> HeadFolder:
    """The head folder's config.json and tensor names, shapes and dtypes (no weights read), checked
    against each other and, when given, against the target's hidden and vocabulary sizes."""
    folder = Path(folder)
    if not (folder / CONFIG_FILE).exists():
        raise _error(
            folder,
            f"no {CONFIG_FILE}; an EAGLE head folder holds config.json + pytorch_model.bin or model.safetensors",
        )
    try:
        config = read_json(folder / CONFIG_FILE)
        if not isinstance(config, dict):
            raise _error(folder, f"{CONFIG_FILE} holds a {type(config).__name__}, not a config object")
        _foreign(folder, config, set())  # another drafter's folder: said before its weights are opened
        path = weights_file(folder)
        infos = tensor_infos(path)
    except (WeightsFileError, json.JSONDecodeError) as e:
        raise HeadFormatError(str(e) if str(e).startswith(str(folder)) else f"{folder}: {e}") from e
    names = set(infos)
    _foreign(folder, config, names)
    layout = EDGESPEC if isinstance(config.get("eagle"), dict) else OFFICIAL
    _check_keys(folder, config, layout)
    shape = _shape(folder, config, layout, vocab_size)
    theta, kind, params = _rope(folder, config, layout)
    e = config.get("eagle") or {}
    hc = HeadConfig(
        **shape,
        input_layernorm="layers.0.input_layernorm.weight" in names,
        final_norm="norm.weight" in names,
        d2t_by_frequency="d2t" in names and e.get("d2t_order") == "frequency",
        qkv_bias=bool(config.get("qkv_bias", False)),
        fc_bias=bool(config.get("bias", True)),
        rope_theta=theta,
        rope_type=kind,
        rope_params=params,
    )
    if eps_problem(hc.rms_norm_eps):
        raise _error(folder, f"config.json: {eps_problem(hc.rms_norm_eps)}")
    for flag, has in (("input_layernorm", hc.input_layernorm), ("final_norm", hc.final_norm)):
        if flag in e and bool(e[flag]) != has:
            raise _error(
                folder, f"eagle.{flag} is {e[flag]} in config.json but the weights {'' if has else 'do not '}hold it"
            )
    H = hc.hidden_size
    if hidden_size is not None and H != hidden_size:
        raise _error(
            folder,
            f"head hidden size {H} does not fit the target's hidden size {hidden_size}",
            "was it trained for another model?",
        )
    if vocab_size is not None and int(config.get("vocab_size", vocab_size)) != vocab_size:
        raise _error(
            folder,
            f"head vocab {config['vocab_size']} != target vocab {vocab_size}",
            "was it trained for another model?",
        )
    want = _expected(hc)
    missing = sorted(set(want) - names)
    if missing:
        why = " (config.json: bias true, the official default)" if missing == ["fc.bias"] else ""
        raise _error(folder, f"missing tensors {missing}{why}; expected EAGLE-1 names (fc.*, layers.0.*)")
    unknown = sorted(names - set(want) - {EMBED, "d2t", "t2d"})
    if unknown:
        raise _unknown(folder, unknown[0])
    for name, shape_want in want.items():
        info = infos[name]
        if info.shape != shape_want or info.dtype not in _FLOATS:
            raise _error(
                folder,
                f"{name} is {list(info.shape)} {info.dtype}, expected {list(shape_want)} float "
                f"(hidden {H}, {hc.num_attention_heads} heads x {hc.head_dim}, {hc.num_key_value_heads} KV heads, "
                f"MLP {hc.intermediate_size}, from config.json)",
            )
    if EMBED in names:
        rows = vocab_size if vocab_size is not None else infos[EMBED].shape[0]
        if infos[EMBED].shape != (rows, H):
            raise _error(
                folder,
                f"{EMBED} is {list(infos[EMBED].shape)}, the target's embedding is [{rows}, {H}]",
                "was it trained for another model?",
            )
    Vd = int(config.get("draft_vocab_size") or hc.vocab_size)
    if "d2t" in names:
        if infos["d2t"].dtype not in _INTS or len(infos["d2t"].shape) != 1:
            raise _error(
                folder, f"d2t is {list(infos['d2t'].shape)} {infos['d2t'].dtype}, expected [draft vocab] int64"
            )
        Vd = infos["d2t"].shape[0]
    if not hc.vocab_size:
        rows = infos[EMBED].shape[0] if EMBED in names else 0
        hc = replace(hc, vocab_size=rows or Vd)
    hc = replace(hc, draft_vocab_size=Vd)
    if Vd > hc.vocab_size:
        raise _error(folder, f"draft vocabulary {Vd} > vocab {hc.vocab_size}")
    if Vd < hc.vocab_size and "d2t" not in names:
        raise _error(folder, f"draft_vocab_size {Vd} < vocab {hc.vocab_size} but no d2t tensor naming its tokens")
    return HeadFolder(
        folder=folder,
        layout=layout,
        config=config,
        weights=path,
        dtype=infos["fc.weight"].dtype,
        names=tuple(want),
        has_embed=EMBED in names,
        hc=hc,
    )


def load_head(hf: HeadFolder) -> dict[str, np.ndarray]:
    """The checked head's arrays (float32, whatever they were stored in) + d2t (absolute target ids);
    fc.bias zeros where it has none."""
    names = set(hf.names) | {"d2t", "t2d"}
    w = load_tensors(hf.weights, names=names)
    hc = hf.hc
    out = {k: w[k] for k in hf.names}
    if not hc.fc_bias:
        out["fc.bias"] = np.zeros(hc.hidden_size, np.float32)
    out["d2t"] = _read_d2t(hf.folder, w, hc.draft_vocab_size, hc.vocab_size, HeadFormatError)
    if "t2d" in w:  # EAGLE-3's mask of the draft tokens: must name the same set
        mask = np.zeros(hc.vocab_size, bool)
        mask[out["d2t"]] = True
        if w["t2d"].shape != mask.shape or not np.array_equal(w["t2d"].astype(bool), mask):
            raise _error(hf.folder, "t2d does not mark the tokens d2t lists")
    return out


def read_head(folder: str | Path, hidden_size: int, vocab_size: int) -> tuple[HeadConfig, dict[str, np.ndarray]]:
    """Read and check an EAGLE-1 head (either layout) against the target's sizes; float32 arrays + d2t (absolute)."""
    hf = inspect_head(folder, hidden_size, vocab_size)
    return hf.hc, load_head(hf)


def check_embedding(hf: HeadFolder, target_embed: np.ndarray) -> None:
    """An official head's embed_tokens (the official loader uses it in place of the target's) must be
    its target's: edgespec's head graph reads the target's. Equal up to the rounding of either copy
    (fp16/bf16 storage, a quantized GGUF target): relative error < 0.1; another model's embedding is
    ~1.4 away."""
    if not hf.has_embed:
        return
    head = load_tensors(hf.weights, names={EMBED})[EMBED]
    err = float(np.linalg.norm(head - target_embed) / max(float(np.linalg.norm(target_embed)), 1e-30))
    if err > 0.1:
        raise _error(
            hf.folder,
            f"its {EMBED} (the embedding the head was trained on) differs from the target's (relative error "
            f"{err:.3g}): it was trained for another model",
            "pass the head published for this exact target",
        )


# ---- writing -----------------------------------------------------------------------------------------
def save_head(head: EagleHead, folder: str | Path, extra: dict | None = None) -> Path:
    """edgespec's layout: config.json (LlamaConfig fields, the head's RoPE, draft_vocab_size; `extra`
    joins its `eagle` section) + model.safetensors in float16."""
    c = head.cfg
    arrays = head.state()
    fc_bias = c.fc_bias or bool(np.any(arrays["fc.bias"]))
    if not fc_bias:
        del arrays["fc.bias"]
    rope = {}
    if c.rope_theta is not None:
        rope["rope_theta"] = c.rope_theta
        if c.rope_type != "default":
            rope["rope_scaling"] = {"rope_type": c.rope_type, **dict(c.rope_params)}
    config = {
        "architectures": ["LlamaForCausalLM"],
        **c.llama_config(),
        **rope,
        "bias": fc_bias,
        **({"qkv_bias": True} if c.qkv_bias else {}),
        "hidden_act": "silu",
        "torch_dtype": "float16",
        "eagle": {
            "version": 1,
            "features": "final_norm",
            "input_layernorm": c.input_layernorm,
            "final_norm": c.final_norm,
        }
        | ({"d2t_order": "frequency"} if c.d2t_by_frequency else {})
        | (extra or {}),
    }
    return write_checkpoint(folder, arrays, config)


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
    kept = {k: v for k, v in hf.config.items() if k in _INERT and hf.layout == OFFICIAL}
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
        raise _error(
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


def is_eagle1_folder(folder: Path) -> bool:
    """Does `folder` hold an EAGLE-1 head in either layout (a config.json and tensors that pass
    `inspect_head`)? Never raises."""
    try:
        inspect_head(folder)
    except (HeadFormatError, OSError, ValueError, KeyError, TypeError):
        return False
    return True
