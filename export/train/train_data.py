"""What a training run reads and how it batches it (torch only to seed and size its threads): the
self-distillation shards (`head_data`) loaded and split by sequence (`prepare`), the aux features
of the kinds that read them, the target's frozen tensors, the draft vocabulary (the most frequent
answer tokens) and the batches of a head over it (sequences of similar length, rows and labels).
trainer.py runs the loop over them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from edgespec.export.train.commands import BaseTrainConfig
from edgespec.export.train.matmul_probe import default_threads
from edgespec.export.train.text_data import EVAL_MARK


# ---- the shards and the target ---------------------------------------------------------------------------
class TrainDataError(ValueError):
    """Training data without (or with misaligned) features a kind needs."""


@dataclass(frozen=True)
class SoftLabels:
    """The target's next-token distribution at each position of teacher-forced text (`text_data`)."""

    ids: np.ndarray  # [N, k] int32: its k most likely tokens after position i, most likely first
    probs: np.ndarray  # [N, k] float32: their probabilities
    has: np.ndarray  # [N] bool: the position has them (text data; self-distillation shards do not)

    def labels(self, tokens: np.ndarray, starts: np.ndarray) -> np.ndarray:
        """[N] what the target emits at each position: the token itself (its own greedy answers) or,
        in text, its argmax given the text before (the label of position i is row i - 1's top-1)."""
        prev = np.roll(self.ids[:, 0], 1).astype(tokens.dtype)
        has_prev = np.roll(self.has, 1)
        has_prev[starts[:-1]] = False  # a sequence's first token has no row before it
        return np.where(has_prev, prev, tokens)

    def shifted(self, starts: np.ndarray) -> SoftLabels:
        """The same, moved one position on: row i holds the distribution over token i (row i - 1's),
        so it lines up with the labels."""
        has = np.roll(self.has, 1)
        has[starts[:-1]] = False
        return SoftLabels(np.roll(self.ids, 1, axis=0), np.roll(self.probs, 1, axis=0), has)


@dataclass(frozen=True)
class TrainData:
    tokens: np.ndarray  # [N] int32: all sequences, back to back
    feats: np.ndarray  # [N, H] float16: the target's post-norm feature at each token
    starts: np.ndarray  # [S+1] int64: sequence boundaries in tokens
    n_prompt: np.ndarray  # [S] int64: prompt tokens at the start of each sequence
    hold: np.ndarray  # sequence ids held out for the acceptance estimate (sorted)
    train: np.ndarray  # sequence ids trained on (sorted)
    answer: np.ndarray  # [N] bool: the token is part of an answer (not of the prompt)
    soft: SoftLabels | None = None  # the target's next-token distributions (teacher-forced text data)
    emitted: np.ndarray | None = None  # [N] what the target emits at each position (None: tokens):
    #                                    SoftLabels.labels, the label a drafter learns

    def labels(self) -> np.ndarray:
        """[N] the token the target emits at each position: the token itself in its own answers,
        its argmax given the text before in teacher-forced text."""
        return self.tokens if self.emitted is None else self.emitted

    @property
    def train_tokens(self) -> int:
        """Tokens of the training sequences."""
        return int(sum(self.starts[s + 1] - self.starts[s] for s in self.train))


def prepare(cfg: BaseTrainConfig) -> tuple[Path, np.random.Generator, TrainData]:
    """Torch set up (threads, seed), the out folder made, the shards loaded and split by sequence.
    Returns (out folder, the numpy generator after the split, the data)."""
    from edgespec.export.train.head_data import load_shards, load_soft

    for folder in str(cfg.data).split(","):
        if (Path(folder) / EVAL_MARK).exists():
            raise TrainDataError(
                f"{folder} holds eval answers ({EVAL_MARK}: made by tools/head_accept.py); train on data "
                "made from training prompts (edgespec answer-data / text-data)"
            )
    torch.set_num_threads(cfg.threads or default_threads())
    torch.manual_seed(cfg.seed)
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    tokens, feats, starts, n_prompt = load_shards(cfg.data)
    n_seq = len(n_prompt)
    rng = np.random.default_rng(cfg.seed)
    perm = rng.permutation(n_seq)
    n_hold = max(1, int(n_seq * cfg.holdout))
    answer = np.zeros(len(tokens), bool)
    for s in range(n_seq):
        answer[starts[s] + n_prompt[s] : starts[s + 1]] = True
    soft = load_soft(cfg.data)
    if soft is not None and len(soft[0]) != len(tokens):  # a shard written between the two reads
        raise TrainDataError(f"{cfg.data}: {len(soft[0])} soft-label rows for {len(tokens)} tokens; still being made?")
    return (
        out,
        rng,
        TrainData(
            tokens=tokens,
            feats=feats,
            starts=starts,
            n_prompt=n_prompt,
            hold=np.sort(perm[:n_hold]),
            train=np.sort(perm[n_hold:]),
            answer=answer,
            soft=SoftLabels(*soft) if soft is not None else None,
            emitted=SoftLabels(*soft).labels(tokens, starts) if soft is not None else None,
        ),
    )


@dataclass(frozen=True)
class TargetTensors:
    arch: Any  # the target's ArchSpec (export.arch)
    embed: np.ndarray  # [V, H] token embedding
    lm_head: np.ndarray  # [V, H] LM head
    state: dict[str, np.ndarray]  # every parameter under its HF name, float32
    rope_cos: np.ndarray  # [max_pos, D] float32
    rope_sin: np.ndarray  # [max_pos, D] float32
    tokenizer: Any = None  # the target's HF tokenizer


def target_tensors(target: str | None) -> TargetTensors:
    """The target's frozen tensors as the int4 engine computes with them (dequantized)."""
    from edgespec.export.target.arch import arch_from_config
    from edgespec.export.train.head_data import load_target

    model, tok = load_target(target)
    arch = arch_from_config(model.config, 2048)
    sd = {k: v.detach().float().numpy() for k, v in model.state_dict().items()}
    cos, sin = arch.rope_tables()
    return TargetTensors(
        arch=arch,
        embed=sd["model.embed_tokens.weight"],
        lm_head=model.lm_head.weight.detach().float().numpy(),
        state=sd,
        rope_cos=cos.astype(np.float32),
        rope_sin=sin.astype(np.float32),
        tokenizer=tok,
    )


def load_aux(cfg: BaseTrainConfig, data: TrainData) -> np.ndarray:
    """The shards' aux features [N, n*H] (the target's low/mid/high residual streams), checked to
    line up with the tokens `prepare` read."""
    from edgespec.export.train.head_data import load_aux as read_aux

    try:
        aux = read_aux(cfg.data)
    except FileNotFoundError as e:
        raise TrainDataError(f"{e}. Hint: make the data with DataConfig(aux=True)") from e
    if len(aux) != len(data.tokens):  # a shard written between the two reads (data still being made)
        raise TrainDataError(
            f"{cfg.data}: {len(aux)} aux rows for {len(data.tokens)} tokens; the data changed while "
            "it was read (still being generated?). Hint: run again once the folder holds `done`"
        )
    return aux


# ---- draft vocabulary and batches ---------------------------------------------------------------------
def draft_vocab(tokens: np.ndarray, answer: np.ndarray, vocab: int, size: int) -> np.ndarray:
    """The `size` most frequent tokens of the answers, most frequent first (a prefix is then a
    smaller draft vocabulary), or the full vocabulary (ids in order)."""
    if size <= 0 or size >= vocab:
        return np.arange(vocab, dtype=np.int64)
    return by_frequency(np.arange(vocab, dtype=np.int64), tokens[answer], vocab)[:size]


def by_frequency(ids: np.ndarray, seen: np.ndarray, vocab: int) -> np.ndarray:
    """ids reordered by how often they occur in `seen`, most frequent first (ties: in given order)."""
    counts = np.bincount(seen.astype(np.int64), minlength=vocab)
    return ids[np.argsort(-counts[ids], kind="stable")].astype(np.int64)


def target_to_draft(d2t: np.ndarray, vocab: int) -> np.ndarray:
    """[vocab + 1] draft id of each target id, -100 (no loss) for tokens outside the draft
    vocabulary and for the extra id `vocab` (a label masked out on purpose)."""
    t2d = np.full(vocab + 1, -100, np.int64)
    t2d[d2t] = np.arange(len(d2t))
    return t2d


def copied_positions(tokens: np.ndarray, starts: np.ndarray, n: int = 8) -> np.ndarray:
    """[N] bool: the token ends an n-gram that already occurred earlier in its sequence. Greedy
    answers of a small model loop a lot; such copies are prompt lookup's job, and training on
    them teaches the head little and inflates its held-out score."""
    out = np.zeros(len(tokens), bool)
    for s in range(len(starts) - 1):
        a, b = int(starts[s]), int(starts[s + 1])
        seen: set = set()
        seq = tokens[a:b].tolist()
        for i in range(n - 1, len(seq)):
            key = tuple(seq[i - n + 1 : i + 1])
            out[a + i] = key in seen
            seen.add(key)
    return out


def length_groups(starts: np.ndarray, seqs: np.ndarray, batch_tokens: int, rng: np.random.Generator) -> list[list[int]]:
    """Groups of sequences of similar length whose padded size stays within batch_tokens."""
    lens = starts[seqs + 1] - starts[seqs]
    order = seqs[np.argsort(lens + rng.uniform(0, 8, len(lens)))]
    groups, cur, longest = [], [], 0
    for s in order:
        n = int(starts[s + 1] - starts[s])
        if cur and max(longest, n) * (len(cur) + 1) > batch_tokens:
            groups.append(cur)
            cur, longest = [], 0
        cur.append(s)
        longest = max(longest, n)
    if cur:
        groups.append(cur)
    rng.shuffle(groups)
    return groups


def head_rows(group, data: TrainData, t2d: np.ndarray, label_ids: np.ndarray, extra: int) -> tuple[np.ndarray, ...]:
    """The rows of a head's batch of sequences `group` (EAGLE, EAGLE-3): row j of a sequence (j = 0..n-2)
    is fed token_{j+1} beside the features of position j and learns token_{j+2}. Returns tok_in [B, L],
    labels [B, L + extra] (draft ids of label_ids[j+2]; -100: no loss: prompt tokens, padding, and the
    `extra` columns that later unrolled steps read past the end), valid [B, L] bool and pos [B, L] (= j)."""
    starts = data.starts
    L = max(int(starts[s + 1] - starts[s]) for s in group) - 1
    B = len(group)
    tok_in = np.zeros((B, L), np.int64)
    labels = np.full((B, L + extra), -100, np.int64)
    valid = np.zeros((B, L), bool)
    for r, s in enumerate(group):
        a, b = int(starts[s]), int(starts[s + 1])
        n = b - a
        tok_in[r, : n - 1] = data.tokens[a + 1 : b]
        valid[r, : n - 1] = True
        lab = t2d[label_ids[a + 2 : b]]  # row j predicts token_{j+2}
        lab[: max(0, int(data.n_prompt[s]) - 2)] = -100  # prompt tokens: context only, no loss
        labels[r, : n - 2] = lab
    pos = np.broadcast_to(np.arange(L), (B, L)).copy()
    return tok_in, labels, valid, pos


def epoch_groups(data: TrainData, cfg, epoch: float) -> list[list[int]]:
    """The training sequences of the epoch `epoch` is in, grouped by length_groups, in an order
    fixed by cfg.seed and the epoch (a resumed run sees the same batches)."""
    rng = np.random.default_rng(cfg.seed + int(epoch * 1000))
    return length_groups(data.starts, data.train, cfg.batch_tokens, rng)
