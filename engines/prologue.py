"""The per-call masks and slot indices of a graph exported with --host-prologue, built on the host.

The lean graph's prologue (export/target/graph/lean_prologue.py) derives, once per call, what every
layer's attention shares: which cached slots a row sees, which new tokens are its ancestors, the
score column each new key goes to, where the new values sit in the window. Computed inside the
graph it needs Shape, Range, CumSum and friends, which ONNX Runtime places on the CPU, so a CUDA
graph cannot capture the call. The engine knows every number involved (past_len, the positions,
the tree), so a --host-prologue graph reads them as inputs and this module writes them: the same
integers and the same 0 / -1e9 masks, so the logits are bitwise those of the in-graph prologue.

Buffers are made once per width, sized for the widest window; a (width, window) pair views their
first elements, so its tensors always sit at the same addresses (what a captured graph replays on).
Filling a call writes in place: no allocation per token.
"""

from __future__ import annotations

import numpy as np

from edgespec.engines.base import EngineError
from edgespec.engines.manifest import GraphSpec

NEG = -1e9  # a masked score (the lean graph's ninf_f): exp(NEG - max) is exactly 0 in float32
# inputs a --host-prologue graph takes (lean_prologue.host_prologue_inputs): their presence marks the folder
HOST_INPUTS = (
    "mask_past",
    "mask_new",
    "score_cols",
    "mask_past_local",
    "mask_new_local",
    "to_node",
    "value_slots",
    "two_rows_pads",
    "n_rows",
)


def takes_host_prologue(graph: GraphSpec) -> bool:
    """Was this graph exported with --host-prologue (its manifest declares the prologue's inputs)?"""
    return "mask_past" in graph.input_names()


def host_window_slots(past_len: int, width: int, bucket: int) -> int:
    """Cache window of a --host-prologue call: the bucket multiple that holds all `width` new rows,
    padding rows included (the graph has no Slice to drop rows past the window's end)."""
    return -(-(past_len + width) // bucket) * bucket


def cache_slots(max_len: int, widths, bucket: int) -> int:
    """KV slots a --host-prologue engine allocates: every window host_window_slots can ask for
    (past_len <= max_len - 1, so past_len + width rounds up to at most max_len + a bucketed widest width)."""
    return max_len + -(-max(widths) // bucket) * bucket


class HostPrologue:
    """The prologue tensors of one model's calls: per width, buffers for the widest window; per call,
    `fill` writes them for (width, window, past_len, positions, ancestors) and `views` gives the
    arrays a binding reads."""

    def __init__(self, graph: GraphSpec, widths, max_window: int, sliding_window: int | None = None) -> None:
        specs = {t.name: t for t in graph.inputs}
        if "mask_past_local" in specs and not sliding_window:
            raise EngineError(
                f"{graph.file} takes the sliding layers' masks but the manifest gives no sliding_window; "
                "Hint: re-export the folder with this edgespec"
            )
        self.window = sliding_window if "mask_past_local" in specs else None  # the sliding layers' key window
        self.n_heads = int(specs["mask_new"].shape[1])  # query heads Hq: rows t*Hq + h
        self.trees = "to_node" in specs
        self.max_window = max_window
        self._specs = {n: specs[n] for n in HOST_INPUTS if n in specs}
        self._flat = {
            w: {n: np.zeros(int(np.prod(t.shape_at(w, max_window))), np.dtype(t.dtype)) for n, t in self._specs.items()}
            for w in widths
        }
        for w in widths:
            if "two_rows_pads" in self._specs:  # fixed per width: max(T, 2) rows through the int4 matmuls
                self._flat[w]["two_rows_pads"][4] = max(2 - w, 0)
                self._flat[w]["n_rows"][0] = w
        self._slot = np.arange(max_window, dtype=np.int64)  # slot index j (to_node's identity, value slots)
        self._views: dict[tuple[int, int], dict[str, np.ndarray]] = {}
        # per-width scratch [w, w]: ancestors, ancestors before each column, cols, the new keys' mask
        self._anc = {w: np.zeros((w, w), bool) for w in widths}
        self._before = {w: np.zeros((w, w), np.int64) for w in widths}
        self._cols = {w: np.zeros((w, w), np.int64) for w in widths}
        dtype = np.dtype(self._specs["mask_new"].dtype)
        self._mask = {w: np.zeros((w, w), dtype) for w in widths}
        self._neg = dtype.type(NEG)
        if self.window:  # per-width scratch of the sliding layers' masks: first visible position, seen slots
            self._first = {w: np.zeros(w, np.int64) for w in widths}
            self._seen_past = {w: np.zeros((w, max_window), bool) for w in widths}
            self._seen_new = {w: np.zeros((w, w), bool) for w in widths}

    def views(self, width: int, window: int) -> dict[str, np.ndarray]:
        """name -> the array a (width, window) call binds (views of the width's buffers, made once)."""
        key = (width, window)
        if key not in self._views:
            if window > self.max_window:
                raise EngineError(f"window {window} is past the {self.max_window} slots the prologue was sized for")
            self._views[key] = {
                n: self._flat[width][n][: int(np.prod(t.shape_at(width, window)))].reshape(t.shape_at(width, window))
                for n, t in self._specs.items()
            }
        return self._views[key]

    def fill(self, width: int, window: int, past_len: int, pos: np.ndarray, tree: np.ndarray) -> dict[str, np.ndarray]:
        """Write a call's prologue: pos [width] its positions, tree [width, width] (nonzero where the
        column node is the row node or an ancestor; a chain is lower-triangular). Needs
        window >= past_len + width. Returns views(width, window)."""
        assert past_len + width <= window, (past_len, width, window)
        v = self.views(width, window)
        anc, before, cols, mask = self._anc[width], self._before[width], self._cols[width], self._mask[width]
        mask_past = v["mask_past"][0]  # cached slots j < past_len are seen
        mask_past[:past_len] = 0
        mask_past[past_len:] = self._neg
        np.not_equal(tree, 0, out=anc)
        mask.fill(self._neg)
        np.copyto(mask, 0, where=anc)
        np.copyto(v["mask_new"], mask[:, None, :])  # row t*Hq + h = row t
        # an ancestor c of row r scores at column pos[c] (where a chain has it); any other node at
        # pos[r] + 1 + its rank among r's non-ancestors (pos[r] + c + 1 - ancestors before c)
        np.cumsum(anc, axis=1, out=before)
        np.subtract(before, anc, out=before)  # exclusive count
        np.add(pos[:, None], self._slot[1 : width + 1], out=cols)
        np.subtract(cols, before, out=cols)
        np.copyto(cols, pos[None, :], where=anc)
        np.minimum(cols, window - 1, out=cols)
        np.copyto(v["score_cols"], cols[:, None, :])
        if self.window:  # sliding layers: a key at position j is seen from position p only if p - j < window
            first = self._first[width]
            np.subtract(pos, self.window - 1, out=first)
            seen = self._seen_past[width][:, :window]
            np.greater_equal(self._slot[None, :window], first[:, None], out=seen)
            seen[:, past_len:] = False  # cached slots only
            local = v["mask_past_local"]
            local.fill(self._neg)
            np.copyto(local, 0, where=seen[:, None, :])
            seen_new = self._seen_new[width]
            np.greater_equal(pos[None, :], first[:, None], out=seen_new)
            np.logical_and(seen_new, anc, out=seen_new)
            mask.fill(self._neg)
            np.copyto(mask, 0, where=seen_new)
            np.copyto(v["mask_new_local"], mask[:, None, :])
        if self.trees:  # probability column of each slot: cols on the new slots, the identity elsewhere
            to_node = v["to_node"]
            np.copyto(to_node, self._slot[:window])
            np.copyto(to_node[:, :, past_len : past_len + width], cols[:, None, :])
        np.add(self._slot[:width], past_len, out=v["value_slots"][0, :, 0])
        return v
