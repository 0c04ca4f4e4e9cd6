"""The recycle drafter: chains and trees from the recycle table (table.py), and the table's life in
the generator (`shared_table`).

A context drafts from its longest order present: the chain follows each row's first token while the
path's stored probability stays at or above `min_prob`; a tree adds the best candidate of the whole
frontier at a time (`grow`; score: the product of stored probabilities along the path), the top
`branch` tokens of each node's row, so the cost-sized tree machinery (TreeBudget, tree.keep_best)
sizes it by those scores. With --adaptive a chain is sized the same way (TreeBudget.choose_chain):
each draft scored by the calibrated chance it is kept (calibration.py, learned from the verified
chains), the step verifies the prefix that pays by the width table; on this CPU that beats a k
chosen from one running acceptance rate, since a context the table knows well is worth a longer
chain than one it saw once.

A sampled chain draws each draft from its row's stored candidates (at the call's temperature /
`sharpen`: a q over 8 tokens, `SparseQ`), not their first: verified by the rejection rule with that
q, it keeps sum(min(p, q)) of the target's row p, where the first token alone keeps p(first), and its
verification touches only q's tokens of each row. Greedy drafts and tree nodes are deterministic
candidates (a one-hot q); either way verification is the usual lossless rule (runtime/verify.py).
"""

from __future__ import annotations

import heapq
import warnings
from pathlib import Path

import numpy as np

from edgespec.runtime.drafters import Drafter
from edgespec.runtime.drafters.recycle.calibration import Calibration, table_gate
from edgespec.runtime.drafters.recycle.table import WARM_FILE, RecycleConfig, RecycleError, RecycleTable, recycle_path
from edgespec.runtime.sampling import KeyedDraws
from edgespec.runtime.state import Proposal, SeqState, SparseQ, chain

SAVE_EVERY = 16  # requests between saves of a table kept in a file
SHARPEN = 2.0  # sampled chains draw each draft at the call's temperature / SHARPEN (RecycleDrafter._draw)


def shared_table(ctx) -> RecycleTable:
    """The generator's table: made at the first build, then kept in its drafter store, so it lives
    across requests and drafter switches (and a combinator that recycles shares it). It starts from
    its --suffix-cache file's table, else from the folder's `edgespec warm` table, else empty."""
    if "recycle" not in ctx.store:
        c = ctx.cfg
        cfg = RecycleConfig(
            bits=c.recycle_bits,
            min_prob=c.recycle_min_prob,
            file=recycle_path(c.suffix_cache),
            orders=c.recycle_orders,
            every_row=c.recycle_every_row,
        )
        man = ctx.engines.target.manifest  # (None: an engine not loaded from a folder, a test's fake)
        start = man.path(WARM_FILE) if man is not None else None
        table = ctx.store["recycle"] = RecycleTable(ctx.target_vocab, cfg, start=start)
        cold = start is not None and not start.exists() and not (cfg.file and Path(cfg.file).exists())
        if cold:  # (said once per generator: the table lives in its store from here on)
            warnings.warn(
                f"recycle: {man.folder} has no warm table, so the table starts empty and fills as you generate "
                "(on new chat text a cold table drafts little: docs/results/recycle.md). Hint: edgespec warm "
                f"{man.folder} --answers 300 (~2 min for the default model on 2 cores) starts every later load "
                "from the model's own answers",
                RuntimeWarning,
                stacklevel=2,
            )
        if not ctx.engines.target.top_k:
            table.needs_logits = True
            warnings.warn(
                "recycle: this folder's target graph has no top-k output (exported before it had one); "
                "the table keeps each row's argmax only, read off the logits (slower, a chain per context). "
                "Hint: re-export the folder (edgespec export --out FOLDER --force)",
                RuntimeWarning,
                stacklevel=2,
            )
    return ctx.store["recycle"]


class RecycleDrafter(Drafter):
    """Drafts from the table of the target's own earlier predictions (module docstring)."""

    name = "recycle"
    drafts_trees = True
    scores_chains = True

    def __init__(self, table: RecycleTable, min_prob: float = 0.0, sharpen: float = SHARPEN) -> None:
        super().__init__()
        if not sharpen > 0:
            raise RecycleError(
                f"recycle sharpen {sharpen}: choose > 0 (sampled drafts are drawn at the call's temperature "
                "/ sharpen; inf: each row's first candidate). Hint: --recycle-sharpen 2"
            )
        self.recycle_table = table  # filled from every target call (the observe hooks)
        self.min_prob = min_prob
        self.sharpen = sharpen  # sampled drafts: drawn at the call's temperature / sharpen
        self.last_score = 0.0  # the last chain's sum of path probabilities: its expected accepted length
        self.greedy_calibration = Calibration()  # kept across greedy calls; a sampled call starts afresh
        self.calibration = self.greedy_calibration
        self.chain_probs: list[float] = []  # the last chain's stored probability per draft
        self._scores: list[float] = []  # its path scores (chain_scores)
        self._verified = -1  # drafts of it the verify call took (-1: not cost-sized, nothing to learn)
        self._q_ids = np.full((0, table.k), -1, np.int64)  # [k, K] a sampled chain's draft distributions:
        self._q_probs = np.zeros((0, table.k))  # [k, K]  the tokens and probabilities of each (SparseQ)

    def configure(self, sampling, rng) -> None:
        super().configure(sampling, rng)
        self.calibration = self.greedy_calibration if sampling.greedy else Calibration()

    def chain_scores(self) -> list[float]:
        return self.calibration.chain_scores(self.chain_probs, 0, self._scores)

    def chain_verified(self, m: int) -> None:
        self._verified = m

    @property
    def needs_logits(self) -> bool:  # (only a folder without the top-k output: the argmax fallback)
        return self.recycle_table.needs_logits

    def observe(self, tgt, seq: SeqState, prop: Proposal, logits) -> None:
        self.recycle_table.observe_call(tgt, seq, prop, logits)

    def observe_prefill(self, tgt, seq: SeqState, past: int, n: int, logits) -> None:
        self.recycle_table.observe_prefill(tgt, seq.tokens, past, n, logits)

    def accepted(self, seq: SeqState, n_old: int, n_acc: int) -> None:
        self.recycle_table.observe_commit(seq)  # (the committed-only orders of the last verify call)
        if self._verified >= 0:
            self.calibration.observe_chain(self.chain_probs, 0, self._verified, n_acc)
            self._verified = -1

    def finish(self, seq: SeqState) -> None:
        t = self.recycle_table
        t.requests += 1
        if t.cfg.file and t.requests >= SAVE_EVERY:
            t.save()

    def propose(self, seq: SeqState, k: int) -> Proposal:
        self._verified = -1  # a new chain (a grammar redrafts mid-step): cost-sized only if chain_verified says so
        self.chain_probs.clear()
        idle = self.chain_idle
        if idle is not None and idle(self.calibration.best_first((1,))):  # no chain would be verified: draft none
            return chain(seq, 0)
        m = self.extend(seq, 0, k, probs=self.chain_probs, gate=table_gate(self.chain_gate, self.calibration))
        return chain(seq, m, self.sparse_q(m))

    def sparse_q(self, m: int) -> SparseQ | None:
        """The draft distributions of the last chain's first m drafts (None: greedy, one-hot drafts)."""
        return None if self.sampling.greedy else SparseQ(self._q_ids[:m], self._q_probs[:m])

    def extend(self, seq: SeqState, m: int, k: int, path: float = 1.0, probs: list | None = None, gate=None) -> int:
        """Continue a chain of m drafts in seq's draft slots (0: from the pending token) up to k from
        the table while the path's stored probability (from `path`) stays >= min_prob: greedy, each
        context's first token; sampling, a token drawn from the row's stored top-k at the call's
        temperature (`_draw`: its q row written at slot m). Returns the chain's new length;
        last_score: the sum of path probabilities; probs (if given): each new draft's row's stored
        top probability appended (a greedy draft's own). gate (m = 0 only): called with the first
        draft's stored probability; True stops the chain there (`Drafter.chain_gate`)."""
        t = self.recycle_table
        ctx = _context(seq.tokens, seq.n + m, t.orders)
        score, greedy = 0.0, self.sampling.greedy
        if not greedy:
            self._grow_q(k)
        if m:
            gate = None
        while m < k:
            r = t.row(*ctx)
            if r < 0:
                break
            x, p = t.ids.item(r, 0), t.probs.item(r, 0)
            path *= p
            if x < 0 or path < self.min_prob:
                break
            if not greedy:
                x = self._draw(r, m)
            seq.tokens[seq.n + m] = x
            m += 1
            score += path
            if probs is not None:
                probs.append(p)
            if gate is not None and gate(p):
                break
            gate = None
            ctx = ctx[1:] + (x,)
        self.last_score = score
        return m

    def one_hot_q(self, tokens: np.ndarray) -> None:
        """q rows 0 .. len(tokens) - 1 one-hot on these tokens (a combinator's deterministic drafts
        before the table's, in the same chain)."""
        m = len(tokens)
        self._grow_q(m)
        self._q_ids[:m] = -1
        self._q_ids[:m, 0] = tokens
        self._q_probs[:m] = 0.0
        self._q_probs[:m, 0] = 1.0

    def _grow_q(self, k: int) -> None:
        if len(self._q_ids) < k:
            self._q_ids = np.full((k, self.recycle_table.k), -1, np.int64)
            self._q_probs = np.zeros((k, self.recycle_table.k))

    def _draw(self, r: int, m: int) -> int:
        """A token drawn from table row r's stored candidates, q written at slot m: their stored
        probabilities at the call's temperature / sharpen, renormalised over them (past the call's
        top_k none). Lossless whatever q is (verify.accept_sampled); a draft drawn from q is kept with
        chance sum(min(p, q)) of the target's row p, the first candidate alone with p(first). The
        stored row is an earlier context's, flatter or sharper than this one's; q sharper than it
        (sharpen 2) kept the most on the tuning prompts (docs/results/recycle.md)."""
        t, cfg = self.recycle_table, self.sampling
        ids, ps = t.ids[r].tolist(), t.probs[r].tolist()
        power, top = self.sharpen / cfg.temperature, cfg.top_k or len(ids)
        if power == float("inf"):
            ws = [1.0] + [0.0] * (len(ids) - 1)
        else:
            ws = [p**power if x >= 0 and j < top else 0.0 for j, (x, p) in enumerate(zip(ids, ps, strict=True))]
        total = sum(ws)
        if total <= 0.0:  # (stored probabilities that underflowed: the row's first token, one-hot)
            ws, total = [1.0] + [0.0] * (len(ids) - 1), 1.0
        self._q_ids[m] = ids
        self._q_probs[m] = [w / total for w in ws]
        if isinstance(self.rng, KeyedDraws):  # a seeded call: the race on position m's own clocks (coupled)
            return self.rng.pick_among(ids, ws, m, t.vocab)
        u, j = self.rng.random() * total, 0
        while j < len(ws) - 1 and u >= ws[j]:  # (u >= 0: a zero weight is always passed)
            u -= ws[j]
            j += 1
        if ws[j] == 0.0:  # (rounding past the last weighted candidate)
            j = max(i for i, w in enumerate(ws) if w > 0.0)
        return ids[j]

    def propose_tree(self, seq: SeqState, tree, cfg) -> None:
        grow(tree, seq, cfg, self.recycle_table)


def _context(tokens: np.ndarray, end: int, orders: int) -> tuple[int, ...]:
    """tokens[end - orders : end] as ints, oldest first (-1 before the start)."""
    lo = end - orders
    return tuple(tokens[lo:end].tolist()) if lo >= 0 else (-1,) * -lo + tuple(tokens[:end].tolist())


def grow(tree, seq: SeqState, cfg, table: RecycleTable, lookup=None, estimate=None) -> None:
    """Grow a token tree best first from two sources: a lookup's tree (`lookup`: a TokenTree drafted
    under the same root, or None) and the recycle table, which offers the top cfg.branch tokens of
    its row under every node, the lookup's included. The next node is always the best candidate of
    the whole frontier; a candidate's score is its parent's times `estimate(source, depth, p)`, the
    chance it is kept given its parent was (None: p itself), p being its source's own probability of
    it (the lookup's continuation frequency, the target's stored probability); down to cfg.depth,
    while scores stay >= cfg.min_score, until the tree is full. Each node records its source (0: the
    lookup, 1: the table) and p (TokenTree.source / prob), which the calibration learns from."""
    heap: list = []
    pushed = 0
    branch = min(cfg.branch, table.k)
    floor = max(cfg.min_score, 1e-12)
    kids: dict[int, list[int]] = {}  # a lookup node -> its children
    if lookup is not None:  # (its nodes as Python ints and floats: read per candidate)
        n_look = lookup.n
        look_parent, look_token = lookup.parents[:n_look].tolist(), lookup.tokens[:n_look].tolist()
        look_score = lookup.score[:n_look].tolist()
        for j in range(1, n_look):
            kids.setdefault(look_parent[j], []).append(j)

    def offer(node: int, score: float, ctx: tuple, at: int, table_too: bool = True) -> None:
        """Push the candidates under tree node `node` (its context ctx; lookup node `at`, or -1)."""
        nonlocal pushed
        depth = tree.node_depth(node) + 1
        if depth > cfg.depth:
            return
        for j in kids.get(at, ()):
            ps = look_score[look_parent[j]]
            p = look_score[j] / ps if ps > 0 else 0.0
            s = score * (estimate(0, depth, p) if estimate else p)
            if s >= floor:
                pushed += 1
                heapq.heappush(heap, (-s, pushed, node, look_token[j], 0, p, ctx, j))
        r = table.row(*ctx) if table_too else -1
        if r < 0:
            return
        for x, p in zip(table.ids[r, :branch].tolist(), table.probs[r, :branch].tolist(), strict=True):
            s = score * (estimate(1, depth, p) if estimate else p)
            if x < 0 or s < floor:
                break  # (best first: the rest are no better)
            pushed += 1
            heapq.heappush(heap, (-s, pushed, node, x, 1, p, ctx, -1))

    offer(0, 1.0, _context(seq.tokens, seq.n, table.orders), 0 if lookup is not None else -1)
    while heap and tree.n < tree.limit:
        neg, _, parent, tok, source, p, pctx, at = heapq.heappop(heap)
        before = tree.n
        c = tree.add(parent, tok, -neg, source, p)
        if c < 0:
            return
        if c < before:  # the same token from the table, added already with a better score: the
            if at >= 0:  # lookup's continuations of it go under that node (the table's are there)
                offer(c, float(tree.score[c]), pctx[1:] + (tok,), at, table_too=False)
            continue
        offer(c, -neg, pctx[1:] + (tok,), at)
