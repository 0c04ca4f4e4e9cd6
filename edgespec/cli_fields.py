"""`edgespec` flags made from the config dataclasses: a field whose metadata holds "help" is a flag,
with the field's default and that help text, written once, in the field.

The metadata keys ("help" required, the rest optional):
    help     the --help text, or a function returning it (lists read from a registry); "%(default)s"
             shows the default (so "%" itself is written "%%")
    flag     the option string, or a tuple of them (aliases); default --name-with-dashes
    choices  the allowed values: a tuple, or a function returning one
    metavar  the value's name in --help
    type     argparse's converter; default from the annotation (tuple[X, ...]: comma-separated Xs)
    action   argparse's action; default for a bool "store_true" when the field defaults to False,
             else --x/--no-x (argparse.BooleanOptionalAction); "append": a tuple field, repeatable
    env      an environment variable that, when set, gives the flag's default instead

The flag's value lands in the namespace under the field's name, so `config_from` builds the config
back. A field without a default is a required flag. A default argparse cannot show (an object, e.g.
a TreeConfig) is None on the command line: unset, the field keeps its own."""

from __future__ import annotations

import argparse
import dataclasses
import os
import types
import typing
from collections.abc import Iterable

SIMPLE = (bool, int, float, str)  # field types a flag parses to as they are


def flag_fields(cls) -> dict[str, dataclasses.Field]:
    """The fields of `cls` that are flags (their metadata has "help"), in field order."""
    return {f.name: f for f in dataclasses.fields(cls) if "help" in f.metadata}


def add_fields(
    p, cls, names: Iterable[str] | None = None, helps: dict[str, str] | None = None, fill: dict | None = None
) -> None:
    """Add the flags of `cls`'s fields `names` (default: every flag field, in field order) to the
    parser `p`; `helps`: another help text for some, where a command gives the option another sense;
    `fill`: the help texts are format strings of these names and `default` (the field's)."""
    fields = flag_fields(cls)
    hints = typing.get_type_hints(cls)  # the annotations as types (they are strings in the modules)
    for name in fields if names is None else names:
        flags, kw = _argument(fields[name], hints[name])
        if helps and name in helps:
            kw["help"] = helps[name]
        if fill is not None:
            kw["help"] = kw["help"].format(default=fields[name].default, **fill)
        p.add_argument(*flags, **kw)


def cli_default(f: dataclasses.Field):
    """The value a flag holds when not given: the field's default (argparse's form of it)."""
    default = os.environ.get(f.metadata["env"], f.default) if "env" in f.metadata else f.default
    if default is dataclasses.MISSING:  # a field without a default: a required flag
        return None
    if isinstance(default, tuple):
        return list(default) if f.metadata.get("action") == "append" else ",".join(map(str, default))
    return default if default is None or isinstance(default, SIMPLE) else None


def config_from(cls, a, **values):
    """An instance of `cls` from the namespace `a`: every field `a` holds (an unset flag, None, keeps
    a default that is not None; lists become tuples), then `values`."""
    given = {}
    for f in dataclasses.fields(cls):
        if f.name not in vars(a) or f.name in values:
            continue
        v = getattr(a, f.name)
        if v is None and f.default is not None and f.default is not dataclasses.MISSING:
            continue
        given[f.name] = tuple(v) if isinstance(v, list) else v
    return cls(**given, **values)


def _argument(f: dataclasses.Field, hint) -> tuple[tuple[str, ...], dict]:
    """(option strings, add_argument's keywords) of the flag field f, annotated `hint`."""
    m = f.metadata
    flags = m.get("flag") or "--" + f.name.replace("_", "-")
    flags = (flags,) if isinstance(flags, str) else tuple(flags)
    kind, item = _kind(hint)
    kw = {"dest": f.name, "default": cli_default(f), "help": m["help"]() if callable(m["help"]) else m["help"]}
    if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
        kw["required"] = True
    action = m.get("action")
    if kind is bool and action is None:
        action = "store_true" if f.default is False else argparse.BooleanOptionalAction
    if action is not None:
        kw["action"] = action
    if action in ("store_true", "store_false", argparse.BooleanOptionalAction):
        return flags, kw  # no value: no type, choices or metavar
    if "type" in m:
        kw["type"] = m["type"]
    elif kind is tuple and action is None:
        kw["type"] = comma_list(item)
    elif (item or kind) in (int, float):
        kw["type"] = item or kind
    choices = m.get("choices")
    choices = choices() if callable(choices) else choices
    if choices:  # an empty tuple: any value of the type
        kw["choices"] = choices
    if m.get("metavar"):
        kw["metavar"] = m["metavar"]
    return flags, kw


def comma_list(item):
    """argparse type: comma-separated values of type `item`, as a tuple."""

    def parse(text: str) -> tuple:
        return tuple(item(x) for x in text.split(",") if x)

    parse.__name__ = f"comma-separated {item.__name__}"  # argparse's "invalid ... value" message
    return parse


def _kind(hint) -> tuple[object, object]:
    """(the type a value of `hint` has, the item type of a tuple or None), None taken out of unions."""
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        rest = [t for t in typing.get_args(hint) if t is not type(None)]
        hint = rest[0] if len(rest) == 1 else str
    if typing.get_origin(hint) is tuple:
        return tuple, (typing.get_args(hint) or (str,))[0]
    return hint, None
