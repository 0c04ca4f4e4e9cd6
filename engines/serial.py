"""Dataclasses <-> JSON, generically: one writer and one reader for every typed section of the
manifest, driven by the fields' type hints (no to_json/from_json pair per class).

Supported field types: bool, int, float, str, Path, dict (kept as is), nested dataclasses,
tuple[X, ...], dict[K, V] with str or int keys (int keys are written as strings, as JSON needs),
X | None (written only when not None: an absent key reads back as None), and unions of plain
scalars (int | str). A field with metadata {"json": False} is neither written nor read. A field
typed with a registry of dataclasses (metadata {"registry": mapping}) is a dict name -> section,
each read with the class its name is registered under.
"""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from pathlib import Path

_SCALARS = (bool, int, float, str)


@functools.cache
def _hints(cls: type) -> dict[str, object]:
    return typing.get_type_hints(cls)


def to_json(obj):
    """A dataclass (or a value inside one) as JSON-ready data."""
    if dataclasses.is_dataclass(obj):
        out = {}
        for f in dataclasses.fields(obj):
            value = getattr(obj, f.name)
            if f.metadata.get("json", True) and value is not None:
                out[f.name] = to_json(value)
        return out
    if isinstance(obj, tuple | list):
        return [to_json(v) for v in obj]
    if isinstance(obj, dict):
        return {str(k): to_json(v) for k, v in obj.items()}
    if isinstance(obj, Path):
        return str(obj)
    return obj


def from_json(cls: type, d: dict, **given):
    """Build dataclass `cls` from JSON data d; `given` fills fields that are not written (json: False)."""
    if not isinstance(d, dict):
        raise TypeError(f"{cls.__name__}: expected an object, got {type(d).__name__}")
    hints, values = _hints(cls), dict(given)
    for f in dataclasses.fields(cls):
        if not f.metadata.get("json", True) or f.name in given:
            continue
        if f.name not in d:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                if _optional(hints[f.name]):
                    values[f.name] = None
                    continue
                raise KeyError(f"{cls.__name__}.{f.name}")
            continue  # the field's default
        registry = f.metadata.get("registry")
        if registry is not None:
            values[f.name] = {name: _section(registry, name, v) for name, v in d[f.name].items()}
        else:
            values[f.name] = _read(hints[f.name], d[f.name], f"{cls.__name__}.{f.name}")
    return cls(**values)


def _section(registry: dict, name: str, d: dict):
    if name not in registry:
        raise ValueError(f"unknown section {name!r} (known: {', '.join(sorted(registry))})")
    return from_json(registry[name], d)


def _optional(tp) -> bool:
    return typing.get_origin(tp) in (typing.Union, types.UnionType) and type(None) in typing.get_args(tp)


def _read(tp, v, where: str):
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        if v is None and type(None) in args:
            return None
        kinds = [a for a in args if a is not type(None)]
        if len(kinds) == 1:
            return _read(kinds[0], v, where)
        if all(a in _SCALARS for a in kinds) and isinstance(v, tuple(kinds)):
            return v
        raise TypeError(f"{where}: {v!r} is none of {kinds}")
    if origin is tuple:
        item = args[0]
        return tuple(_read(item, x, where) for x in v)
    if origin is dict:
        key, val = args
        return {(int(k) if key is int else k): _read(val, x, where) for k, x in v.items()}
    if tp is dict:
        return dict(v)
    if dataclasses.is_dataclass(tp):
        return from_json(tp, v)
    if tp is Path:
        return Path(v)
    if tp is float:
        return float(v)
    if tp in _SCALARS:
        if not isinstance(v, tp) or (tp is int and isinstance(v, bool)):
            raise TypeError(f"{where}: {v!r} is not {tp.__name__}")
        return v
    if tp is typing.Any or tp is object:
        return v
    raise TypeError(f"{where}: cannot read type {tp}")


class Serial:
    """Base of a dataclass written to JSON: `to_json()` and `cls.from_json(d)`, both generic."""

    def to_json(self) -> dict:
        return to_json(self)

    @classmethod
    def from_json(cls, d: dict):
        return from_json(cls, d)
