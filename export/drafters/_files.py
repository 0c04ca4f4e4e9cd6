"""Reading published drafter checkpoints: which weights file a folder holds, its tensors' names,
shapes and dtypes without reading the data (`tensor_infos`: what the checks before the target
loads use; each file checked whole, so one cut short is refused by name there), NaN and infinities
refused (`check_finite`), and the tensors as float32 numpy whatever they were stored in
(`load_tensors`: fp32, fp16, bf16; .safetensors, sharded .safetensors, pytorch_model.bin, .pt).

None of it imports torch: safetensors files are read through their header, torch.save zips (_torch_zip.py) through
their data.pkl with an unpickler that rebuilds tensors as places in the file (only a pre-1.6
torch.save pickle goes through torch.load). The early check refuses in seconds, not after torch's.

bf16 is read explicitly (safetensors' raw bytes widened to float32 by a shift), never through
numpy's understanding of a 'bfloat16' dtype, which exists only once some other package has
imported ml_dtypes.
"""

from __future__ import annotations

import json
import math
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
# bytes per element of each safetensors dtype: the data section's length follows from the shapes
_ST_SIZES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U64": 8, "U32": 4}
_ST_SIZES |= {"U16": 2, "U8": 1, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1}


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


def eps_problem(eps) -> str | None:
    """What is wrong with a config's rms_norm_eps for the graphs' RMSNorm (None: nothing): it must be
    a finite number > 0 (NaN gives NaN everywhere, a negative one the root of a negative number)."""
    if isinstance(eps, bool) or not isinstance(eps, int | float) or not math.isfinite(eps) or eps <= 0:
        return f"rms_norm_eps {eps!r} is not a finite number > 0, which RMSNorm needs (typically 1e-5 or 1e-6)"
    return None


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
    if not path.name.endswith(".index.json"):
        return [path]
    try:
        index = read_json(path)
        shards = [path.parent / f for f in dict.fromkeys(index["weight_map"].values())]
    except (ValueError, UnicodeDecodeError, KeyError, TypeError, AttributeError) as e:
        raise WeightsFileError(
            f"{path}: not a weights index (a JSON object with a weight_map of tensor -> file): {type(e).__name__}: {e}"
        ) from e
    missing = [s.name for s in shards if not s.exists()]
    if missing:
        raise WeightsFileError(f"{path} names shard(s) {', '.join(missing[:3])}, which the folder does not hold")
    return shards


MAX_CONFIG_BYTES = 16 << 20  # a config.json is a few KB; a bigger one is not a config (or is /dev/zero)


def read_json(path: str | Path) -> dict:
    """A drafter folder's JSON file (config.json, an index), refused in one line unless it is a regular
    file under MAX_CONFIG_BYTES of UTF-8 JSON: a FIFO, device or link to /dev/zero would block or grow
    without end before any check could run."""
    from edgespec.runtime.files import InputFileError, read_text

    try:
        text = read_text(path, "drafter file", MAX_CONFIG_BYTES)
    except InputFileError as e:
        raise WeightsFileError(str(e)) from None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise WeightsFileError(f"{path}: not valid JSON ({e.msg}, line {e.lineno}). Hint: restore the file") from None
    if not isinstance(value, dict):
        raise WeightsFileError(f"{path}: a JSON {type(value).__name__}, not an object of fields")
    return value


def _regular(path: Path) -> Path:
    """`path`, refused unless it is a regular file (a FIFO or device would block or never end)."""
    if not path.is_file():
        raise WeightsFileError(f"{path}: not a regular file (a folder, FIFO or device); pass the checkpoint's own file")
    return path


def _st_header(path: Path) -> tuple[dict, int]:
    """(name -> header entry, where the data section starts) of a .safetensors file, checked: the
    file is at least its header, every entry's offsets hold its shape in its dtype, and the data
    section is exactly as long as the header says (a file cut short is refused here, by name)."""
    size = _regular(path).stat().st_size
    cut = "the file is cut short (an interrupted download or save?). Hint: download or save it again"
    if size < 8:
        raise WeightsFileError(f"{path}: {size} bytes, less than a safetensors header's 8-byte length: {cut}")
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        if n > size - 8:
            raise WeightsFileError(
                f"{path}: its first 8 bytes give a {n}-byte header but {size - 8} bytes follow: not a safetensors "
                f"file, or {cut}"
            )
        raw = f.read(n)
    try:
        header = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as e:
        raise WeightsFileError(f"{path}: its header is not JSON ({e}): not a safetensors file, or a damaged one") from e
    if not isinstance(header, dict):
        raise WeightsFileError(f"{path}: its header is a JSON {type(header).__name__}, not safetensors' object")
    header.pop("__metadata__", None)
    end = 0
    for k, v in header.items():
        try:
            shape, (a, b) = [int(s) for s in v["shape"]], [int(o) for o in v["data_offsets"]]
            dtype = str(v["dtype"])
        except (KeyError, TypeError, ValueError) as e:
            raise WeightsFileError(f"{path}: tensor {k}'s header entry {v!r} is not safetensors' ({e})") from e
        nbytes = int(np.prod(shape, dtype=np.int64)) * _ST_SIZES.get(dtype, 0)
        if a < 0 or b < a or min(shape, default=0) < 0 or (dtype in _ST_SIZES and b - a != nbytes):
            raise WeightsFileError(
                f"{path}: tensor {k} ({dtype} {shape}) has data_offsets [{a}, {b}], not the {nbytes} bytes its "
                "shape holds: a damaged file. Hint: download or save it again"
            )
        end = max(end, b)
    data = size - 8 - n
    if end > data:
        raise WeightsFileError(
            f"{path}: its header places tensor data up to byte {end} of the data section, which holds {data} "
            f"({end - data} bytes missing): {cut}"
        )
    if end < data:
        raise WeightsFileError(
            f"{path}: {data - end} bytes follow the last tensor the header lists: not a file safetensors wrote "
            "(safetensors refuses it too). Hint: save it again"
        )
    return header, 8 + n


def _st_views(path: Path) -> dict[str, tuple[TensorInfo, object]]:
    """As _torch_zip.pickle_views, of a checked .safetensors file (dtypes not read here: their view is None)."""
    header, start = _st_header(path)
    out = {}
    for k, v in header.items():
        a, b = v["data_offsets"]
        dt = _ST_DTYPES.get(v["dtype"])
        shape = tuple(v["shape"])

        def view(a=a, b=b, dt=dt, shape=shape):
            raw_dt = np.uint16 if dt == "bf16" else dt
            if b == a:
                return np.zeros(shape, raw_dt)
            return np.memmap(path, raw_dt, "r", offset=start + a, shape=(int(np.prod(shape)),)).reshape(shape)

        out[k] = (TensorInfo(shape, v["dtype"]), None if dt is None else view)
    return out


def _views(shard: Path) -> dict[str, tuple[TensorInfo, object]]:
    """name -> (shape and dtype, its elements as stored) of one weights file, whatever its format."""
    if shard.suffix == ".safetensors":
        return _st_views(shard)
    from edgespec.export.drafters._torch_zip import from_torch, pickle_views, torch_kind, torch_load

    if torch_kind(_regular(shard)) == "zip":
        return pickle_views(shard)
    # torch's legacy (pre-1.6) format: torch reads it
    return {
        k: (TensorInfo(tuple(t.shape), str(t.dtype).removeprefix("torch.")), lambda t=t: from_torch(t))
        for k, t in torch_load(shard).items()
    }


def tensor_infos(path: Path) -> dict[str, TensorInfo]:
    """name -> shape and dtype of every tensor, without reading the data; each file checked to be
    whole (a safetensors header and a data section as long as it says; a torch.save zip that opens,
    each tensor's storage there and long enough): WeightsFileError names the file and the problem.
    Needs no torch (but for a pre-1.6 torch.save file)."""
    out = {}
    for shard in _shards(path):
        out |= {k: info for k, (info, _) in _views(shard).items()}
    return out


def _bf16_to_f32(raw: np.ndarray) -> np.ndarray:
    return (raw.astype(np.uint32) << 16).view(np.float32)


def load_tensors(path: Path, names=None) -> dict[str, np.ndarray]:
    """name -> array: float tensors as float32 (bf16 and fp16 widened exactly), the rest as stored.
    names: only these (None: all)."""
    out = {}
    for shard in _shards(path):
        for k, (info, view) in _views(shard).items():
            if names is not None and k not in names:
                continue
            if view is None:
                raise WeightsFileError(f"{shard}: tensor {k} has dtype {info.dtype}, which is not read here")
            raw = view()
            if info.dtype in ("BF16", "bfloat16"):
                arr = _bf16_to_f32(raw).reshape(info.shape)
            else:
                arr = np.array(raw)  # a copy: the file is not kept open
            out[k] = arr.astype(np.float32) if arr.dtype.kind == "f" else arr
    return out


# float dtypes (safetensors' and torch's names) -> (raw unsigned type, exponent bits, mantissa bits)
_FLOAT_BITS = {
    "F16": (np.uint16, 0x7C00, 0x03FF),
    "float16": (np.uint16, 0x7C00, 0x03FF),
    "BF16": (np.uint16, 0x7F80, 0x007F),
    "bfloat16": (np.uint16, 0x7F80, 0x007F),
    "F32": (np.uint32, 0x7F800000, 0x007FFFFF),
    "float32": (np.uint32, 0x7F800000, 0x007FFFFF),
    "F64": (np.uint64, 0x7FF0000000000000, 0x000FFFFFFFFFFFFF),
    "float64": (np.uint64, 0x7FF0000000000000, 0x000FFFFFFFFFFFFF),
}
_CHUNK = 1 << 22  # elements scanned at a time (a 16 MiB float32 slice: memory stays flat on large heads)


def check_finite(path: Path, names=None) -> None:
    """Refuse (WeightsFileError, naming the tensor and the file) a float tensor holding NaN or an
    infinity: a head with one drafts nothing useful, and the export's checks would compare NaN with
    NaN. Streams over the tensors' bytes (memory-mapped, in slices); names: only these (None: all).
    Needs no torch (but for a pre-1.6 torch.save file)."""
    for shard in _shards(path):
        for k, (info, view) in _views(shard).items():
            bits = _FLOAT_BITS.get(info.dtype)
            if bits is None or view is None or (names is not None and k not in names):
                continue
            raw_t, exp, mant = bits
            flat = np.asarray(view()).reshape(-1).view(raw_t)
            nan = inf = 0
            for i in range(0, flat.size, _CHUNK):
                x = flat[i : i + _CHUNK]
                top = (x & raw_t(exp)) == exp
                if top.any():
                    m = (x & raw_t(mant))[top] != 0
                    nan, inf = nan + int(m.sum()), inf + int((~m).sum())
            if nan or inf:
                what = " and ".join(f"{c} {w}" for c, w in ((nan, "NaN"), (inf, "infinite")) if c)
                raise WeightsFileError(
                    f"{shard}: tensor {k} holds {what} value(s) of {flat.size}: the head cannot draft with it (did "
                    "its training diverge?). Hint: export a checkpoint saved before that"
                )
