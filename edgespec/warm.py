"""`edgespec warm FOLDER --text FILE...`: fill a folder's recycle table from the target's own prefill
over a corpus (forward passes only, no training), saved as FOLDER/recycle.npz, where every later
Generator of that folder starts its table (runtime/drafters/recycle.py WARM_FILE).

The eval prompt files (tools/prompts/*.jsonl, HumanEval when installed: export/train/text_data.py
eval_files) are refused outright, and any paragraph of the corpus that shares an 8-word window with
one of their prompts is left out, so a bench on them never drafts from their own text.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np


class WarmError(ValueError):
    """A corpus `edgespec warm` refuses (an eval file, nothing left to read)."""


def add_arguments(p) -> None:
    p.add_argument("folder", help="engine folder whose table to fill (written to FOLDER/recycle.npz)")
    p.add_argument("--text", nargs="+", required=True, metavar="FILE", help="plain-text corpus files")
    p.add_argument(
        "--max-tokens", type=int, default=200_000, help="corpus tokens to prefill at most (default %(default)s)"
    )
    p.add_argument("--keep-out", action="append", default=[], metavar="JSONL", help="another eval prompt file")


def paragraphs(files, keep_out=()) -> tuple[list[str], int]:
    """(the corpus's paragraphs, how many were left out); an eval file among `files` is a WarmError."""
    from edgespec.export.train.text_data import eval_files, eval_windows, windows

    evals = {f.resolve() for f in eval_files(tuple(keep_out))}
    blocked = eval_windows(tuple(keep_out))
    kept, dropped = [], 0
    for f in map(Path, files):
        if f.resolve() in evals or f.suffix == ".jsonl" and f.name in {e.name for e in evals}:
            raise WarmError(f"{f} is an eval prompt file: a table warmed on it would draft its answers")
        for para in f.read_text(encoding="utf-8", errors="replace").split("\n\n"):
            if not para.strip():
                continue
            if windows(para) & blocked:
                dropped += 1
                continue
            kept.append(para)
    return kept, dropped


def warm(folder: str, files, max_tokens: int = 200_000, keep_out=(), out=None) -> Path:
    """Prefill the corpus through the folder's target into its recycle table; the table's file.
    out: where the summary line goes (None: sys.stderr at call time, so a redirected stderr gets it)."""
    from edgespec.runtime.config import RuntimeConfig
    from edgespec.runtime.drafters.recycle import WARM_FILE
    from edgespec.runtime.generator import Generator

    texts, dropped = paragraphs(files, keep_out)
    if not texts:
        raise WarmError("no text left to read (every paragraph empty or sharing an 8-word window with an eval prompt)")
    g = Generator.load(folder, RuntimeConfig(drafter="recycle", k=1, adaptive=False))
    table = g.drafter.recycle_table
    window = g.target.max_len - 2
    ids = np.concatenate([g.codec.encode(t + "\n\n") for t in texts])[:max_tokens]
    t0 = time.perf_counter()
    for i in range(0, len(ids), window):
        g.forget()
        for _ in g.generate_ids(ids[i : i + window], 1):  # the prefill's rows go into the table
            pass
    path = g.manifest.path(WARM_FILE)
    table.save(path)
    print(
        f"edgespec warm: {len(ids)} tokens of {len(texts)} paragraphs ({dropped} left out: an eval prompt's "
        f"8-word window) in {time.perf_counter() - t0:.0f} s; {table.seen} rows -> {path} "
        f"({table.nbytes / 2**20:.1f} MiB)",
        file=out if out is not None else sys.stderr,
    )
    return path


def run_command(a) -> int:
    warm(a.folder, a.text, a.max_tokens, tuple(a.keep_out))
    return 0
