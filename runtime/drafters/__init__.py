"""Drafters: cheap proposers of the next tokens, one module each in this package.

Each module registers an instance of its `DrafterPlugin` (base.py) subclass with `register`; `registry()` imports every
module of the package once (modules whose name starts with "_" are shared code, not drafters),
so a new drafter is its module and nothing else. Every list of drafters (CLI choices and help,
RuntimeConfig's options, the backend x drafter checks, `tune`, the server's abilities) reads
the registry.
"""

from __future__ import annotations

from edgespec.engines.manifest import SECTIONS, drafter_section, sections_from
from edgespec.runtime.drafters.base import (
    BuildContext,
    Command,
    Drafter,
    DrafterPlugin,
    LoadContext,
    Option,
    penalized,
)
from edgespec.runtime.registry import Registry

__all__ = [
    "BuildContext",
    "Command",
    "Drafter",
    "DrafterPlugin",
    "LoadContext",
    "Option",
    "penalized",
    "register",
    "registry",
    "spec_of",
    "names",
    "tree_names",
    "options",
    "commands",
    "shipped",
    "make_drafter",
    "UnknownDrafterError",
]

REGISTRY: Registry[DrafterPlugin] = Registry(__name__, "drafter name")


class UnknownDrafterError(ValueError):
    """A drafter name no registered drafter answers to."""


def register(plugin: DrafterPlugin) -> DrafterPlugin:
    """Add a drafter (its module calls this at import; a test may call it for a toy drafter).
    Its manifest section, if any, is registered with the manifest reader at the same time."""
    REGISTRY.register(plugin)
    if plugin.section is not None:
        drafter_section(plugin.name)(plugin.section)
    return plugin


def unregister(name: str) -> None:
    """Remove a drafter (tests that register a toy one clean up with this)."""
    REGISTRY.unregister(name)
    SECTIONS.pop(name, None)


def registry() -> dict[str, DrafterPlugin]:
    """name -> plugin of every drafter, in listing order (DrafterPlugin.order, then by name)."""
    return REGISTRY.all()


# the manifest reader asks this registry for the section types of a folder's drafters (it imports
# nothing above engines/): every drafter module is imported before a manifest is read
sections_from(registry)


def names() -> tuple[str, ...]:
    return tuple(registry())


def tree_names() -> tuple[str, ...]:
    """The drafters that grow token trees."""
    return tuple(n for n, s in registry().items() if s.trees)


def spec_of(name: str) -> DrafterPlugin:
    """The plugin of drafter `name` (or of an alias); a clear error for an unknown name."""
    reg = registry()
    spec = reg.get(REGISTRY.aliases.get(name, name))
    if spec is None:
        raise UnknownDrafterError(f"unknown drafter {name!r}; choose one of {', '.join(reg)}")
    return spec


def options() -> tuple[Option, ...]:
    """Every drafter's options, once each (a drafter may read another's, e.g. a shared cut-off)."""
    return REGISTRY.options()


def commands() -> tuple[Command, ...]:
    """Every drafter's `edgespec` commands (recycle's `warm`), in the drafters' order."""
    return tuple(c for plugin in registry().values() for c in plugin.commands)


def shipped(manifest, cfg) -> tuple[str, ...]:
    """The drafters a folder can run with cfg: the model-free ones and those whose sections it ships."""
    return tuple(n for n, s in registry().items() if all(need in manifest.drafters for need in s.needs(cfg)))


def make_drafter(name: str, ctx: BuildContext) -> Drafter:
    """Drafter `name` over a generator's engines and buffers."""
    return spec_of(name).build(ctx)
