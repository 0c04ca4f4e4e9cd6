"""Medusa heads on disk (`save_heads`, `read_heads`), in the layout Medusa publishes, on the
helpers of `checkpoint`.

config.json {"medusa_num_heads", "medusa_num_layers", "hidden_size", "vocab_size",
"draft_vocab_size", "medusa": {...}}; model.safetensors (fp16) with parameter names
"{i}.{j}.linear.{weight,bias}" and the draft vocabulary as `checkpoint` stores it (d2t). Medusa's
published heads also carry a full LM head per head ("{i}.{n_layers}.weight" [V, H]); these heads
share the target's rows instead (4 heads of SmolLM2-135M: 2.7 MB in fp16), so this layout refuses
such tensors by name: Medusa's own layouts (official.py: medusa_lm_head.pt / .safetensors, or a
Medusa-2 model) carry them, and `read_any` reads every layout `--medusa` takes.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from edgespec.export.drafters.medusa.config import MedusaConfig, param_names
from edgespec.export.train import checkpoint

if TYPE_CHECKING:  # the module needs torch; reading and checking heads does not
    from edgespec.export.drafters.medusa.head import MedusaHeads


class MedusaFormatError(checkpoint.CheckpointError):
    """A heads checkpoint that is not in the Medusa layout or does not fit the target."""


def save_heads(heads: MedusaHeads, folder: str | Path, extra: dict | None = None) -> Path:
    """config.json (`extra` joins its `medusa` section: "target", the model they were trained for, lets
    `export-drafter` write the target's LM head into Medusa's layout) + model.safetensors (float16 weights)."""
    c = heads.cfg
    config = {
        "medusa_num_heads": c.n_heads,
        "medusa_num_layers": c.n_layers,
        "hidden_size": c.hidden_size,
        "vocab_size": c.vocab_size,
        "draft_vocab_size": c.draft_vocab_size,
        "torch_dtype": "float16",
        "medusa": {"features": "final_norm", "lm_head": "target"} | (extra or {}),
    }
    from edgespec.export.drafters.medusa.head import heads_state

    return checkpoint.write_checkpoint(folder, heads_state(heads), config)


def _check(folder: Path, cfg: dict, shapes: dict[str, tuple], hidden_size: int | None, vocab_size: int | None):
    """edgespec's layout checked on config.json and its tensors' names and shapes, against the target's
    sizes (None: not known yet); its MedusaConfig back."""
    if "medusa_num_heads" not in cfg:
        raise MedusaFormatError(f"{folder}/{checkpoint.CONFIG_FILE} has no medusa_num_heads: not a Medusa heads folder")
    sizes = [cfg.get("medusa_num_heads"), cfg.get("medusa_num_layers", 1), cfg.get("hidden_size")]
    if not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in sizes):
        raise MedusaFormatError(
            f"{folder}/{checkpoint.CONFIG_FILE}: medusa_num_heads, medusa_num_layers and hidden_size {sizes} are "
            "not all positive integers (edgespec's layout; Medusa's own keeps its heads in medusa_lm_head.pt)"
        )
    K, n_layers = int(cfg["medusa_num_heads"]), int(cfg.get("medusa_num_layers", 1))
    if any(k == f"{i}.{n_layers}.weight" for i in range(K) for k in shapes):
        raise MedusaFormatError(
            f"{folder}: heads with their own LM heads ({0}.{n_layers}.weight) in edgespec's layout, whose "
            "heads share the target's LM head. Hint: Medusa's layout keeps them in medusa_lm_head.pt / "
            ".safetensors beside a MedusaConfig config.json; or train with `edgespec train-medusa`"
        )
    H = int(cfg["hidden_size"])
    if hidden_size is not None and H != hidden_size:
        raise MedusaFormatError(
            f"{folder}: heads of hidden size {H} do not fit the target's {hidden_size}; "
            "were they trained for another model?"
        )
    V = int(cfg.get("vocab_size", vocab_size or 0))
    if vocab_size is not None and V != vocab_size:
        raise MedusaFormatError(f"{folder}: heads vocab {cfg['vocab_size']} != target vocab {vocab_size}")
    vd = int(cfg.get("draft_vocab_size") or V)
    mc = MedusaConfig(hidden_size=H, vocab_size=V, draft_vocab_size=vd, n_heads=K, n_layers=n_layers)
    need = param_names(mc)
    missing = [k for k in need if k not in shapes]
    if missing:
        raise MedusaFormatError(f"{folder}: missing tensors {missing[:4]}; expected Medusa names i.j.linear.*")
    bad = [k for k in need if shapes[k] != ((H, H) if k.endswith("weight") else (H,))]
    unknown = sorted(set(shapes) - set(need) - {"d2t"})
    if bad or unknown:
        raise MedusaFormatError(
            f"{folder}: tensors {(bad + unknown)[:4]} are not {K} heads x {n_layers} blocks of hidden size {H} "
            "(i.j.linear.weight [H, H], i.j.linear.bias [H], d2t)"
        )
    return mc


def read_heads(folder: str | Path, hidden_size: int, vocab_size: int) -> tuple[MedusaConfig, dict[str, np.ndarray]]:
    """Read and check a heads folder against the target's sizes: float32 arrays + d2t (absolute)."""
    folder, cfg = checkpoint.read_config(
        folder, MedusaFormatError, "a Medusa heads folder holds {} (from `edgespec train-medusa`)"
    )
    w = checkpoint.read_weights(folder)
    mc = _check(folder, cfg, {k: v.shape for k, v in w.items()}, hidden_size, vocab_size)
    d2t = checkpoint._read_d2t(folder, w, mc.draft_vocab_size, vocab_size, MedusaFormatError)
    return mc, {k: w[k].astype(np.float32) for k in param_names(mc)} | {"d2t": d2t}


def preflight_heads(folder: str | Path, hidden_size: int | None, vocab_size: int | None, target: str | None) -> str:
    """A heads folder of any layout `--medusa` reads, checked against the target's sizes (None: unknown
    before it loads) on config.json and tensor names and shapes, then on the weights' values (NaN, inf;
    Medusa's tied ResBlocks equal); what it is back."""
    from edgespec.export.drafters._files import WeightsFileError, check_finite, tensor_infos
    from edgespec.export.drafters.medusa import official

    folder = Path(folder)
    if official.detect(folder) is not None:
        h = official.inspect(folder)
        if hidden_size is not None:
            official.check_target(h, hidden_size, vocab_size)
        official.check_full_target(h, target)
        official.check_values(h)
        return h.layout
    if not (folder / checkpoint.CONFIG_FILE).exists() or not (folder / checkpoint.WEIGHTS_FILE).exists():
        raise MedusaFormatError(
            f"{folder}: a Medusa heads folder holds {checkpoint.CONFIG_FILE} + {checkpoint.WEIGHTS_FILE} (from "
            "`edgespec train-medusa`), or Medusa's medusa_lm_head.pt / .safetensors beside its config.json"
        )
    cfg = official.read_json(folder / checkpoint.CONFIG_FILE)
    try:
        infos = tensor_infos(folder / checkpoint.WEIGHTS_FILE)
    except WeightsFileError as e:  # cut short, a bad header: its message names the file
        raise MedusaFormatError(str(e)) from e
    except (ValueError, OSError) as e:
        raise MedusaFormatError(f"{folder}/{checkpoint.WEIGHTS_FILE}: cannot be read ({e})") from e
    mc = _check(folder, cfg, {k: v.shape for k, v in infos.items()}, hidden_size, vocab_size)
    if "d2t" in infos and infos["d2t"].shape != (mc.draft_vocab_size,):
        raise MedusaFormatError(f"{folder}: d2t has {infos['d2t'].shape} entries, config {mc.draft_vocab_size}")
    try:
        check_finite(folder / checkpoint.WEIGHTS_FILE)
    except WeightsFileError as e:
        raise MedusaFormatError(str(e)) from e
    return f"Medusa heads (edgespec's layout, {mc.n_heads} heads x {mc.n_layers} blocks)"


def read_any(folder: str | Path, hidden_size: int, vocab_size: int) -> tuple[MedusaConfig, dict[str, np.ndarray]]:
    """Heads in any layout `--medusa` reads (the format told by the folder itself): Medusa's own
    (official.py: medusa_lm_head.pt / .safetensors, a Medusa-2 model) or edgespec's (`read_heads`)."""
    from edgespec.export.drafters.medusa import official

    folder = Path(folder)
    if official.detect(folder) is None:
        return read_heads(folder, hidden_size, vocab_size)
    h = official.inspect(folder)
    official.check_target(h, hidden_size, vocab_size)
    arrays, d2t = official.read(h, vocab_size)
    mc = MedusaConfig(
        hidden_size=h.hidden_size,
        vocab_size=vocab_size,
        draft_vocab_size=len(d2t),
        n_heads=h.n_heads,
        n_layers=h.n_layers,
        own_lm_heads=h.own_lm_heads,
    )
    return mc, arrays | {"d2t": d2t}
