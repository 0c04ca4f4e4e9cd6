"""EAGLE-1/2 head checkpoints: the two layouts `--eagle` reads, checked before any weight loads
(`inspect_head`; config.json by config_json.py), read (`read_head`), and written (`save_head`:
edgespec's; publish.py writes the official one, for `edgespec export-drafter --format eagle1-official`).

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

from edgespec.export.drafters._files import (
    WeightsFileError,
    eps_problem,
    load_tensors,
    read_json,
    tensor_infos,
    weights_file,
)
from edgespec.export.drafters.eagle.config import BIAS_NAMES, HeadConfig
from edgespec.export.drafters.eagle.config_json import (
    EDGESPEC,
    OFFICIAL,
    check_keys,
    error,
    foreign,
    head_shape,
    rope,
)
from edgespec.export.train.checkpoint import CONFIG_FILE, HeadFormatError, _read_d2t, write_checkpoint

if TYPE_CHECKING:  # the module needs torch; reading and checking heads does not
    from edgespec.export.drafters.eagle.head import EagleHead

EMBED = "embed_tokens.weight"  # the official checkpoints' copy of the target's embedding
_FLOATS = {"F32", "F16", "BF16", "float32", "float16", "bfloat16"}
_INTS = {"I64", "I32", "int64", "int32"}


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
        return error(
            folder,
            "holds layers.0.self_attn.o_proj.bias: the official EAGLE class has no o_proj bias (its loader "
            "drops it), so which head was trained is unclear",
        )
    if name in BIAS_NAMES.values():
        return error(
            folder,
            f"holds {name} but config.json has no `qkv_bias: true`: the official EAGLE code then builds q/k/v "
            "without biases and its loader drops them",
            'add "qkv_bias": true to config.json if the head was trained with them (EAGLE heads for Qwen2 are)',
        )
    if name == "fc.bias":
        return error(
            folder,
            "holds fc.bias but config.json says `bias: false` (fc without bias; the official loader drops it)",
            "set bias to true if the head was trained with it",
        )
    if name.startswith("layers.") and not name.startswith("layers.0."):
        return error(folder, f"holds {name}: a second decoder layer; edgespec's EAGLE-1 heads have one")
    if name == "lm_head.weight":
        return error(
            folder,
            "holds lm_head.weight: an LM head of its own, which EAGLE-1/2 heads do not have (they draft "
            "through the target's)",
            "EAGLE-3 heads carry one: --eagle3-head",
        )
    return error(folder, f"holds {name}, a tensor an EAGLE-1 head does not compute with")


def inspect_head(folder: str | Path, hidden_size: int | None = None, vocab_size: int | None = None) -> HeadFolder:
    """The head folder's config.json and tensor names, shapes and dtypes (no weights read), checked
    against each other and, when given, against the target's hidden and vocabulary sizes."""
    folder = Path(folder)
    config, path, infos = _open(folder)
    names = set(infos)
    foreign(folder, config, names)
    layout = EDGESPEC if isinstance(config.get("eagle"), dict) else OFFICIAL
    hc = _head_config(folder, config, layout, names, vocab_size)
    H = hc.hidden_size
    if hidden_size is not None and H != hidden_size:
        raise error(
            folder,
            f"head hidden size {H} does not fit the target's hidden size {hidden_size}",
            "was it trained for another model?",
        )
    if vocab_size is not None and int(config.get("vocab_size", vocab_size)) != vocab_size:
        raise error(
            folder,
            f"head vocab {config['vocab_size']} != target vocab {vocab_size}",
            "was it trained for another model?",
        )
    want = _check_tensors(folder, hc, infos, vocab_size)
    return HeadFolder(
        folder=folder,
        layout=layout,
        config=config,
        weights=path,
        dtype=infos["fc.weight"].dtype,
        names=tuple(want),
        has_embed=EMBED in names,
        hc=_vocabularies(folder, config, hc, infos),
    )


def _open(folder: Path) -> tuple[dict, Path, dict]:
    """(config.json, the weights file, its tensors' names, shapes and dtypes); another drafter's folder is
    named by its config before its weights are opened."""
    if not (folder / CONFIG_FILE).exists():
        raise error(
            folder,
            f"no {CONFIG_FILE}; an EAGLE head folder holds config.json + pytorch_model.bin or model.safetensors",
        )
    try:
        config = read_json(folder / CONFIG_FILE)
        if not isinstance(config, dict):
            raise error(folder, f"{CONFIG_FILE} holds a {type(config).__name__}, not a config object")
        foreign(folder, config, set())  # another drafter's folder: said before its weights are opened
        path = weights_file(folder)
        infos = tensor_infos(path)
    except (WeightsFileError, json.JSONDecodeError) as e:
        raise HeadFormatError(str(e) if str(e).startswith(str(folder)) else f"{folder}: {e}") from e
    return config, path, infos


def _head_config(folder: Path, config: dict, layout: str, names: set[str], vocab_size: int | None) -> HeadConfig:
    """The head as config.json and its tensor names say it computes (vocabularies not yet settled)."""
    check_keys(folder, config, layout)
    shape = head_shape(folder, config, layout, vocab_size)
    theta, kind, params = rope(folder, config, layout)
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
        raise error(folder, f"config.json: {eps_problem(hc.rms_norm_eps)}")
    for flag, has in (("input_layernorm", hc.input_layernorm), ("final_norm", hc.final_norm)):
        if flag in e and bool(e[flag]) != has:
            raise error(
                folder, f"eagle.{flag} is {e[flag]} in config.json but the weights {'' if has else 'do not '}hold it"
            )
    return hc


def _check_tensors(folder: Path, hc: HeadConfig, infos: dict, vocab_size: int | None) -> dict[str, tuple[int, ...]]:
    """The tensors the head computes with (name -> shape), every one present in float at its shape,
    nothing else held but the target's embedding copy, d2t and t2d."""
    names, H = set(infos), hc.hidden_size
    want = _expected(hc)
    missing = sorted(set(want) - names)
    if missing:
        why = " (config.json: bias true, the official default)" if missing == ["fc.bias"] else ""
        raise error(folder, f"missing tensors {missing}{why}; expected EAGLE-1 names (fc.*, layers.0.*)")
    unknown = sorted(names - set(want) - {EMBED, "d2t", "t2d"})
    if unknown:
        raise _unknown(folder, unknown[0])
    for name, shape_want in want.items():
        info = infos[name]
        if info.shape != shape_want or info.dtype not in _FLOATS:
            raise error(
                folder,
                f"{name} is {list(info.shape)} {info.dtype}, expected {list(shape_want)} float "
                f"(hidden {H}, {hc.num_attention_heads} heads x {hc.head_dim}, {hc.num_key_value_heads} KV heads, "
                f"MLP {hc.intermediate_size}, from config.json)",
            )
    if EMBED in names:
        rows = vocab_size if vocab_size is not None else infos[EMBED].shape[0]
        if infos[EMBED].shape != (rows, H):
            raise error(
                folder,
                f"{EMBED} is {list(infos[EMBED].shape)}, the target's embedding is [{rows}, {H}]",
                "was it trained for another model?",
            )
    return want


def _vocabularies(folder: Path, config: dict, hc: HeadConfig, infos: dict) -> HeadConfig:
    """hc with its vocabulary (from the embedding copy or the draft's when config.json has none) and its
    draft vocabulary (d2t's length) settled and checked."""
    names = set(infos)
    Vd = int(config.get("draft_vocab_size") or hc.vocab_size)
    if "d2t" in names:
        if infos["d2t"].dtype not in _INTS or len(infos["d2t"].shape) != 1:
            raise error(folder, f"d2t is {list(infos['d2t'].shape)} {infos['d2t'].dtype}, expected [draft vocab] int64")
        Vd = infos["d2t"].shape[0]
    if not hc.vocab_size:
        rows = infos[EMBED].shape[0] if EMBED in names else 0
        hc = replace(hc, vocab_size=rows or Vd)
    hc = replace(hc, draft_vocab_size=Vd)
    if Vd > hc.vocab_size:
        raise error(folder, f"draft vocabulary {Vd} > vocab {hc.vocab_size}")
    if Vd < hc.vocab_size and "d2t" not in names:
        raise error(folder, f"draft_vocab_size {Vd} < vocab {hc.vocab_size} but no d2t tensor naming its tokens")
    return hc


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
            raise error(hf.folder, "t2d does not mark the tokens d2t lists")
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
        raise error(
            hf.folder,
            f"its {EMBED} (the embedding the head was trained on) differs from the target's (relative error "
            f"{err:.3g}): it was trained for another model",
            "pass the head published for this exact target",
        )


# ---- writing edgespec's layout ----------------------------------------------------------------------------
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


def is_eagle1_folder(folder: Path) -> bool:
    """Does `folder` hold an EAGLE-1 head in either layout (a config.json and tensors that pass
    `inspect_head`)? Never raises."""
    try:
        inspect_head(folder)
    except (HeadFormatError, OSError, ValueError, KeyError, TypeError):
        return False
    return True
