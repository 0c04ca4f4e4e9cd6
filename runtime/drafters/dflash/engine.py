"""ONNX Runtime engine of a DFlash drafter: one call drafts a block from the target's features.

Its cache holds the context K/V of every drafter layer for positions 0..ctx_len-1, made from the
target's features of VERIFIED tokens only, so nothing is ever rolled back: `draft` appends the
rows it is given and commits them at once. A call binds the cache window S (a bucket multiple
>= ctx_len) and the C-row context buffer of the smallest width that holds the new rows; the
host writes the attention bias (which keys each block row sees), so the graph computes no shapes.
All buffers are allocated at load; nothing is allocated per call. The cache lives on the host
(with a GPU provider ONNX Runtime copies the bound window in: a drafter's cache is small).
"""

from __future__ import annotations

import numpy as np
import onnxruntime as ort

from edgespec.engines import session as es
from edgespec.engines.base import EngineError, pick_width
from edgespec.engines.manifest import Manifest

NEG = -1e30  # bias of a key a block row must not see (the graph adds it before the softmax)


class OrtDFlash:
    """The DFlash block drafter of an engine folder (engines.base.BlockDrafter)."""

    def __init__(self, manifest: Manifest, section, provider: str = "cpu", threads: int | None = None) -> None:
        """section: the folder's DFlash section (its model spec and block settings)."""
        es.check_provider(provider)
        spec = section.model
        self.manifest, self.spec, self.provider = manifest, spec, provider
        self.block_size = section.block_size  # b: anchor + b-1 drafts
        self.mask_token_id = section.mask_token_id
        self.max_len, self.bucket = manifest.max_len, manifest.kv_bucket
        self.widths = tuple(spec.widths())  # context rows per call C
        self.vocab_size = spec.vocab_size  # draft vocabulary Vd
        self.d2t = es.read_d2t(manifest, spec)
        self.n_layers, kv_w = spec.n_layers, spec.kv_width
        dtype = np.dtype(spec.kv_dtype)
        n_feat = self.feature_width = section.feature_width  # n*H: the target's hidden_aux width
        b = self.block_size
        self.kv = np.zeros((self.n_layers, 2, self.max_len, kv_w), dtype)  # [Ld, 2, S_max, Hkv*D]
        self._ids = np.zeros((1, b), np.int64)
        self._aux = {c: np.zeros((1, c, n_feat), dtype) for c in self.widths}
        self._pos = {c: np.zeros((1, c + b), np.int64) for c in self.widths}
        self._bias: dict[tuple[int, int], np.ndarray] = {}  # (C, S) -> [b, S + C + b]
        self._logits = np.zeros((1, b - 1, self.vocab_size), np.float32)
        self._new_kv = {c: np.zeros((self.n_layers, 2, c, kv_w), dtype) for c in self.widths}
        self._max_pos = section.max_position - 1  # rows past the rope table reuse its last row
        self._ar = np.arange(self.max_len + self.widths[-1] + b)  # positions, sliced per call (no allocation)
        self._session: ort.InferenceSession | None = None
        self._bindings: dict[tuple[int, int], ort.IOBinding] = {}
        self.n_calls = 0  # calls so far (stats)
        self._session_options, self._initializers = es.session_options(manifest, spec, threads)

    def load(self) -> None:
        """Create the session and run each width once (a first real call pays for nothing)."""
        for c in self.widths:
            self.draft(self._aux[c][0, :c], 0, 0)

    def _window(self, ctx_len: int) -> int:
        return min(self.max_len, max(self.bucket, -(-ctx_len // self.bucket) * self.bucket))

    def _binding(self, c: int, s: int) -> ort.IOBinding:
        key = (c, s)
        if key not in self._bindings:
            if self._session is None:
                self._session = es.new_session(
                    self.manifest.path(self.spec.graph.file), self._session_options, self.provider
                )
            self._bias[key] = np.zeros((self.block_size, s + c + self.block_size), self.kv.dtype)
            bind = self._session.io_binding()
            inputs = [
                ("block_ids", self._ids),
                ("ctx_aux", self._aux[c]),
                ("positions", self._pos[c]),
                ("attn_bias", self._bias[key]),
            ]
            for layer in range(self.n_layers):
                inputs += [(f"past_key_{layer}", self.kv[layer, 0, :s]), (f"past_value_{layer}", self.kv[layer, 1, :s])]
            for name, arr in inputs:
                bind.bind_input(name, "cpu", 0, arr.dtype, arr.shape, arr.ctypes.data)
            for name, arr in (("logits", self._logits), ("new_kv", self._new_kv[c])):
                bind.bind_output(name, "cpu", 0, arr.dtype, arr.shape, arr.ctypes.data)
            self._bindings[key] = bind
        return self._bindings[key]

    def draft(self, feats: np.ndarray, ctx_len: int, anchor: int) -> np.ndarray:
        """feats [n, n*H]: the target's features of positions ctx_len..ctx_len+n-1 (verified);
        anchor: the token at position ctx_len + n (verified, not yet through the target). Appends
        the features to the context (in calls of the widest width, then one that holds the rest)
        and returns the logits [b-1, Vd] drafting positions ctx_len+n+1 .. (a view, valid until
        the next call)."""
        n = len(feats)
        widest = self.widths[-1]
        while n > widest:  # a prefill: whole chunks first (their block rows are not read)
            self._call(feats[:widest], ctx_len, anchor)
            feats, ctx_len, n = feats[widest:], ctx_len + widest, n - widest
        return self._call(feats, ctx_len, anchor)

    def _call(self, feats: np.ndarray, ctx_len: int, anchor: int) -> np.ndarray:
        n, b = len(feats), self.block_size
        if ctx_len + n + b > self.max_len + b:
            raise EngineError(f"DFlash context {ctx_len + n} past the cache ({self.max_len} slots)")
        c = pick_width(self.widths, max(n, 1))
        s = self._window(ctx_len)
        bind = self._binding(c, s)
        aux, pos, bias = self._aux[c], self._pos[c], self._bias[(c, s)]
        aux[0, :n] = feats
        aux[0, n:] = 0  # padding rows: no key of theirs is seen
        np.minimum(self._ar[ctx_len : ctx_len + c], self._max_pos, out=pos[0, :c])  # context rows
        np.minimum(self._ar[ctx_len + n : ctx_len + n + b], self._max_pos, out=pos[0, c:])  # block rows
        self._ids[0, 0] = anchor
        self._ids[0, 1:] = self.mask_token_id
        # keys: cached slots [0, s) (real below ctx_len), new context rows [s, s+c) (real below
        # s+n), block rows [s+c, s+c+b) (all seen: the block is non-causal)
        bias[:, :ctx_len] = 0
        bias[:, ctx_len:s] = NEG
        bias[:, s : s + n] = 0
        bias[:, s + n : s + c] = NEG
        bias[:, s + c :] = 0
        self._session.run_with_iobinding(bind)
        self.kv[:, :, ctx_len : ctx_len + n] = self._new_kv[c][:, :, :n]  # verified rows: kept at once
        self.n_calls += 1
        return self._logits[0]
