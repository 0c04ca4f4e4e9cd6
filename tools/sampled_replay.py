"""Offline replay of one-hot drafting policies under sampling (docs/results/recycle.md, "Sampling").

With one-hot candidates (the table's and the lookups' drafts), the lossless walk (verify.py) keeps a
node exactly when the target's own sample at its parent is the node's token: so on a trajectory
sampled plainly from the target, the accepted length of a step's tree is the longest prefix of the
trajectory that is a path of the tree (an exact coupling; the tokens per call it gives have the
real loop's distribution). The table learns from the committed rows only, so a replay is a lower
bound (real runs also write the rows of rejected nodes).

  collect  run the folder plainly at --temperature over prompt files (seed 1, 128 tokens), then
           prefill each prompt + answer once more to keep every position's TopK (ids, probs)
  replay   for each policy: tokens per call, mean width, and speed against plain by a width cost
           curve (--costs T1,T2,...,T9 in ms; default: attn-warm's, past 256, min of 30)

Policies: chain=K (recycle chain), tree=N:D:B:BEAM (recycle tree, fixed), budget=N:D:B:BEAM;ROW
(recycle tree cut per step by the sampled TreeBudget at ROW decodes per extra row), mchain=K,
mergedfix=N:D:B:BEAM, merged=N:D:B:BEAM;ROW (the same with suffix lookup + recycle, fresh
calibration per request as a sampled call has).

  python tools/sampled_replay.py collect FOLDER traj.npz tools/prompts/drafts_eval.jsonl
  python tools/sampled_replay.py replay FOLDER traj.npz chain=2 "budget=9:4:4:2;0.08" "merged=9:4:4:2;0.08"
"""

from __future__ import annotations

import argparse
import dataclasses
import json

import numpy as np

COSTS = "4.07,4.62,4.62,4.81,5.07,5.50,5.93,6.40,6.87"  # ms by width 1..9 (T3 measured 4.56: kept monotone)


def collect(folder: str, out: str, files: list[str], temperature: float, n_new: int) -> None:
    from edgespec.engines.ort import share_thread_pool

    share_thread_pool()
    from edgespec.runtime.config import RuntimeConfig
    from edgespec.runtime.generator import Generator
    from edgespec.runtime.prefill import prefill
    from edgespec.runtime.sampling import SamplingConfig

    prompts = [json.loads(line) for f in files for line in open(f)]
    g = Generator.load(folder, RuntimeConfig(drafter="none"))
    tgt, data = g.target, {}
    for j, p in enumerate(prompts):
        ids = g.codec.encode(p.get("messages") or p["prompt"])
        g.forget()
        cfg = SamplingConfig(temperature=temperature, seed=1)
        answer = np.concatenate([c.copy() for c in g.generate_ids(ids, n_new, cfg)])
        toks = np.concatenate([ids, answer]).astype(np.int64)  # [n]
        top_ids = np.zeros((len(toks), tgt.top_k), np.int32)  # [n, k] each position's next tokens
        top_p = np.zeros((len(toks), tgt.top_k), np.float32)

        def seen(past: int, m: int, _logits, top_ids=top_ids, top_p=top_p) -> None:
            a, b = tgt.last_topk(m)
            top_ids[past : past + m], top_p[past : past + m] = a, b

        g.forget()
        prefill(tgt, toks, 0, seen=seen)
        g.forget()
        data.update({f"tok{j}": toks, f"np{j}": np.array(len(ids)), f"ids{j}": top_ids, f"p{j}": top_p})
        print(f"{j + 1}/{len(prompts)}: prompt {len(ids)}, answer {len(answer)}", flush=True)
    np.savez_compressed(out, n=len(prompts), vocab=tgt.spec.vocab_size, **data)


class Policy:
    """One drafting policy over a replay: its drafter objects and, for budgets, the TreeBudget."""

    def __init__(self, spec: str, table, vocab: int) -> None:
        from edgespec.runtime.drafters import recycle
        from edgespec.runtime.drafters.suffix import SuffixCache, SuffixConfig, SuffixDrafter
        from edgespec.runtime.tree import TokenTree, TreeConfig

        self.spec = spec
        self.kind, _, arg = spec.partition("=")
        shape, _, row = arg.partition(";")
        self.row = float(row) if row else None  # decodes per extra row of the tree budget
        self.k = int(shape) if self.kind in ("chain", "mchain") else 0
        self.cfg = TreeConfig.parse(shape) if not self.k else None
        self.tree = TokenTree(16)
        self.recycle = recycle.RecycleDrafter(table)
        self.merged = (
            recycle.MergedDrafter(SuffixDrafter(SuffixCache(SuffixConfig(), vocab)), self.recycle)
            if self.kind.startswith("m")
            else None
        )
        self.budget = None

    def start(self, seq, temperature: float) -> None:
        """A new request: a sampled call's fresh calibration and budget."""
        from edgespec.runtime.adaptive import TreeBudget
        from edgespec.runtime.sampling import SamplingConfig

        if self.merged is not None:
            self.merged.configure(SamplingConfig(temperature=temperature), np.random.default_rng(0))
            self.merged.start(seq, 0)
        if self.row is not None:
            costs = {w: 1.0 + self.row * (w - 1) for w in range(1, self.cfg.nodes + 1)}
            self.budget = TreeBudget(self.cfg.nodes, costs, timed=False)

    def draft(self, seq):
        from edgespec.runtime.drafters import recycle

        tree = self.tree
        if self.k:  # a chain, as a tree of one path
            tree.reset(seq.pending)
            d = self.merged or self.recycle
            m = d.propose(seq, self.k).n_drafted
            if self.merged is not None:
                self.merged._tree = None  # (a chain: nothing to calibrate from)
            for i in range(m):
                tree.add(i, int(seq.tokens[seq.n + i]))
            return tree
        cfg = self.cfg
        tree.reset(seq.pending, cfg.nodes)
        if self.budget is not None and self.budget.floor() > cfg.min_score:
            cfg = dataclasses.replace(cfg, min_score=self.budget.floor())
        if self.merged is not None:
            self.merged.propose_tree(seq, tree, cfg)
        else:
            recycle.grow(tree, seq, cfg, self.recycle.recycle_table)
        if self.budget is not None:
            eff = tree.path_scores()
            tree.keep_best(self.budget.choose(eff[1:]), eff)
        return tree

    def accepted(self, seq, n_old: int, n_acc: int, width: int) -> None:
        if self.budget is not None:
            self.budget.observe(width, n_acc, 0.0)
        if self.merged is not None:
            self.merged.accepted(seq, n_old, n_acc)

    def finish(self, seq) -> None:
        if self.merged is not None:
            self.merged.finish(seq)


def replay(folder: str, traj_file: str, specs: list[str], costs: np.ndarray, temperature: float) -> None:
    from edgespec.runtime.drafters import recycle
    from edgespec.runtime.state import SeqState

    z = np.load(traj_file)
    vocab = int(z["vocab"])
    for spec in specs:
        table = recycle.RecycleTable(vocab, recycle.RecycleConfig(), start=f"{folder}/{recycle.WARM_FILE}")
        pol = Policy(spec, table, vocab)
        buf = np.zeros(1 << 14, np.int64)
        steps = n_tok = width = 0
        for j in range(int(z["n"])):
            toks, n_p, ids, probs = z[f"tok{j}"], int(z[f"np{j}"]), z[f"ids{j}"], z[f"p{j}"]
            end = len(toks)
            table.observe_span(toks, 0, n_p, ids[:n_p], probs[:n_p])  # the prefill's rows
            n = n_p + 1  # the first answer token came from the prefill
            buf[:n] = toks[:n]
            seq = SeqState(tokens=buf, n=n, n_prompt=n_p, tgt_past=n - 1)
            pol.start(seq, temperature)
            while n < end:
                tree = pol.draft(seq)
                cur, i = 0, n
                tree.path[0] = 0
                while i < end and (c := tree.child(cur, int(toks[i]))) >= 0:  # the coupled walk
                    cur, i = c, i + 1
                    tree.path[i - n] = cur
                n_acc = i - n
                rows = n_acc + 1  # committed: the root and the accepted path
                table.observe_span(toks, n - 1, rows, ids[n - 1 : n - 1 + rows], probs[n - 1 : n - 1 + rows])
                new_end = min(n + rows, end)  # the accepted tokens and the next one
                buf[n:new_end] = toks[n:new_end]
                seq.n, seq.tgt_past = new_end, new_end - 1
                pol.accepted(seq, n, n_acc, tree.n)
                steps, n_tok, width = steps + 1, n_tok + n_acc + 1, width + tree.n
                n = seq.n
            pol.finish(seq)
        tau, w = n_tok / steps, width / steps
        speed = tau * costs[0] / np.interp(w, np.arange(1, len(costs) + 1), costs)
        print(f"{spec:28} tokens/call {tau:.3f} width {w:.2f} speed vs plain (verify only) {speed:.3f}x", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("collect")
    c.add_argument("folder")
    c.add_argument("out")
    c.add_argument("prompts", nargs="+")
    c.add_argument("--temperature", type=float, default=0.7)
    c.add_argument("--new", type=int, default=128)
    r = sub.add_parser("replay")
    r.add_argument("folder", help="the engine folder whose recycle.npz the table starts from")
    r.add_argument("traj")
    r.add_argument("policies", nargs="+")
    r.add_argument("--costs", default=COSTS, help="verify ms by width 1, 2, ... (comma-separated)")
    r.add_argument("--temperature", type=float, default=0.7)
    a = ap.parse_args()
    if a.cmd == "collect":
        collect(a.folder, a.out, a.prompts, a.temperature, a.new)
    else:
        replay(a.folder, a.traj, a.policies, np.array([float(x) for x in a.costs.split(",")]), a.temperature)


if __name__ == "__main__":
    main()
