"""The word lists and templates of the training prompt mixes, read from prompt_data/*.json.

Each file holds one family's named lists (`wide_*`: `draft_prompts`, `eagle_*`: `eagle_prompts`),
written for this project and shipped as package data. Lists come back as tuples, pairs as pairs,
in the file's order: the mixes draw from them with a seeded `random.Random`, so order is part of
what a seed reproduces.
"""

from __future__ import annotations

import json
from pathlib import Path

PROMPT_DATA = Path(__file__).parent / "prompt_data"


def _frozen(v):
    return tuple(_frozen(x) for x in v) if isinstance(v, list) else v


def load_lists(family: str, *names: str) -> tuple[tuple, ...]:
    """The lists `names` of prompt_data/<family>.json, in that order; the file must hold exactly
    those (a list nobody reads, or a missing one, is an error)."""
    path = PROMPT_DATA / f"{family}.json"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise FileNotFoundError(
            f"prompt lists {path} not found. Hint: reinstall edgespec (package data "
            "edgespec.export: prompt_data/*.json)"
        ) from None
    if set(data) != set(names):
        raise ValueError(
            f"{path}: holds lists {sorted(data)}, the code reads {sorted(names)}. Hint: add or "
            "remove the list in both places"
        )
    return tuple(_frozen(data[n]) for n in names)
