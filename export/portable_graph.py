"""The portable flavour of the decoder graphs: standard ONNX ops only (opset 17), which TensorRT
parses; what every folder had before the lean flavour (lean_graph.py), and what fp16 folders get.

Per layer: RMSNorm as Pow / ReduceMean / Add / Sqrt / Div / Mul (ORT fuses it at load), rotary as
Split / Neg / Concat / Mul / Mul / Add on cos/sin rows gathered once per call, and attention over
the sequence-major cache by block-diagonal 2-D Gemms (`_attention`), with the per-call masks and
slot placements built in `_prologue`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
from onnx import TensorProto

if TYPE_CHECKING:
    from edgespec.export.graph import _Builder

NEG_INF = {"float32": -1e9, "float16": -3e4}  # additive mask: finite, so no row can turn NaN


class PortableLayers:
    """Mixin of graph.LlamaGraphWriter: the portable norm, rotary, attention, prologue and layer.
    Uses the writer's arch, opts, dtype and _matmul."""

    def _rms_norm(self, b: _Builder, x: str, weight: str, name: str, eps_name: str, axes: str | None = None) -> str:
        # y = x / sqrt(mean(x^2) + eps) * w  (the pattern ORT fuses into SimplifiedLayerNormalization)
        # axes: an input naming the reduced axis (opset >= 18); None: the opset-17 attribute
        sq = b.op("Pow", [x, "two"], name + "/Pow")
        if axes:
            mean = b.op("ReduceMean", [sq, axes], name + "/ReduceMean", keepdims=1)
        else:
            mean = b.op("ReduceMean", [sq], name + "/ReduceMean", axes=[-1], keepdims=1)
        var = b.op("Add", [mean, eps_name], name + "/Add")
        std = b.op("Sqrt", [var], name + "/Sqrt")
        normed = b.op("Div", [x, std], name + "/Div")
        return b.op("Mul", [normed, b.weight(weight)], name + "/Mul")

    def _rope(self, b: _Builder, x: str, cos: str, sin: str, name: str) -> str:
        # HF rotate_half convention: x*cos + [-x2, x1]*sin, x: [T, heads, D], cos/sin: [T, 1, D]
        x1, x2 = b.op("Split", [x, "rope_split"], name + "/Split", n_out=2, axis=-1)
        neg = b.op("Neg", [x2], name + "/Neg")
        rot = b.op("Concat", [neg, x1], name + "/Concat", axis=-1)
        return b.op("Add", [b.op("Mul", [x, cos], name + "/MulCos"),
                            b.op("Mul", [rot, sin], name + "/MulSin")], name + "/Add")

    def _attention(self, b: _Builder, i: int, x: str, cos: str, sin: str, mask: str, slots: dict):
        """GQA attention over the cache window [S, Hkv*D] with the T new rows in place; returns
        (out, new_k, new_v).

        The new rows are placed at their absolute slots past_len..past_len+T-1 (score columns
        for K, a copy of the value window for V), so every key sits at the same place of every
        reduction whatever T is: a token's numbers are bitwise the same in a decode, verify or prefill call (the
        batch-invariance that keeps greedy speculative output identical to plain decoding).
        Heads are folded into single 2-D Gemms so the sequence-major cache is read as is:
          Qbd [Hq*T, Hkv*D]: query (h, t) placed in the columns of its kv head g(h), zeros elsewhere
          scores = Qbd . K^T * scale, new columns placed -> [Hq*T, S]   (Gemm transB=1, alpha)
          ctx    = softmax(scores + mask) . V_full -> [Hq*T, Hkv*D], keep the g(h) block per row
        The zero blocks cost Hkv-fold attention FLOPs, negligible at small T next to reading the
        cache once.
        """
        a = self.arch
        n_q, n_kv, d = a.n_heads, a.n_kv_heads, a.head_dim
        p = f"/layers.{i}/attn"
        qkv = self._matmul(b, x, f"l{i}.qkv", a.hidden_size, (n_q + 2 * n_kv) * d)
        if "two_rows" in slots:  # the attention itself runs on the T real rows
            qkv = b.op("Slice", [qkv, "zero_1", slots["t_len"], "zero_1"], p + "/qkv_rows")
        if a.qkv_bias:
            qkv = b.op("Add", [qkv, b.weight(f"l{i}.qkv_b")], p + "/qkv_bias")
        q, k, v = b.op("Split", [qkv, b.const(f"qkv_split_{i}", np.array([n_q * d, n_kv * d, n_kv * d],
                                                                          np.int64))],
                       p + "/Split", n_out=3, axis=-1)
        q = b.op("Reshape", [q, "shape_q"], p + "/q_heads")  # [T, Hq, D]
        k = b.op("Reshape", [k, "shape_kv"], p + "/k_heads")  # [T, Hkv, D]
        if a.qk_norm:
            q = self._rms_norm(b, q, f"l{i}.q_norm", p + "/q_norm", "eps")
            k = self._rms_norm(b, k, f"l{i}.k_norm", p + "/k_norm", "eps")
        q = self._rope(b, q, cos, sin, p + "/q_rope")
        k = self._rope(b, k, cos, sin, p + "/k_rope")
        new_k = b.op("Reshape", [k, "shape_rows"], p + "/new_k")  # [T, Hkv*D]
        new_v = v  # [T, Hkv*D]
        # V_full[j] = new_v[j - past_len] for the T new slots, past_value[j] elsewhere: [S, Hkv*D]
        v_full = b.op("Where", [slots["is_new"], b.op("Pad", [new_v, slots["pad_rows"]], p + "/v_place"),
                                f"past_value_{i}"], p + "/v_full")
        # Block-diagonal queries: [Hq, T, 1, D] * head_mask[Hq, 1, Hkv, 1] -> [Hq*T, Hkv*D]
        qt = b.op("Transpose", [q], p + "/q_T", perm=[1, 0, 2])
        qt = b.op("Unsqueeze", [qt, "axis2"], p + "/q_unsq")
        qbd = b.op("Reshape", [b.op("Mul", [qt, "head_mask"], p + "/q_blocks"), "shape_qbd"], p + "/qbd")
        scale = 1.0 / float(np.sqrt(d))
        # scores over the window, the new keys' columns placed at their slots (each dot product is
        # the same bits whichever Gemm computes it, so K needs no placed copy; V does, below)
        s_past = b.op("Gemm", [qbd, f"past_key_{i}"], p + "/scores_past", transB=1, alpha=scale)  # [Hq*T, S]
        s_new = b.op("Gemm", [qbd, new_k], p + "/scores_new", transB=1, alpha=scale)  # [Hq*T, T]
        if "anc_cols" in slots:  # token trees: row r's ancestors' scores moved to the columns a chain
            # would have them at (past_len + depth): its softmax row is the chain's bit for bit
            s_new = b.op("GatherElements", [s_new, slots["anc_cols"]], p + "/s_depth", axis=1)
        scores = b.op("Where", [slots["is_new_row"], b.op("Pad", [s_new, slots["pad_cols"]], p + "/s_place"),
                                s_past], p + "/scores")
        probs = b.op("Softmax", [b.op("Add", [scores, mask], p + "/masked")], p + "/Softmax", axis=-1)
        if "to_node" in slots:  # ... and the probabilities back to the slots the new values sit at
            # (node order), exact zeros for non-ancestors: the same non-zero terms in the same order
            probs = b.op("GatherElements", [probs, slots["to_node"]], p + "/p_node", axis=1)
        ctx = b.op("Gemm", [probs, v_full], p + "/ctx")  # [Hq*T, Hkv*D]
        # keep each query head's own kv block: [Hq, T, Hkv, D] * head_mask, summed over Hkv
        ctx = b.op("Reshape", [ctx, "shape_ctx4"], p + "/ctx4")
        ctx = b.op("ReduceSum", [b.op("Mul", [ctx, "head_mask"], p + "/ctx_blocks"), "axis2"],
                   p + "/ctx_sum", keepdims=0)  # [Hq, T, D]
        ctx = b.op("Reshape", [b.op("Transpose", [ctx], p + "/ctx_T", perm=[1, 0, 2]), "shape_hidden_q"],
                   p + "/ctx_flat")  # [T, Hq*D]
        if "two_rows" in slots:
            ctx = b.op("Pad", [ctx, slots["two_rows"]], p + "/ctx_rows")
        out = self._matmul(b, ctx, f"l{i}.o", n_q * d, a.hidden_size)
        return out, new_k, new_v

    # ---- graph ---------------------------------------------------------------------------------
    def _prologue(self, b: _Builder) -> tuple[dict, str, str, str]:
        """Constants, the [Hq*T, S] causal mask, the new-slot placement and rope rows of the
        positions; returns (slots, mask, cos, sin)."""
        a = self.arch
        f = self.dtype
        n_q, n_kv, d = a.n_heads, a.n_kv_heads, a.head_dim
        kv_w = n_kv * d
        # constants
        b.const("two", np.array(2.0, f))
        b.const("eps", np.array(a.rms_norm_eps, f))
        b.const("axis0", np.array([0], np.int64))
        b.const("axis2", np.array([2], np.int64))
        b.const("rope_split", np.array([d // 2, d // 2], np.int64))
        b.const("shape_q", np.array([-1, n_q, d], np.int64))
        b.const("shape_kv", np.array([-1, n_kv, d], np.int64))
        b.const("shape_rows", np.array([-1, kv_w], np.int64))
        b.const("shape_qbd", np.array([-1, kv_w], np.int64))
        b.const("shape_ctx4", np.array([n_q, -1, n_kv, d], np.int64))
        b.const("shape_hidden_q", np.array([-1, n_q * d], np.int64))
        head_mask = np.zeros((n_q, 1, n_kv, 1), f)
        for h in range(n_q):
            head_mask[h, 0, h // (n_q // n_kv), 0] = 1
        b.const("head_mask", head_mask)
        b.const("axis1", np.array([1], np.int64))
        b.const("zero_i", np.array(0, np.int64))
        b.const("one_i", np.array(1, np.int64))
        # T from the input; slot j of the window [S] is visible to new row t iff j <= positions[t]
        # (a chain: positions[t] = past_len + t; a tree: past_len + depth(t), columns in depth order)
        t_len = b.op("Gather", [b.op("Shape", ["input_ids"], "/T/shape"), "axis1"], "/T/T")  # [1]
        s_len = b.op("Gather", [b.op("Shape", ["past_key_0"], "/mask/shape"), "axis0"], "/mask/S")
        j_idx = b.op("Range", ["zero_i", b.op("Squeeze", [s_len], "/mask/S_scalar"), "one_i"], "/mask/slots")
        pos_flat = b.op("Reshape", ["positions", b.const("shape_T", np.array([-1], np.int64))], "/pos_flat")
        last_visible = b.op("Unsqueeze", [pos_flat, "axis1"], "/mask/last")  # [T, 1]
        hidden_slot = b.op("Greater", [b.op("Unsqueeze", [j_idx, "axis0"], "/mask/j_row"), last_visible],
                           "/mask/hidden")  # [T, S]
        bias = b.op("Where", [hidden_slot, b.const("ninf_f", np.array(NEG_INF[f.name], f)),
                              b.const("zero_f", np.array(0.0, f))], "/mask/bias")
        mask = b.op("Tile", [bias, b.const("tile_heads", np.array([n_q, 1], np.int64))],
                    "/mask/rows")  # [Hq*T, S], row = h*T + t
        # the new rows' slots: row index j - past_len, valid for past_len <= j < past_len + T
        rel = b.op("Sub", [j_idx, "past_len"], "/slots/rel")  # [S]
        is_new = b.op("And", [b.op("GreaterOrEqual", [rel, "zero_i"], "/slots/ge"),
                              b.op("Less", [rel, t_len], "/slots/lt")], "/slots/is_new")
        # the T new rows padded out to the window: past_len before, S - past_len - T after
        after = b.op("Sub", [b.op("Sub", [s_len, "past_len"], "/slots/rest"), t_len], "/slots/after")  # [1]
        zero1 = b.const("zero_1", np.array([0], np.int64))
        pad_rows = b.op("Concat", ["past_len", zero1, after, zero1], "/slots/pad_rows", axis=0)  # for [T, W]
        pad_cols = b.op("Concat", [zero1, "past_len", zero1, after], "/slots/pad_cols", axis=0)  # for [Hq*T, T]
        slots = {"is_new": b.op("Unsqueeze", [is_new, "axis1"], "/slots/is_new_col"),  # [S, 1]
                 "is_new_row": b.op("Unsqueeze", [is_new, "axis0"], "/slots/is_new_row"),  # [1, S]
                 "pad_rows": pad_rows, "pad_cols": pad_cols, "t_len": t_len}
        if self.opts.two_row_matmuls and self.opts.precision == "int4":
            # rows added below a [T, W] activation so that MatMulNBits sees max(T, 2) rows: [0, 0, max(2-T, 0), 0]
            extra = b.op("Max", [b.op("Sub", [b.const("two_1", np.array([2], np.int64)), t_len], "/two_rows/sub"),
                                 zero1], "/two_rows/extra")
            slots["two_rows"] = b.op("Concat", [zero1, zero1, extra, zero1], "/two_rows/pads", axis=0)
        if self.opts.trees:
            slots |= self._tree_gathers(b, pos_flat, j_idx, slots["is_new_row"], pad_cols, n_q)
        pos = pos_flat
        cos = b.op("Unsqueeze", [b.op("Gather", [b.weight("rope_cos"), pos], "/rope/cos"), "axis1"],
                   "/rope/cos_unsq")  # [T, 1, D]
        sin = b.op("Unsqueeze", [b.op("Gather", [b.weight("rope_sin"), pos], "/rope/sin"), "axis1"],
                   "/rope/sin_unsq")

        return slots, mask, cos, sin

    def _tree_gathers(self, b: _Builder, pos: str, j_idx: str, is_new_row: str, pad_cols: str, n_q: int) -> dict:
        """Column maps for a token tree given as `tree_mask` [T, T] (1 where t is r or an ancestor
        of r; nodes in topological order) and positions (past_len + depth):
          anc_cols [Hq*T, T]: new-score column d of row r <- new column anc(r, d) (its ancestor at
                              depth d; d > depth(r) lands on masked slots)
          to_node [Hq*T, S]:  probability of slot past_len + t <- column past_len + depth(t) if t is
                              an ancestor of r, else column past_len + T - 1, which is masked for r
                              (an exact 0): a row with a non-ancestor has depth < T - 1, because a
                              row at depth T - 1 has all T nodes on its path
        Outside the T new slots to_node is the identity. A chain (lower-triangular mask, depth = t)
        maps every column to itself, so chains compute exactly what they did before. Only one
        full-width op per layer (the probabilities' gather); the scores' is T wide."""
        anc = b.op("Cast", ["tree_mask"], "/tree/anc", to=TensorProto.BOOL)  # [T, T]
        depth = b.op("Sub", [pos, "past_len"], "/tree/depth")  # [T]
        t_len = b.op("Shape", [depth], "/tree/T")
        t_idx = b.op("Range", ["zero_i", b.op("Squeeze", [t_len], "/tree/T_scalar"), "one_i"], "/tree/t")
        # anc_at[r, d] = sum_t [t anc of r][depth(t) == d] * t  (exact small integers in a float matmul)
        at_depth = b.op("Cast", [b.op("Equal", [b.op("Unsqueeze", [depth, "axis1"], "/tree/d_col"),
                                                 b.op("Unsqueeze", [t_idx, "axis0"], "/tree/d_row")], "/tree/eq")],
                        "/tree/onehot", to=TensorProto.FLOAT)  # [t, d]
        anc_t = b.op("Mul", [b.op("Cast", [anc], "/tree/anc_f", to=TensorProto.FLOAT),
                             b.op("Cast", [b.op("Unsqueeze", [t_idx, "axis0"], "/tree/t_row")], "/tree/t_f",
                                  to=TensorProto.FLOAT)], "/tree/anc_t")  # [r, t]
        anc_at = b.op("Cast", [b.op("MatMul", [anc_t, at_depth], "/tree/anc_at_f")], "/tree/anc_at",
                      to=TensorProto.INT64)  # [r, d]
        n_heads = b.const("tile_tree", np.array([n_q, 1], np.int64))
        j_row = b.op("Unsqueeze", [j_idx, "axis0"], "/tree/j_row")  # [1, S]
        d_slot = b.op("Add", [b.op("Unsqueeze", [depth, "axis0"], "/tree/depth_row"), "past_len"], "/tree/d_slot")
        zero_slot = b.op("Sub", [b.op("Add", ["past_len", t_len], "/tree/end"), "one_i"], "/tree/zero_slot")  # [1]
        node_cols = b.op("Where", [anc, d_slot, zero_slot], "/tree/node_cols")  # [r, t]
        to_node = b.op("Where", [is_new_row, b.op("Pad", [node_cols, pad_cols], "/tree/d_place"), j_row],
                       "/tree/to_node")
        return {"anc_cols": b.op("Tile", [anc_at, n_heads], "/tree/anc_cols_h"),
                "to_node": b.op("Tile", [to_node, n_heads], "/tree/to_node_h")}

    def _layer(self, b: _Builder, i, x: str, cos: str, sin: str, mask: str, slots: dict,
               ln1: bool = True) -> tuple[str, list[str]]:
        """One pre-norm decoder layer; returns (x, [k_row, v_row] each [1, T, Hkv*D])."""
        a = self.arch
        p = f"/layers.{i}"
        h = self._rms_norm(b, x, f"l{i}.ln1", p + "/ln1", "eps") if ln1 else x
        attn, new_k, new_v = self._attention(b, i, h, cos, sin, mask, slots)
        x = b.op("Add", [x, attn], p + "/res1")
        h = self._rms_norm(b, x, f"l{i}.ln2", p + "/ln2", "eps")
        gu = self._matmul(b, h, f"l{i}.gate_up", a.hidden_size, 2 * a.intermediate_size)
        g, u = b.op("Split", [gu, b.const(f"gu_split_{i}", np.array([a.intermediate_size] * 2, np.int64))],
                    p + "/mlp/Split", n_out=2, axis=-1)
        act = b.op("Mul", [b.op("Mul", [g, b.op("Sigmoid", [g], p + "/mlp/Sigmoid")], p + "/mlp/SiLU"), u],
                   p + "/mlp/GLU")
        x = b.op("Add", [x, self._matmul(b, act, f"l{i}.down", a.intermediate_size, a.hidden_size)], p + "/res2")
        return x, [b.op("Unsqueeze", [new_k, "axis0"], p + "/k_row"), b.op("Unsqueeze", [new_v, "axis0"], p + "/v_row")]
