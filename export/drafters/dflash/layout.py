"""The DFlash checkpoint layout (`dflash-zlab`): z-lab's published drafters (package `dflash` 0.1.0,
`DFlashDraftModel`; Qwen3-4B/8B, Llama-3.1-8B) and edgespec's own (`edgespec train-dflash`: the same
layout plus a draft vocabulary), read for `--dflash` with every field honoured or refused
(`read_layout`: config.json (config.py) and the tensors' names, shapes and dtypes, no weights: what
the check before the target loads uses; `read_dflash`: the weights too) and written for z-lab's
loaders (publish.py).

Tensors: exactly DFlashDraftModel's (`expected_shapes`), in fp32, fp16 or bf16, plus edgespec's
draft vocabulary (d2t, and t2d beside it). Its embedding and LM head are the target's
(DFlashDraftModel has neither: a checkpoint that holds embed_tokens / lm_head is refused, not half
read).

Target layer ids. z-lab's `extract_context_feature` reads `hidden_states[layer_id + 1]` of the
target's forward with output_hidden_states (dflash/model.py: offset = 1). In transformers (5.25,
checked on a tiny Qwen3 with hooks) hidden_states[j], j < L, is the input of decoder layer j
(hidden_states[0] the embedding output) and hidden_states[L] the final NORMED output (capture_outputs
ties it to last_hidden_state). So z-lab's id i is the OUTPUT of target layer i, which is the residual
stream ENTERING layer i+1: edgespec's aux layer i+1 (GraphOptions.aux_layers counts the stream
entering a layer; `DFlashConfig.aux_layers`). Ids -1 .. L-2 map to aux 0 .. L-1; id L-1 (the normed
final output, not a residual stream) is refused. fc's column blocks follow target_layer_ids' order
while the target's hidden_aux lists each layer once in ascending order: the reader permutes fc's
blocks into that order and adds the blocks of an id listed twice (fc is linear).

Block size and k. The graph computes all b rows of a block (the rows attend to each other, so b
changes every row's output: it must be the trained one); the runtime proposes the first
min(k, b-1, room left) of them (runtime/drafters/dflash), k being at most the export's --k (the
verify widths it exported). z-lab verifies all b-1; a smaller k keeps a prefix of the same drafts.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from edgespec.export.drafters._files import (
    TensorInfo,
    WeightsFileError,
    load_tensors,
    read_json,
    tensor_infos,
    weights_file,
)
from edgespec.export.drafters.dflash.config import HINT, DFlashConfig, DFlashFormatError, fail, parse_config

FLOAT_DTYPES = {"F32", "F16", "BF16", "float32", "float16", "bfloat16"}
PROJ = (
    "self_attn.q_proj",
    "self_attn.k_proj",
    "self_attn.v_proj",
    "self_attn.o_proj",
    "mlp.gate_proj",
    "mlp.up_proj",
    "mlp.down_proj",
)
NORMS = ("input_layernorm", "post_attention_layernorm", "self_attn.q_norm", "self_attn.k_norm")


@dataclass(frozen=True)
class Layout:
    """A DFlash checkpoint folder as config.json and its tensors' names and shapes say (no weights read)."""

    folder: Path  # the checkpoint folder
    cfg: DFlashConfig  # its drafter, checked
    stored_ids: tuple[int, ...]  # target_layer_ids as stored: the order of fc's column blocks
    weights: Path  # its weights file
    dtype: str  # its float tensors' dtype as stored ("BF16", "F16", "F32"; torch's names for .bin)
    has_d2t: bool  # it holds edgespec's draft vocabulary (d2t): else it proposes from the whole vocabulary


def read_layout(
    folder: str | Path, hidden_size: int | None = None, vocab_size: int | None = None, n_layers: int | None = None
) -> Layout:
    """Read and check a DFlash checkpoint's config.json and tensor shapes (no weights), against the
    target's hidden size, vocabulary and depth where given; DFlashFormatError says what does not fit."""
    folder = Path(folder)
    if not (folder / "config.json").is_file():
        raise fail(folder, "no config.json", HINT)
    try:
        raw = read_json(folder / "config.json")
    except json.JSONDecodeError as e:
        raise fail(folder, f"config.json is not JSON ({e})") from e
    cfg, ids = parse_config(raw, folder, hidden_size, vocab_size, n_layers)
    try:
        path = weights_file(folder)
        infos = tensor_infos(path)
    except WeightsFileError as e:
        raise DFlashFormatError(str(e)) from e
    dtype, has_d2t = _check_tensors(folder, infos, cfg, len(ids))
    return Layout(folder, cfg, ids, path, dtype, has_d2t)


def expected_shapes(c: DFlashConfig, n_feature_blocks: int) -> dict[str, tuple[int, ...]]:
    """name -> shape of every tensor DFlashDraftModel has (fc: n_feature_blocks blocks of H columns)."""
    H, d, inner = c.hidden_size, c.head_dim, c.intermediate_size
    q, kv = c.n_heads * d, c.n_kv_heads * d
    out = {"fc.weight": (H, n_feature_blocks * H), "hidden_norm.weight": (H,), "norm.weight": (H,)}
    shapes = dict(zip(PROJ, ((q, H), (kv, H), (kv, H), (H, q), (inner, H), (inner, H), (H, inner)), strict=True))
    for i in range(c.n_layers):
        p = f"layers.{i}."
        out |= {p + n + ".weight": s for n, s in shapes.items()}
        out |= {p + n + ".weight": (H,) for n in NORMS[:2]} | {p + n + ".weight": (d,) for n in NORMS[2:]}
        if c.attention_bias:
            out |= {p + n + ".bias": (shapes[n][0],) for n in PROJ[:4]}
    return out


def _check_tensors(folder: Path, infos: dict[str, TensorInfo], c: DFlashConfig, n_blocks: int) -> tuple[str, bool]:
    """Its tensors against the config: (their float dtype, whether it holds a d2t)."""
    want = expected_shapes(c, n_blocks)
    own = sorted(k for k in infos if {"embed_tokens", "lm_head"} & set(k.split(".")))
    if own:
        raise fail(
            folder,
            f"it holds {own}: DFlashDraftModel has no embedding or LM head of its own (it reads the target's), so "
            "its loaders would drop them; edgespec will not guess which to use",
        )
    extra = sorted(set(infos) - set(want) - {"d2t", "t2d"})
    missing = sorted(set(want) - set(infos))
    if extra or missing:
        what = f"tensors DFlashDraftModel does not have {extra[:4]}" if extra else ""
        what += (" and " if extra and missing else "") + (f"no {missing[:4]}" if missing else "")
        raise fail(folder, f"{what} (config: {c.n_layers} layers, attention_bias {c.attention_bias})", HINT)
    wrong = [f"{k} {list(infos[k].shape)} (config: {list(s)})" for k, s in want.items() if infos[k].shape != s]
    if wrong:
        raise fail(folder, f"tensor shapes do not match config.json: {'; '.join(wrong[:3])}")
    dtypes = sorted({infos[k].dtype for k in want})
    if len(dtypes) != 1 or dtypes[0] not in FLOAT_DTYPES:
        raise fail(folder, f"weights in {dtypes}; edgespec reads one of fp32, fp16, bf16")
    has_d2t = "d2t" in infos
    if has_d2t and infos["d2t"].shape != (c.draft_vocab_size,):
        raise fail(folder, f"d2t {list(infos['d2t'].shape)} != draft_vocab_size {c.draft_vocab_size}")
    if not has_d2t and c.draft_vocab_size != c.vocab_size:
        raise fail(folder, f"draft_vocab_size {c.draft_vocab_size} < vocab {c.vocab_size} but no d2t tensor")
    if "t2d" in infos and not has_d2t:
        raise fail(folder, "a t2d tensor without d2t (the draft vocabulary's target ids)")
    return dtypes[0], has_d2t


def _fc_in_aux_order(fc, stored_ids: tuple[int, ...], H: int):
    """fc [H, n*H] with its column blocks in ascending layer order, the blocks of a repeated id added."""
    import numpy as np

    order = sorted(set(stored_ids))
    blocks = fc.reshape(H, len(stored_ids), H)
    out = np.zeros((H, len(order), H), np.float32)
    for j, i in enumerate(stored_ids):
        out[:, order.index(i)] += blocks[:, j]
    return out.reshape(H, len(order) * H)


def read_dflash(
    folder: str | Path, hidden_size: int, vocab_size: int, n_layers: int | None = None
) -> tuple[DFlashConfig, dict]:
    """Read and check a DFlash checkpoint against the target's sizes: (config, float32 arrays under
    its tensor names, fc in hidden_aux order, + d2t: the draft tokens' absolute target ids)."""
    import numpy as np

    from edgespec.export.train.checkpoint import _read_d2t

    lay = read_layout(folder, hidden_size, vocab_size, n_layers)
    c = lay.cfg
    try:
        w = load_tensors(lay.weights)
    except WeightsFileError as e:
        raise DFlashFormatError(str(e)) from e
    arrays = {k: v.astype(np.float32) for k, v in w.items() if k not in ("d2t", "t2d")}
    arrays["fc.weight"] = _fc_in_aux_order(arrays["fc.weight"], lay.stored_ids, c.hidden_size)
    arrays["d2t"] = _read_d2t(lay.folder, w, c.draft_vocab_size, c.vocab_size, DFlashFormatError)
    return c, arrays
