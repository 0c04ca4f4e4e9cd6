"""Teacher-forced acceptance of drafting heads on an eval prompt file, by task type, in seconds.

The engine answers each prompt of the file greedily (plain decoding's tokens; `edgespec
answer-data`'s path, so the features and labels are the exact target graph's), once, into --work.
Each head then drafts at every answer position from the true context: step 1 from the target's own
feature, step 2 from its own step-1 output (EAGLE's chain). Printed per task type:
  step1    P(draft 1 = the target's token)
  step2|1  P(draft 2 right | draft 1 right)
  oov      share of the target's tokens outside the head's draft vocabulary (never draftable)
  target   the target's mean top-1 probability there (how predictable the text is at all)
  step1 per call  step 1 where a run's calls start: two-token chains drafted from where the last
           call left off (after a miss: harder positions); what a bench's acceptance by position 1 is
A bench measures what a head gains end to end; this shows why (vocabulary, step 1, text).
The work folder holds eval answers: never train on it (the trainers refuse a folder with EVAL).

    python tools/head_accept.py --engine ENG --eagle export/heads/smollm2-135m-instruct --eagle3 E3
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np


@dataclass(frozen=True)
class AcceptConfig:
    engine: str  # engine folder: answers and labels (with --eagle3: exported with EAGLE-3 features)
    prompts: str  # eval prompt file (.jsonl with messages, category)
    work: str  # folder for the eval answers (made once, reused)
    eagle: tuple[str, ...]  # EAGLE-1 head folders to score
    eagle3: tuple[str, ...]  # EAGLE-3 head folders to score
    max_new_tokens: int  # answer length
    limit: int | None  # first prompts only


def answers(cfg: AcceptConfig) -> Path:
    """The engine's greedy answers to the prompt file, labelled (made once)."""
    from edgespec.export.train.answer_data import AnswerDataConfig, make_answer_data
    from edgespec.export.train.text_data import EVAL_MARK

    work = Path(cfg.work)
    if not (work / "done").exists():
        rows = [json.loads(line) for line in Path(cfg.prompts).read_text().splitlines() if line.strip()]
        rows = rows[: cfg.limit]
        work.mkdir(parents=True, exist_ok=True)
        (work / EVAL_MARK).write_text(f"answers to {cfg.prompts}: eval data, never train on it\n")
        (work / "prompts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        make_answer_data(
            AnswerDataConfig(engine=cfg.engine, out=str(work), max_new_tokens=cfg.max_new_tokens, shard_seqs=len(rows))
        )
    return work


def score(head, forward, data, t2d: np.ndarray, labels: np.ndarray, cats: list[str]) -> dict[str, np.ndarray]:
    """Per task type: [positions, step-1 right, step-1 right with a next position, step 2 right too,
    out of vocabulary, sum of the target's top-1 probability, simulated calls, of them step 1 right]."""
    import torch

    out: dict[str, np.ndarray] = {}
    with torch.no_grad():
        for s in range(len(data.n_prompt)):
            a, b = int(data.starts[s]), int(data.starts[s + 1])
            n = b - a - 2  # rows j predict token j + 2
            p1, p2 = forward(s)
            d1 = head.d2t[head.logits(p1)[0, :n].argmax(-1)].numpy()
            d2 = head.d2t[head.logits(p2)[0, :n].argmax(-1)].numpy()
            want = labels[a + 2 : b]
            m = np.arange(n) >= max(0, int(data.n_prompt[s]) - 2)  # answer positions
            ok1 = (d1 == want) & m
            ok2 = np.zeros(n, bool)
            ok2[:-1] = (d2[:-1] == want[1:]) & ok1[:-1]
            p_top = data.soft.probs[a + 1 : b - 1, 0]  # row i - 1: the target's distribution over token i
            calls = called = 0  # two-token chains drafted where the last call left off, as a run drafts
            j = int(np.argmax(m)) if m.any() else n
            while j < n:
                calls, called = calls + 1, called + int(ok1[j])
                j += 1 + int(ok1[j]) + int(ok1[j] and ok2[j])
            r = np.array(
                [m.sum(), ok1.sum(), ok1[:-1].sum(), ok2.sum(), ((t2d[want] < 0) & m).sum(), (p_top * m).sum()]
                + [calls, called],
                np.float64,
            )
            out[cats[s]] = out.get(cats[s], np.zeros(8)) + r
    return out


def report(name: str, per: dict[str, np.ndarray]) -> None:
    print(f"\n{name}\n| task | tokens | step1 | step2\\|1 | oov | target | step1 per call |")
    print("|---|---|---|---|---|---|---|")
    rows = sorted(per.items())
    if list(per) != ["all"]:  # prompts without a category are one task already: no total row twice
        rows.append(("all", sum(per.values())))
    for c, r in rows:
        rates = (r[1] / r[0], r[3] / max(r[2], 1), r[4] / r[0], r[5] / r[0], r[7] / max(r[6], 1))
        print(f"| {c} | {int(r[0])} | " + " | ".join(f"{x:.3f}" for x in rates) + " |")


def main(cfg: AcceptConfig) -> None:

    from edgespec.export.train import train_data
    from edgespec.export.train.head_data import load_aux, load_shards, load_soft

    work = answers(cfg)
    tokens, feats, starts, n_prompt = load_shards(work)
    soft = train_data.SoftLabels(*load_soft(work))
    cats = [json.loads(line).get("category", "all") for line in (work / "prompts.jsonl").read_text().splitlines()]
    n = len(n_prompt)
    answer = np.zeros(len(tokens), bool)
    for s in range(n):
        answer[starts[s] + n_prompt[s] : starts[s + 1]] = True
    data = train_data.TrainData(
        tokens, feats, starts, n_prompt, np.arange(n), np.arange(0), answer, soft, soft.labels(tokens, starts)
    )
    labels = data.labels().astype(np.int64)
    tt = train_data.target_tensors(None)
    V, H = tt.arch.vocab_size, tt.arch.hidden_size
    for folder in cfg.eagle:
        from edgespec.export.drafters.eagle.checkpoint import read_head
        from edgespec.export.drafters.eagle.head import build_head
        from edgespec.export.drafters.eagle.train import _collate

        hc, arrays = read_head(folder, H, V)
        head = build_head(hc, arrays, tt.embed, tt.lm_head, tt.rope_cos, tt.rope_sin).eval()
        t2d = train_data.target_to_draft(head.d2t.numpy(), V)

        def fwd(s, head=head, t2d=t2d):
            tok, f, pos, valid, _ = _collate([s], data, t2d, labels)
            return head(tok, f[:, : tok.shape[1]], pos, valid, 2)

        report(f"EAGLE {folder}", score(head, fwd, data, t2d, labels, cats))
    if cfg.eagle3:
        from edgespec.export.drafters.eagle3.head import build_eagle3, read_eagle3
        from edgespec.export.drafters.eagle3.train import _collate as collate3

        aux = load_aux(work)
        for folder in cfg.eagle3:
            ec, arrays, _ = read_eagle3(folder, H, V, tt.arch.n_layers)
            head = build_eagle3(ec, arrays, tt.embed, tt.rope_cos, tt.rope_sin).eval()
            t2d = train_data.target_to_draft(head.d2t.numpy(), V)

            def fwd3(s, head=head, t2d=t2d):
                tok, a_in, pos, valid, _ = collate3([s], data, aux, t2d, labels, 2)
                return head(tok, a_in, pos, valid, 2)

            report(f"EAGLE-3 {folder}", score(head, fwd3, data, t2d, labels, cats))


def parse(argv=None) -> AcceptConfig:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--engine", required=True, help="engine folder (with --eagle3: exported with EAGLE-3 features)")
    p.add_argument("--prompts", default="tools/prompts/drafts_eval.jsonl", help="eval prompt file")
    p.add_argument("--work", default="/tmp/edgespec-eval-answers", help="folder for the eval answers (reused)")
    p.add_argument("--eagle", action="append", default=[], help="EAGLE-1 head folder (repeatable)")
    p.add_argument("--eagle3", action="append", default=[], help="EAGLE-3 head folder (repeatable)")
    p.add_argument("--max-new-tokens", type=int, default=128, help="answer length (default 128, the eval's)")
    p.add_argument("--limit", type=int, help="first prompts only")
    a = p.parse_args(argv)
    return AcceptConfig(a.engine, a.prompts, a.work, tuple(a.eagle), tuple(a.eagle3), a.max_new_tokens, a.limit)


if __name__ == "__main__":
    main(parse())
