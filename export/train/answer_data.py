"""Self-distillation data through the exact graph: the engine answers chat prompts itself.

`eagle_data` has the PyTorch target (int4 dequantized, batched `generate`) answer prompts and keeps
its hidden states: close to the deployed graph, not equal to it (its answers drift from the
runtime's at the first near-tie). Here the engine folder's own Generator answers, greedy, with the
folder's speculative drafter (lossless: the tokens of plain decoding, faster), and every row its
target commits — prompt chunks and the accepted rows of each verify call — is kept as it is
computed (`Generator.tap`): the target graph's `hidden` and top-k next-token probabilities, bitwise
what `text_data.label` computes from an empty cache (a single pass: no second run through the
target). So the sequences are exactly what the runtime writes and the features exactly what a
head will read. The prompt tokens are context only (`n_prompt`); the labels at answer
positions are the answer's own next tokens (the graph's argmax) with the graph's distribution.

When the engine's target graph outputs the aux features (`export --eagle3-features`), shards keep
them too (`aux` [N, 3H]: what `train-eagle3` reads). `answers_from` labels the sequences of an
earlier answer-data folder instead of answering again: the same tokens, this graph's labels.

Prompts: the wide mix (`draft_prompts.wide_prompts`, nine families), a seed of its own; a prompt
sharing an 8-word window with an eval prompt file is dropped. Shards of `shard_seqs` answers,
the `text_data` layout (resumable: prompts.jsonl is written once, finished shards are skipped).
Imports no torch.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from edgespec.export.train.text_data import (
    EVAL_MARK,
    OUT,
    THREADS,
    TOP_K,
    TextDataError,
    eval_windows,
    keep_out_flag,
    label,
    soft_labels,
    windows,
)


@dataclass(frozen=True)
class AnswerDataConfig:
    """What `edgespec answer-data` makes; a field with a "help" is one of its flags (edgespec/cli_fields.py)."""

    engine: str = field(  # engine folder: its Generator answers, its target graph labels
        metadata={"help": "engine folder that answers and labels"}
    )
    out: str = field(metadata=OUT)  # folder for prompts.jsonl, shards, generation.json
    n_prompts: int = field(  # chat prompts of the wide mix to answer
        default=1000,
        metadata={"help": "chat prompts to answer (default %(default)s)", "flag": "--prompts", "metavar": "PROMPTS"},
    )
    max_new_tokens: int = field(  # an answer stops at the end-of-turn token before
        default=192, metadata={"help": "answer length cap (default %(default)s)"}
    )
    drafter: str | None = field(  # None: the folder's default; greedy output is plain decoding's either
        #                           way, a drafter only makes it faster
        default=None,
        metadata={"help": "drafter that speeds the answers up (default: the folder's)"},
    )
    top_k: int = field(default=8, metadata=TOP_K)  # soft labels kept per position
    shard_seqs: int = 32  # answers per shard
    threads: int | None = field(default=None, metadata=THREADS)  # ORT intra-op threads of each session
    seed: int = field(  # the shipped heads' data used 0..4
        default=101, metadata={"help": "the prompt mix's seed (default %(default)s)"}
    )
    keep_out: tuple[str, ...] = field(  # more eval prompt files (.jsonl) whose windows prompts must not share
        default=(), metadata=keep_out_flag("no prompt may share")
    )
    families: tuple[str, ...] = field(  # the wide mix's families to draw from, in turn (empty: all nine)
        default=(),
        metadata={
            "help": "only these families of the wide mix, comma-separated (e.g. code: a top-up for a head that drafts "
            "code; default: all nine)",
            "metavar": "FAMILY,..",
        },
    )
    answers_from: str | None = field(  # the tokens are the same, e.g. to add EAGLE-3's aux features
        default=None,
        metadata={
            "help": "an earlier answer-data folder: label its answered sequences through this --engine's target "
            "graph instead of answering again (same tokens; e.g. an engine exported with --eagle3-features adds "
            "the aux features train-eagle3 reads)",
            "metavar": "DIR",
        },
    )


class RowRecorder:
    """A Generator.tap: the rows the target commits while it answers, by position (features, the
    top-k of their next-token distribution, aux rows), one sequence at a time."""

    def __init__(self, n_slots: int, hidden_size: int, aux_width: int, k: int) -> None:
        self.k = k
        self.hidden = np.zeros((n_slots, hidden_size), np.float32)  # [max_len, H]
        self.ids = np.zeros((n_slots, k), np.int32)  # [max_len, k]
        self.probs = np.zeros((n_slots, k), np.float32)  # [max_len, k]
        self.aux = np.zeros((n_slots, aux_width), np.float32) if aux_width else None  # [max_len, A]
        self.n = 0  # positions recorded

    def start(self) -> None:
        """Record a new sequence (from position 0)."""
        self.n = 0

    def __call__(self, past: int, logits: np.ndarray, hidden: np.ndarray, aux: np.ndarray | None) -> None:
        assert past == self.n, (past, self.n)  # committed rows arrive in order, none skipped (no KV reuse)
        end = past + len(hidden)
        self.hidden[past:end] = hidden
        self.ids[past:end], self.probs[past:end] = soft_labels(logits, self.k)
        if aux is not None:
            self.aux[past:end] = aux
        self.n = end

    def labelled(self, seq: np.ndarray, target) -> tuple:
        """`text_data.label`'s tuple for seq, the sequence just answered: the rows recorded, plus the
        last token's (never verified: the answer stopped on it), run through `target` here."""
        from edgespec.runtime.prefill import prefill

        T = len(seq)
        if self.n < T:
            prefill(target, seq[self.n : T], self.n, tap=self)
        aux = self.aux[:T].copy() if self.aux is not None else None
        return self.hidden[:T].copy(), self.ids[:T].copy(), self.probs[:T].copy(), aux


def plan_prompts(cfg: AnswerDataConfig, keep_out: set[tuple[str, ...]]) -> tuple[list[dict], int]:
    """(the wide mix's first cfg.n_prompts rows that share no 8-word window with `keep_out`, how many
    were dropped)."""
    from edgespec.export.train.wide_prompts import wide_prompts

    rows = wide_prompts(cfg.n_prompts, cfg.seed, cfg.families)
    kept = [r for r in rows if not windows("\n".join(m["content"] for m in r["messages"])) & keep_out]
    return kept, len(rows) - len(kept)


def _load_prompts(cfg: AnswerDataConfig, out: Path, progress: bool) -> list[dict]:
    path = out / "prompts.jsonl"
    if path.exists():  # a resumed run answers the prompts planned first
        return [json.loads(line) for line in path.read_text().splitlines()]
    rows, dropped = plan_prompts(cfg, eval_windows(cfg.keep_out))
    if progress:
        print(f"[answers] {len(rows)} prompts, {dropped} dropped (an 8-word window of an eval prompt)", file=sys.stderr)
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in rows))
    tmp.rename(path)
    return rows


def make_answer_data(cfg: AnswerDataConfig, progress: bool = True) -> Path:
    """Answer the prompts shard by shard (skipping shards already written), keeping each prompt +
    answer's rows as the target computes them, then write `done`. Returns the folder."""
    from edgespec.export.train.head_data import GenMeter, log_run
    from edgespec.export.train.matmul_probe import default_threads
    from edgespec.export.train.wide_prompts import check_families
    from edgespec.runtime.config import RuntimeConfig
    from edgespec.runtime.generator import Generator

    try:  # before any folder is made or engine loaded
        check_families(cfg.families)
    except ValueError as e:
        raise TextDataError(f"--families: {e}") from None
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    threads = cfg.threads or default_threads()
    if cfg.answers_from:
        return _relabel(cfg, out, threads, progress)
    rows = _load_prompts(cfg, out, progress)
    # no prompt-prefix reuse: every row of every sequence goes through the target, so the tap sees it
    gen = Generator.load(cfg.engine, RuntimeConfig(drafter=cfg.drafter, threads=threads, reuse_kv=False))
    if gen.codec is None:
        raise TextDataError(f"{cfg.engine} has no tokenizer; answers need the folder's chat template")
    man, tgt = gen.manifest, gen.target
    gen.tap = rec = RowRecorder(tgt.max_len + max(tgt.widths), tgt.hidden_size, tgt.spec.aux_width, cfg.top_k)
    n_shards = -(-len(rows) // cfg.shard_seqs)
    todo = [b for b in range(n_shards) if not (out / f"shard-{b:05d}.npz").exists()]
    # the ETA counts answers: their lengths are unknown until written
    meter = GenMeter(sum(len(rows[b * cfg.shard_seqs : (b + 1) * cfg.shard_seqs]) for b in todo))
    for b in todo:
        part = rows[b * cfg.shard_seqs : (b + 1) * cfg.shard_seqs]
        seqs, n_prompt, labelled, n_new = [], [], [], 0
        for row in part:
            ids = gen.codec.encode(row["messages"]).astype(np.int64)
            room = man.max_len - len(ids)
            if room < 8:  # a prompt that leaves no room to answer is skipped, not cut
                continue
            rec.start()
            new = np.concatenate([np.array(x) for x in gen.generate_ids(ids, min(cfg.max_new_tokens, room))])
            seqs.append(np.concatenate([ids, new.astype(np.int64)]))
            labelled.append(rec.labelled(seqs[-1], tgt))
            n_prompt.append(len(ids))
            n_new += len(new)
        n_tokens = _write_shard(out / f"shard-{b:05d}.npz", seqs, n_prompt, labelled)
        meter.add(n_tokens, n_new, len(part))
        if progress:
            print(f"[answers] shard {b + 1}/{n_shards}: {n_tokens} tokens, {meter.line()}", file=sys.stderr)
    if todo:
        log_run(out, f"{man.target.precision} target graph (ORT), drafter {gen.cfg.drafter}", threads, meter)
    (out / "done").write_text(f"{n_shards} shards\n")
    return out


def _write_shard(path: Path, seqs: list[np.ndarray], n_prompt: list[int], labelled: list[tuple]) -> int:
    """Write the prompt + answer sequences and their labels (`text_data.label`'s tuples) as one
    shard (the aux features too where the graph outputs them). Returns the tokens written."""
    lengths = np.array([len(s) for s in seqs], np.int64)
    has_aux = bool(labelled) and labelled[0][3] is not None
    aux = {"aux": np.concatenate([x[3] for x in labelled]).astype(np.float16)} if has_aux else {}
    tmp = path.with_suffix(".tmp.npz")
    np.savez(
        tmp,
        tokens=np.concatenate(seqs).astype(np.int32),
        features=np.concatenate([x[0] for x in labelled]).astype(np.float16),
        starts=np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64),
        n_prompt=np.array(n_prompt, np.int64),
        topk_ids=np.concatenate([x[1] for x in labelled]),
        topk_probs=np.concatenate([x[2] for x in labelled]).astype(np.float16),
        **aux,
    )
    tmp.rename(path)
    return int(lengths.sum())


def _relabel(cfg: AnswerDataConfig, out: Path, threads: int, progress: bool) -> Path:
    """The sequences of `cfg.answers_from`'s shards, labelled through this folder's target graph,
    shard for shard (resumable like answering)."""
    import shutil

    from edgespec.engines.context import for_checks
    from edgespec.engines.manifest import load_manifest
    from edgespec.engines.ort import OrtModel
    from edgespec.export.train.head_data import GenMeter, log_run

    src = Path(cfg.answers_from)
    shards = sorted(src.glob("shard-[0-9]*[0-9].npz"))
    if not shards:
        raise TextDataError(f"{src} holds no answer shards (shard-NNNNN.npz); answer prompts into it first")
    if (src / EVAL_MARK).exists():  # answers to eval prompts (tools/head_accept.py) stay where they are
        raise TextDataError(f"{src} holds eval answers ({EVAL_MARK}); label answers to training prompts instead")
    if out.resolve() == src.resolve():
        raise TextDataError(f"--answers-from {src} is the --out folder; label into another folder")
    if (src / "prompts.jsonl").exists() and not (out / "prompts.jsonl").exists():
        shutil.copy(src / "prompts.jsonl", out / "prompts.jsonl")
    man = for_checks(load_manifest(cfg.engine))
    labeller = OrtModel(man, man.target, threads=threads)
    todo = [p for p in shards if not (out / p.name).exists()]
    meter = GenMeter(len(todo))
    for i, p in enumerate(todo):
        z = np.load(p)
        starts, n_prompt = z["starts"], z["n_prompt"]
        seqs = [z["tokens"][starts[s] : starts[s + 1]].astype(np.int64) for s in range(len(n_prompt))]
        labelled = [label(labeller, s, cfg.top_k) for s in seqs]
        n_tokens = _write_shard(out / p.name, seqs, [int(x) for x in n_prompt], labelled)
        meter.add(n_tokens, 0, 1)
        if progress:
            line = f"[answers] labelled {p.name} ({i + 1}/{len(todo)}): {n_tokens} tokens, {meter.line()}"
            print(line, file=sys.stderr)
    if todo:
        log_run(out, f"{man.target.precision} target graph (ORT), labels of {src}", threads, meter)
    (out / "done").write_text(f"{len(shards)} shards\n")
    return out
