"""The export side of the drafters that ship models, one module each in this package.

Each module registers an instance of its `ExportPlugin` (base.py) subclass with `register`.
`registry()` reads the one list of drafters, the runtime's (runtime/registry.py): it imports the
module here named as each runtime drafter that ships a manifest section (modules whose name starts
with "_" are shared code), so a drafter's export is its module and nothing else: `edgespec
export`'s flags and ExportConfig's fields (`options`), the export's steps (export.exporter), the
`train-<name>` commands (edgespec.cli_offline) all read the registry. Model-free drafters (and
combinators of others) have no module here.
"""

from __future__ import annotations

from edgespec.export.drafters.base import ExportContext, ExportOption, ExportPlugin, Shipped
from edgespec.runtime.registry import Registry

__all__ = [
    "ExportContext",
    "ExportOption",
    "ExportPlugin",
    "Shipped",
    "register",
    "unregister",
    "registry",
    "options",
    "sources",
]


def _shipping() -> list[str]:
    """The drafters whose export half sits here: the runtime's drafters that ship a manifest section."""
    from edgespec.runtime.drafters import registry as drafters

    return [name for name, plugin in drafters().items() if plugin.section is not None]


REGISTRY: Registry[ExportPlugin] = Registry(__name__, "export plugin", modules=_shipping)


def register(plugin: ExportPlugin) -> ExportPlugin:
    """Add a drafter's export (its module calls this at import; a test may call it for a toy one)."""
    return REGISTRY.register(plugin)


def unregister(name: str) -> None:
    """Remove a drafter's export (tests that register a toy one clean up with this)."""
    REGISTRY.unregister(name)


def registry() -> dict[str, ExportPlugin]:
    """name -> plugin of every drafter that ships models, by `order` (then by name)."""
    return REGISTRY.all()


def options() -> tuple[ExportOption, ...]:
    """Every plugin's options, once each (a plugin may read another's, e.g. a shared draft-vocabulary cut)."""
    return REGISTRY.options()


def sources(cfg, src) -> dict[str, object]:
    """name -> what each drafter of this export ships from (drafters with none left out). A folder
    given to one drafter's flag that another drafter claims (its own format) is taken as that
    one's; given to both, it is refused."""
    from pathlib import Path

    from edgespec.export.target.spec import ExportError

    plugins = registry()
    found = {name: p.source(cfg, src) for name, p in plugins.items()}
    for name, p in plugins.items():
        for other, folder in list(found.items()):
            if other == name or not isinstance(folder, Path) or not p.claims(folder):
                continue
            if found[name] is not None:
                a = "an" if p.title[:1] in "AEIOU" else "a"
                raise ExportError(
                    f"{plugins[other].flag} {folder} is {a} {p.title} and {p.flag} names another; pass it once, "
                    f"as {p.flag}"
                )
            found[name], found[other] = folder, None
    return {name: s for name, s in found.items() if s is not None}
