"""`edgespec export-drafter --format dflash-zlab`: a DFlash drafter folder (any layout `--dflash`
reads: z-lab's, or edgespec's from `train-dflash`) rewritten in z-lab's layout, the one their
`DFlashDraftModel` (package `dflash` 0.1.0) and the serving engines' DFlash support load:
config.json (layout.zlab_config) + model.safetensors holding exactly the class's tensors, in the
source's float dtype (bf16 stays bf16, edgespec's fp16 stays fp16).

On the way:
- target_layer_ids come out ascending, each once (fc's column blocks permuted, a repeated id's
  blocks added: layout.read_dflash): the same computation.
- A draft vocabulary (edgespec's d2t) is not carried: z-lab's class scores the target's whole LM
  head, so the published drafter proposes from the whole vocabulary. Its hidden states, and the
  logits of the draft vocabulary's tokens, are unchanged; a token outside the draft vocabulary
  (never trained against) may win a row there. Widened rather than refused: drafts stay drafts
  (the target verifies them), and every drafter `train-dflash` writes has a draft vocabulary. The
  trained draft vocabulary's size is recorded under config.json's `edgespec`.
Everything else DFlashConfig holds has a z-lab field, so nothing else is refused. No auto_map or
modeling file is written (that file is z-lab's code): load the folder with `from dflash import
DFlashDraftModel; DFlashDraftModel.from_pretrained(DIR)` or a serving engine's DFlash support.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from edgespec.export.drafters.dflash.config import DFlashFormatError, zlab_config
from edgespec.export.drafters.dflash.layout import read_dflash, read_layout
from edgespec.export.partials import clean_stale_partials, finish_partial, make_partial, remove_partial

# the stored dtype (safetensors' or torch's name) -> config.json's torch_dtype
DTYPE_NAMES = {
    "BF16": "bfloat16",
    "bfloat16": "bfloat16",
    "F16": "float16",
    "float16": "float16",
    "F32": "float32",
    "float32": "float32",
}


def publish_zlab(folder: Path, out: Path) -> Path:
    """The DFlash drafter `folder` in z-lab's layout, written into the new folder `out` (through a
    temporary name: an interrupted write leaves nothing under `out`)."""
    import torch
    from safetensors.torch import save_file

    if out.exists():
        raise DFlashFormatError(f"{out} already exists; choose a new folder")
    lay = read_layout(folder)
    c, arrays = read_dflash(folder, lay.cfg.hidden_size, lay.cfg.vocab_size)
    name = DTYPE_NAMES[lay.dtype]
    dtype = getattr(torch, name)
    tensors = {k: torch.from_numpy(v).to(dtype).contiguous() for k, v in sorted(arrays.items()) if k != "d2t"}
    config = zlab_config(dataclasses.replace(c, draft_vocab_size=c.vocab_size), name)
    if lay.has_d2t:
        config["edgespec"] = {"published_by": "edgespec export-drafter", "trained_draft_vocab_size": c.draft_vocab_size}
    clean_stale_partials(out.parent)
    tmp = make_partial(out)
    try:
        save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        return finish_partial(tmp, out)
    except BaseException:
        remove_partial(tmp)
        raise
