"""The passages of the wide mix's `passage` family (and its multi-turn summaries): prose paragraphs from
this machine's own documentation (stdlib docstrings, /usr/share/doc READMEs and copyright files),
filtered to readable prose, plus a few written for this project (prompt_data/wide_doc_passages.json)."""

from __future__ import annotations

import functools
import gzip
import importlib
import inspect
import re
import warnings
from pathlib import Path

from edgespec.export.train.prompt_lists import load_lists

DOC_MODULES, WRITTEN_PASSAGES = load_lists("wide_doc_passages", "doc_modules", "written_passages")


def _paragraphs(text: str) -> list[str]:
    """Blank-line separated paragraphs, lines joined ("." lines separate Debian copyright paragraphs)."""
    out, cur = [], []
    for line in text.splitlines() + [""]:
        s = line.strip()
        if s in ("", "."):
            if cur:
                out.append(" ".join(cur))
            cur = []
        else:
            cur.append(s)
    return out


LEGAL = re.compile(r"licen[cs]e|warrant|copyright|permission|liabilit|redistribut", re.I)


def is_prose(par: str, first_line: str = "") -> bool:
    """A readable paragraph: 40-170 words of sentences, not code, a table, a list, a licence shout or
    an address, no licence text (170, not 200: prompts over the data job's 384-token cap would be skipped)."""
    words = par.split()
    if not 40 <= len(words) <= 170 or "@" in par or "http" in par or "---" in par or "===" in par:
        return False
    if LEGAL.search(par):  # licence boilerplate repeats across hundreds of packages: a few are plenty
        return False
    if re.match(r"[A-Z][\w-]*:\s", first_line or par) or par.lstrip().startswith((">>>", "$", "|", "*", "-", "#")):
        return False
    plain = sum(c.isalpha() or c.isspace() or c in ".,;:'\"()-" for c in par) / len(par)
    letters = [c for c in par if c.isalpha()]
    upper = sum(c.isupper() for c in letters) / max(1, len(letters))
    sentences = par.count(". ") + par.rstrip().endswith(".")
    return plain > 0.95 and upper < 0.12 and sentences >= 2 and 3.5 <= len(letters) / len(words) <= 8


def _read_doc(path: Path) -> str:
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rt", encoding="utf-8", errors="replace") as f:
            return f.read(40_000)
    except OSError:
        return ""


@functools.lru_cache(maxsize=1)
def passages() -> tuple[str, ...]:
    """Prose paragraphs from this machine's documentation plus the written ones, in a fixed order."""
    found: list[tuple[str, str]] = []  # (source, paragraph): sorted below, so listing order is irrelevant
    with warnings.catch_warnings():  # deprecated aliases (typing.io...) warn when their docstring is read
        warnings.simplefilter("ignore")
        for name in DOC_MODULES:
            try:
                mod = importlib.import_module(name)
            except Exception:  # noqa: BLE001 - a module missing on this Python is just skipped
                continue
            objs = [mod] + [
                v
                for _, v in sorted(vars(mod).items())
                if (inspect.isclass(v) or inspect.isfunction(v)) and getattr(v, "__module__", None) == mod.__name__
            ]
            for obj in objs:
                doc = inspect.getdoc(obj) or ""
                found += [(f"py:{name}:{getattr(obj, '__name__', '')}", p) for p in _paragraphs(doc)]
    root = Path("/usr/share/doc")
    if root.is_dir():
        for pkg in sorted(root.iterdir()):
            if not pkg.is_dir():
                continue
            for f in sorted(pkg.iterdir()):
                if f.name.startswith("README") or f.name == "copyright":
                    found += [(str(f), p) for p in _paragraphs(_read_doc(f))]
    seen, per_source, out = set(), {}, []
    for src, par in sorted(found):
        key = par.lower()[:80]
        if key in seen or per_source.get(src, 0) >= 3 or not is_prose(par):
            continue
        seen.add(key)
        per_source[src] = per_source.get(src, 0) + 1
        out.append(par)
    return tuple(out) + WRITTEN_PASSAGES
