"""Issue 37's layout, kept: every package is in the wheel, and the goals tools/layout_goals.py
measures hold (engines/ imports nothing above it, the Engine protocol names no drafter, the step
fits on a screen without grammar branches, a drafter's code sits in its two places)."""

import importlib.util
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[1]
ROOTS = {
    "edgespec": "edgespec",
    "edgespec.export": "export",
    "edgespec.runtime": "runtime",
    "edgespec.engines": "engines",
}


def _goals():
    spec = importlib.util.spec_from_file_location("layout_goals", ROOT / "tools/layout_goals.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_package_is_in_the_wheel():
    """pyproject's `packages` lists every folder with an __init__.py (a missing one installs without it)."""
    text = (ROOT / "pyproject.toml").read_text()  # (tomllib is 3.11+)
    listed = set(re.findall(r'"([\w.]+)"', re.search(r"^packages = \[(.*?)\]", text, re.S | re.M).group(1)))
    found = set()
    for name, folder in ROOTS.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT / folder).parts
            found.add(".".join([name, *rel]))
    assert found <= listed, sorted(found - listed)


def test_layout_goals():
    g = _goals()
    assert len(list((ROOT / "export").glob("*.py"))) <= 8
    assert g._engine_members() == [] and g._engines_importing_runtime() == []
    lines, grammar = g._step()
    assert lines <= 20 and grammar == 0
    for name in g.DRAFTERS:
        folders, plumbing, _ = g._drafter_places(name)
        assert len(folders) <= 2 and plumbing == [], (name, folders, plumbing)
