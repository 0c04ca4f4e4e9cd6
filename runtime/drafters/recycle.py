"""Token recycling (after Luo et al. 2024, arXiv 2408.08696): draft from what the target itself
predicted the last time it saw the same context, with no model call.

Every target call returns, beside its logits, each row's top-8 next tokens and their probabilities
(the graph's TopK output, engines' `last_topk`): prefill chunks, verified chains, rejected drafts and
every tree node alike; the drafter's observe hooks (base.Drafter.observe / observe_prefill) hand
them over. `RecycleTable` keeps the latest of them per context: the row's token alone (order 1: a
dense [V, 8] table), and the row's last 2 .. `orders` tokens (default 3; direct-mapped hash tables
of 2**bits slots each, a slot holding its key so a collision is a miss, never a wrong row). Each
order is written either from every row a verify call checked or from its committed rows only (the
accepted path, once acceptance is known: `every_row`). A later context drafts from its longest
order present: the chain follows each row's first token while the path's stored probability stays
at or above `min_prob`; a tree adds the best candidate of the whole frontier at a time (score: the
product of stored probabilities along the path), the top `branch` tokens of each node's row, so the
cost-sized tree machinery (TreeBudget, tree.keep_best) sizes it by those scores. With --adaptive a
chain is sized the same way (TreeBudget.choose_chain): each draft scored by the calibrated chance
it is kept (`Calibration`, learned from the verified chains), the step verifies the prefix that pays
by the width table; on this CPU that beats a k chosen from one running acceptance rate, since a
context the table knows well is worth a longer chain than one it saw once.

Cost: an update works out its T rows' contexts, keys and slots on Python ints and writes them with
three numpy assignments (with the caches cold after the model call each numpy call costs
microseconds, more than the arithmetic; no row of the 49k vocabulary is ever scanned); drafting
reads one table row per node. A sampled chain draws each draft from its row's stored candidates
(at the call's temperature / `sharpen`: a q over 8 tokens, `SparseQ`), not their first: verified by
the rejection rule with that q, it keeps sum(min(p, q)) of the target's row p, where the first token
alone keeps p(first), and its verification touches only q's tokens of each row.
Memory: (V + (orders - 1) * 2**bits) rows of 8 int32 ids, 8 float16 probabilities and one int64 key,
56 bytes each: 10.1 MB for a 49,152-token vocabulary at orders = 3, bits = 16 (`RecycleTable.nbytes`).

The table lives in the generator's drafter store: across requests and drafter switches, for the
generator's life; with --suffix-cache FILE it is saved beside it (FILE's stem + .recycle.npz) every
`SAVE_EVERY` requests and loaded at the next start. Greedy drafts and tree nodes are deterministic
candidates (a one-hot q); sampled chains carry their q; either way verification is the usual
lossless rule (runtime/verify.py).

A folder exported before its target graph had the top-k output still runs: the table then keeps
each row's argmax only (read off the logits in numpy: one 49k-wide scan per row, the slow path the
graph output exists to avoid), with probability 1, and the drafter says once to re-export.
"""

from __future__ import annotations

import heapq
import os
import stat
import warnings
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from edgespec.runtime.drafters import Drafter, DrafterPlugin, Option, register
from edgespec.runtime.files import set_aside, write_atomic
from edgespec.runtime.sampling import KeyedDraws
from edgespec.runtime.state import Proposal, SeqState, SparseQ, chain

TOP_K = 8  # candidates kept per context (the graphs' top-k output: export/target/graph.py TOP_K)
MAX_ORDERS = 4  # longest context that may be keyed (tokens): 4 keys fit int64 for vocabularies < 55,109
MULT = 0x9E3779B97F4A7C15  # Fibonacci hashing: key * MULT mod 2**64, its top bits are the slot
M64 = (1 << 64) - 1
SAVE_EVERY = 16  # requests between saves of a table kept in a file
SHARPEN = 2.0  # sampled chains draw each draft at the call's temperature / SHARPEN (RecycleDrafter._draw)


@dataclass(frozen=True)
class RecycleConfig:
    bits: int = 16  # log2 of the slots of each hashed order (2 and up)
    min_prob: float = 0.0  # chains stop when the path's stored probability falls below it
    file: str | None = None  # .npz the table is loaded from and saved to (None: kept in memory only)
    orders: int = 3  # longest context keyed (tokens, 1..MAX_ORDERS)
    # the orders written from every row a verify call checked (rejected drafts, tree nodes); the others
    # from committed rows only (prefill rows and the accepted path), e.g. "1": orders 2.. committed only
    every_row: str = "1234"


class RecycleError(ValueError):
    """A recycle table setting outside what the table can key."""


class _OtherTable(ValueError):
    """A whole saved table of another vocabulary, size or width (not damaged: made with other settings)."""


class RecycleTable:
    """The target's latest top-k next tokens per context of 1 .. `orders` tokens (module docstring).
    Rows: [0, V) order 1 (keyed by the token), then one block of 2**bits hashed slots per order 2 ..
    `orders`, and one scratch row that writes of contexts too short for an order (or of an order
    not written from that row) land on."""

    def __init__(
        self, vocab: int, cfg: RecycleConfig = RecycleConfig(), k: int = TOP_K, start: str | Path | None = None
    ) -> None:
        """start: a table to start from when cfg.file has none yet (a folder's `edgespec warm` table)."""
        if not 4 <= cfg.bits <= 24:
            raise RecycleError(f"recycle table bits {cfg.bits}: choose 4..24 (2**bits slots per order)")
        if not 1 <= cfg.orders <= MAX_ORDERS or vocab**cfg.orders >= 1 << 63:
            raise RecycleError(
                f"recycle table orders {cfg.orders}: choose 1..{MAX_ORDERS} with vocab**orders < 2**63 "
                f"(vocabulary {vocab:,}). Hint: --recycle-orders 3"
            )
        if not set(cfg.every_row) <= set("1234"):
            raise RecycleError(
                f"recycle every_row {cfg.every_row!r}: a string of the orders written from every row a call "
                "checked, e.g. '1234' (all) or '1' (the longer contexts from committed rows only). "
                "Hint: --recycle-every-row 1234"
            )
        self.cfg, self.vocab, self.k, self.orders = cfg, vocab, k, cfg.orders
        self.slots = 1 << cfg.bits
        self.shift = 64 - cfg.bits
        self._base = [0, 0] + [vocab + (o - 2) * self.slots for o in range(2, cfg.orders + 1)]  # first row per order
        self._pow = [vocab**i for i in range(cfg.orders)]  # V**i: a context's token i back weighs V**i in its key
        rows = vocab + (cfg.orders - 1) * self.slots + 1
        self.scratch = rows - 1
        self.keys = np.full(rows, -1, np.int64)  # [rows] each row's context key (-1: empty)
        self.ids = np.full((rows, k), -1, np.int32)  # [rows, k] next tokens, best first (-1: none)
        self.probs = np.zeros((rows, k), np.float16)  # [rows, k] their target probabilities
        every = [str(o) in cfg.every_row for o in range(1, cfg.orders + 1)]
        self.every_row = tuple(every)  # per order: written from every row a verify call checked
        self.committed = tuple(not e for e in every)  # per order: written from the committed rows only
        self.all_orders = (True,) * cfg.orders
        self.needs_logits = False  # set where the engine has no top-k output (the argmax fallback reads logits)
        self._pending = None  # (seq.n, proposal) of the verify call whose committed rows are still to write
        self._buf_rows = 0
        self._grow(64)
        self.requests = 0  # requests finished since the last save
        self.seen = 0  # rows of target calls observed (stats)
        if cfg.file and Path(cfg.file).exists():
            self.load(cfg.file)
        elif start is not None and Path(start).exists():
            self.load(start)

    @property
    def nbytes(self) -> int:
        return self.keys.nbytes + self.ids.nbytes + self.probs.nbytes

    def _grow(self, n: int) -> None:
        """Scratch buffers for updates of up to n rows (grown once to the widest call, then reused)."""
        if n <= self._buf_rows:
            return
        self._buf_rows = n
        O = self.orders
        self._rows = np.zeros(O * n, np.int64)  # [O * n] table rows written, order-major
        self._keyb = np.zeros(O * n, np.int64)  # [O * n] their keys
        self._argmax = np.zeros((n, 1), np.int64)  # the argmax-only fallback's ids and probabilities
        self._ones = np.ones((n, 1), np.float32)
        self._call_ids = np.full((n, self.k), -1, np.int64)  # a verify call's rows, kept for its commit
        self._call_probs = np.zeros((n, self.k), np.float32)
        self._sel_ids = np.full((n, self.k), -1, np.int64)  # its committed rows, in sequence order
        self._sel_probs = np.zeros((n, self.k), np.float32)

    # ---- update -----------------------------------------------------------------------------------
    def observe_span(
        self, tokens: np.ndarray, start: int, n: int, ids: np.ndarray, probs: np.ndarray, orders=None
    ) -> None:
        """Rows for tokens[start:start + n] (consecutive positions: a prefill chunk, a committed path),
        their contexts read from tokens before them; ids / probs [n, k'] their next tokens; orders:
        per order, written or not (None: all)."""
        self.observe_tree(tokens, start, tokens[start : start + n], None, ids, probs, orders)

    def observe_tree(
        self,
        tokens: np.ndarray,
        before: int,
        nodes: np.ndarray,
        parents: np.ndarray | None,
        ids: np.ndarray,
        probs: np.ndarray,
        orders=None,
    ) -> None:
        """Rows for a verify call's nodes [n] (parents [n]: a tree, parents[0] = -1; None: a chain)
        whose root follows tokens[:before]; ids / probs [n, k'] their next tokens; orders: per order,
        written or not (None: all). The contexts, keys and slots are worked out on Python ints (a
        call has a few rows; with the caches cold after the model call, every numpy call costs
        microseconds), then three writes into the table."""
        n, O = len(nodes), self.orders
        self._grow(n)
        orders = orders or self.all_orders
        toks = nodes.tolist()
        lo = before - (O - 1)  # the root's context: tokens[lo:before], -1 before position 0
        ctx = [-1] * -lo + tokens[:before].tolist() if lo < 0 else tokens[lo:before].tolist()
        if parents is None:  # a chain: each node's context is the O - 1 tokens before it
            line = ctx + toks
            back = [line[i : i + O - 1] for i in range(n)]
        else:  # a node's context: its parent's, shifted by the parent's token
            par = parents.tolist()
            back = [ctx]
            for i in range(1, n):
                p = par[i]
                back.append((back[p] + [toks[p]])[1:])
        base, pw, shift, scratch = self._base, self._pow, self.shift, self.scratch
        rows, keys = [scratch] * (O * n), [0] * (O * n)  # order-major: order o's row of node i at (o-1)*n + i
        first = orders[0]
        for i in range(n):
            key = toks[i]
            keys[i] = key
            if first:
                rows[i] = key
            ctx_i = back[i]
            for o in range(2, O + 1):  # key of order o: the order o-1 key + the token o-1 back * V**(o-1)
                t = ctx_i[O - o]
                if t < 0:  # (before position 0: so are the older ones)
                    break
                key += t * pw[o - 1]
                j = (o - 1) * n + i
                keys[j] = key
                if orders[o - 1]:
                    rows[j] = base[o] + (((key * MULT) & M64) >> shift)
        m = O * n
        r, kb = self._rows[:m], self._keyb[:m]
        r[:] = rows
        kb[:] = keys
        self.keys[r] = kb  # (a row written twice: the latest write wins, as numpy assigns in order)
        r = r.reshape(O, n)
        k = min(ids.shape[1], self.k)
        if ids.shape[1] == self.k:
            self.ids[r] = ids
            self.probs[r] = probs
        else:
            self.ids[r, :k] = ids[:, :k]
            self.probs[r, :k] = probs[:, :k]
            self.ids[r, k:] = -1

    # ---- what the generator hands over (through the drafters' observe hooks) -----------------------
    def observe_prefill(self, engine, tokens: np.ndarray, past: int, n: int, logits) -> None:
        """A prefill chunk's rows (committed: every order)."""
        ids, probs = self.rows_of(engine, logits, n)
        self.observe_span(tokens, past, n, ids, probs)
        self.seen += n

    def observe_call(self, engine, seq, prop, logits) -> None:
        """A verify call's rows, before its acceptance: the orders written from every row now; the
        others once its committed rows are known (`observe_commit`)."""
        n = len(prop.tokens)
        ids, probs = self.rows_of(engine, logits, n)
        self.seen += n
        if any(self.every_row):
            self.observe_tree(seq.tokens, seq.n - 1, prop.tokens, prop.parents, ids, probs, self.every_row)
        if not any(self.committed):
            return
        self._grow(n)
        k = ids.shape[1]
        self._call_ids[:n, :k] = ids  # (the engine's buffers are the next call's)
        self._call_probs[:n, :k] = probs
        self._call_k = k
        self._pending = (seq.n, prop)

    def observe_commit(self, seq) -> None:
        """After the acceptance of the call `observe_call` saw: its committed rows (the root and the
        accepted path, now seq.tokens[n - 1 : seq.n - 1] for the n it saw) into the other orders."""
        if self._pending is None:
            return
        n_before, prop = self._pending
        self._pending = None
        m, k = seq.n - n_before, self._call_k  # committed rows: the root and the accepted drafts
        if m <= 0:
            return
        rows = prop.rows()
        if rows is None:
            ids, probs = self._call_ids[:m, :k], self._call_probs[:m, :k]
        else:
            ids, probs = self._sel_ids[:m, :k], self._sel_probs[:m, :k]
            np.take(self._call_ids[:, :k], rows[:m], axis=0, out=ids)
            np.take(self._call_probs[:, :k], rows[:m], axis=0, out=probs)
        self.observe_span(seq.tokens, n_before - 1, m, ids, probs, self.committed)

    # ---- lookup -----------------------------------------------------------------------------------
    def row(self, *ctx: int) -> int:
        """The table row of the longest context present among the last 1 .. orders tokens of ctx
        (oldest first, the newest last; unknown tokens -1); -1: none."""
        key_of, V = self.keys.item, self.vocab  # (item: a Python int, no numpy scalar per read)
        t0 = ctx[-1]
        best = t0 if key_of(t0) == t0 else -1
        key, mult = t0, V
        for o in range(2, min(len(ctx), self.orders) + 1):
            t = ctx[-o]
            if t < 0:
                break
            key += t * mult
            mult *= V
            r = self._base[o] + (((key * MULT) & M64) >> self.shift)
            if key_of(r) == key:
                best = r
        return best

    # ---- file -------------------------------------------------------------------------------------
    def save(self, file: str | None = None) -> None:
        """Write the table to `file` (else cfg.file) whole: a temporary file renamed over the old one,
        so a kill or a failed write mid-save leaves the old table or none, never half of one."""
        file = file or self.cfg.file
        if not file:
            return
        sizes = dict(vocab=self.vocab, bits=self.cfg.bits, orders=self.orders)
        write_atomic(file, lambda f: np.savez(f, keys=self.keys, ids=self.ids, probs=self.probs, **sizes))
        self.requests = 0

    def load(self, file: str) -> None:
        """A saved table of the same vocabulary, width and size. Another table's, or a damaged file
        (`_read_checked`), is one warning and an empty table, never an error at each step; a damaged
        file of the table's own (cfg.file) is also set aside as NAME.bad so the next start is quiet."""
        try:
            arrays = self._read_checked(file)
        except _OtherTable as e:
            msg = f"{file}: a recycle table of another {e}; starting an empty one"
            warnings.warn(msg, RuntimeWarning, stacklevel=3)
            return
        except (ValueError, OSError, EOFError, KeyError, zipfile.BadZipFile) as e:
            own = self.cfg.file is not None and Path(file).resolve() == Path(self.cfg.file).resolve()
            bad = set_aside(file) if own else None
            where = f"set aside as {bad.name}" if bad else "ignored"
            warnings.warn(
                f"{file}: damaged recycle table ({str(e).splitlines()[0] if str(e) else type(e).__name__}), {where}; "
                "the recycle drafter starts cold (an empty table)",
                RuntimeWarning,
                stacklevel=3,
            )
            return
        self.keys[:], self.ids[:], self.probs[:] = arrays

    def _arrays(self) -> tuple[tuple[str, np.ndarray], ...]:
        """(name, array) of what a saved table holds beside its settings."""
        return ("keys", self.keys), ("ids", self.ids), ("probs", self.probs)

    def _read_checked(self, file: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(keys, ids, probs) of a saved table, each checked: a regular file of a bounded size, the
        arrays present with this table's dtypes and shapes, every id in -1 .. vocab - 1, every key in
        the row its context hashes to, probabilities finite in [0, 1]. _OtherTable for a whole table of
        another setting; ValueError (or the reader's OSError / BadZipFile) for a damaged one."""
        if not stat.S_ISREG(os.stat(file).st_mode):  # (a FIFO or a device would block np.load or never end)
            raise ValueError("not a regular file")
        with np.load(file, allow_pickle=False) as z:
            if not isinstance(z, np.lib.npyio.NpzFile):
                raise ValueError("not an .npz archive")
            missing = {"keys", "ids", "probs", "vocab", "bits"} - set(z.files)
            if missing:
                raise ValueError(f"no {', '.join(sorted(missing))} array")

            def member(name: str, limit: int) -> np.ndarray:  # (its stated size bounds what reading allocates)
                if z.zip.getinfo(name + ".npy").file_size > limit:
                    raise ValueError(f"its {name} array is larger than a table of these settings")
                return z[name]

            sizes = {n: member(n, 1024) for n in ("vocab", "bits", "orders") if n in z.files}
            if any(a.shape != () or a.dtype.kind not in "iu" for a in sizes.values()):
                raise ValueError("vocab / bits / orders are not whole numbers")
            vocab, bits = int(sizes["vocab"]), int(sizes["bits"])
            orders = int(sizes["orders"]) if "orders" in sizes else 3  # (tables saved before orders were a setting)
            if (vocab, bits, orders) != (self.vocab, self.cfg.bits, self.orders):
                raise _OtherTable(f"vocabulary or size (vocab {vocab}, bits {bits}, orders {orders})")
            keys, ids, probs = (member(n, a.nbytes + 1024) for n, a in self._arrays())
        if ids.shape != self.ids.shape and ids.ndim == 2 and ids.shape[0] == self.ids.shape[0]:
            raise _OtherTable(f"width ({ids.shape[1]} candidates per row, this one {self.k})")
        for (name, want), a in zip(self._arrays(), (keys, ids, probs), strict=True):
            if a.shape != want.shape:
                raise ValueError(f"{name} of shape {a.shape}, this table's is {want.shape}")
        if keys.dtype.kind not in "iu" or ids.dtype.kind not in "iu" or probs.dtype.kind != "f":
            raise ValueError(f"dtypes keys {keys.dtype}, ids {ids.dtype}, probs {probs.dtype}")
        if ids.size and (int(ids.min()) < -1 or int(ids.max()) >= self.vocab):
            raise ValueError(f"ids from {int(ids.min())} to {int(ids.max())}, outside -1 .. {self.vocab - 1}")
        if not (np.isfinite(probs).all() and (probs >= 0).all() and (probs <= 1.001).all()):
            raise ValueError("probabilities not finite or outside [0, 1]")
        keys = keys.astype(np.int64, copy=False)
        first = keys[: self.vocab]
        if ((first != -1) & (first != np.arange(self.vocab))).any():
            raise ValueError("an order-1 row keyed by another token")
        for o in range(2, self.orders + 1):
            block = keys[self._base[o] : self._base[o] + self.slots]
            used = block != -1
            if ((block < -1) | (used & (block >= self.vocab**o))).any():
                raise ValueError(f"an order-{o} key outside 0 .. vocab**{o} - 1")
            with np.errstate(over="ignore"):
                slot = (block[used].astype(np.uint64) * np.uint64(MULT)) >> np.uint64(self.shift)
            if (slot != np.flatnonzero(used)).any():
                raise ValueError(f"an order-{o} key in a slot its context does not hash to")
        return keys, ids, probs

    # ---- what a call returned ---------------------------------------------------------------------
    def rows_of(self, engine, logits: np.ndarray | None, n: int) -> tuple[np.ndarray, np.ndarray]:
        """(ids [n, k], probs [n, k]) of the engine's last call: its top-k output (views), or on a
        graph without one each row's argmax with probability 1 (a numpy scan of the rows)."""
        if getattr(engine, "top_k", 0):
            return engine.last_topk(n)
        self._grow(n)
        np.argmax(logits[:n], axis=-1, out=self._argmax[:n, 0])
        return self._argmax[:n], self._ones[:n]


def recycle_path(suffix_cache: str | None) -> str | None:
    """The file the table is kept in beside a suffix cache file (None: none)."""
    if not suffix_cache:
        return None
    p = Path(suffix_cache)
    return str(p.with_name(p.stem + ".recycle.npz"))


WARM_FILE = "recycle.npz"  # an engine folder's table filled by `edgespec warm` (loaded as a start, never written)


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
        man = getattr(ctx.engines.target, "manifest", None)
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
        if not getattr(ctx.engines.target, "top_k", 0):
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
        if isinstance(self.rng, KeyedDraws):  # a seeded call: the race with position m's own E (coupled)
            e = self.rng.exponentials(m, self.recycle_table.vocab)
            return ids[max(range(len(ids)), key=lambda j: ws[j] / e[ids[j]] if ws[j] > 0.0 else -1.0)]
        u, j = self.rng.random() * total, 0
        while j < len(ws) - 1 and u >= ws[j]:  # (u >= 0: a zero weight is always passed)
            u -= ws[j]
            j += 1
        if ws[j] == 0.0:  # (rounding past the last weighted candidate)
            j = max(i for i, w in enumerate(ws) if w > 0.0)
        return ids[j]

    def propose_tree(self, seq: SeqState, tree, cfg) -> None:
        grow(tree, seq, cfg, self.recycle_table)


def table_gate(chain_gate, calibration: Calibration):
    """extend's gate for a chain whose first draft comes from the table: the chain gate (None: none) of
    that draft's path score as the chain's calibration scores it (Calibration.chain_scores)."""
    if chain_gate is None:
        return None
    return lambda p: chain_gate(calibration.estimate(1, 1, p))


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


DEPTHS = 4  # calibration depth buckets: 1, 2, 3, 4 and deeper
P_EDGES = (0.1, 0.2, 0.35, 0.5, 0.7, 0.9)  # calibration bins of a source's own probability
_BIN = [sum(q / 20 >= e for e in P_EDGES) for q in range(21)]  # bin of p by round-down to 0.05


class Calibration:
    """The chance a node is kept given its parent was, learned online per source (0: the lookup, 1:
    the table), depth bucket and bin of the source's own probability p: decayed counts of the nodes
    verify calls tested (those whose parent was kept) and of the kept ones among them, started from
    a prior of `prior` nodes kept at the bin's middle probability (uncalibrated: p itself)."""

    def __init__(self, n_sources: int = 2, decay: float = 0.995, prior: float = 2.0) -> None:
        mids = np.array([0.05, 0.15, 0.275, 0.425, 0.6, 0.8, 0.95])  # [bins]
        shape = (n_sources, DEPTHS, len(mids))
        self.decay = decay
        self.tested = np.full(shape, prior)  # [sources, depths, bins] decayed tested counts (+ prior)
        self.kept = np.broadcast_to(prior * mids, shape).copy()  # their kept counts (+ prior)
        self.est = self.kept / self.tested  # [sources, depths, bins] the estimates
        self._est = self.est.tolist()  # the same as nested lists (read per candidate while drafting)

    def estimate(self, source: int, depth: int, p: float) -> float:
        return self._est[source][min(depth, DEPTHS) - 1][_BIN[int(min(p, 1.0) * 20)]]

    def observe_tree(self, tree, n_acc: int) -> None:
        """A verified tree whose accepted path is tree.path[:n_acc + 1]: every node whose parent was
        kept was tested, kept or not. Each cell a tree tested decays once, then counts its nodes. On
        Python ints and floats (a tree has a few nodes; numpy's calls cost more with the caches cold
        after the model call)."""
        n = tree.n
        if n <= 1:
            return
        on = set(tree.path[: n_acc + 1].tolist())
        par, src = tree.parents[1:n].tolist(), tree.source[1:n].tolist()
        dep, prob = tree.depth[1:n].tolist(), tree.prob[1:n].tolist()
        cells: dict[tuple[int, int, int], list[int]] = {}  # cell -> [nodes tested, nodes kept], in node order
        for i in range(n - 1):
            if par[i] in on:
                cell = (src[i], min(dep[i], DEPTHS) - 1, _BIN[int(min(prob[i] * 20, 20))])
                seen = cells.setdefault(cell, [0, 0])
                seen[0] += 1
                seen[1] += i + 1 in on
        self._count(cells)

    def observe_chain(self, probs: list[float], n_look: int, n: int, n_acc: int) -> None:
        """A verified chain of n drafts (the first n_look from the lookup, source 0; the rest from the
        table), probs their sources' own probabilities, n_acc of them kept: draft i was tested when
        every draft before it was kept. The same counts as observe_tree of that chain as a tree."""
        cells: dict[tuple[int, int, int], list[int]] = {}
        for i in range(min(n, n_acc + 1)):
            cell = (0 if i < n_look else 1, min(i + 1, DEPTHS) - 1, _BIN[int(min(probs[i] * 20, 20))])
            seen = cells.setdefault(cell, [0, 0])
            seen[0] += 1
            seen[1] += i < n_acc
        self._count(cells)

    def chain_scores(self, probs: list[float], n_look: int, out: list[float]) -> list[float]:
        """out := the path scores of a chain whose first n_look drafts came from the lookup (source 0),
        the rest from the table: the product of each draft's estimate down to it."""
        out.clear()
        path, est = 1.0, self.estimate
        for i, p in enumerate(probs):
            path *= est(0 if i < n_look else 1, i + 1, p)
            out.append(path)
        return out

    def _count(self, cells: dict) -> None:
        """Decay each tested cell once, then count its nodes tested and kept."""
        tested, kept, decay = self.tested, self.kept, self.decay
        for cell, (n_tested, n_kept) in cells.items():
            t, k = float(tested[cell]) * decay, float(kept[cell]) * decay
            for _ in range(n_tested):  # (one at a time: the same sums, bit for bit, as counting node by node)
                t += 1.0
            for _ in range(n_kept):
                k += 1.0
            tested[cell], kept[cell] = t, k
            self.est[cell] = self._est[cell[0]][cell[1]][cell[2]] = k / t


class MergedDrafter(Drafter):
    """merged: a lookup (suffix decoding or prompt lookup) first, the recycle table after. Chains:
    the lookup's chain, continued from the table up to k (the table's alone where the lookup has no
    match). Trees: one tree of both, best node first (`grow`), each node scored by the calibrated
    chance it is kept (`Calibration`, per source, depth and own probability, learned from every
    verified tree), so the cost-sized tree machinery (--adaptive: TreeBudget keeps the nodes that pay
    for their verify rows by the folder's measured width table) sizes one tree over both sources;
    --adaptive chains are cut the same way, each draft scored by the same calibration.
    Greedy calls keep learning across calls; a sampled call starts from the prior (its seed then
    reproduces its output given the same table and cache)."""

    name = "merged"
    drafts_trees = True
    scores_chains = True

    def __init__(self, lookup: Drafter, recycle: RecycleDrafter) -> None:
        super().__init__()
        self.lookup, self.recycle = lookup, recycle
        self.recycle_table = recycle.recycle_table  # (shared: filled through the observe hooks)
        self.greedy_calibration = Calibration()
        self.calibration = self.greedy_calibration
        self._scratch = None  # the lookup's own tree, merged into the step's
        self._tree = None  # the tree drafted this step (learned from after its verify call)
        self.chain_probs: list[float] = []  # the last chain's per-draft probability (its source's own)
        self._n_look = 0  # drafts of it from the lookup (the rest from the table)
        self._scores: list[float] = []
        self._verified = -1  # drafts of it the verify call took (-1: not cost-sized, nothing to learn)
        self._kept = (None, 0)  # the last step's (tree or None for a chain, drafts kept): kept_sources

    def configure(self, sampling, rng) -> None:
        super().configure(sampling, rng)
        self.lookup.configure(sampling, rng)
        self.recycle.configure(sampling, rng)
        self.calibration = self.greedy_calibration if sampling.greedy else Calibration()

    def finish(self, seq: SeqState) -> None:
        self.lookup.finish(seq)
        self.recycle.finish(seq)

    @property
    def needs_logits(self) -> bool:
        return self.lookup.needs_logits or self.recycle.needs_logits

    def observe(self, tgt, seq: SeqState, prop: Proposal, logits) -> None:
        self.lookup.observe(tgt, seq, prop, logits)
        self.recycle.observe(tgt, seq, prop, logits)

    def observe_prefill(self, tgt, seq: SeqState, past: int, n: int, logits) -> None:
        self.lookup.observe_prefill(tgt, seq, past, n, logits)
        self.recycle.observe_prefill(tgt, seq, past, n, logits)

    def propose(self, seq: SeqState, k: int) -> Proposal:
        self._tree = None
        self._verified = -1  # a new chain (a grammar redrafts mid-step): cost-sized only if chain_verified says so
        m = self.lookup.propose(seq, k).n_drafted
        probs = self.chain_probs
        probs.clear()
        look_probs = getattr(self.lookup, "last_probs", None)  # (prompt lookup has none: 1 each)
        probs += look_probs[:m] if look_probs is not None else [1.0] * m
        rec, gate = self.recycle, self.chain_gate
        if m and gate is not None and gate(self.calibration.estimate(0, 1, probs[0])):
            m, k = 1, 1  # the budget verifies none of this chain: its lookup draft alone, no table drafts
            del probs[1:]
        total = rec.extend(seq, m, k, probs=probs, gate=table_gate(gate, self.calibration))
        self._n_look = m
        look = self.lookup.name
        self.source = (look if total == m else f"{look}+recycle") if m else ("recycle" if total else "")
        if self.sampling.greedy or not total:
            return chain(seq, total)
        rec.one_hot_q(seq.draft_slots(m))  # the lookup's drafts
        return chain(seq, total, rec.sparse_q(total))

    def propose_tree(self, seq: SeqState, tree, cfg) -> None:
        from edgespec.runtime.tree import TokenTree

        if self._scratch is None or self._scratch.max_nodes < tree.max_nodes:
            self._scratch = TokenTree(tree.max_nodes)
        look = self._scratch
        look.reset(int(tree.tokens[0]), tree.limit)
        self.lookup.propose_tree(seq, look, cfg)
        grow(tree, seq, cfg, self.recycle_table, look, self.calibration.estimate)
        self._tree = tree
        srcs = tree.source[1 : tree.n].tolist()  # (not .all() / .any(): two more numpy paths a step)
        look = self.lookup.name
        self.source = "" if tree.n == 1 else ("recycle" if all(srcs) else look if not any(srcs) else f"{look}+recycle")

    def chain_scores(self) -> list[float]:
        return self.calibration.chain_scores(self.chain_probs, self._n_look, self._scores)

    def chain_verified(self, m: int) -> None:
        self._verified = m

    @property
    def last_size(self) -> int:
        """The last chain's lookup match length (0: the table's drafts alone), as suffix decoding
        reports it: hybrid calibrates each match length apart (--hybrid-lookup merged)."""
        return getattr(self.lookup, "last_size", 0) if self._n_look else 0

    @property
    def last_score(self) -> float:
        """The last chain's expected accepted length by the calibration: the sum of its path scores.
        Sampled, only the drafts whose rows follow from the prefix (the lookup's and the first table
        draft): the later table drafts' scores follow from drawn tokens, and a choice of this chain
        by them would verify a drawn token more often where it leads somewhere confident."""
        scores = self.chain_scores()
        return sum(scores if self.sampling.greedy else scores[: self._n_look + 1])

    def kept_sources(self, n_kept: int) -> list[tuple[int, str]]:
        runs: list[tuple[int, str]] = []
        look, (tree, n_acc) = self.lookup.name, self._kept
        n = min(n_kept, n_acc)
        if tree is None:  # a chain: the lookup's drafts first
            srcs = [0] * min(n, self._n_look) + [1] * max(0, n - self._n_look)
        else:  # the kept path of the tree (read before the next step resets it)
            srcs = tree.source[tree.path[1 : n + 1]].tolist()
        for src in srcs:  # 0: the lookup, 1: the table
            label = "recycle" if src else look
            if runs and runs[-1][1] == label:
                runs[-1] = (runs[-1][0] + 1, label)
            else:
                runs.append((1, label))
        return runs

    def accepted(self, seq: SeqState, n_old: int, n_acc: int) -> None:
        self.lookup.accepted(seq, n_old, n_acc)
        self.recycle.accepted(seq, n_old, n_acc)
        self._kept = (self._tree, n_acc)  # (kept_sources reads it, if anyone asks)
        if self._tree is not None:
            self.calibration.observe_tree(self._tree, n_acc)
            self._tree = None
        if self._verified >= 0:
            self.calibration.observe_chain(self.chain_probs, self._n_look, self._verified, n_acc)
            self._verified = -1


LOOKUPS = ("suffix", "ngram")  # what merged drafts first


class RecyclePlugin(DrafterPlugin):
    name = "recycle"
    order = 2
    aliases = ("token_recycling",)
    summary = (
        "token recycling: the target's own top-8 next tokens from the last time it saw the last 3/2/1 "
        "tokens (every verified row of every call, kept across requests; no model call)"
    )
    trees = True
    draft_cost = 0.01
    redrafts = True
    options = (
        Option(
            "recycle_min_prob",
            float,
            0.0,
            "recycle drafter: stop a chain when its path's stored target probability falls below this (default 0)",
        ),
        Option(
            "recycle_sharpen",
            float,
            SHARPEN,
            "recycle drafter, sampling: draw each draft from its row's stored candidates at the call's "
            f"temperature / this (default {SHARPEN:g}; inf: always the first candidate)",
        ),
        Option(
            "recycle_orders",
            int,
            3,
            f"recycle drafter: the longest context keyed, in tokens (1..{MAX_ORDERS}; default 3)",
        ),
        Option(
            "recycle_every_row",
            str,
            "1234",
            "recycle drafter: the context orders written from every row a verify call checked (rejected "
            "drafts and tree nodes too); the others from committed rows only (default 1234: all)",
        ),
        Option(
            "recycle_bits",
            int,
            16,
            "recycle drafter: 2**bits hashed slots for each of the 2- and 3-token contexts (default 16: "
            "10 MB with a 49k vocabulary)",
        ),
    )

    def build(self, ctx) -> Drafter:
        return RecycleDrafter(shared_table(ctx), ctx.cfg.recycle_min_prob, ctx.cfg.recycle_sharpen)


PLUGIN = register(RecyclePlugin())


class MergedPlugin(DrafterPlugin):
    name = "merged"
    order = 5
    summary = (
        "suffix decoding (or prompt lookup) first, token recycling after: chains continued from the table, "
        "trees of both scored by calibrated acceptance and sized by the width table (--adaptive)"
    )
    trees = True
    draft_cost = 0.04
    redrafts = True
    options = (
        Option(
            "merged_lookup",
            str,
            "suffix",
            "merged drafter: the lookup drafted first, suffix (default) or ngram (prompt lookup)",
            choices=LOOKUPS,
        ),
    )

    def build(self, ctx) -> Drafter:
        from edgespec.runtime.drafters.ngram import NgramDrafter, ngram_config
        from edgespec.runtime.drafters.suffix import SuffixDrafter, recent_requests

        c = ctx.cfg
        lookup = NgramDrafter(ngram_config(c)) if c.merged_lookup == "ngram" else SuffixDrafter(recent_requests(ctx))
        return MergedDrafter(lookup, RecycleDrafter(shared_table(ctx), c.recycle_min_prob, c.recycle_sharpen))


MERGED = register(MergedPlugin())
