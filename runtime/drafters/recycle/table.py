"""The recycle table (runtime/drafters/recycle/__init__.py says what it drafts): per context of the
last 1 .. `orders` tokens, the target's latest top-k next tokens and their probabilities, and its file.

Layout: order 1 is a dense [V, k] table keyed by the token; orders 2 .. `orders` are direct-mapped hash
tables of 2**bits slots each (Fibonacci hashing of the context's key, the key kept in its slot, so a
collision is a miss, never a wrong row). Each order is written either from every row a verify call
checked or from its committed rows only (`every_row`).

Cost: an update works out its T rows' contexts, keys and slots on Python ints and writes them with
three numpy assignments (with the caches cold after the model call each numpy call costs
microseconds, more than the arithmetic; no row of the 49k vocabulary is ever scanned); drafting
reads one table row per node.
Memory: (V + (orders - 1) * 2**bits) rows of 8 int32 ids, 8 float16 probabilities and one int64 key,
56 bytes each: 10.1 MB for a 49,152-token vocabulary at orders = 3, bits = 16 (`RecycleTable.nbytes`).

File: an .npz of the three arrays and the settings (vocab, bits, orders), written whole (a temporary
renamed over the old one) and read back checked (`_read_checked`): another setting's table or a
damaged file is one warning and an empty table, never an error at each step.

A folder exported before its target graph had the top-k output still runs: the table then keeps
each row's argmax only (read off the logits in numpy: one 49k-wide scan per row, the slow path the
graph output exists to avoid), with probability 1 (`rows_of`).
"""

from __future__ import annotations

import os
import stat
import warnings
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from edgespec.runtime.files import set_aside, write_atomic

TOP_K = 8  # candidates kept per context (the graphs' top-k output: export/target/graph/writer.py TOP_K)
MAX_ORDERS = 4  # longest context that may be keyed (tokens): 4 keys fit int64 for vocabularies < 55,109
MULT = 0x9E3779B97F4A7C15  # Fibonacci hashing: key * MULT mod 2**64, its top bits are the slot
M64 = (1 << 64) - 1


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
        back = self._contexts(tokens, before, toks, parents)
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

    def _contexts(self, tokens: np.ndarray, before: int, toks: list, parents: np.ndarray | None) -> list:
        """Each node's context, the orders - 1 tokens before it (oldest first, -1 before position 0),
        for the nodes toks whose root follows tokens[:before] (parents: a tree; None: a chain)."""
        n, O = len(toks), self.orders
        lo = before - (O - 1)  # the root's context: tokens[lo:before], -1 before position 0
        ctx = [-1] * -lo + tokens[:before].tolist() if lo < 0 else tokens[lo:before].tolist()
        if parents is None:  # a chain: each node's context is the O - 1 tokens before it
            line = ctx + toks
            return [line[i : i + O - 1] for i in range(n)]
        par = parents.tolist()  # a tree: a node's context is its parent's, shifted by the parent's token
        back = [ctx]
        for i in range(1, n):
            p = par[i]
            back.append((back[p] + [toks[p]])[1:])
        return back

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
        if engine.top_k:
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
