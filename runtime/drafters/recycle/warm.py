"""`edgespec warm FOLDER --answers N` / `--text FILE...`: fill a folder's recycle table from the
target's own forward passes (no training), saved as FOLDER/recycle.npz, where every later Generator of
that folder starts its table (table.py WARM_FILE). The recycle drafter plugin registers the command
(RecyclePlugin.commands).

--answers N: the folder's Generator answers N chat prompts of the wide mix (export/train/wide_prompts.py:
nine families, seeded), greedy, drafting from the table it fills: every prefill chunk and verify row
writes the target's top-k into the table, so it holds what this model says next in its own answers
(the text recycling meets at run time). --text: the target's prefill over a corpus (what it predicts
in someone else's text). Both may be given; the answers come last, so their entries win.

The eval prompt files (tools/prompts/*.jsonl, HumanEval when installed: export/train/text_data.py
eval_files) are refused outright, and any paragraph of the corpus that shares an 8-word window with
one of their prompts is left out, so a bench on them never drafts from their own text.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

from edgespec.runtime.drafters.recycle.table import WARM_FILE
from edgespec.runtime.files import MAX_TEXT_BYTES, input_file, output_file, read_text


class WarmError(ValueError):
    """A corpus `edgespec warm` refuses (an eval file, nothing left to read)."""


def add_arguments(p) -> None:
    p.add_argument("folder", help="engine folder whose table to fill (written to FOLDER/recycle.npz)")
    p.add_argument(
        "--answers",
        type=int,
        default=0,
        metavar="N",
        help="answer N chat prompts of the wide mix (nine families) and keep the target's rows; "
        "300 take ~2 min on 2 cores for the 135M default (default 0)",
    )
    p.add_argument("--seed", type=int, default=301, help="which wide-mix prompts --answers draws (default %(default)s)")
    p.add_argument(
        "--max-new-tokens", type=int, default=160, help="answer length cap of --answers (default %(default)s)"
    )
    p.add_argument("--text", nargs="+", default=[], metavar="FILE", help="plain-text corpus files")
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
        for para in read_text(f, "--text").split("\n\n"):
            if not para.strip():
                continue
            if windows(para) & blocked:
                dropped += 1
                continue
            kept.append(para)
    return kept, dropped


def check_inputs(files, max_tokens: int, keep_out, answers: int, max_new_tokens: int) -> None:
    """Every number and file warm reads, refused in one line before anything is read (a folder,
    FIFO, device, unreadable, empty or oversized --text is an InputFileError; one not UTF-8 is
    refused as paragraphs() reads it)."""
    if answers < 0 or max_new_tokens < 1:
        raise WarmError(f"--answers {answers} / --max-new-tokens {max_new_tokens}: need answers >= 0 and a cap >= 1")
    if max_tokens < 1:
        raise WarmError(f"--max-tokens {max_tokens}: give at least 1 (corpus tokens to prefill; default 200000)")
    if not files and not answers:
        raise WarmError("nothing to read: give --answers N (the model's own answers; e.g. 300) and/or --text FILE...")
    for f in files:
        input_file(f, "--text", MAX_TEXT_BYTES)
    for f in keep_out:
        input_file(f, "--keep-out", MAX_TEXT_BYTES)


def check_folder(folder: str) -> None:
    """An engine folder whose table file warm can write, refused in one line before the model loads."""
    from edgespec.engines.manifest import load_manifest

    load_manifest(folder, files=False)  # (a folder that is none: its one-line ManifestError)
    output_file(Path(folder) / WARM_FILE, "the table")


def answer_prompts(n: int, seed: int, keep_out=()) -> tuple[list[dict], int]:
    """(the wide mix's first n chat rows sharing no 8-word window with an eval prompt, how many were dropped)."""
    from edgespec.export.train.text_data import eval_windows, windows
    from edgespec.export.train.wide_prompts import wide_prompts

    blocked = eval_windows(tuple(keep_out))
    rows = wide_prompts(n, seed)
    kept = [r for r in rows if not windows("\n".join(m["content"] for m in r["messages"])) & blocked]
    return kept, len(rows) - len(kept)


def warm(
    folder: str,
    files=(),
    max_tokens: int = 200_000,
    keep_out=(),
    out=None,
    answers: int = 0,
    seed: int = 301,
    max_new_tokens: int = 160,
) -> Path:
    """Fill the folder's recycle table from the corpus's prefill, then from `answers` greedy answers to
    wide-mix prompts; the table's file. out: where progress and the summary go (None: sys.stderr at
    call time, so a redirected stderr gets it)."""
    out = out if out is not None else sys.stderr
    check_inputs(files, max_tokens, keep_out, answers, max_new_tokens)
    texts, dropped = paragraphs(files, keep_out) if files else ([], 0)
    if files and not texts:
        raise WarmError("no text left to read (every paragraph empty or sharing an 8-word window with an eval prompt)")
    check_folder(folder)
    prompts, n_dropped = answer_prompts(answers, seed, keep_out) if answers else ([], 0)
    g = _generator(folder, bool(prompts), bool(texts or prompts))
    table = g.drafter.recycle_table
    t0 = time.perf_counter()
    said = []
    if texts:
        n_read = prefill_corpus(g, texts, max_tokens)
        said.append(f"{n_read} tokens of {len(texts)} paragraphs ({dropped} left out: an eval prompt's 8-word window)")
    if prompts:
        n_answered = answer(g, prompts, max_new_tokens, t0, out)
        said.append(
            f"{n_answered} answer tokens to {len(prompts)} wide-mix prompts ({n_dropped} dropped: eval overlap)"
        )
    path = g.manifest.path(WARM_FILE)
    table.save(path)
    print(
        f"edgespec warm: {'; '.join(said)} in {time.perf_counter() - t0:.0f} s; {table.seen} rows -> {path} "
        f"({table.nbytes / 2**20:.1f} MiB)",
        file=out,
    )
    d = g.manifest.defaults
    if d.drafter not in ("recycle", "merged"):  # the table only drafts for these two
        print(
            f"edgespec warm: the folder's default drafter is {d.drafter}; recycle and merged draft from this "
            "table (docs/results/recycle.md: on 20 new chat prompts 1.24x plain with a 1000-answer table, "
            f"ngram 1.10x; level without one): `edgespec tune {folder} --prompts YOURS.jsonl` picks the "
            "fastest setting for your prompts and makes it the folder's default",
            file=out,
        )
    return path


def _generator(folder: str, answering: bool, reading: bool):
    """The folder's Generator, drafting recycle chains from the table being filled (k=4 where it
    answers: greedy, so the answers are plain decoding's, only sooner); a folder without a tokenizer
    is refused where warm reads text."""
    from edgespec.runtime.config import RuntimeConfig
    from edgespec.runtime.generator import Generator

    g = Generator.load(folder, RuntimeConfig(drafter="recycle", k=1, adaptive=False))
    k_max = max(w for w in g.target.widths if all(v in g.target.widths for v in range(2, w + 1))) - 1
    if answering and k_max > 1:
        g.reconfigure(k=min(4, k_max))
    if g.codec is None and reading:
        raise WarmError(f"{folder} has no tokenizer: warm reads text. Hint: re-export the folder with its tokenizer")
    return g


def prefill_corpus(g, texts: list[str], max_tokens: int) -> int:
    """The target's prefill over the paragraphs' first max_tokens tokens, a context window at a time
    (its rows go into the table); the tokens read."""
    window = g.target.max_len - 2
    ids = np.concatenate([g.codec.encode(t + "\n\n") for t in texts])[:max_tokens]
    for i in range(0, len(ids), window):
        g.forget()
        for _ in g.generate_ids(ids[i : i + window], 1):
            pass
    return len(ids)


def answer(g, prompts: list[dict], max_new_tokens: int, t0: float, out) -> int:
    """The folder's greedy answers to the chat prompts (every prefill chunk and verify row goes into
    the table; a prompt too long for its context is passed over), progress to `out` every 50; the
    answer tokens."""
    n_answered = 0
    for i, row in enumerate(prompts):
        ids = g.codec.encode(row["messages"])
        if len(ids) + max_new_tokens + max(g.target.widths) > g.target.max_len:
            continue
        g.forget()
        n_answered += sum(len(c) for c in g.generate_ids(ids, max_new_tokens))
        if (i + 1) % 50 == 0 or i + 1 == len(prompts):
            el = time.perf_counter() - t0
            left = el / (i + 1) * (len(prompts) - i - 1)
            print(f"edgespec warm: {i + 1}/{len(prompts)} answers, {el:.0f} s, ~{left:.0f} s left", file=out)
    return n_answered


def run_command(a) -> int:
    warm(
        a.folder,
        a.text,
        a.max_tokens,
        tuple(a.keep_out),
        answers=a.answers,
        seed=a.seed,
        max_new_tokens=a.max_new_tokens,
    )
    return 0
