"""Medusa heads in the layouts the Medusa project writes (layout id `medusa-official`), read before
and after the target loads.

Two config variants, one head layout:
  heads  config.json = MedusaConfig {medusa_num_heads, medusa_num_layers, base_model_name_or_path,
         [version]} + medusa_lm_head.pt (train.py, medusa-llm 0.1: torch.save of the heads' state
         dict; the released Medusa-1 heads) or medusa_lm_head.safetensors (train_legacy.py);
  full   Medusa-2 (the axolotl fork): the whole fine-tuned model, its config.json the base model's
         plus medusa_num_heads / medusa_num_layers, the heads inside its weights as medusa_head.*.
Head i is nn.Sequential(*[ResBlock(H)] * L, nn.Linear(H, V, bias=False)):
    "{i}.{j}.linear.weight" [H, H], "{i}.{j}.linear.bias" [H]   j < L (ResBlock: x + SiLU(W x + b))
    "{i}.{L}.weight" [V, H]                                      the head's own trained LM head
on the base model's post-norm hidden state (edgespec's Medusa feature). `[ResBlock(H)] * L` repeats
ONE module, so a head's L blocks share their weights: the file lists every j, loading keeps the
last; a file whose blocks of one head differ means different things to Medusa (tied) and to other
loaders (TGI: separate), so it is refused. Config "version": "2" (train_legacy.py at the repo's
HEAD) drops the per-head LM heads: logits through the base's own LM head; a v1 file without them
loads the same way (the class starts each head as a copy of the base's LM head, strict=False).
A published edgespec head may also carry `d2t` + `draft_vocab_size` (its draft vocabulary, as
edgespec's own layout stores it); Medusa's loaders ignore both.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from edgespec.export.drafters import _files
from edgespec.export.drafters._files import WeightsFileError, load_tensors, tensor_infos, weights_file
from edgespec.export.drafters.medusa.checkpoint import MedusaFormatError
from edgespec.export.train import checkpoint

HEAD_FILES = ("medusa_lm_head.safetensors", "medusa_lm_head.pt")  # the heads variant's weights, either or both
FULL_PREFIX = "medusa_head."  # Medusa-2: the heads' names inside the whole model's weights
MEDUSA_KEYS = ("medusa_num_heads", "medusa_num_layers", "base_model_name_or_path", "version")
# PretrainedConfig's own keys (transformers 4.x and 5.x write them into every config.json): none is
# read by Medusa's heads, so none changes what they compute
GENERIC_KEYS = _files.HF_INERT | frozenset(  # the other attributes every transformers PretrainedConfig has
    "add_cross_attention bad_words_ids begin_suppress_tokens chunk_size_feed_forward cross_attention_hidden_size "
    "decoder_start_token_id diversity_penalty do_sample early_stopping encoder_no_repeat_ngram_size "
    "exponential_decay_length_penalty finetuning_task forced_bos_token_id forced_eos_token_id "
    "id2label is_decoder is_encoder_decoder label2id length_penalty max_length min_length "
    "no_repeat_ngram_size num_beam_groups num_beams num_return_sequences output_scores prefix problem_type "
    "pruned_heads remove_invalid_values repetition_penalty return_dict_in_generate sep_token_id suppress_tokens "
    "task_specific_params temperature tf_legacy_loss tie_encoder_decoder tie_word_embeddings top_k top_p "
    "typical_p use_bfloat16".split()
)
EDGESPEC_KEYS = ("draft_vocab_size",)  # a published edgespec head's draft vocabulary (with its d2t tensor)
FLOATS = {"F32", "F16", "BF16", "float32", "float16", "bfloat16"}
_NAME = re.compile(r"^(\d+)\.(\d+)\.(linear\.weight|linear\.bias|weight|bias)$")


@dataclass(frozen=True)
class OfficialHeads:
    """A Medusa checkpoint as read before any weight: config.json and its tensors' names and shapes."""

    folder: Path  # the checkpoint folder
    variant: str  # "heads" (MedusaConfig + medusa_lm_head.*) | "full" (Medusa-2: the model, heads inside)
    files: tuple[Path, ...]  # the weights files holding the heads (heads: one, or .safetensors and .pt)
    prefix: str  # the heads' tensor names start with this ("" | "medusa_head.")
    n_heads: int  # K (medusa_num_heads)
    n_layers: int  # ResBlocks per head (medusa_num_layers; 0: the LM head on the feature itself)
    version: str  # "1": own LM heads as the file holds them | "2": the base model's LM head for every head
    hidden_size: int  # H of the ResBlocks / LM heads
    vocab_size: int | None  # rows of the heads' own LM heads; None: they have none (the base's)
    draft_vocab_size: int | None  # a published edgespec head's draft vocabulary (d2t); None: the whole vocab
    dtype: str  # the heads' stored dtype (safetensors' or torch's name)
    base_model: str  # base_model_name_or_path ("" when the config has none)
    blocks: dict  # (i, j) -> the names present for head i's block j ("weight", "bias")

    @property
    def own_lm_heads(self) -> bool:
        return self.vocab_size is not None

    @property
    def layout(self) -> str:
        """What it is, for messages: 'Medusa heads (medusa_lm_head.pt, 4 heads x 1 ResBlock, own LM heads)'."""
        lm = "own LM heads" if self.own_lm_heads else "the base model's LM head"
        where = self.files[0].name if self.variant == "heads" else f"Medusa-2 model, {self.files[0].name}"
        blocks = f"{self.n_layers} ResBlock" + ("s" if self.n_layers != 1 else "")
        return f"Medusa heads ({where}, {self.n_heads} heads x {blocks}, {lm})"


def detect(folder: Path) -> str | None:
    """'heads' / 'full' for a folder in one of Medusa's layouts, else None (edgespec's own layout, or none)."""
    if any((folder / f).exists() for f in HEAD_FILES):
        return "heads"
    try:
        cfg = read_json(folder / checkpoint.CONFIG_FILE)
    except (OSError, ValueError):
        return None
    return "full" if isinstance(cfg, dict) and "medusa_num_heads" in cfg and "model_type" in cfg else None


def _int(cfg: dict, key: str, default: int | None, folder: Path, least: int) -> int:
    v = cfg.get(key, default)
    if v is None:
        raise MedusaFormatError(f"{folder}/config.json has no {key}: not a Medusa checkpoint")
    if isinstance(v, bool) or not isinstance(v, int) or v < least:
        raise MedusaFormatError(f"{folder}/config.json: {key} {v!r} is not an integer >= {least}")
    return v


def read_json(path: Path) -> dict:
    """A config.json as a dict, else MedusaFormatError saying what is wrong with it (_files.read_json
    refuses what is not a regular file of a JSON object)."""
    try:
        return _files.read_json(path)
    except ValueError as e:  # WeightsFileError; a UnicodeDecodeError is a ValueError too
        raise MedusaFormatError(f"{path} is not JSON ({e})") from e


def _config(folder: Path, variant: str) -> dict:
    cfg = read_json(folder / checkpoint.CONFIG_FILE) if (folder / checkpoint.CONFIG_FILE).exists() else None
    if cfg is None:
        raise MedusaFormatError(
            f"{folder}: has {' / '.join(f.name for f in map(folder.joinpath, HEAD_FILES) if f.exists())} "
            "but no config.json. Hint: Medusa's heads folder holds the MedusaConfig beside them "
            "(medusa_num_heads, medusa_num_layers, base_model_name_or_path)"
        )
    medusa = {k for k in cfg if k.startswith("medusa")}
    unknown = sorted(medusa - set(MEDUSA_KEYS))
    if variant == "heads":
        known = (medusa, MEDUSA_KEYS, GENERIC_KEYS, EDGESPEC_KEYS, ("hidden_size", "vocab_size"))
        unknown += sorted(_files.unknown_keys(cfg, *known))
    if unknown:
        raise MedusaFormatError(
            f"{folder}/config.json: {', '.join(unknown)}: not a setting of Medusa's heads that edgespec "
            f"reads ({', '.join(MEDUSA_KEYS)}); it may change what the heads compute, so it is not ignored. "
            "Hint: remove it if it does not"
        )
    return cfg


def inspect(folder: Path) -> OfficialHeads:
    """Read config.json and the heads' tensor names, shapes and dtypes (no weights); MedusaFormatError
    with the exact reason for anything Medusa's code would read differently or edgespec cannot run."""
    folder = Path(folder)
    variant = detect(folder)
    if variant is None:
        raise MedusaFormatError(f"{folder}: not in a Medusa layout (no {' or '.join(HEAD_FILES)})")
    cfg = _config(folder, variant)
    K = _int(cfg, "medusa_num_heads", None, folder, 1)
    L = _int(cfg, "medusa_num_layers", 1, folder, 0)  # MedusaConfig's default
    version = str(cfg.get("version", "1"))
    if version not in ("1", "2"):
        raise MedusaFormatError(
            f'{folder}/config.json: version {cfg["version"]!r}: Medusa writes version "2" (heads without their '
            "own LM heads) or none (with them); edgespec reads those two"
        )
    try:
        if variant == "heads":
            files = tuple(folder / f for f in HEAD_FILES if (folder / f).exists())
            infos = [tensor_infos(f) for f in files]
            shapes = [{k: v.shape for k, v in info.items()} for info in infos]
            if len(shapes) == 2 and shapes[0] != shapes[1]:
                raise MedusaFormatError(
                    f"{folder}: holds both {HEAD_FILES[0]} and {HEAD_FILES[1]} with different tensors; "
                    "Medusa's loader reads the .pt, TGI the .safetensors. Hint: keep the one you mean"
                )
            info, prefix = infos[0], ""
        else:
            files = (weights_file(folder),)
            info, prefix = tensor_infos(files[0]), FULL_PREFIX
    except WeightsFileError as e:
        raise MedusaFormatError(str(e)) from e
    return _tensors(folder, variant, files, prefix, info, cfg, K, L, version)


def _tensors(folder, variant, files, prefix, info, cfg, K, L, version) -> OfficialHeads:
    """The heads' tensors checked against K, L and version (names and shapes only)."""
    where = f"{folder}/{files[0].name}"
    blocks, lm, extra, dtypes, d2t = _sorted_names(where, variant, prefix, info, K, L)
    _refuse_others(where, prefix, extra, dtypes, K, L)
    H = _block_width(where, prefix, info, blocks, K, L)
    V, H = _lm_heads(where, lm, H, K, version)
    for key, want in (("hidden_size", H), ("vocab_size", V)):
        if variant == "heads" and key in cfg and want is not None and cfg[key] != want:
            raise MedusaFormatError(f"{folder}/config.json: {key} {cfg[key]} but the heads' tensors have {want}")
    vd = cfg.get("draft_vocab_size") if variant == "heads" else None
    if (vd is None) != (d2t is None):
        raise MedusaFormatError(
            f"{folder}: draft_vocab_size in config.json and a d2t tensor come together (edgespec's draft "
            "vocabulary); this one has only one of them"
        )
    if d2t is not None and (d2t.shape != (vd,) or d2t.dtype not in ("I64", "I32", "int64", "int32")):
        raise MedusaFormatError(f"{where}: d2t {d2t.shape} {d2t.dtype} is not [draft_vocab_size {vd}] integers")
    return OfficialHeads(
        folder=folder,
        variant=variant,
        files=files,
        prefix=prefix,
        n_heads=K,
        n_layers=L,
        version=version,
        hidden_size=H,
        vocab_size=V,
        draft_vocab_size=vd,
        dtype=sorted(dtypes)[0],
        base_model=str(cfg.get("base_model_name_or_path", "")),
        blocks={k: tuple(sorted(v)) for k, v in blocks.items()},
    )


def _sorted_names(where: str, variant: str, prefix: str, info: dict, K: int, L: int):
    """(ResBlock (head, block) -> its parts, head -> its own LM head's shape, names that are no head's,
    the heads' dtypes, the d2t tensor or None) of the file's tensors under `prefix`."""
    blocks: dict[tuple[int, int], set[str]] = {}
    lm: dict[int, tuple] = {}
    extra, dtypes = [], set()
    d2t = None
    for name, t in info.items():
        if not name.startswith(prefix):
            continue  # Medusa-2: the model's own tensors
        short = name[len(prefix) :]
        if variant == "heads" and short == "d2t":
            d2t = t
            continue
        m = _NAME.match(short)
        i, j, kind = (int(m[1]), int(m[2]), m[3]) if m else (None, None, None)
        if m is None or i >= K or j > L or (j == L) != (kind in ("weight", "bias")):
            extra.append(name)
            continue
        dtypes.add(t.dtype)
        if j == L and kind == "bias":
            raise MedusaFormatError(
                f"{where}: {name}: a bias on head {i}'s LM head, which Medusa's heads do not have "
                "(nn.Linear(bias=False); its loader would drop it silently). Hint: fold it out or remove it"
            )
        if j == L:
            lm[i] = t.shape
        else:
            blocks.setdefault((i, j), set()).add(kind.removeprefix("linear."))
    return blocks, lm, extra, dtypes, d2t


def _refuse_others(where: str, prefix: str, extra: list[str], dtypes: set[str], K: int, L: int) -> None:
    """Refuse tensors that are no head of K x L ResBlocks (more heads than config.json says named as
    such) and heads stored in other than fp32, fp16, bf16."""
    firsts = [n[len(prefix) :].split(".")[0] for n in extra]
    heads_beyond = sorted({int(f) for f in firsts if f.isdigit()})
    if heads_beyond and max(heads_beyond) >= K:
        raise MedusaFormatError(
            f"{where} holds heads up to {max(heads_beyond)} but config.json says medusa_num_heads {K} (Medusa's "
            f"loaders disagree here: medusa-llm drops the rest, the repo's HEAD assumes 5). Hint: set "
            f"medusa_num_heads to {max(heads_beyond) + 1} to use them all, or remove the extra heads"
        )
    if extra:
        raise MedusaFormatError(
            f"{where}: tensors {extra[:4]} are not Medusa heads of {K} x {L} ResBlocks "
            f"(expected {prefix}{{i}}.{{j}}.linear.weight/bias for j < {L} and {prefix}{{i}}.{L}.weight)"
        )
    if not dtypes <= FLOATS:
        raise MedusaFormatError(f"{where}: heads stored as {sorted(dtypes)}; edgespec reads fp32, fp16 and bf16")


def _block_width(where: str, prefix: str, info: dict, blocks: dict, K: int, L: int) -> int | None:
    """The heads' width from their ResBlocks (None: they have none), every head's blocks whole and square."""
    H = None
    for i in range(K):
        for j in range(L):
            if blocks.get((i, j), set()) not in ({"weight", "bias"}, set()):
                raise MedusaFormatError(f"{where}: head {i} block {j} has a weight or a bias, not both")
        if L and not any((i, j) in blocks for j in range(L)):
            raise MedusaFormatError(
                f"{where}: head {i} has no ResBlock weights ({prefix}{i}.0.linear.weight); Medusa would run it "
                "from its random initialisation. Hint: medusa_num_heads may be too large"
            )
        for j in range(L):
            if (i, j) in blocks:
                w = info[f"{prefix}{i}.{j}.linear.weight"].shape
                b = info[f"{prefix}{i}.{j}.linear.bias"].shape
                if len(w) != 2 or w[0] != w[1] or b != (w[0],) or (H is not None and w[0] != H):
                    raise MedusaFormatError(f"{where}: head {i} block {j} weight {w} / bias {b} is not a ResBlock")
                H = w[0]
    return H


def _lm_heads(where: str, lm: dict, H: int | None, K: int, version) -> tuple[int | None, int]:
    """(vocabulary, width) of the heads' own LM heads (every head one or none, none under version "2")."""
    if lm and len(lm) != K:
        raise MedusaFormatError(
            f"{where}: heads {sorted(lm)} have their own LM head, heads {sorted(set(range(K)) - set(lm))} not; "
            "Medusa's loaders read such a file differently (medusa-llm: the base's LM head for the rest; "
            "TGI: no head's own). Hint: give every head one or none"
        )
    if lm and version == "2":
        raise MedusaFormatError(
            f'{where}: config.json says version "2" (heads without their own LM heads: Medusa\'s v2 code '
            "ignores them) but the heads have them. Hint: remove `version` to use them, or the LM heads"
        )
    V = None
    for i, shape in lm.items():
        if len(shape) != 2 or (V is not None and shape[0] != V) or (H is not None and shape[1] != H):
            raise MedusaFormatError(f"{where}: head {i}'s LM head is {list(shape)}, not [vocab, {H}] like the others")
        V, H = shape[0], shape[1]
    if H is None:
        raise MedusaFormatError(f"{where}: no heads found (medusa_num_layers 0 and no LM heads)")
    return V, H


def check_target(h: OfficialHeads, hidden_size: int, vocab_size: int | None) -> None:
    """The heads against the target's shape."""
    if h.hidden_size != hidden_size:
        raise MedusaFormatError(
            f"{h.folder}: {h.layout} of hidden size {h.hidden_size} do not fit the target's {hidden_size}. "
            f"Hint: they were trained for {h.base_model or 'another model'}; pass that model as --target"
        )
    if h.own_lm_heads and vocab_size is not None and h.vocab_size != vocab_size:
        raise MedusaFormatError(
            f"{h.folder}: the heads' own LM heads have {h.vocab_size} rows, the target's vocabulary {vocab_size}. "
            f"Hint: they were trained for {h.base_model or 'another model'}"
        )


def check_full_target(h: OfficialHeads, target: str | None) -> None:
    """A Medusa-2 model's heads go with that model alone: the target must be its folder."""
    if h.variant == "full" and (target is None or Path(target).resolve() != h.folder.resolve()):
        raise MedusaFormatError(
            f"{h.folder} is a Medusa-2 model: its heads were trained together with the model in that folder "
            f"(fine-tuned, not the base), so they draft for it alone. Hint: pass --target {h.folder}"
        )


def _head_names(h: OfficialHeads) -> list[str] | None:
    """The stored names of the heads' tensors (None: every tensor of the file)."""
    return None if h.variant == "heads" else [n for n in tensor_infos(h.files[0]) if n.startswith(h.prefix)]


def check_values(h: OfficialHeads) -> None:
    """The heads' weights, read before the target loads: finite (a NaN or inf named with its tensor
    and file), and the ResBlocks each head lists equal (`_check_tied`). MedusaFormatError else."""
    try:
        for f in h.files:
            _files.check_finite(f, _head_names(h))
    except WeightsFileError as e:
        raise MedusaFormatError(str(e)) from e
    if any(sum((i, j) in h.blocks for j in range(h.n_layers)) > 1 for i in range(h.n_heads)):
        names = [f"{h.prefix}{i}.{j}.linear.{p}" for i, j in h.blocks for p in ("weight", "bias")]
        _check_tied(h, {k[len(h.prefix) :]: v for k, v in load_tensors(h.files[0], names).items()})


def _check_tied(h: OfficialHeads, w: dict[str, np.ndarray]) -> None:
    """A head's blocks are one tied module in Medusa: the blocks it lists must agree, else refused."""
    for i in range(h.n_heads):
        listed = [j for j in range(h.n_layers) if (i, j) in h.blocks]
        for part in ("weight", "bias"):
            vals = [w[f"{i}.{j}.linear.{part}"] for j in listed]
            if any(not np.array_equal(v, vals[-1]) for v in vals):
                plural = {"weight": "weights", "bias": "biases"}[part]
                raise MedusaFormatError(
                    f"{h.folder}: head {i}'s ResBlocks {listed} hold different {plural}. Medusa builds a head from "
                    f"one ResBlock repeated {h.n_layers} times (its loader keeps the last), other loaders build "
                    "separate blocks: the file means two things, so it is refused. Hint: medusa_num_layers 1"
                )


def read(h: OfficialHeads, vocab_size: int) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """(float32 arrays: "{i}.{j}.linear.weight/bias" for every j < L, "{i}.lm_head" [V, H] when the heads
    have their own; d2t: the draft tokens' target ids). A head's blocks are one tied module in Medusa:
    the blocks it lists must agree (else refused), and every j gets them."""
    try:
        for f in h.files:
            _files.check_finite(f, _head_names(h))
    except WeightsFileError as e:
        raise MedusaFormatError(str(e)) from e
    w = {k[len(h.prefix) :]: v for k, v in load_tensors(h.files[0], _head_names(h)).items()}
    if len(h.files) == 2:
        other = load_tensors(h.files[1])
        if any(not np.array_equal(other[k], v) for k, v in w.items()):
            raise MedusaFormatError(
                f"{h.folder}: {h.files[0].name} and {h.files[1].name} hold different values; Medusa's loader "
                "reads the .pt, TGI the .safetensors. Hint: keep the one you mean"
            )
    _check_tied(h, w)
    out = {}
    for i in range(h.n_heads):
        listed = [j for j in range(h.n_layers) if (i, j) in h.blocks]
        for part in ("weight", "bias"):
            for j in range(h.n_layers):
                out[f"{i}.{j}.linear.{part}"] = w[f"{i}.{listed[-1]}.linear.{part}"].astype(np.float32)
        if h.own_lm_heads:
            out[f"{i}.lm_head"] = w[f"{i}.{h.n_layers}.weight"].astype(np.float32)
    vd = h.draft_vocab_size or vocab_size
    d2t = checkpoint._read_d2t(h.folder, w, vd, vocab_size, MedusaFormatError)
    return out, d2t
