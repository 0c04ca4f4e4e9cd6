"""Reading published drafter checkpoints: which weights file a folder holds, its tensors' names,
shapes and dtypes without reading the data (`tensor_infos`: what the checks before the target
loads use), and the tensors as float32 numpy whatever they were stored in (`load_tensors`: fp32,
fp16, bf16; .safetensors, sharded .safetensors, pytorch_model.bin, .pt).

bf16 is read explicitly (safetensors' raw bytes widened to float32 by a shift), never through
numpy's understanding of a 'bfloat16' dtype, which exists only once some other package has
imported ml_dtypes.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

# Weights file names in the order a folder is searched; the first present wins.
WEIGHT_NAMES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
)
_ST_DTYPES = {
    "F32": np.float32,
    "F16": np.float16,
    "BF16": "bf16",
    "F64": np.float64,
    "I64": np.int64,
    "I32": np.int32,
    "I16": np.int16,
    "I8": np.int8,
    "U8": np.uint8,
    "BOOL": np.bool_,
}


# config.json keys that change nothing a model computes, whatever the drafter: ids, bookkeeping and
# transformers' training and output switches (each reader adds its own kind's inert keys; keys that
# start with "_" are transformers' bookkeeping too)
HF_INERT = frozenset(
    {
        "architectures",
        "model_type",
        "auto_map",
        "transformers_version",
        "dtype",
        "torch_dtype",
        "initializer_range",
        "use_cache",
        "bos_token_id",
        "eos_token_id",
        "pad_token_id",
        "attention_dropout",
        "output_attentions",
        "output_hidden_states",
        "return_dict",
        "torchscript",
        "tokenizer_class",
    }
)


def unknown_keys(cfg: dict, *known) -> list[str]:
    """The keys of config `cfg` that no reader interprets, in its order: in none of the collections
    `known`, not in HF_INERT and not bookkeeping ("_..."). A reader refuses them, as they may change
    what the drafter computes."""
    return [k for k in cfg if k not in HF_INERT and not k.startswith("_") and not any(k in s for s in known)]


class WeightsFileError(ValueError):
    """A checkpoint folder whose weights cannot be found or read."""


@dataclass(frozen=True)
class TensorInfo:
    shape: tuple[int, ...]  # as stored
    dtype: str  # safetensors' name ("F32", "BF16", "I64", ...); torch's for .bin/.pt ("float32", ...)


def weights_file(folder: Path, names: tuple[str, ...] = WEIGHT_NAMES) -> Path:
    """The folder's weights file (the first of `names` present): else WeightsFileError listing what is there."""
    for name in names:
        if (folder / name).exists():
            return folder / name
    held = sorted(p.name for p in folder.iterdir())[:8] if folder.is_dir() else []
    raise WeightsFileError(f"{folder}: no weights file (looked for {', '.join(names)}); it holds {held}")


def _shards(path: Path) -> list[Path]:
    """The files a weights path stands for (an index.json: its shards, in order)."""
    if path.name.endswith(".index.json"):
        index = json.loads(path.read_text())
        return [path.parent / f for f in dict.fromkeys(index["weight_map"].values())]
    return [path]


def _st_header(path: Path) -> tuple[dict, int]:
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
    header.pop("__metadata__", None)
    return header, 8 + n


def _torch_load(path: Path) -> dict:
    import torch

    try:
        sd = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception as e:  # noqa: BLE001 - torch raises many kinds for a file it cannot read
        raise WeightsFileError(f"{path}: cannot be read as a PyTorch state dict ({type(e).__name__}: {e})") from e
    if not isinstance(sd, dict):
        raise WeightsFileError(f"{path}: holds a {type(sd).__name__}, not a state dict of tensors")
    return sd


def tensor_infos(path: Path) -> dict[str, TensorInfo]:
    """name -> shape and dtype of every tensor, without reading the data (.bin/.pt: memory-mapped)."""
    out = {}
    for shard in _shards(path):
        if shard.suffix == ".safetensors":
            header, _ = _st_header(shard)
            out |= {k: TensorInfo(tuple(v["shape"]), v["dtype"]) for k, v in header.items()}
        else:
            sd = _torch_load(shard)
            out |= {k: TensorInfo(tuple(v.shape), str(v.dtype).removeprefix("torch.")) for k, v in sd.items()}
    return out


def _bf16_to_f32(raw: np.ndarray) -> np.ndarray:
    return (raw.astype(np.uint32) << 16).view(np.float32)


def load_tensors(path: Path, names=None) -> dict[str, np.ndarray]:
    """name -> array: float tensors as float32 (bf16 and fp16 widened exactly), the rest as stored.
    names: only these (None: all)."""
    out = {}
    for shard in _shards(path):
        if shard.suffix == ".safetensors":
            header, start = _st_header(shard)
            with open(shard, "rb") as f:
                for k, v in header.items():
                    if names is not None and k not in names:
                        continue
                    a, b = v["data_offsets"]
                    f.seek(start + a)
                    raw = f.read(b - a)
                    dt = _ST_DTYPES.get(v["dtype"])
                    if dt is None:
                        raise WeightsFileError(f"{shard}: tensor {k} has dtype {v['dtype']}, which is not read here")
                    if dt == "bf16":
                        arr = _bf16_to_f32(np.frombuffer(raw, np.uint16))
                    else:
                        arr = np.frombuffer(raw, dt).copy()
                    arr = arr.reshape(v["shape"])
                    out[k] = arr.astype(np.float32) if arr.dtype.kind == "f" else arr
        else:
            for k, t in _torch_load(shard).items():
                if names is not None and k not in names:
                    continue
                t = t.float() if t.is_floating_point() else t
                out[k] = t.numpy().copy()
    return out
