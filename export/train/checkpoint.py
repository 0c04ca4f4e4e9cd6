"""Head checkpoints on disk, in the Hugging Face layouts the methods publish: what every layout
shares (`write_checkpoint`, `_read_d2t`, `CheckpointError`, `HeadFormatError`) and the
draft-vocabulary cut. Each drafter's layouts are read and written in its own package (EAGLE-1's:
export/drafters/eagle/checkpoint.py `read_head`, `save_head`), on the helpers here.

Each is a folder of `config.json` + `model.safetensors` (float weights in fp16). A reduced draft
vocabulary is stored as EAGLE-3 does: `d2t` [Vd] int64 with target_id = i + d2t[i], and
`draft_vocab_size` in config.json; a head over the whole vocabulary has no d2t. The embedding and
the LM-head rows are the target's (frozen), so they are not stored.

EAGLE heads trained here list their draft tokens most frequent first (`eagle.d2t_order:
"frequency"`), so an export can keep a prefix: a cheaper head call (`prune_draft_vocab`,
`edgespec export --eagle-draft-vocab`).
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np

WEIGHTS_FILE = "model.safetensors"
CONFIG_FILE = "config.json"


class CheckpointError(ValueError):
    """A head checkpoint that is not in the expected layout or does not fit the target."""


class HeadFormatError(CheckpointError):
    """An EAGLE head checkpoint that is not in the EAGLE layout or does not fit the target."""


def write_checkpoint(folder: str | Path, arrays: dict[str, np.ndarray], config: dict, d2t: str = "reduced") -> Path:
    """config.json + model.safetensors (float weights in fp16, integer and bool maps as they are); a
    `d2t` among the arrays (absolute target ids) is stored relative, or (d2t "reduced") left out when
    it is the whole vocabulary in order ("always": kept then too). The weights go through a temporary
    name, so an interrupted save leaves no half file under the real one."""
    from safetensors.numpy import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    arrays = dict(arrays)
    ids = arrays.pop("d2t", None)
    if ids is not None and (d2t == "always" or config["draft_vocab_size"] < config["vocab_size"]):
        arrays["d2t"] = ids - np.arange(len(ids))  # EAGLE-3 convention: target = i + d2t[i]
    arrays = {k: (v.astype(np.float16) if v.dtype.kind == "f" else v) for k, v in arrays.items()}
    tmp = folder / (WEIGHTS_FILE + ".tmp")
    save_file(arrays, str(tmp))
    tmp.rename(folder / WEIGHTS_FILE)
    (folder / CONFIG_FILE).write_text(json.dumps(config, indent=1))
    return folder


def read_config(folder: str | Path, error: type[CheckpointError], held: str) -> tuple[Path, dict]:
    """(folder, its config.json) of a checkpoint folder, which holds config.json + model.safetensors:
    else `error`, saying so (held: what such a folder is and where one comes from, "a Medusa heads
    folder holds {}"; {}: the two files)."""
    folder = Path(folder)
    if not (folder / CONFIG_FILE).exists() or not (folder / WEIGHTS_FILE).exists():
        raise error(f"{folder}: " + held.format(f"{CONFIG_FILE} + {WEIGHTS_FILE}"))
    return folder, json.loads((folder / CONFIG_FILE).read_text())


def read_weights(folder: Path) -> dict[str, np.ndarray]:
    """model.safetensors' arrays as stored."""
    from safetensors.numpy import load_file

    return load_file(str(folder / WEIGHTS_FILE))


def _read_d2t(
    folder: Path, w: dict[str, np.ndarray], draft_vocab: int, vocab_size: int, error: type[CheckpointError]
) -> np.ndarray:
    """The draft tokens' target ids (absolute), checked against the sizes config.json states."""
    if "d2t" in w:
        d2t = w["d2t"].astype(np.int64) + np.arange(len(w["d2t"]))
        if len(d2t) != draft_vocab or d2t.min() < 0 or d2t.max() >= vocab_size:
            raise error(
                f"{folder}: d2t has {len(d2t)} entries (config: {draft_vocab}) or ids outside 0..{vocab_size - 1}"
            )
        return d2t
    if draft_vocab == vocab_size:
        return np.arange(vocab_size, dtype=np.int64)
    raise error(f"{folder}: draft_vocab_size {draft_vocab} < vocab but no d2t tensor")


def prune_draft_vocab(hc, arrays: dict[str, np.ndarray], n: int, rows: tuple[str, ...] = ("d2t",)) -> tuple:
    """The head over its n most frequent draft tokens (n <= 0 or >= its size: unchanged); hc is
    any head config with draft_vocab_size and d2t_by_frequency, rows the arrays indexed by draft
    token (a head with its own LM head lists it too). Nothing to retrain: the kept rows are
    unchanged, so the kept tokens' logits are the same; the head's argmax can no longer land on a
    dropped (rare) token, and each call streams fewer rows."""
    if n <= 0 or n >= hc.draft_vocab_size:
        return hc, arrays
    if not hc.d2t_by_frequency:
        raise HeadFormatError(
            f"cannot cut this head's draft vocabulary from {hc.draft_vocab_size} to {n} tokens: "
            "its d2t is not in frequency order (heads from `edgespec train-eagle` record it "
            "as eagle.d2t_order in config.json). Hint: --eagle-draft-vocab 0 keeps all of it"
        )
    return replace(hc, draft_vocab_size=n), arrays | {k: arrays[k][:n] for k in rows}
