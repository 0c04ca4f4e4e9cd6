"""The export side of the drafters that ship models, one module each in this package.

Each module registers an `ExportPlugin` (base.py) with `register`; `registry()` imports every
module of the package once (modules whose name starts with "_" are shared code), so a drafter's
export is its module and nothing else: `edgespec export`'s flags and ExportConfig's fields
(`options`), the export's steps (export.exporter), the `train-<name>` commands (edgespec.cli_offline)
all read the registry. Model-free drafters (and combinators of others) have no module here.
"""

from __future__ import annotations

import importlib
import pkgutil

from edgespec.export.drafters.base import ExportContext, ExportOption, ExportPlugin, Shipped, TrainCommand

__all__ = [
    "ExportContext",
    "ExportOption",
    "ExportPlugin",
    "Shipped",
    "TrainCommand",
    "register",
    "unregister",
    "registry",
    "options",
    "sources",
]

_REGISTRY: dict[str, ExportPlugin] = {}
_loaded = False


def register(plugin: ExportPlugin) -> ExportPlugin:
    """Add a drafter's export (its module calls this at import; a test may call it for a toy one)."""
    if _REGISTRY.get(plugin.name, plugin) is not plugin:
        raise ValueError(f"export plugin {plugin.name!r} is registered twice")
    _REGISTRY[plugin.name] = plugin
    return plugin


def unregister(name: str) -> None:
    """Remove a drafter's export (tests that register a toy one clean up with this)."""
    _REGISTRY.pop(name)


def registry() -> dict[str, ExportPlugin]:
    """name -> plugin of every drafter that ships models, by `order` (then by name)."""
    global _loaded
    if not _loaded:
        _loaded = True
        for m in pkgutil.iter_modules(__path__):
            if not m.name.startswith("_") and m.name != "base":
                importlib.import_module(f"{__name__}.{m.name}")
    ordered = sorted(_REGISTRY.values(), key=lambda p: (p.order, p.name))
    return {p.name: p for p in ordered}


def options() -> tuple[ExportOption, ...]:
    """Every plugin's options, once each (a plugin may read another's, e.g. a shared draft-vocabulary cut)."""
    seen: dict[str, ExportOption] = {}
    for plugin in registry().values():
        for opt in plugin.options:
            seen.setdefault(opt.name, opt)
    return tuple(seen.values())


def sources(cfg, src) -> dict[str, object]:
    """name -> what each drafter of this export ships from (drafters with none left out). A folder
    given to one drafter's flag that another drafter claims (its own format) is taken as that
    one's; given to both, it is refused."""
    from pathlib import Path

    from edgespec.export.target.spec import ExportError

    plugins = registry()
    found = {name: p.source(cfg, src) for name, p in plugins.items()}
    for name, p in plugins.items():
        if p.claims is None:
            continue
        for other, folder in list(found.items()):
            if other == name or not isinstance(folder, Path) or not p.claims(folder):
                continue
            if found[name] is not None:
                raise ExportError(
                    f"{plugins[other].flag} {folder} is {p.title} and {p.flag} names another; pass it once, as {p.flag}"
                )
            found[name], found[other] = folder, None
    return {name: s for name, s in found.items() if s is not None}
