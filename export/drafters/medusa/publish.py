"""`edgespec export-drafter FOLDER --format medusa-official`: Medusa heads (any layout `--medusa`
reads; edgespec's own trained or shipped heads above all) written as the Medusa project publishes
them, for its own loader (medusa-llm's MedusaModel.from_pretrained), TGI and the tools built on it.

The folder written: config.json (MedusaConfig: medusa_num_heads, medusa_num_layers,
base_model_name_or_path) + medusa_lm_head.pt (torch.save of the heads' state dict, as Medusa's
train.py writes it): per head "{i}.{j}.linear.weight/bias" for every ResBlock j and "{i}.{L}.weight",
its LM head [V, H]. edgespec's heads share the target's LM head, which Medusa's layout stores per
head, so the target's LM head is read (the model the heads' config.json names under
medusa.target, or the default model for the shipped heads) and written K times. A reduced draft
vocabulary is kept as `d2t` + `draft_vocab_size` (Medusa's loaders ignore both: they draft over
the whole vocabulary; edgespec reads them back, so the round trip drafts as before). Values are
kept exactly: fp16 when every value is an fp16 number (edgespec's blocks are stored in fp16),
else fp32 (an LM head dequantized from a GGUF is not). What the layout cannot carry is refused:
different ResBlocks within one head (Medusa's head repeats one ResBlock module).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from edgespec.export.drafters.medusa import official
from edgespec.export.drafters.medusa.checkpoint import MedusaFormatError, read_heads
from edgespec.export.partials import clean_stale_partials, finish_partial, make_partial, remove_partial
from edgespec.export.target.spec import ExportError

# The packaged models' Hugging Face ids: what Medusa's loader needs as base_model_name_or_path (edgespec
# reads their GGUF; the upstream loader reads the HF model)
HF_IDS = {"smollm2-135m-instruct": "HuggingFaceTB/SmolLM2-135M-Instruct", "gemma3-270m": "google/gemma-3-270m"}


def _target_of(folder: Path, cfg: dict) -> str | None:
    """The model the heads were trained for, as a --target spec: their config's record, or the
    default model for the heads shipped with edgespec (heads/<model name>-medusa)."""
    from edgespec.export.target.write import SHIPPED_HEADS

    spec = (cfg.get("medusa") or {}).get("target") or cfg.get("base_model_name_or_path")
    if spec:
        return str(spec)
    if folder.resolve().parent == SHIPPED_HEADS.resolve() and folder.name.endswith("-medusa"):
        return folder.name.removesuffix("-medusa")
    return None


def target_lm_head(spec: str) -> tuple[np.ndarray, str]:
    """(the target's LM head [V, H] float32 as edgespec loads it, the base_model_name_or_path to write),
    reading that one tensor (an HF folder's weights file; a GGUF's output / token_embd, dequantized)."""
    from edgespec.export.drafters._files import load_tensors, tensor_infos, weights_file
    from edgespec.export.target import sources

    try:
        src = sources.resolve(spec)
    except sources.SourceError as e:
        raise ExportError(f"the heads' target {spec!r}: {e}") from e
    if src.kind == "hub":
        raise ExportError(
            f"the heads' target {spec!r} is a hub id: its LM head (written into every head) is read from a local "
            "copy. Hint: download it and name that folder in the heads' config.json instead"
        )
    if src.kind == "hf":
        path = weights_file(Path(src.path))
        names = tensor_infos(path)
        name = "lm_head.weight" if "lm_head.weight" in names else None
        if name is None:  # tied: the LM head is the embedding table
            embeds = [n for n in names if n.endswith("embed_tokens.weight")]
            name = embeds[0] if len(embeds) == 1 else None
        if name is None:
            raise ExportError(f"{src.path}: no lm_head.weight and no single embed_tokens.weight (its LM head)")
        return load_tensors(path, [name])[name], str(Path(src.path).resolve())
    from gguf import GGUFReader
    from gguf.quants import dequantize

    tensors = {t.name: t for t in GGUFReader(src.path).tensors}
    t = tensors.get("output.weight") or tensors["token_embd.weight"]  # no output.weight: tied
    lm = dequantize(t.data, t.tensor_type).astype(np.float32).reshape(int(t.shape[1]), int(t.shape[0]))
    return lm, HF_IDS.get(src.name, str(Path(src.path).resolve()))


def _heads(folder: Path) -> tuple[dict[str, np.ndarray], np.ndarray, int, int, np.ndarray | None, str]:
    """(float32 arrays: blocks, and "{i}.lm_head" when the heads have their own; d2t; K; L; the target's LM
    head when they have none (else None); base_model_name_or_path) of a heads folder in any layout."""
    cfg = json.loads((folder / "config.json").read_text()) if (folder / "config.json").exists() else {}
    try:
        if official.detect(folder) is not None:
            h = official.inspect(folder)
            if h.own_lm_heads:
                arrays, d2t = official.read(h, h.vocab_size)
                base = h.base_model or (str(folder.resolve()) if h.variant == "full" else "")
                return arrays, d2t, h.n_heads, h.n_layers, None, base
            lm, base = _lm(folder, cfg, h.hidden_size, "base_model_name_or_path in config.json")
            arrays, d2t = official.read(h, lm.shape[0])
            return arrays, d2t, h.n_heads, h.n_layers, lm, h.base_model or base
        if "hidden_size" not in cfg or "vocab_size" not in cfg:
            raise ExportError(
                f"{folder}: not a Medusa heads folder (Medusa's medusa_lm_head.pt / .safetensors, or edgespec's "
                "config.json with medusa_num_heads, hidden_size and vocab_size + model.safetensors)"
            )
        mc, arrays = read_heads(folder, int(cfg["hidden_size"]), int(cfg["vocab_size"]))
    except MedusaFormatError as e:
        raise ExportError(str(e)) from e
    lm, base = _lm(folder, cfg, mc.hidden_size, 'a "target" entry in the "medusa" section of config.json')
    if lm.shape[0] != mc.vocab_size:
        raise ExportError(f"{folder}: heads for a vocabulary of {mc.vocab_size}, their target's has {lm.shape[0]}")
    return arrays, arrays["d2t"], mc.n_heads, mc.n_layers, lm, base


def _lm(folder: Path, cfg: dict, hidden_size: int, where: str) -> tuple[np.ndarray, str]:
    """The LM head the heads share (their target's) and its base_model_name_or_path. where: the config
    entry that would name the target, for the hint."""
    spec = _target_of(folder, cfg)
    if spec is None:
        raise ExportError(
            f"{folder}: these heads use their target's LM head, which Medusa's layout stores in every head, and "
            f"the folder does not say which model that is. Hint: name the target folder, GGUF or packaged model "
            f"in {where} (train-medusa records it)"
        )
    lm, base = target_lm_head(spec)
    if lm.shape[1] != hidden_size:
        raise ExportError(f"{folder}: heads of hidden size {hidden_size}, their target {spec}'s is {lm.shape[1]}")
    return lm, base


def _fp16_exact(arrays) -> bool:
    return all(np.array_equal(a.astype(np.float16).astype(np.float32), a) for a in arrays)


def publish_official(folder: Path, out: Path) -> Path:
    """Write `folder`'s heads into the new folder `out` in Medusa's layout; returns `out`."""
    import torch

    arrays, d2t, K, L, lm, base = _heads(Path(folder))
    for i in range(K):  # Medusa repeats one ResBlock module per head: one set of block weights per head
        for j in range(1, L):
            for part in ("weight", "bias"):
                if not np.array_equal(arrays[f"{i}.{j}.linear.{part}"], arrays[f"{i}.0.linear.{part}"]):
                    raise ExportError(
                        f"{folder}: head {i}'s ResBlocks 0 and {j} differ; Medusa's heads repeat one ResBlock "
                        f"module (`[ResBlock(H)] * medusa_num_layers`), so its layout cannot carry {L} different "
                        "blocks. Hint: train with --layers 1"
                    )
    lm_heads = [arrays[f"{i}.lm_head"] for i in range(K)] if lm is None else [lm] * K
    blocks = [arrays[f"{i}.0.linear.{p}"] for i in range(K) if L for p in ("weight", "bias")]
    floats = blocks + (lm_heads if lm is None else [lm])
    dtype = torch.float16 if _fp16_exact(floats) else torch.float32
    state = {}
    lm_t = None if lm is None else torch.from_numpy(lm).to(dtype)  # one tensor, saved once, named K times
    for i in range(K):
        if L:
            w, b = (torch.from_numpy(arrays[f"{i}.0.linear.{p}"]).to(dtype) for p in ("weight", "bias"))
        for j in range(L):  # the same tensors under every j, as Medusa's tied module's state dict has them
            state[f"{i}.{j}.linear.weight"], state[f"{i}.{j}.linear.bias"] = w, b
        state[f"{i}.{L}.weight"] = lm_t if lm_t is not None else torch.from_numpy(lm_heads[i]).to(dtype)
    V = lm_heads[0].shape[0]
    config = {"medusa_num_heads": K, "medusa_num_layers": L, "base_model_name_or_path": base}
    if len(d2t) < V or not np.array_equal(d2t, np.arange(V)):  # edgespec's draft vocabulary, kept for the way back
        state["d2t"] = torch.from_numpy(d2t - np.arange(len(d2t)))  # EAGLE-3's convention: target = i + d2t[i]
        config["draft_vocab_size"] = len(d2t)
    clean_stale_partials(out.parent)
    tmp = make_partial(out)  # an interrupted write leaves nothing under `out`
    try:
        (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        torch.save(state, tmp / "medusa_lm_head.pt")
        official.inspect(tmp)  # what was written reads back as Medusa's layout
        return finish_partial(tmp, out)
    except BaseException:
        remove_partial(tmp)
        raise
