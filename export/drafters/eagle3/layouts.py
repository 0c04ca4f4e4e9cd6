"""EAGLE-3 heads in the layouts their projects publish: which one a folder holds (`detect`, from its
config.json and tensor names alone), its config and tensor shapes checked against a target before
any weight is read (`inspect`, then `Eagle3Checkpoint.check`: what the export's preflight runs), its
tensors under edgespec's names (`read`); publish.py writes a head in another project's layout.

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
features' RMSNorm weight, one vector over all n*Ht features: per-layer norms concatenated). Each
project's config.json is read by its own rules (config_json.py).

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
Written back out (publish.py), ids take the written layout's convention.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from edgespec.export.drafters._files import (
    WEIGHT_NAMES,
    TensorInfo,
    WeightsFileError,
    eps_problem,
    load_tensors,
    read_json,
    tensor_infos,
    weights_file,
)
from edgespec.export.drafters.eagle3.config import (
    ARCHITECTURE,
    LAYER_NAMES,
    NORM_NAMES,
    Eagle3Config,
    Eagle3FormatError,
)
from edgespec.export.drafters.eagle3.config_json import HINT, read_config, refuse

LAYOUTS = ("eagle3-edgespec", "eagle3-official", "eagle3-specforge", "eagle3-speculators")
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


def stored_name(layout: str, name: str) -> str:
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
        raise refuse(
            folder,
            "not an EAGLE-3 head in a layout edgespec reads (official EAGLE, SpecForge, vLLM speculators, "
            "`edgespec train-eagle3`): its config.json declares none of LlamaForCausalLMEagle3, Eagle3Speculator, "
            "Eagle3DraftModel and its weights hold no midlayer.* tensors. Hint: an EAGLE-1/2 head goes to --eagle",
        )
    cfg = _config(folder)
    fields, _ = read_config(folder, layout, cfg)
    if eps_problem(fields["rms_norm_eps"]):
        raise refuse(folder, f"config.json: {eps_problem(fields['rms_norm_eps'])}")
    path = weights_file_of(folder, WEIGHT_NAMES if layout != "eagle3-official" else OFFICIAL_WEIGHTS)
    try:
        infos = tensor_infos(path)
    except WeightsFileError as e:  # cut short, a bad header: its message names the file
        raise Eagle3FormatError(str(e)) from e
    except (ValueError, OSError, EOFError) as e:
        raise refuse(folder, f"its {path.name} cannot be read ({type(e).__name__}: {e}); {HINT}") from e
    want = {ours: stored_name(layout, ours) for ours in CORE}
    missing = [theirs for theirs in want.values() if theirs not in infos]
    if missing:
        raise refuse(folder, f"its {path.name} lacks {', '.join(missing[:4])} of the {layout} layout; {HINT}")
    want |= {opt: opt for opt in ("embed_tokens.weight", "d2t", "t2d") if opt in infos}
    fc_shape = infos[want["fc.weight"]].shape
    n_aux = _feature_blocks(folder, layout, fields, fc_shape)
    norm_names = _fc_norm_names(folder, layout, fields.get("fc_norm", "none"), n_aux, infos, want, path.name)
    if fields["aux_layers"] and len(fields["aux_layers"]) != n_aux:
        raise refuse(
            folder,
            f"fc.weight {fc_shape} reads {n_aux} feature blocks but the config names {len(fields['aux_layers'])} "
            f"target layers ({list(fields['aux_layers'])}); {HINT}",
        )
    ec = Eagle3Config(
        **fields,
        n_aux=0 if fields["aux_layers"] else n_aux,
        own_embed="embed_tokens.weight" in want,
        layout=layout,
    )
    _check_shapes(folder, ec, infos, want, norm_names)
    return Eagle3Checkpoint(folder, layout, cfg, path, infos, want, norm_names, ec)


def _feature_blocks(folder: Path, layout: str, fields: dict, fc_shape: tuple) -> int:
    """How many target feature blocks the head's fc reads, checked against its config."""
    H = fields["hidden_size"]
    if len(fc_shape) != 2 or fc_shape[0] != H:
        raise refuse(folder, f"fc.weight {fc_shape} is not [hidden_size {H}, n*features]; {HINT}")
    Ht = fields["target_hidden_size"] or H
    n_aux = fc_shape[1] // Ht
    if n_aux * Ht != fc_shape[1] or n_aux < 1:
        raise refuse(
            folder,
            f"fc.weight {fc_shape} does not read whole feature blocks of width {Ht} "
            f"({'target_hidden_size' if fields['target_hidden_size'] else 'hidden_size'}); {HINT}",
        )
    if layout == "eagle3-official" and n_aux != 3:
        raise refuse(folder, f"fc.weight {fc_shape} reads {n_aux} feature blocks; the official EAGLE-3 code feeds 3")
    return n_aux


def _fc_norm_names(
    folder: Path, layout: str, fc_norm: str, n_aux: int, infos: dict, want: dict, file: str
) -> tuple[str, ...]:
    """The stored names of the features' norm weights the config turns on; any tensor the layout
    does not have (an fc norm the config leaves off among them) is refused."""
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
        raise refuse(
            folder,
            f"its {file} holds tensor(s) {', '.join(unknown[:4])}{hint} that the {layout} layout does not "
            f"have; as they may change what the head computes, it is refused. {HINT}",
        )
    missing = [n for n in norm_names if n not in infos]
    if missing:
        raise refuse(folder, f"the config turns on an fc norm but the weights lack {', '.join(missing)}")
    return norm_names


def _check_shapes(folder: Path, ec: Eagle3Config, infos: dict, names: dict, norm_names: tuple) -> None:
    H, I, d = ec.hidden_size, ec.intermediate_size, ec.head_dim
    nq, nkv = ec.num_attention_heads * d, ec.num_key_value_heads * d
    if ec.num_attention_heads % ec.num_key_value_heads:
        raise refuse(folder, f"{ec.num_attention_heads} attention heads over {ec.num_key_value_heads} KV heads")
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
            raise refuse(
                folder,
                f"{names[ours]} is {got.dtype} {list(got.shape)}, the config says float {list(shape)}; {HINT}",
            )
    for n in norm_names:
        w = ec.aux_width // len(norm_names)
        if infos[n].shape != (w,):
            raise refuse(folder, f"{n} is {list(infos[n].shape)}, the features' norm is over {w}")
    if ec.feature_width != H and not ec.own_embed:
        raise refuse(
            folder,
            f"the head's width {H} differs from the target's {ec.feature_width} (target_hidden_size) but it has no "
            "embed_tokens.weight of its own: the target's embedding table does not fit it. Hint: re-save the head "
            "with its embedding (SpecForge's export does)",
        )
    vd, v = ec.draft_vocab_size, ec.vocab_size
    if vd > v:
        raise refuse(folder, f"draft_vocab_size {vd} exceeds vocab_size {v}")
    if vd < v:
        if "d2t" not in names:
            raise refuse(folder, f"draft_vocab_size {vd} < vocab_size {v} but no d2t tensor maps draft to target ids")
        if infos["d2t"].shape != (vd,) or infos["d2t"].dtype in FLOAT_DTYPES:
            raise refuse(folder, f"d2t is {infos['d2t'].dtype} {list(infos['d2t'].shape)}, not integer [{vd}]")
        if "t2d" in names and infos["t2d"].shape != (v,):
            raise refuse(folder, f"t2d is {list(infos['t2d'].shape)}, not [vocab_size {v}]")


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
