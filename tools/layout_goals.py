"""Issue 37's layout goals, measured on the tree as it is (docs/results/layout.md quotes the output).

    python tools/layout_goals.py [--no-duplicates]

- export/'s top-level modules (goal <= 8; the rest in subpackages named for their concern);
- per drafter with models (dflash, medusa, eagle, eagle3): the folders holding its code (goal <= 2,
  one per side) and the non-test modules elsewhere that import it (plumbing: goal 0; another
  drafter building on it is listed apart);
- the Engine protocol's members named for one drafter (goal 0) and engines/ modules importing
  runtime/ (goal 0);
- Generator._step's body length (goal <= 20 lines) and its grammar branches (goal 0);
- `duplicates --most 200` pairs with a side outside tests/ (goal <= 25; the tool reads the tree as
  text for up to --seconds, so run it on a quiet machine).
Reads files only (ast and text); imports nothing of edgespec.
"""

from __future__ import annotations

import ast
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DRAFTERS = ("dflash", "medusa", "eagle", "eagle3")
DRAFTER_WORDS = ("dflash", "medusa", "eagle", "eagle3", "fused", "head")  # Engine members named for a drafter


def _modules(folder: str) -> list[Path]:
    return sorted(p for p in (ROOT / folder).rglob("*.py") if "__pycache__" not in p.parts)


def _imports(path: Path) -> set[str]:
    """The dotted modules `path` imports (`from a.b import c` gives a.b and a.b.c)."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
            out.update(f"{node.module}.{a.name}" for a in node.names)
    return out


def _drafter_places(name: str) -> tuple[list[str], list[str], list[str]]:
    """(folders holding its code, plumbing modules importing it, other drafters' modules importing it)."""
    homes = [f"runtime/drafters/{name}", f"export/drafters/{name}"]
    folders = sorted(
        {h for h in homes if (ROOT / h).is_dir() or (ROOT / f"{h}.py").exists()}
        | {str(p.parent.relative_to(ROOT)) for p in ROOT.rglob("*.py") if _named(p, name) and not _home(p, homes)}
    )
    pattern = re.compile(rf"^edgespec\.(runtime|export)\.drafters\.{name}(\.|$)")
    plumbing, drafters = [], []
    for p in [*_modules("runtime"), *_modules("engines"), *_modules("export"), *_modules("edgespec")]:
        if _home(p, homes) or not any(pattern.match(m) for m in _imports(p)):
            continue
        rel = str(p.relative_to(ROOT))
        in_drafter = re.match(r"(runtime|export)/drafters/[a-z0-9]", rel)  # not a shared _module
        (drafters if in_drafter else plumbing).append(rel)
    return folders, plumbing, drafters


def _named(p: Path, name: str) -> bool:
    """A source module (not a test) named for drafter `name` (name.py, name_*.py)."""
    rel = p.relative_to(ROOT).parts
    own = p.stem == name or p.stem.startswith(f"{name}_")
    return own and rel[0] in ("runtime", "engines", "export", "edgespec") and "__pycache__" not in rel


def _home(p: Path, homes: list[str]) -> bool:
    rel = str(p.relative_to(ROOT))
    return any(rel == f"{h}.py" or rel.startswith(f"{h}/") for h in homes)


def _engine_members() -> list[str]:
    tree = ast.parse((ROOT / "engines/base.py").read_text())
    engine = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Engine")
    names = [n.name for n in engine.body if isinstance(n, ast.FunctionDef)]
    names += [n.target.id for n in engine.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)]
    return [n for n in names if any(w in n.split("_") for w in DRAFTER_WORDS)]


def _engines_importing_runtime() -> list[str]:
    return [
        str(p.relative_to(ROOT))
        for p in _modules("engines")
        if any(m.startswith("edgespec.runtime") for m in _imports(p))
    ]


def _step() -> tuple[int, int]:
    """(lines of Generator._step's body, docstring left out; its branches on a grammar)."""
    tree = ast.parse((ROOT / "runtime/generator.py").read_text())
    gen = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Generator")
    step = next(n for n in gen.body if isinstance(n, ast.FunctionDef) and n.name == "_step")
    body = step.body[1:] if isinstance(step.body[0], ast.Expr) else step.body
    lines = body[-1].end_lineno - body[0].lineno + 1
    grammar = sum(
        1
        for n in ast.walk(step)
        if isinstance(n, (ast.If, ast.IfExp)) and re.search(r"\b(con|grammar|constraint)\b", ast.unparse(n.test))
    )
    return lines, grammar


def _duplicates() -> tuple[int, int, list[str]]:
    """(pairs with a side outside tests/, pairs in all, those rows)."""
    if shutil.which("duplicates") is None:
        return -1, -1, ["duplicates: not installed"]
    out = subprocess.run(
        ["duplicates", "--most", "200", "--seconds", "120"], cwd=ROOT, capture_output=True, text=True
    ).stdout
    rows = [line for line in out.splitlines() if re.match(r"^D\d+ ", line)]
    outside = [r for r in rows if not all(side.strip().startswith("tests/") for side in _sides(r))]
    return len(outside), len(rows), outside + [line for line in out.splitlines() if line.startswith("incomplete")]


def _sides(row: str) -> list[str]:
    return row.split(" ", 1)[1].split("  ")[0].split(" ~ ")


def main() -> int:
    top = [p.name for p in (ROOT / "export").glob("*.py")]
    print(f"export/ top-level modules: {len(top)} ({', '.join(sorted(top))})  [goal <= 8]")
    for name in DRAFTERS:
        folders, plumbing, drafters = _drafter_places(name)
        print(
            f"{name}: code in {len(folders)} folder(s) ({', '.join(folders)}) [goal <= 2]; plumbing modules "
            f"importing it: {len(plumbing)} {plumbing or ''} [goal 0]; drafters building on it: {drafters or 'none'}"
        )
    print(f"Engine protocol members named for a drafter: {_engine_members() or 'none'}  [goal 0]")
    print(f"engines/ modules importing runtime/: {_engines_importing_runtime() or 'none'}  [goal 0]")
    lines, grammar = _step()
    print(f"Generator._step: {lines} lines of body, {grammar} grammar branches  [goal <= 20, 0]")
    if "--no-duplicates" not in sys.argv:
        outside, total, rows = _duplicates()
        print(f"duplicates pairs outside tests/: {outside} of {total}  [goal <= 25]")
        for r in rows:
            print("  " + r)
    return 0


if __name__ == "__main__":
    sys.exit(main())
