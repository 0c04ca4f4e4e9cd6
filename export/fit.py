"""Does a folder's drafting head fit its target? Step-1 acceptance on a small built-in prompt set.

A head (EAGLE, EAGLE-3, Medusa, DFlash) learns the hidden states of the target it was trained on; a
target quantized another way (a user's GGUF, kept blocks instead of re-quantized ones) computes
other ones, and the head then drafts for a model that is not there. Nothing in the logits check
shows it, so the export and `edgespec check` measure it:

  step 1    over every answer position of the check prompts, teacher-forced on the target's own
            features: the share where the head's first draft is the target's greedy next token
  ngram     the same share for the folder's prompt lookup (`ngram`, which needs no head): a head
            below it drafts worse than the lookup that comes free with every folder

The target answers the prompts greedily (the folder's own engines, so the features and tokens are
the exported graphs' bits), then each head is driven through the runtime's own drafter at every
position: a one-draft proposal, the target's token appended (the drafter's code path of a rejected
draft), the next position. The prompts (export/train/prompt_data/wide_fit.json) are 16 of the wide
training mix (export/train/wide_prompts.py, seed 53, two per family, passages left out since they
depend on the machine's documentation), none sharing an 8-word window with an eval prompt: frozen,
so every machine checks on the same text. No torch: `edgespec check` runs it on a runtime install.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass

import numpy as np

HEADS = ("eagle", "eagle3", "medusa", "dflash")  # the drafters whose model reads the target's features
MIN_ANSWER = 8  # a prompt is checked only where this many answer tokens fit its max_len
# how each head kind is fitted to a folder's target: on the folder's own answers (`edgespec answer-data`)
RETRAIN = {
    "eagle": "edgespec train-eagle --init HEAD_DIR --data ANSWERS --lr 3e-4 --minutes 30",
    "eagle3": "edgespec train-eagle3 --init HEAD_DIR --data ANSWERS --minutes 30",
    "medusa": "edgespec train-medusa --init HEADS_DIR --data ANSWERS --lr 3e-4 --minutes 30",
    "dflash": "edgespec train-dflash --data ANSWERS --minutes 30",
}


@dataclass(frozen=True)
class FitConfig:
    prompts: int = 12  # check prompts answered (the built-in set's first that fit max_len)
    new_tokens: int = 40  # greedy answer tokens per prompt: the positions the heads are scored on
    threads: int | None = None  # ONNX Runtime threads (None: every core)
    messages: tuple | None = None  # chat prompts to use instead of the built-in set (tests)


def check_prompts() -> list[list[dict]]:
    """The built-in check prompts as chat messages."""
    from edgespec.export.train.prompt_lists import load_lists

    (rows,) = load_lists("wide_fit", "prompts")
    return [[{"role": r, "content": c} for r, c in row] for row in rows]


def head_names(manifest) -> list[str]:
    """The head drafters the folder ships, in HEADS order."""
    return [n for n in HEADS if manifest.section(n) is not None]


def _answers(g, cfg: FitConfig) -> tuple[list[tuple], str]:
    """The target's greedy answers: [(tokens, n_prompt, features, aux)], or ([], why none)."""
    messages = list(cfg.messages) if cfg.messages is not None else check_prompts()
    room = g.engines.target.max_len - 2 - g.k  # a step's rows must fit behind the answer
    out, shortest = [], None
    for msgs in messages:
        if len(out) >= cfg.prompts:
            break
        ids = g.codec.encode(msgs)
        shortest = len(ids) if shortest is None else min(shortest, len(ids))
        n_new = min(cfg.new_tokens, room - len(ids))
        if n_new < MIN_ANSWER:
            continue
        for _ in g.generate_ids(ids, n_new):
            pass
        n = len(ids) + g.last_stats.n_output
        rows = g.tgt_rows
        feats = rows.features[: n - 1].copy() if rows.features is not None else None
        aux = rows.aux[: n - 1].copy() if rows.aux is not None else None
        out.append((g._tokens[:n].copy(), len(ids), feats, aux))
    if not out:
        return [], (
            f"no check prompt fits max_len {g.engines.target.max_len} with {MIN_ANSWER} answer tokens "
            f"(shortest prompt: {shortest} tokens); re-export with a larger --max-len to check the heads"
        )
    return out, ""


def _step1(g, name: str, answers: list[tuple]) -> tuple[int, int, int]:
    """(positions, first drafts right, positions whose target token the drafter can propose at all)
    of drafter `name` over the answers, one draft per position from the true context."""
    from edgespec.runtime.sampling import SamplingConfig
    from edgespec.runtime.state import SeqState

    g.set_drafter(name, 1)
    d = g.drafter
    d.configure(SamplingConfig(), np.random.default_rng(0))
    d2t = getattr(d, "d2t", None)
    draftable = None
    if d2t is not None:  # which target ids the head can propose at all
        draftable = np.zeros(max(g.manifest.target.vocab_size, 1 + int(d2t.max())), bool)
        draftable[d2t] = True
    total = right = covered = 0
    buf = np.zeros(len(g._tokens), np.int64)
    for tokens, n_prompt, feats, aux in answers:
        n = len(tokens)
        if feats is not None:
            g.tgt_rows.features[: n - 1] = feats
        if aux is not None:
            g.tgt_rows.aux[: n - 1] = aux
        buf[:n] = tokens
        d.forget()
        seq = SeqState(tokens=buf, n=n_prompt + 1, n_prompt=n_prompt, tgt_past=n_prompt)
        d.start(seq, 0)
        for m in range(n_prompt + 1, n):  # propose token m from tokens[:m] (tokens[m-1] pending)
            prop = d.propose(seq, 1)
            got = int(prop.tokens[1]) if prop.n_drafted else -1
            want = int(tokens[m])
            total += 1
            right += got == want
            covered += bool(draftable is None or draftable[want])
            seq.advance(0, want)  # the draft rejected or not, the target's token follows
            d.accepted(seq, m, 0)
    return total, right, covered


def fit_check(folder, cfg: FitConfig = FitConfig()) -> dict:
    """{"prompts", "positions", "ngram", "seconds", "heads": {name: {"step1"} or {"reason"}}} or
    {"reason"} when nothing could be checked. Every failure is a one-line reason, never raised."""
    from edgespec.runtime.config import RuntimeConfig
    from edgespec.runtime.generator import Generator

    t0 = time.perf_counter()
    try:
        g = Generator.load(
            folder,
            RuntimeConfig(
                drafter="ngram",
                k=4,
                adaptive=False,
                threads=cfg.threads,
                fuse_head=False,  # the head's own calls: its drafts, not the fused graph's
                eagle_min_confidence=0.0,  # the first draft always (a cut-off would hide a miss as no draft)
                medusa_min_confidence=0.0,
            ),
        )
    except Exception as e:  # noqa: BLE001 - the check never stops an export: the reason is the result
        return {"reason": f"the folder does not load for the check ({type(e).__name__}: {_line(e)})"}
    try:
        out = _run(g, cfg)
    except Exception as e:  # noqa: BLE001 - the check never stops an export: the reason is the result
        out = {"reason": f"the check failed ({type(e).__name__}: {_line(e)})"}
    finally:
        g.close()
    return out | {"seconds": round(time.perf_counter() - t0, 2)}


def _run(g, cfg: FitConfig) -> dict:
    names = [n for n in head_names(g.manifest) if n in g.engines.models]
    out: dict = {"heads": {}}
    for n in head_names(g.manifest):
        if n not in g.engines.models:
            why = g.engines.broken.get(n, "its drafter cannot run on this backend")
            out["heads"][n] = {"reason": f"not loaded: {_line(why)}"}
    if not names:
        return out | {"reason": "no head to check" if not out["heads"] else "no head loads"}
    answers, why = _answers(g, cfg)
    if not answers:
        return out | {"reason": why, "heads": out["heads"] | {n: {"reason": why} for n in names}}
    total, right, _ = _step1(g, "ngram", answers)
    out |= {"prompts": len(answers), "positions": total, "ngram": round(right / total, 4)}
    for n in names:
        try:
            total, right, covered = _step1(g, n, answers)
        except Exception as e:  # noqa: BLE001 - one head's failure is its line, the others still run
            out["heads"][n] = {"reason": f"the head failed on the check prompts ({type(e).__name__}: {_line(e)})"}
            continue
        if covered == 0:
            out["heads"][n] = {
                "step1": 0.0,
                "reason": f"its draft vocabulary holds none of the target's {total} next tokens on the check "
                "prompts; re-export with a larger draft vocabulary (e.g. --eagle-draft-vocab 0)",
            }
        else:
            out["heads"][n] = {"step1": round(right / total, 4), "covered": round(covered / total, 4)}
    return out


def _line(e) -> str:
    return " ".join(str(e).split())[:300]


def report_lines(fit: dict, folder: str = "FOLDER") -> list[str]:
    """What the export and `edgespec check` print: one line per head, plus one naming the fine-tune
    for each head below prompt lookup."""
    if not fit:
        return []
    if "positions" not in fit:
        heads = fit.get("heads", {})
        if not heads:
            return [f"fit check: {fit.get('reason', 'not run')}"]
        return [f"fit check: {n}: {h.get('reason', fit.get('reason', 'not run'))}" for n, h in heads.items()]
    ng = fit["ngram"]
    lines = [
        f"fit check ({fit['prompts']} built-in prompts, {fit['positions']} answer positions, "
        f"{fit.get('seconds', 0):.1f} s): step-1 acceptance, prompt lookup (ngram) {ng:.3f}"
    ]
    for n, h in fit["heads"].items():
        if "step1" not in h or "reason" in h:
            lines.append(f"  {n}: {h.get('reason')}")
            continue
        lines.append(f"  {n}: {h['step1']:.3f}")
        if h["step1"] < ng:
            lines.append(
                f"  {n} drafts worse than prompt lookup here ({h['step1']:.3f} < {ng:.3f}): it fits another "
                f"target's features; fit it to this one: edgespec answer-data --engine {folder} --out ANSWERS, "
                f"then {RETRAIN[n]} (docs/usage.md)"
            )
    return lines


def print_report(fit: dict, folder: str = "FOLDER", file=None) -> None:
    """report_lines on stderr (or file)."""
    for line in report_lines(fit, folder):
        print(f"edgespec: {line}" if not line.startswith("  ") else line, file=file or sys.stderr)
