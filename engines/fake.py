"""A table-driven fake model for fast loop tests: next-token logits from the last two tokens.

logits(row) = table[prev_token] + mix * table2[token], deterministic and cheap, with the same
forward/commit contract (and rollback semantics) as a real engine. Its "KV cache" stores the token
of every committed row, so a test can check that only accepted rows were ever committed.
"""

from __future__ import annotations

import numpy as np

from edgespec.engines.base import EngineError, pick_width


class FakeModel:
    def __init__(
        self,
        table: np.ndarray,
        max_len: int = 512,
        widths=tuple(range(1, 10)) + (16,),
        mix: float = 0.5,
        seed_table2: int = 1,
        top_k: int = 8,
    ) -> None:
        self.vocab_size = table.shape[0]
        self.table = table.astype(np.float32)  # [V, V]: logits of the next token given the token
        rng = np.random.default_rng(seed_table2)
        self.table2 = (rng.standard_normal(table.shape) * mix).astype(np.float32)
        self.max_len = max_len
        self.widths = tuple(sorted(widths))
        self.kv = np.full(max_len, -1, np.int64)  # committed token per row
        self._new = np.zeros(max(self.widths), np.int64)
        self._logits = np.zeros((max(self.widths), self.vocab_size), np.float32)
        self.n_calls = 0
        self.hidden_size = self.vocab_size  # "hidden state" of a row = its logits (for a fake head)
        self.takes_tree = True
        self.has_hidden = True
        # each row's top-k next tokens and their probabilities (last_topk), as a real graph outputs them
        self.top_k = min(top_k, self.vocab_size)
        self._topk_ids = np.zeros((max(self.widths), max(self.top_k, 1)), np.int64)
        self._topk_probs = np.zeros((max(self.widths), max(self.top_k, 1)), np.float32)
        self._argmax = np.zeros(max(self.widths), np.int64)  # argmax_rows without a top-k output
        self.manifest = self.spec = None  # no folder
        self.closed = False

    def load_widths(self, widths) -> None:
        pass

    def last_hidden(self, n: int) -> np.ndarray:
        return self._logits[:n]

    def last_hidden_aux(self, n: int) -> np.ndarray:
        raise EngineError("a fake model has no aux features (hidden_aux)")

    def width_for(self, n_tokens: int) -> int:
        return pick_width(self.widths, n_tokens)

    def forward(
        self, token_ids: np.ndarray, past_len: int, parents: np.ndarray | None = None, logits: bool = True
    ) -> np.ndarray | None:
        """parents: a token tree (row i follows row parents[i]; -1: the committed context). logits=False:
        None, as a GPU engine that leaves them on the device (argmax_rows / last_topk read the rows)."""
        n = len(token_ids)
        assert past_len + n <= self.max_len, "context overflow"
        self.n_calls += 1
        for i, tok in enumerate(token_ids):
            par = (i - 1) if parents is None else parents[i]
            prev = token_ids[par] if par >= 0 else (self.kv[past_len - 1] if past_len > 0 else 0)
            assert prev >= 0, "attended to a row that was never committed"
            self._logits[i] = self.table[tok] + self.table2[prev]
        if self.top_k:
            rows = self._logits[:n]
            ids = np.argsort(-rows, axis=-1, kind="stable")[:, : self.top_k]
            p = np.exp(rows - rows.max(axis=-1, keepdims=True))
            p /= p.sum(axis=-1, keepdims=True)
            self._topk_ids[:n] = ids
            self._topk_probs[:n] = np.take_along_axis(p, ids, axis=-1)
        self._new[:n] = token_ids
        return self._logits[:n] if logits else None

    def argmax_rows(self, n: int) -> np.ndarray:
        """Each of the last forward's first n rows' argmax [n]: the top-k output's first ids (the first
        maximum: a stable sort), or the logits' argmax without one."""
        if self.top_k:
            return self._topk_ids[:n, 0]
        return np.argmax(self._logits[:n], axis=-1, out=self._argmax[:n])

    def close(self) -> None:
        self.closed = True

    def last_topk(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        """(ids [n, top_k], probabilities [n, top_k]) of the last forward's rows, best first."""
        return self._topk_ids[:n], self._topk_probs[:n]

    def commit(self, past_len: int, n_rows: int, rows: np.ndarray | None = None) -> None:
        if rows is None:
            self.kv[past_len : past_len + n_rows] = self._new[:n_rows]
        else:
            self.kv[past_len : past_len + n_rows] = self._new[rows[:n_rows]]


def random_table(vocab: int, seed: int = 0, sharpness: float = 3.0) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal((vocab, vocab)) * sharpness).astype(np.float32)


class FakeEagleHead:
    """A fake EAGLE head over a reduced draft vocabulary: its logits mix the fed feature (the
    target's logits, or its own guess) with a token table; its "predicted feature" is a
    table row. Enough to exercise the eagle drafter's bookkeeping and its real q."""

    def __init__(
        self, vocab: int, d2t: np.ndarray, max_len: int = 512, widths=tuple(range(1, 10)) + (16,), seed: int = 5
    ) -> None:
        rng = np.random.default_rng(seed)
        self.d2t = np.asarray(d2t, np.int64)
        self.vocab_size, self.hidden_size = len(self.d2t), vocab
        self.max_len, self.widths = max_len, tuple(sorted(widths))
        self.tok_table = rng.standard_normal((vocab, len(self.d2t))).astype(np.float32)
        self.feat_table = rng.standard_normal((vocab, vocab)).astype(np.float32) * 2
        self._logits = np.zeros((max(self.widths), len(self.d2t)), np.float32)
        self._hidden = np.zeros((max(self.widths), vocab), np.float32)
        self.n_calls = 0
        self.takes_tree = True
        self.fc_t = None  # no input projection: features are fed as they are

    def load_widths(self, widths) -> None:
        pass

    def width_for(self, n_tokens: int) -> int:
        return pick_width(self.widths, n_tokens)

    def forward(self, token_ids: np.ndarray, past_len: int, features=None, parents=None) -> np.ndarray:
        n = len(token_ids)
        assert features is not None and len(features) == n and past_len + n <= self.max_len
        self.n_calls += 1
        for i, tok in enumerate(token_ids):
            self._logits[i] = 0.7 * features[i][self.d2t] + self.tok_table[tok]
            self._hidden[i] = self.feat_table[tok]
        return self._logits[:n]

    def commit(self, past_len: int, n_rows: int, rows: np.ndarray | None = None) -> None:
        pass

    def last_hidden(self, n: int) -> np.ndarray:
        return self._hidden[:n]


class FakeHeads:
    """Fake multi-token heads over a reduced draft vocabulary: head i's logits mix the fed feature
    (the target's logits at the last verified position) with a row of its own. Enough to exercise
    the heads drafter's bookkeeping and its real q."""

    def __init__(self, vocab: int, d2t: np.ndarray, n_heads: int = 3, seed: int = 6) -> None:
        rng = np.random.default_rng(seed)
        self.d2t = np.asarray(d2t, np.int64)
        self.n_heads, self.hidden_size, self.vocab_size = n_heads, vocab, len(self.d2t)
        self.bias = rng.standard_normal((n_heads, len(self.d2t))).astype(np.float32)
        self._logits = np.zeros((n_heads, len(self.d2t)), np.float32)
        self.n_calls = 0

    def load(self) -> None:
        pass

    def forward(self, feature: np.ndarray) -> np.ndarray:
        self.n_calls += 1
        self._logits[:] = 0.8 * feature[self.d2t] + self.bias
        return self._logits
