"""EAGLE-3 heads in the layouts their projects publish: which one a folder holds (`detect`, from its
config.json and tensor names alone), its config and tensor shapes checked against a target before
any weight is read (`inspect`, then `Eagle3Checkpoint.check`: what the export's preflight runs), its
tensors under edgespec's names (`read`), and a head written in another project's layout (`publish`).

Layouts (the ids `edgespec export-drafter` and the tests use):
  eagle3-edgespec     `edgespec train-eagle3`: LlamaForCausalLMEagle3 plus an `eagle3` section,
                      model.safetensors in fp16 (head.py)
  eagle3-official     SafeAILab EAGLE (package `eagle`, eagle/model/cnets.py Model): architectures
                      LlamaForCausalLM, pytorch_model.bin read first (its loader's order), midlayer.*,
                      d2t/t2d, fp16; RoPE theta 10000 when the config sets none; head_dim = H / heads
  eagle3-specforge    SpecForge (LlamaForCausalLMEagle3, specforge/modeling/draft/llama3_eagle.py):
                      midlayer.*, its own embed_tokens, bf16; fc_norm, norm_output, target_hidden_size
  eagle3-speculators  vLLM speculators 0.9 (Eagle3DraftModel; config architectures Eagle3Speculator or
                      Eagle3DraftModel): transformer_layer_config, speculators_config, layers.0.* with
                      hidden_norm, norm_before_residual, norm_before_fc, fc_norm, norm_output,
                      embed_tokens, lm_head, d2t, t2d
Tensors are read under edgespec's names (head.py: fc, midlayer.*, norm, lm_head, d2t absolute), plus
embed_tokens.weight (the head's own table, used in place of the target's) and fc_norm.weight (the
features' RMSNorm weight, one vector over all n*Ht features: per-layer norms concatenated).

The same config key means different things in different projects, so each is read by its own
project's code: SpecForge's norm_output (default true) is whether the logits see the final norm;
speculators' norm_output (default false) is whether the NORMED output is fed to the next step (the
logits see the norm either way). Keys no reader here knows are refused, not ignored (`_no_unknown`).

Aux layer ids. edgespec's convention (GraphOptions.aux_layers): id i = the residual stream ENTERING
target layer i = Hugging Face's output_hidden_states[i]. Each project's, resolved:
  edgespec     eagle_config.eagle_aux_hidden_state_layer_ids are entering ids (eagle3.features says so)
  official     none in the config: its target code (eagle/model/modeling_llama_kv.py) appends the
               stream entering layers 2, L//2 and L-3 in layer order: entering (2, L//2, L-3)
  SpecForge    eagle_config.eagle_aux_hidden_state_layer_ids are SGLang's: SGLang captures
               `layers_to_capture = [i + 1 for i in ids]`, the stream entering layer i+1, i.e. the
               OUTPUT of layer i: entering i+1. None: SGLang's default, entering (2, L//2, L-3)
  speculators  eagle_aux_hidden_state_layer_ids as vLLM reads them (set_aux_hidden_state_layers:
               aux id i = hidden_states + residual before layer i): entering i. None: vLLM's and
               speculators' default (2, L//2, L-3). Id L (the last layer's output) is refused: the
               target graphs output the streams entering layers 0..L-1
Written back out (`publish`), ids take the written layout's convention.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from edgespec.export.drafters._files import (
    HF_INERT,
    WEIGHT_NAMES,
    TensorInfo,
    WeightsFileError,
    eps_problem,
    load_tensors,
    read_json,
    tensor_infos,
    unknown_keys,
    weights_file,
)
from edgespec.export.drafters.eagle3.config import (
    ARCHITECTURE,
    LAYER_NAMES,
    NORM_NAMES,
    Eagle3Config,
    Eagle3FormatError,
)

LAYOUTS = ("eagle3-edgespec", "eagle3-official", "eagle3-specforge", "eagle3-speculators")
FORMATS = ("speculators", "eagle3-official")  # what `publish` writes (`edgespec export-drafter --format`)
SPECULATORS_ARCHS = ("Eagle3Speculator", "Eagle3DraftModel")
# the official loader (eagle/model/ea_model.py) tries pytorch_model.bin first, then model.safetensors
OFFICIAL_WEIGHTS = (
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
    "model.safetensors",
    "model.safetensors.index.json",
)
CORE = ("fc.weight", *LAYER_NAMES.values(), *NORM_NAMES.values(), "lm_head.weight")  # edgespec's names
FLOAT_DTYPES = ("F32", "F16", "BF16", "float32", "float16", "bfloat16")
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


def _config(folder: Path) -> dict | None:
    """The folder's config.json (None: there is none); a file that cannot be a config (a device, a FIFO,
    not JSON) is refused here with its own reason rather than taken for another layout."""
    path = folder / "config.json"
    if not path.exists() and not path.is_symlink():
        return None
    return read_json(path)


def detect(folder: Path) -> str | None:
    """The EAGLE-3 layout the folder holds (LAYOUTS), from its config.json and, for the official
    layout (whose config names plain LlamaForCausalLM), its tensor names; None: not an EAGLE-3 head."""
    cfg = _config(folder)
    if cfg is None:
        return None
    archs = cfg.get("architectures") or []
    if cfg.get("speculators_model_type") == "eagle3" or set(archs) & set(SPECULATORS_ARCHS):
        return "eagle3-speculators"
    if ARCHITECTURE in archs:
        return "eagle3-edgespec" if isinstance(cfg.get("eagle3"), dict) else "eagle3-specforge"
    if cfg.get("speculators_model_type"):  # another speculators method (DFlash, MTP): not ours
        return None
    try:
        names = tensor_infos(weights_file(folder, OFFICIAL_WEIGHTS))
    except (WeightsFileError, OSError, ValueError):
        return None
    return "eagle3-official" if any(n.startswith("midlayer.") for n in names) else None


@dataclass(frozen=True)
class Eagle3Checkpoint:
    """An EAGLE-3 head folder read as far as its config and tensor shapes (no weights)."""

    folder: Path  # the checkpoint folder
    layout: str  # one of LAYOUTS
    config: dict  # its config.json
    weights: Path  # its weights file
    infos: dict[str, TensorInfo]  # stored name -> shape and dtype
    names: dict[str, str]  # edgespec name -> stored name, of every tensor it reads (fc_norm.weight: fc_norm_names)
    fc_norm_names: tuple[str, ...]  # stored names of the features' norm weights, in feature order (): none
    ec: Eagle3Config  # the head; aux_layers entering ids, () where the layout leaves them to the target

    def check(
        self, hidden_size: int | None, vocab_size: int | None, n_layers: int | None, max_len: int | None = None
    ) -> Eagle3Config:
        """The head checked against a target's numbers and the export's --max-len (None: unknown,
        unchecked), its aux layers resolved for a target of n_layers; Eagle3FormatError says what does
        not fit. A key window of at least max_len is full attention; a smaller one is refused (the head
        graph attends to every cached position)."""
        ec, f = self.ec, self.folder
        if max_len is not None and 0 < ec.sliding_window < max_len:
            raise Eagle3FormatError(
                f"{f}: its layer is sliding_attention with sliding_window={ec.sliding_window}, smaller than "
                f"--max-len {max_len} (edgespec's head graph attends to every position); export with --max-len "
                f"<= {ec.sliding_window}"
            )
        if hidden_size is not None and ec.feature_width != hidden_size:
            raise Eagle3FormatError(
                f"{f}: the head's fc reads features of width {ec.feature_width} (fc.weight "
                f"{self.infos[self.names['fc.weight']].shape}), the target's hidden size is {hidden_size}; was it "
                "trained for another model? Hint: pass the head published for this target"
            )
        if vocab_size is not None and ec.vocab_size != vocab_size:
            raise Eagle3FormatError(
                f"{f}: the head's vocabulary has {ec.vocab_size} tokens, the target's {vocab_size}; was it trained "
                "for another model? Hint: pass the head published for this target"
            )
        aux = resolve_aux(ec, n_layers, f) if n_layers else ec.aux_layers
        return dataclasses.replace(ec, aux_layers=aux, n_aux=0 if aux else ec.n_aux)  # n_aux: len(aux) then

    def load(self) -> dict[str, np.ndarray]:
        """Its tensors under edgespec's names: floats as float32 (fp16/bf16 widened exactly), d2t
        absolute target ids (checked against t2d when it has one), fc_norm.weight [n*Ht] concatenated."""
        ec, f = self.ec, self.folder
        stored = load_tensors(self.weights, set(self.names.values()) | set(self.fc_norm_names))
        out = {ours: stored[theirs] for ours, theirs in self.names.items() if ours not in ("d2t", "t2d")}
        if self.fc_norm_names:
            out["fc_norm.weight"] = np.concatenate([stored[n] for n in self.fc_norm_names])
        vd, v = ec.draft_vocab_size, ec.vocab_size
        if vd == v and ("d2t" not in self.names or self.layout == "eagle3-official"):
            out["d2t"] = np.arange(v, dtype=np.int64)  # the whole vocabulary in order (the official code drops d2t)
        else:
            d2t = stored[self.names["d2t"]].astype(np.int64) + np.arange(vd)  # EAGLE-3: target = i + d2t[i]
            if d2t.min() < 0 or d2t.max() >= v or len(np.unique(d2t)) != vd:
                raise Eagle3FormatError(
                    f"{f}: d2t maps draft tokens to ids outside 0..{v - 1} or twice to one id; {HINT}"
                )
            if "t2d" in self.names:
                t2d = stored[self.names["t2d"]].astype(bool)
                if int(t2d.sum()) != vd or not t2d[d2t].all():
                    raise Eagle3FormatError(
                        f"{f}: t2d marks {int(t2d.sum())} tokens, not the {vd} draft tokens d2t maps to; {HINT}"
                    )
            out["d2t"] = d2t
        return out


def resolve_aux(ec: Eagle3Config, n_layers: int, folder: Path | str = "") -> tuple[int, ...]:
    """The head's aux layers (entering ids) for a target of n_layers, checked against its fc and the
    target's depth; Eagle3FormatError when they cannot be the target's."""
    from edgespec.export.target import spec as es

    default = es.aux_layers(n_layers)
    ids = ec.aux_layers or default
    if ec.layout == "eagle3-official":  # its target code: the streams entering 2, L//2, L-3 (deduplicated)
        ids = tuple(sorted({2, n_layers // 2, n_layers - 3}))
    if ec.layout == "eagle3-edgespec" and ids != default:
        raise Eagle3FormatError(
            f"{folder}: the head fuses layers {ids}; edgespec's target graphs output the streams entering "
            f"layers {default} of this {n_layers}-layer target. Hint: train the head with `edgespec train-eagle3` "
            "for this target"
        )
    if len(ids) != ec.n_blocks:
        raise Eagle3FormatError(
            f"{folder}: fc reads {ec.n_blocks} feature blocks but the head names {len(ids)} target layers "
            f"({list(ids)}) for this {n_layers}-layer target; was it trained for another model?"
        )
    if max(ids) == n_layers and min(ids) >= 0:  # only the last one past the graphs': not another model's ids
        raise Eagle3FormatError(
            f"{folder}: the head reads target layer {n_layers} (its {ec.layout} ids resolved to {list(ids)}): the "
            f"last layer's output (speculators' --include-last-layer), which is not available as an aux layer: "
            f"the target graphs output the streams entering layers 0..{n_layers - 1}. Hint: train the head on "
            "layers below the last"
        )
    if min(ids) < 0 or max(ids) >= n_layers:
        raise Eagle3FormatError(
            f"{folder}: the head reads the streams entering target layers {list(ids)} (its {ec.layout} ids "
            f"resolved), outside this {n_layers}-layer target's 0..{n_layers - 1}; was it trained for another "
            "model? Hint: pass the head published for this target"
        )
    return tuple(ids)


# ---- reading a folder ------------------------------------------------------------------------------
def _refuse(folder: Path, what: str) -> Eagle3FormatError:
    return Eagle3FormatError(f"{folder}: {what}")


def _no_unknown(folder: Path, cfg: dict, known: frozenset | set, where: str) -> None:
    """Refuse keys no reader here interprets: they may change the computation."""
    extra = sorted(unknown_keys(cfg, known, HARMLESS))
    if extra:
        raise _refuse(
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
            raise _refuse(
                folder, f"rope_parameters {params}: the official EAGLE-3 code reads rope_theta and rope_scaling only"
            )
        if sc is None:
            return dict(rope_theta=theta, rope_type="default", rope_params=())
        if sc.get("type") == "linear" and "factor" in sc:
            return dict(rope_theta=theta, rope_type="linear", rope_params=(("factor", float(sc["factor"])),))
        raise _refuse(
            folder,
            f"rope_scaling {sc}: of the official EAGLE-3 code's RoPE scalings edgespec computes 'linear' only "
            "('dynamic' rescales past max_position_embeddings at run time)",
        )
    params = dict(cfg.get("rope_parameters") or {})
    if "full_attention" in params or "sliding_attention" in params:
        raise _refuse(folder, "per-layer-type rope_parameters: an EAGLE-3 head has one layer, one RoPE")
    params.update(cfg.get("rope_scaling") or {})
    theta = float(params.pop("rope_theta", None) or cfg.get("rope_theta") or 10000.0)
    kind = params.pop("rope_type", None) or params.pop("type", None) or "default"
    params.pop("type", None)
    if kind not in ROPE_TYPES:
        raise _refuse(folder, f"RoPE type {kind!r}: the head's tables compute {', '.join(ROPE_TYPES)} only")
    partial = float(params.pop("partial_rotary_factor", None) or cfg.get("partial_rotary_factor") or 1.0)
    if partial != 1.0:
        raise _refuse(folder, f"partial_rotary_factor {partial}: the head rotates whole heads only")
    missing = [k for k in ROPE_KEYS[kind] if not isinstance(params.get(k), int | float)]
    if missing:
        raise _refuse(folder, f"RoPE type {kind!r} without {', '.join(missing)}")
    return dict(rope_theta=theta, rope_type=kind, rope_params=tuple(sorted((k, params[k]) for k in ROPE_KEYS[kind])))


def _layer(folder: Path, cfg: dict, where: str, official: bool = False) -> dict:
    """Eagle3Config's shape and RoPE fields from a Llama decoder layer's config (`where` names it)."""
    need = [k for k in ("hidden_size", "intermediate_size", "num_attention_heads", "vocab_size") if k not in cfg]
    if need:
        raise _refuse(folder, f"{where} lacks {', '.join(need)}; {HINT}")
    if int(cfg.get("num_hidden_layers") or 1) != 1:
        raise _refuse(
            folder,
            f"{where} has num_hidden_layers {cfg['num_hidden_layers']}: edgespec's EAGLE-3 head graph has one "
            "decoder layer (EAGLE-3's)",
        )
    if cfg.get("model_type", "llama") != "llama":
        raise _refuse(
            folder,
            f"{where} has a {cfg['model_type']!r} decoder layer: edgespec's EAGLE-3 head graph computes a Llama "
            "layer (no q/k norms, no biases)",
        )
    if (cfg.get("hidden_act") or "silu") != "silu":
        raise _refuse(folder, f"{where} has hidden_act {cfg['hidden_act']!r}: the head's MLP is SwiGLU (silu) only")
    for key in ("attention_bias", "mlp_bias"):
        if cfg.get(key):
            raise _refuse(folder, f"{where} sets {key}: the head's projections have no biases")
    if cfg.get("tie_word_embeddings"):
        raise _refuse(
            folder, f"{where} sets tie_word_embeddings: an EAGLE-3 head's lm_head is its own (draft vocabulary)"
        )
    kinds = list(cfg.get("layer_types") or [])
    if set(kinds) - {"full_attention", "sliding_attention"}:
        raise _refuse(folder, f"{where} has layer_types {kinds}: the head's layer is full or sliding attention")
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
        raise _refuse(folder, f"eagle_config {ec!r} is not a mapping; {HINT}")
    _no_unknown(folder, ec, {"eagle_aux_hidden_state_layer_ids", "use_aux_hidden_state"}, "eagle_config")
    if ec.get("use_aux_hidden_state") is False:
        raise _refuse(
            folder,
            "eagle_config.use_aux_hidden_state is false: the head reads the target's last hidden state, not "
            "EAGLE-3's fused layer features. Hint: an EAGLE-1/2 head goes to --eagle",
        )
    ids = ec.get("eagle_aux_hidden_state_layer_ids")
    return None if ids is None else _ids(folder, ids)


def _ids(folder: Path, ids) -> tuple[int, ...]:
    if not isinstance(ids, list) or not ids or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
        raise _refuse(folder, f"aux layer ids {ids!r} are not a list of layer numbers; {HINT}")
    twice = sorted({i for i in ids if ids.count(i) > 1})
    if twice:
        raise _refuse(
            folder,
            f"aux layer ids {ids} name layer(s) {twice} more than once: the target graphs output each layer's "
            "features once, and a head trained on one layer's copies reads nothing the others do not. Hint: "
            "give each feature block its own layer",
        )
    return tuple(ids)


def _read_config(folder: Path, layout: str, cfg: dict) -> tuple[dict, dict]:
    """(Eagle3Config fields but n_aux and the sizes the tensors say, variant flags) of a layout's config."""
    if layout == "eagle3-speculators":
        layer = cfg.get("transformer_layer_config")
        if not isinstance(layer, dict):
            raise _refuse(folder, f"a speculators config without transformer_layer_config; {HINT}")
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
            raise _refuse(folder, "tie_word_embeddings: an EAGLE-3 head's lm_head is its own (draft vocabulary)")
        if cfg.get("speculators_model_type", "eagle3") != "eagle3":
            raise _refuse(folder, f"speculators_model_type {cfg['speculators_model_type']!r} is not eagle3")
        if cfg.get("norm_before_fc") and cfg.get("fc_norm"):
            raise _refuse(folder, "norm_before_fc and fc_norm both set (speculators refuses the pair too)")
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
        return fields, {}
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
        raise _refuse(
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


def _stored(layout: str, name: str) -> str:
    """A tensor's name in the layout, from edgespec's."""
    if layout == "eagle3-speculators" and name.startswith("midlayer."):
        return "layers.0." + name.removeprefix("midlayer.")
    return name


def inspect(folder: Path) -> Eagle3Checkpoint:
    """The folder's layout, config and tensor shapes checked against each other (no weights read)."""
    folder = Path(folder)
    layout = detect(folder)
    if layout is None:
        _readable(folder)  # a damaged weights file is said as such, not as another layout
        raise _refuse(
            folder,
            "not an EAGLE-3 head in a layout edgespec reads (official EAGLE, SpecForge, vLLM speculators, "
            "`edgespec train-eagle3`): its config.json declares none of LlamaForCausalLMEagle3, Eagle3Speculator, "
            "Eagle3DraftModel and its weights hold no midlayer.* tensors. Hint: an EAGLE-1/2 head goes to --eagle",
        )
    cfg = _config(folder)
    fields, _ = _read_config(folder, layout, cfg)
    if eps_problem(fields["rms_norm_eps"]):
        raise _refuse(folder, f"config.json: {eps_problem(fields['rms_norm_eps'])}")
    names = WEIGHT_NAMES if layout != "eagle3-official" else OFFICIAL_WEIGHTS
    path = weights_file_of(folder, names)
    try:
        infos = tensor_infos(path)
    except WeightsFileError as e:  # cut short, a bad header: its message names the file
        raise Eagle3FormatError(str(e)) from e
    except (ValueError, OSError, EOFError) as e:
        raise _refuse(folder, f"its {path.name} cannot be read ({type(e).__name__}: {e}); {HINT}") from e
    want = {ours: _stored(layout, ours) for ours in CORE}
    missing = [theirs for theirs in want.values() if theirs not in infos]
    if missing:
        raise _refuse(folder, f"its {path.name} lacks {', '.join(missing[:4])} of the {layout} layout; {HINT}")
    for opt in ("embed_tokens.weight", "d2t", "t2d"):
        if opt in infos:
            want[opt] = opt
    fc_norm = fields.get("fc_norm", "none")
    H = fields["hidden_size"]
    fc_shape = infos[want["fc.weight"]].shape
    if len(fc_shape) != 2 or fc_shape[0] != H:
        raise _refuse(folder, f"fc.weight {fc_shape} is not [hidden_size {H}, n*features]; {HINT}")
    Ht = fields["target_hidden_size"] or H
    n_aux = fc_shape[1] // Ht
    if n_aux * Ht != fc_shape[1] or n_aux < 1:
        raise _refuse(
            folder,
            f"fc.weight {fc_shape} does not read whole feature blocks of width {Ht} "
            f"({'target_hidden_size' if fields['target_hidden_size'] else 'hidden_size'}); {HINT}",
        )
    if layout == "eagle3-official" and n_aux != 3:
        raise _refuse(folder, f"fc.weight {fc_shape} reads {n_aux} feature blocks; the official EAGLE-3 code feeds 3")
    norm_names: tuple[str, ...] = ()
    if fc_norm == "per_layer":
        norm_names = tuple(f"fc_norm.{i}.weight" for i in range(n_aux))
    elif fc_norm == "whole":
        norm_names = ("input_norm.weight",)
    ignored = {"verifier_norm.weight", "verifier_lm_head.weight"} if layout == "eagle3-speculators" else set()
    unknown = sorted(set(infos) - set(want.values()) - set(norm_names) - ignored)
    if unknown:
        hint = (
            " (an fc norm the config does not turn on)"
            if any(n.startswith(("fc_norm.", "input_norm.")) for n in unknown)
            else ""
        )
        raise _refuse(
            folder,
            f"its {path.name} holds tensor(s) {', '.join(unknown[:4])}{hint} that the {layout} layout does not "
            f"have; as they may change what the head computes, it is refused. {HINT}",
        )
    missing = [n for n in norm_names if n not in infos]
    if missing:
        raise _refuse(folder, f"the config turns on an fc norm but the weights lack {', '.join(missing)}")
    own_embed = "embed_tokens.weight" in want
    if fields["aux_layers"] and len(fields["aux_layers"]) != n_aux:
        raise _refuse(
            folder,
            f"fc.weight {fc_shape} reads {n_aux} feature blocks but the config names {len(fields['aux_layers'])} "
            f"target layers ({list(fields['aux_layers'])}); {HINT}",
        )
    ec = Eagle3Config(
        **fields,
        n_aux=0 if fields["aux_layers"] else n_aux,
        own_embed=own_embed,
        layout=layout,
    )
    _check_shapes(folder, ec, infos, want, norm_names)
    return Eagle3Checkpoint(folder, layout, cfg, path, infos, want, norm_names, ec)


def _check_shapes(folder: Path, ec: Eagle3Config, infos: dict, names: dict, norm_names: tuple) -> None:
    H, I, d = ec.hidden_size, ec.intermediate_size, ec.head_dim
    nq, nkv = ec.num_attention_heads * d, ec.num_key_value_heads * d
    if ec.num_attention_heads % ec.num_key_value_heads:
        raise _refuse(folder, f"{ec.num_attention_heads} attention heads over {ec.num_key_value_heads} KV heads")
    want = {
        "midlayer.self_attn.q_proj.weight": (nq, 2 * H),
        "midlayer.self_attn.k_proj.weight": (nkv, 2 * H),
        "midlayer.self_attn.v_proj.weight": (nkv, 2 * H),
        "midlayer.self_attn.o_proj.weight": (H, nq),
        "midlayer.mlp.gate_proj.weight": (I, H),
        "midlayer.mlp.up_proj.weight": (I, H),
        "midlayer.mlp.down_proj.weight": (H, I),
        "lm_head.weight": (ec.draft_vocab_size, H),
    } | {n: (H,) for n in NORM_NAMES.values()}
    if ec.own_embed:
        want["embed_tokens.weight"] = (ec.vocab_size, H)
    for ours, shape in want.items():
        got = infos[names[ours]]
        if got.shape != shape or got.dtype not in FLOAT_DTYPES:
            raise _refuse(
                folder,
                f"{names[ours]} is {got.dtype} {list(got.shape)}, the config says float {list(shape)}; {HINT}",
            )
    for n in norm_names:
        w = ec.aux_width // len(norm_names)
        if infos[n].shape != (w,):
            raise _refuse(folder, f"{n} is {list(infos[n].shape)}, the features' norm is over {w}")
    if ec.feature_width != H and not ec.own_embed:
        raise _refuse(
            folder,
            f"the head's width {H} differs from the target's {ec.feature_width} (target_hidden_size) but it has no "
            "embed_tokens.weight of its own: the target's embedding table does not fit it. Hint: re-save the head "
            "with its embedding (SpecForge's export does)",
        )
    vd, v = ec.draft_vocab_size, ec.vocab_size
    if vd > v:
        raise _refuse(folder, f"draft_vocab_size {vd} exceeds vocab_size {v}")
    if vd < v:
        if "d2t" not in names:
            raise _refuse(folder, f"draft_vocab_size {vd} < vocab_size {v} but no d2t tensor maps draft to target ids")
        if infos["d2t"].shape != (vd,) or infos["d2t"].dtype in FLOAT_DTYPES:
            raise _refuse(folder, f"d2t is {infos['d2t'].dtype} {list(infos['d2t'].shape)}, not integer [{vd}]")
        if "t2d" in names and infos["t2d"].shape != (v,):
            raise _refuse(folder, f"t2d is {list(infos['t2d'].shape)}, not [vocab_size {v}]")


def _readable(folder: Path) -> None:
    """Eagle3FormatError when the folder's weights file is there but damaged (cut short, a bad header)."""
    try:
        path = weights_file(folder, OFFICIAL_WEIGHTS)
    except WeightsFileError:
        return
    try:
        tensor_infos(path)
    except WeightsFileError as e:
        raise Eagle3FormatError(str(e)) from e


def weights_file_of(folder: Path, names: tuple[str, ...]) -> Path:
    try:
        return weights_file(folder, names)
    except WeightsFileError as e:
        raise Eagle3FormatError(str(e)) from e


def read(folder: Path, hidden_size: int, vocab_size: int, n_layers: int | None = None):
    """(Eagle3Config checked and resolved for the target, arrays under edgespec's names, config.json's
    `eagle3` training record) of a head in any layout."""
    ck = inspect(folder)
    ec = ck.check(hidden_size, vocab_size, n_layers)
    return ec, ck.load(), dict(ck.config.get("eagle3") or {}) if ck.layout == "eagle3-edgespec" else {}


# ---- writing another project's layout -------------------------------------------------------------
def _torch_dtype(info: TensorInfo):
    import torch

    return {
        "F32": torch.float32,
        "float32": torch.float32,
        "F16": torch.float16,
        "float16": torch.float16,
        "BF16": torch.bfloat16,
        "bfloat16": torch.bfloat16,
    }[info.dtype]


def _tensors(ck: Eagle3Checkpoint, arrays: dict[str, np.ndarray], rename) -> dict:
    """Torch tensors under the written layout's names (`rename`), each float in the dtype it was stored
    in (nothing rounded), d2t relative and t2d when the draft vocabulary is a subset."""
    import torch

    ec, out = ck.ec, {}
    for ours in (*CORE, "embed_tokens.weight"):
        if ours in arrays:
            out[rename(ours)] = torch.from_numpy(arrays[ours]).to(_torch_dtype(ck.infos[ck.names[ours]]))
    if ec.draft_vocab_size < ec.vocab_size:
        d2t = arrays["d2t"]
        t2d = np.zeros(ec.vocab_size, bool)
        t2d[d2t] = True
        out["d2t"] = torch.from_numpy(d2t - np.arange(len(d2t)))
        out["t2d"] = torch.from_numpy(t2d)
    return out


def _refuse_publish(ck: Eagle3Checkpoint, fmt: str, what: str):
    from edgespec.export.target.spec import ExportError

    return ExportError(f"{ck.folder} ({ck.layout}) cannot be written as {fmt}: {what}")


def publish(folder: Path, fmt: str, out: Path, verifier: str | None = None) -> Path:
    """The head in `folder` (any layout `inspect` reads) written into the new folder `out` in layout
    `fmt` (FORMATS), every float in the dtype it is stored in; what the layout cannot carry is refused
    (ExportError) before anything is written. verifier (speculators): the target model speculators'
    from_pretrained reads (`_verifier`)."""
    from edgespec.export.target.spec import ExportError

    if fmt not in FORMATS:
        raise ExportError(f"--format {fmt}: the EAGLE-3 layouts written are {', '.join(FORMATS)}")
    try:
        ck = inspect(Path(folder))
    except Eagle3FormatError as e:
        raise ExportError(str(e)) from e
    ec = ck.ec
    if fmt == "speculators":
        config, rename = _speculators_config(ck, verifier), lambda n: _stored("eagle3-speculators", n)
    else:
        config, rename = _official_config(ck), lambda n: n
    try:
        arrays = ck.load()
    except (Eagle3FormatError, WeightsFileError) as e:
        raise ExportError(str(e)) from e
    tensors = _tensors(ck, arrays, rename)
    if "fc_norm.weight" in arrays:  # speculators only (the official layout refused it)
        import torch

        w = torch.from_numpy(arrays["fc_norm.weight"]).to(_torch_dtype(ck.infos[ck.fc_norm_names[0]]))
        if ec.fc_norm == "whole":
            tensors["input_norm.weight"] = w
        else:
            tensors |= {f"fc_norm.{i}.weight": b for i, b in enumerate(w.chunk(ec.n_blocks))}
    out = Path(out)
    out.mkdir(parents=True)
    if fmt == "speculators":
        from safetensors.torch import save_file

        save_file({k: v.contiguous() for k, v in tensors.items()}, str(out / "model.safetensors"))
    else:
        import torch

        torch.save(tensors, out / "pytorch_model.bin")  # the official loader's first choice
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    if fmt == "speculators" and config["speculators_config"]["verifier"]["name_or_path"] is None:
        import sys

        print(
            f"edgespec: {folder} names no target model, so the speculators config's verifier is null: vLLM does not "
            "read it, speculators' from_pretrained does. Hint: pass --verifier NAME_OR_PATH (hub id or folder)",
            file=sys.stderr,
        )
    return out


def _llama_layer(ec: Eagle3Config) -> dict:
    """The head's decoder layer as a LlamaConfig dict (rope_parameters: transformers 5's form)."""
    return {
        "model_type": "llama",
        "hidden_size": ec.hidden_size,
        "intermediate_size": ec.intermediate_size,
        "num_attention_heads": ec.num_attention_heads,
        "num_key_value_heads": ec.num_key_value_heads,
        "head_dim": ec.head_dim,
        "num_hidden_layers": 1,
        "rms_norm_eps": ec.rms_norm_eps,
        "vocab_size": ec.vocab_size,
        "hidden_act": "silu",
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": False,
        "rope_parameters": {"rope_type": ec.rope_type, "rope_theta": ec.rope_theta, **dict(ec.rope_params)},
    } | ({"layer_types": ["sliding_attention"], "sliding_window": ec.sliding_window} if ec.sliding_window else {})


def _verifier(ck: Eagle3Checkpoint, given: str | None) -> dict:
    """speculators' VerifierConfig of the head: `given` (--verifier), else the one the folder records (a
    speculators config's verifier; edgespec's training record's target, a packaged model by its hub id).
    speculators' from_pretrained reads the verifier's config.json (hidden size, depth) and fills the
    weights the head lacks (its embedding) from the verifier's weights, so a local folder is checked
    against the head here and written as an absolute path; a hub id is written as given."""
    from edgespec.export.drafters.medusa.publish import HF_IDS

    recorded = (ck.config.get("speculators_config") or {}).get("verifier") or {}
    target = (ck.config.get("eagle3") or {}).get("target") if ck.layout == "eagle3-edgespec" else None
    name = given or recorded.get("name_or_path") or (HF_IDS.get(target, target) if target else None)
    archs = list(recorded.get("architectures") or [])
    path = Path(name).expanduser() if name else None
    if path is None or not path.exists():
        if given and (given.startswith((".", "/", "~")) or given.count("/") != 1):
            raise _refuse_publish(ck, "speculators", f"--verifier {given}: no such folder, nor a hub id (org/name)")
        return {"name_or_path": name, "architectures": archs}
    try:
        cfg = read_json(path / "config.json")
    except (OSError, ValueError) as e:
        raise _refuse_publish(
            ck,
            "speculators",
            f"verifier {name}: no readable config.json ({type(e).__name__}); speculators' from_pretrained reads "
            "the target's config and weights from it. Hint: pass --verifier with the target's Hugging Face folder",
        ) from e
    cfg = cfg.get("text_config") or cfg  # multimodal wrappers: speculators reads the text model's
    wrong = [
        f"{k} {cfg.get(k)} (the head's {v})"
        for k, v in (("hidden_size", ck.ec.feature_width), ("vocab_size", ck.ec.vocab_size))
        if cfg.get(k) != v
    ]
    if wrong:
        raise _refuse_publish(ck, "speculators", f"verifier {name} has {', '.join(wrong)}: another model's")
    return {"name_or_path": str(path.resolve()), "architectures": list(cfg.get("architectures") or archs)}


def _speculators_config(ck: Eagle3Checkpoint, verifier: str | None = None) -> dict:
    """An Eagle3SpeculatorConfig (speculators 0.9) of the head; aux ids stay entering ids (vLLM's)."""
    ec = ck.ec
    if not ec.logits_norm:
        raise _refuse_publish(
            ck,
            "speculators",
            "its logits skip the final norm (SpecForge norm_output false); speculators' head always norms them",
        )
    if ec.feature_width != ec.hidden_size:
        raise _refuse_publish(
            ck,
            "speculators",
            f"its fc reads target features of width {ec.feature_width} into a head of width {ec.hidden_size}; "
            "speculators' Eagle3DraftModel builds fc over n*hidden_size features only",
        )
    return {
        "architectures": ["Eagle3Speculator"],
        "speculators_model_type": "eagle3",
        "speculators_version": "0.9.0",
        "draft_vocab_size": ec.draft_vocab_size,
        "norm_before_residual": ec.norm_before_residual,
        "norm_before_fc": ec.fc_norm == "whole",
        "fc_norm": ec.fc_norm == "per_layer",
        "norm_output": ec.feed_normed,
        "target_hidden_size": None,
        "eagle_aux_hidden_state_layer_ids": list(ec.aux_layers) or None,
        "embed_requires_grad": False,
        "tie_word_embeddings": False,
        "transformer_layer_config": _llama_layer(ec),
        "speculators_config": {
            "algorithm": "eagle3",
            "proposal_methods": [
                {"proposal_type": "greedy", "speculative_tokens": 3, "verifier_accept_k": 1, "accept_tolerance": 0.0}
            ],
            "default_proposal_method": "greedy",
            "verifier": _verifier(ck, verifier),
        },
    }


def _official_config(ck: Eagle3Checkpoint) -> dict:
    """The official EAGLE-3 code's config.json (EConfig) of the head, or what it cannot carry refused."""
    ec = ck.ec
    why = []
    if ec.fc_norm != "none":
        why.append(f"an fc norm ({ec.fc_norm})")
    if ec.norm_before_residual:
        why.append("norm_before_residual")
    if not ec.logits_norm:
        why.append("logits without the final norm")
    if ec.feed_normed:
        why.append("the normed output fed back (speculators norm_output)")
    if ec.rope_type not in ("default", "linear"):
        why.append(f"RoPE scaling {ec.rope_type!r} (it computes linear only)")
    if ec.head_dim * ec.num_attention_heads != ec.hidden_size:
        why.append(f"head_dim {ec.head_dim} x {ec.num_attention_heads} heads != hidden_size {ec.hidden_size}")
    if ec.n_blocks != 3:
        why.append(f"{ec.n_blocks} feature blocks (it feeds 3)")
    if ec.sliding_window:
        why.append(f"a sliding-window layer (sliding_window={ec.sliding_window}; it attends to every position)")
    ids = ec.aux_layers
    if ids and (len(ids) != 3 or ids[0] != 2 or ids[1] != (ids[2] + 3) // 2):
        why.append(f"aux layers {list(ids)} (its target code feeds the streams entering 2, L//2, L-3)")
    if why:
        raise _refuse_publish(ck, "eagle3-official", "the official EAGLE-3 code computes none of: " + "; ".join(why))
    out = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": ec.hidden_size,
        "intermediate_size": ec.intermediate_size,
        "num_attention_heads": ec.num_attention_heads,
        "num_key_value_heads": ec.num_key_value_heads,
        "num_hidden_layers": 1,
        "rms_norm_eps": ec.rms_norm_eps,
        "vocab_size": ec.vocab_size,
        "draft_vocab_size": ec.draft_vocab_size,
        "rope_theta": ec.rope_theta,
        "hidden_act": "silu",
        "tie_word_embeddings": False,
        "max_position_embeddings": 2048,
        "pretraining_tp": 1,
        "torch_dtype": "float16",
    }
    if ec.rope_type == "linear":
        out["rope_scaling"] = {"type": "linear", "factor": dict(ec.rope_params)["factor"]}
    if ec.feature_width != ec.hidden_size:
        out["target_hidden_size"] = ec.feature_width
    return out
