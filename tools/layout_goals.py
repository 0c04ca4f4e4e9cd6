"""The layout goals of issues 37 and 55, measured on the tree as it is (docs/results/layout.md quotes the
output; tests/test_layout.py holds them).

    python tools/layout_goals.py [--no-duplicates]

- export/'s top-level modules (goal <= 8; the rest in subpackages named for their concern) and
  export/target/'s (goal <= 8);
- per drafter with models (dflash, medusa, eagle, eagle3): the folders holding its code (goal <= 2,
  one per side) and the non-test modules elsewhere that import it (plumbing: goal 0; another
  drafter building on it is listed apart);
- the Engine protocol's members named for one drafter (goal 0) and engines/ modules importing
  runtime/ (goal 0);
- Generator._step's body length (goal <= 20 lines) and its grammar branches (goal 0);
- the places that spell the list of model families (goal 1): a set / tuple / list / dict naming three
  or more families (as constants or as its rows' first fields), or a string (not a docstring) that
  names three or more;
- package modules (edgespec/ runtime/ engines/ export/) over 400 lines (goal <= 6) and functions over
  60 lines (goal <= 12); the hard ceiling tests/test_layout.py holds is 500 and 80;
- `duplicates --most 200` pairs with a side outside tests/ (goal <= 20; pairs between generated
  bench pages under docs/data/ are data, not code, and do not count; the tool reads the tree as text
  for up to --seconds, so run it on a quiet machine).
Reads files only (ast and text); imports nothing of edgespec.
"""

from __future__ import annotations

import ast
import functools
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DRAFTERS = ("dflash", "medusa", "eagle", "eagle3")
DRAFTER_WORDS = ("dflash", "medusa", "eagle", "eagle3", "fused", "head")  # Engine members named for a drafter
PACKAGE = ("edgespec", "runtime", "engines", "export")  # the folders installed as edgespec.*
FAMILY_WORDS = ("llama", "mistral", "qwen2", "qwen3", "gemma3", "gemma3_text")  # names a family list holds


def _modules(folder: str) -> list[Path]:
    return sorted(p for p in (ROOT / folder).rglob("*.py") if "__pycache__" not in p.parts)


@functools.cache
def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text())


def _imports(path: Path) -> set[str]:
    """The dotted modules `path` imports (`from a.b import c` gives a.b and a.b.c)."""
    out: set[str] = set()
    for node in ast.walk(_tree(path)):
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


def _target_top() -> list[str]:
    """export/target/'s top-level modules."""
    return sorted(p.name for p in (ROOT / "export/target").glob("*.py"))


def _package_modules() -> list[Path]:
    return [p for d in PACKAGE for p in _modules(d) if "build" not in p.relative_to(ROOT).parts]


def long_modules(limit: int) -> list[tuple[int, str]]:
    """(lines, path) of the package modules longer than `limit` lines, longest first."""
    sized = [(len(p.read_text().splitlines()), str(p.relative_to(ROOT))) for p in _package_modules()]
    return sorted((s for s in sized if s[0] > limit), reverse=True)


def long_functions(limit: int) -> list[tuple[int, str]]:
    """(lines, path:line name) of the package functions longer than `limit` lines, longest first."""
    out = []
    for p in _package_modules():
        for n in ast.walk(_tree(p)):
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.end_lineno - n.lineno + 1 > limit:
                out.append((n.end_lineno - n.lineno + 1, f"{p.relative_to(ROOT)}:{n.lineno} {n.name}"))
    return sorted(out, reverse=True)


def family_lists() -> list[str]:
    """path:line of each place in the package that spells the list of model families."""
    out = []
    for p in _package_modules():
        tree = _tree(p)
        docs = {id(n.body[0].value) for n in ast.walk(tree) if _has_docstring(n)}
        for n in ast.walk(tree):
            if isinstance(n, (ast.Set, ast.Tuple, ast.List, ast.Dict)):
                names = {c.value for e in (n.keys if isinstance(n, ast.Dict) else n.elts) for c in _first_fields(e)}
            elif isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs:
                names = {w for w in FAMILY_WORDS if re.search(rf"\b{w}\b", n.value)}
            else:
                continue
            if len(names & set(FAMILY_WORDS)) >= 3:
                out.append(f"{p.relative_to(ROOT)}:{n.lineno}")
    return out


def _has_docstring(n: ast.AST) -> bool:
    scopes = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
    return isinstance(n, scopes) and ast.get_docstring(n, clean=False) is not None


def _first_fields(e: ast.AST) -> list[ast.Constant]:
    """e itself, or the first field of a row (a tuple's first element, a call's first argument), if a string."""
    first = e.elts[:1] if isinstance(e, ast.Tuple) else e.args[:1] if isinstance(e, ast.Call) else [e]
    return [c for c in first if isinstance(c, ast.Constant) and isinstance(c.value, str)]


def _duplicates() -> tuple[int, int, list[str]]:
    """(pairs with a side outside tests/, pairs in all, those rows)."""
    if shutil.which("duplicates") is None:
        return -1, -1, ["duplicates: not installed"]
    out = subprocess.run(
        ["duplicates", "--most", "200", "--seconds", "120"], cwd=ROOT, capture_output=True, text=True
    ).stdout
    rows = [line for line in out.splitlines() if re.match(r"^D\d+ ", line)]
    outside = [r for r in rows if counts(r)]
    return len(outside), len(rows), outside + [line for line in out.splitlines() if line.startswith("incomplete")]


def counts(row: str) -> bool:
    """A pair that counts toward the goal: not both sides in tests/, nor both generated bench data."""
    sides = [side.strip() for side in _sides(row)]
    return not all(s.startswith("tests/") for s in sides) and not all(s.startswith("docs/data/") for s in sides)


def _sides(row: str) -> list[str]:
    return row.split(" ", 1)[1].split("  ")[0].split(" ~ ")


def main() -> int:
    top = [p.name for p in (ROOT / "export").glob("*.py")]
    print(f"export/ top-level modules: {len(top)} ({', '.join(sorted(top))})  [goal <= 8]")
    target = _target_top()
    print(f"export/target/ top-level modules: {len(target)} ({', '.join(target)})  [goal <= 8]")
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
    families = family_lists()
    print(f"places spelling the list of model families: {len(families)} {families}  [goal 1]")
    for limit, goal, ceiling, what, found in (
        (400, 6, 500, "package modules over 400 lines", long_modules),
        (60, 12, 80, "package functions over 60 lines", long_functions),
    ):
        rows = found(limit)
        print(f"{what}: {len(rows)}  [goal <= {goal}; none over {ceiling}]")
        for n, where in rows:
            print(f"  {n:4d} {where}")
    if "--no-duplicates" not in sys.argv:
        outside, total, rows = _duplicates()
        print(f"duplicates pairs outside tests/: {outside} of {total}  [goal <= 20]")
        for r in rows:
            print("  " + r)
    return 0


if __name__ == "__main__":
    sys.exit(main())
