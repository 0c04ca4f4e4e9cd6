"""Medusa heads on disk (`save_heads`, `read_heads`), in the layout Medusa publishes, on the
helpers of `checkpoint`.

config.json {"medusa_num_heads", "medusa_num_layers", "hidden_size", "vocab_size",
"draft_vocab_size", "medusa": {...}}; model.safetensors (fp16) with parameter names
"{i}.{j}.linear.{weight,bias}" and the draft vocabulary as `checkpoint` stores it (d2t). Medusa's
published heads also carry a full LM head per head ("{i}.{n_layers}.weight" [V, H]); these heads
share the target's rows instead (4 heads of SmolLM2-135M: 2.7 MB in fp16), so such checkpoints
are refused by name.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from edgespec.export.drafters.medusa.head import MedusaConfig, MedusaHeads, heads_state, param_names
from edgespec.export.train import checkpoint


class MedusaFormatError(checkpoint.CheckpointError):
    """A heads checkpoint that is not in the Medusa layout or does not fit the target."""


def save_heads(heads: MedusaHeads, folder: str | Path, extra: dict | None = None) -> Path:
    """config.json (`extra` joins its `medusa` section) + model.safetensors (float16 weights)."""
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
    return checkpoint.write_checkpoint(folder, heads_state(heads), config)


def read_heads(folder: str | Path, hidden_size: int, vocab_size: int) -> tuple[MedusaConfig, dict[str, np.ndarray]]:
    """Read and check a heads folder against the target's sizes: float32 arrays + d2t (absolute)."""
    folder, cfg = checkpoint.read_config(
        folder, MedusaFormatError, "a Medusa heads folder holds {} (from `edgespec train-medusa`)"
    )
    if "medusa_num_heads" not in cfg:
        raise MedusaFormatError(f"{folder}/{checkpoint.CONFIG_FILE} has no medusa_num_heads: not a Medusa heads folder")
    w = checkpoint.read_weights(folder)
    K, n_layers = int(cfg["medusa_num_heads"]), int(cfg.get("medusa_num_layers", 1))
    if any(k == f"{i}.{n_layers}.weight" for i in range(K) for k in w):
        raise MedusaFormatError(
            f"{folder}: heads with their own LM heads ({0}.{n_layers}.weight); these "
            "heads share the target's LM head. Hint: train with `edgespec train-medusa`"
        )
    H = int(cfg["hidden_size"])
    if H != hidden_size:
        raise MedusaFormatError(
            f"{folder}: heads of hidden size {H} do not fit the target's {hidden_size}; "
            "were they trained for another model?"
        )
    if int(cfg.get("vocab_size", vocab_size)) != vocab_size:
        raise MedusaFormatError(f"{folder}: heads vocab {cfg['vocab_size']} != target vocab {vocab_size}")
    vd = int(cfg.get("draft_vocab_size") or vocab_size)
    mc = MedusaConfig(hidden_size=H, vocab_size=vocab_size, draft_vocab_size=vd, n_heads=K, n_layers=n_layers)
    need = param_names(mc)
    missing = [k for k in need if k not in w]
    if missing:
        raise MedusaFormatError(f"{folder}: missing tensors {missing[:4]}; expected Medusa names i.j.linear.*")
    d2t = checkpoint._read_d2t(folder, w, vd, vocab_size, MedusaFormatError)
    return mc, {k: w[k].astype(np.float32) for k in need} | {"d2t": d2t}
