"""A registry of plugins, one module each in a package. The drafters have one list: the runtime's
(runtime/drafters: every drafter the loop runs, each module found in its package). The export
halves of those that ship models (export/drafters) are found through it: that registry imports
`export/drafters/<name>` for each runtime drafter with a manifest section, and only the export
imports it, so the runtime never imports torch.

`all()` imports every plugin module once (in a package, modules whose name starts with "_", and
`base`, are shared code, not plugins); each registers its plugin at import with `register`, so a
new plugin is its module and nothing else. Plugins are listed by their `order`, then by name.
"""

from __future__ import annotations

import importlib
import pkgutil
from typing import Generic, TypeVar

T = TypeVar("T")


class Registry(Generic[T]):
    """name -> plugin (anything with `name`, `order`, `options` and optionally `aliases`)."""

    def __init__(self, package: str, what: str, modules=None) -> None:
        self.package = package  # the dotted name of the package whose modules register plugins
        self.what = what  # what a plugin's name is called in errors ("drafter name")
        # () -> the names of the package's modules that register plugins (another registry's entries);
        # None: every module of the package
        self.modules = modules
        self.items: dict[str, T] = {}  # live: tests may patch an entry for the length of a test
        self.aliases: dict[str, str] = {}  # other names -> the plugin's own
        self._loaded = False

    def register(self, plugin: T) -> T:
        """Add a plugin (its module calls this at import; a test may call it for a toy one)."""
        for n in (plugin.name, *getattr(plugin, "aliases", ())):
            owner = self.items.get(self.aliases.get(n, n))
            if owner is not None and owner is not plugin:
                raise ValueError(f"{self.what} {n!r} is registered twice")
        self.items[plugin.name] = plugin
        self.aliases.update({a: plugin.name for a in getattr(plugin, "aliases", ())})
        if self._loaded:  # a late one (a test's toy) takes its place in the order too
            self._sort()
        return plugin

    def unregister(self, name: str) -> T:
        """Remove a plugin (tests that register a toy one clean up with this); returns it."""
        plugin = self.items.pop(name)
        for a in getattr(plugin, "aliases", ()):
            self.aliases.pop(a, None)
        return plugin

    def all(self) -> dict[str, T]:
        """name -> plugin of every plugin of the package, in order (the modules imported on first use)."""
        if not self._loaded:
            self._loaded = True
            if self.modules is not None:
                names = self.modules()
            else:
                pkg = importlib.import_module(self.package)
                names = [m.name for m in pkgutil.iter_modules(pkg.__path__)]
            for name in names:
                if not name.startswith("_") and name != "base":
                    importlib.import_module(f"{self.package}.{name}")
            self._sort()
        return self.items

    def options(self) -> tuple:
        """Every plugin's options, once each (a plugin may list another's, e.g. a shared cut-off)."""
        seen: dict[str, object] = {}
        for plugin in self.all().values():
            for opt in plugin.options:
                seen.setdefault(opt.name, opt)
        return tuple(seen.values())

    def _sort(self) -> None:
        ordered = sorted(self.items.values(), key=lambda p: (p.order, p.name))
        self.items.clear()
        self.items.update({p.name: p for p in ordered})
