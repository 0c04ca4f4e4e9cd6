"""torch.save files read without torch (what _files.py's early checks use for pytorch_model.bin and
.pt): a zip's data.pkl unpickled with tensors as places in the file (`pickle_views`), anything but a
dict of tensors refused; only a pre-1.6 torch.save pickle goes through torch.load (`torch_load`)."""

from __future__ import annotations

import collections
import io
import pickle
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from edgespec.export.drafters._files import TensorInfo, WeightsFileError

# torch's storage classes in a torch.save zip's data.pkl -> (torch's dtype name, numpy dtype; "bf16": raw uint16)
_TORCH_STORAGES = {
    "FloatStorage": ("float32", np.float32),
    "HalfStorage": ("float16", np.float16),
    "BFloat16Storage": ("bfloat16", "bf16"),
    "DoubleStorage": ("float64", np.float64),
    "LongStorage": ("int64", np.int64),
    "IntStorage": ("int32", np.int32),
    "ShortStorage": ("int16", np.int16),
    "CharStorage": ("int8", np.int8),
    "ByteStorage": ("uint8", np.uint8),
    "BoolStorage": ("bool", np.bool_),
}


@dataclass(frozen=True)
class _Storage:
    key: str  # its member's name under data/
    kind: str  # torch's storage class name (_TORCH_STORAGES)


@dataclass(frozen=True)
class _Pickled:
    storage: _Storage  # where its elements are
    offset: int  # its first element's index in the storage
    shape: tuple[int, ...]  # as saved
    stride: tuple[int, ...]  # in elements


def _rebuild_tensor(storage, offset, shape, stride, *_):
    return _Pickled(storage, int(offset), tuple(int(s) for s in shape), tuple(int(s) for s in stride))


def _rebuild_parameter(data, *_):
    return data


class _StateDictUnpickler(pickle.Unpickler):
    """data.pkl of a torch.save zip read without torch: tensors become `_Pickled` (where their data
    is), and any object but a dict of tensors is refused (what torch.load's weights_only allows, less)."""

    def __init__(self, file, path: Path) -> None:
        super().__init__(file)
        self.path = path

    def find_class(self, module: str, name: str):
        if module == "torch._utils" and name in ("_rebuild_tensor", "_rebuild_tensor_v2"):
            return _rebuild_tensor
        if module == "torch._utils" and name == "_rebuild_parameter":
            return _rebuild_parameter
        if module == "torch" and name in _TORCH_STORAGES:
            return name
        if module == "collections" and name == "OrderedDict":
            return collections.OrderedDict
        raise WeightsFileError(f"{self.path}: holds a {module}.{name} object, not a state dict of tensors")

    def persistent_load(self, pid):
        if not (isinstance(pid, tuple) and len(pid) >= 3 and pid[0] == "storage" and pid[1] in _TORCH_STORAGES):
            raise WeightsFileError(f"{self.path}: a storage record {pid!r} torch.save does not write")
        return _Storage(str(pid[2]), pid[1])


def torch_kind(path: Path) -> str:
    """ "zip" (torch.save's format since 1.6, or what is left of one), "legacy" (an older torch.save
    pickle), else WeightsFileError."""
    with open(path, "rb") as f:
        head = f.read(4)
    if head[:1] == b"\x80":  # pickle's PROTO opcode
        return "legacy"
    if head == b"PK\x03\x04" or (len(head) < 4 and b"PK\x03\x04".startswith(head)):  # (a file cut short: refused)
        return "zip"
    raise WeightsFileError(
        f"{path}: cannot be read as a PyTorch state dict: neither a torch.save zip nor a pickle (it starts {head!r})"
    )


def _state_dict(path: Path) -> tuple[dict, str, dict]:
    """(the zip's members by name, its <name>/ prefix, data.pkl's dict of `_Pickled`) of a torch.save zip."""
    import zipfile

    try:
        z = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError) as e:
        raise WeightsFileError(
            f"{path}: not a complete zip archive ({e}): a torch.save file cut short (an interrupted download or "
            "save?) or damaged. Hint: download or save it again"
        ) from e
    with z:
        members = {i.filename: i for i in z.infolist()}
        pkl = [n for n in members if n.endswith("data.pkl") and n.count("/") == 1]
        if len(pkl) != 1:
            raise WeightsFileError(f"{path}: a zip without torch.save's <name>/data.pkl; not a PyTorch state dict")
        prefix = pkl[0][: -len("data.pkl")]
        order = members.get(prefix + "byteorder")
        if order is not None and z.read(order).decode(errors="replace").strip() != "little":
            raise WeightsFileError(f"{path}: saved big-endian; edgespec reads little-endian state dicts")
        try:
            sd = _StateDictUnpickler(io.BytesIO(z.read(pkl[0])), path).load()
        except WeightsFileError:
            raise
        except Exception as e:  # noqa: BLE001 - a damaged pickle raises many kinds
            raise WeightsFileError(f"{path}: its data.pkl cannot be read ({type(e).__name__}: {e})") from e
    if not isinstance(sd, dict) or not all(isinstance(t, _Pickled) for t in sd.values()):
        raise WeightsFileError(f"{path}: holds a {type(sd).__name__}, not a state dict of tensors")
    return members, prefix, sd


def _data_start(path: Path, m, name: str) -> int:
    """Where the bytes of zip member `m` (tensor `name`'s storage) start in the file."""
    with open(path, "rb") as f:  # the local header: 30 bytes, then the name and an extra field
        f.seek(m.header_offset)
        local = f.read(30)
    if len(local) < 30 or local[:4] != b"PK\x03\x04":
        raise WeightsFileError(f"{path}: tensor {name}'s storage has no zip entry header: a damaged file")
    name_len, extra_len = struct.unpack("<HH", local[26:30])
    return m.header_offset + 30 + name_len + extra_len


def pickle_views(path: Path) -> dict[str, tuple[TensorInfo, object]]:
    """name -> (shape and dtype, a function giving its elements as stored: a numpy view of the file,
    bf16 as uint16) of a torch.save zip (pytorch_model.bin, .pt), read without torch; every tensor's
    storage checked present and long enough, so a file cut short or damaged is refused here."""
    import zipfile

    members, prefix, sd = _state_dict(path)
    size = path.stat().st_size
    starts: dict[str, int] = {}  # storage key -> where its bytes start in the file
    out = {}
    for name, t in sd.items():
        torch_name, dt = _TORCH_STORAGES[t.storage.kind]
        item = 2 if dt == "bf16" else np.dtype(dt).itemsize
        m = members.get(f"{prefix}data/{t.storage.key}")
        if m is None:
            raise WeightsFileError(f"{path}: tensor {name}'s storage data/{t.storage.key} is missing: a damaged file")
        if m.compress_type != zipfile.ZIP_STORED:
            raise WeightsFileError(f"{path}: tensor {name} is stored compressed; torch.save writes it uncompressed")
        if t.storage.key not in starts:
            starts[t.storage.key] = _data_start(path, m, name)
        start, n_elems = starts[t.storage.key], m.file_size // item
        if start + m.file_size > size:
            raise WeightsFileError(f"{path}: tensor {name}'s storage runs past the end of the file: a damaged file")
        count = int(np.prod(t.shape, dtype=np.int64))
        extent = t.offset + sum((s - 1) * st for s, st in zip(t.shape, t.stride, strict=False)) + 1 if count else 0
        if t.offset < 0 or min(t.stride, default=0) < 0 or extent > n_elems:
            raise WeightsFileError(
                f"{path}: tensor {name} {list(t.shape)} reaches element {extent} of a storage of {n_elems}: a "
                "damaged file"
            )

        def view(path=path, start=start, n=n_elems, t=t, dt=dt):
            raw_dt = np.uint16 if dt == "bf16" else dt
            if not n:
                return np.zeros(t.shape, raw_dt)
            flat = np.memmap(path, raw_dt, "r", offset=start, shape=(n,))
            item = flat.dtype.itemsize
            return np.lib.stride_tricks.as_strided(
                flat[t.offset :], t.shape, tuple(s * item for s in t.stride), writeable=False
            )

        out[name] = (TensorInfo(t.shape, torch_name), view)
    return out


def from_torch(t):
    """A torch tensor's elements as _files._views gives them (bf16 as raw uint16)."""
    import torch

    if t.dtype == torch.bfloat16:
        return t.contiguous().view(torch.int16).numpy().view(np.uint16)
    return t.numpy()


def torch_load(path: Path) -> dict:
    import torch

    try:
        sd = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - torch raises many kinds for a file it cannot read
        why = " ".join(str(e).split())[:300]  # one line: torch's messages run to paragraphs
        raise WeightsFileError(f"{path}: cannot be read as a PyTorch state dict ({type(e).__name__}: {why})") from e
    if not isinstance(sd, dict):
        raise WeightsFileError(f"{path}: holds a {type(sd).__name__}, not a state dict of tensors")
    return sd
