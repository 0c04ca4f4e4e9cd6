"""The portable flavour of the graphs: standard ONNX ops only (opset 17), which TensorRT parses;
what fp16 folders get, and the layers of the graphs written in one form (layer_ops.standard).

Rows are [T, W]. Per layer: RMSNorm as Pow / ReduceMean / Add / Sqrt / Div / Mul (ORT fuses it at
load), rotary as Split / Neg / Concat / Mul / Mul / Add on cos/sin rows gathered once per call, and
attention over the sequence-major cache by block-diagonal 2-D Gemms (`attention`), with the
per-call masks and slot placements built in `prologue`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
from onnx import TensorProto

from edgespec.export.target.graph.layer_ops import LayerOps, Stream

if TYPE_CHECKING:
    from edgespec.export.target.graph.builder import GraphBuilder

NEG_INF = {"float32": -1e9, "float16": -3e4}  # additive mask: finite, so no row can turn NaN


class PortableOps(LayerOps):
    """The portable flavour's layer ops (layer_ops.LayerOps)."""

    def _gate_up_split(self, i: int) -> str:
        return f"gu_split_{i}"

    def store_tables(self) -> None:
        for local in (False, True) if self.arch.local_rope else (False,):  # local: the sliding layers' (Gemma 3)
            cos, sin = self.arch.rope_tables(local=local)  # [max_pos, D]
            for part, table in (("cos", cos), ("sin", sin)):
                name = f"rope_{part}{'_local' if local else ''}"
                self.store.add(name, self.arch.rope_table(table.astype(self.dtype), part, False, local))

    def embed(self, b: GraphBuilder) -> str:
        ids = b.op("Reshape", ["input_ids", "shape_T"], "/ids_flat")
        return self.linears.embed_rows(b, ids, 1)  # [T, H]

    def rows_in(self, b: GraphBuilder, name: str, width: int, node: str) -> str:
        return b.op("Reshape", [name, b.const("shape_feat", np.array([-1, width], np.int64))], node)

    def real_rows(self, b: GraphBuilder, ctx: dict, y: str, name: str) -> str:
        return b.op("Slice", [y, "zero_1", ctx["t_len"], "zero_1"], name) if "two_rows" in ctx else y

    def norm(self, b: GraphBuilder, s: Stream, weight: str, name: str) -> tuple[str, Stream]:
        assert s.delta is None, "the portable stream adds at once"
        return self.rms_norm(b, s.x, weight, name), s

    def add(self, b: GraphBuilder, s: Stream, y: str, name: str) -> Stream:
        return Stream(b.op("Add", [s.x, y], name))

    def resolve(self, b: GraphBuilder, s: Stream, name: str) -> Stream:
        return s

    def out_norm(self, b: GraphBuilder, ctx: dict, s: Stream, weight: str, name: str) -> str:
        return self.norm(b, Stream(self.real_rows(b, ctx, s.x, "/two_rows/out")), weight, name)[0]

    def rotary(self, b: GraphBuilder, x: str, n_heads: int, ctx: dict, name: str) -> str:
        # x*cos + [-x2, x1]*sin, x: [T, heads, D], cos/sin: [T, 1, D]
        x1, x2 = b.op("Split", [x, "rope_split"], name + "/Split", n_out=2, axis=-1)
        neg = b.op("Neg", [x2], name + "/Neg")
        rot = b.op("Concat", [neg, x1], name + "/Concat", axis=-1)
        return b.op(
            "Add",
            [b.op("Mul", [x, ctx["cos"]], name + "/MulCos"), b.op("Mul", [rot, ctx["sin"]], name + "/MulSin")],
            name + "/Add",
        )

    def kv_rows(self, b: GraphBuilder, k: str, v: str, name: str) -> list[str]:
        return [b.op("Unsqueeze", [k, "axis0"], name + "/k_row"), b.op("Unsqueeze", [v, "axis0"], name + "/v_row")]

    def attention(self, b: GraphBuilder, i: int, h: str, ctx: dict) -> tuple[str, str, str]:
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
        p = f"/layers.{i}/attn"
        q, new_k, new_v = self._qkv(b, i, h, ctx, p)  # [T, Hq, D], [T, Hkv*D], [T, Hkv*D]
        # V_full[j] = new_v[j - past_len] for the T new slots, past_value[j] elsewhere: [S, Hkv*D]
        v_full = b.op(
            "Where",
            [ctx["is_new"], b.op("Pad", [new_v, ctx["pad_rows"]], p + "/v_place"), f"past_value_{i}"],
            p + "/v_full",
        )
        # Block-diagonal queries: [Hq, T, 1, D] * head_mask[Hq, 1, Hkv, 1] -> [Hq*T, Hkv*D]
        qt = b.op("Transpose", [q], p + "/q_T", perm=[1, 0, 2])
        qt = b.op("Unsqueeze", [qt, "axis2"], p + "/q_unsq")
        qbd = b.op("Reshape", [b.op("Mul", [qt, "head_mask"], p + "/q_blocks"), "shape_qbd"], p + "/qbd")
        # scores over the window, the new keys' columns placed at their slots (each dot product is
        # the same bits whichever Gemm computes it, reductions of <= 128 (LayerOps.scores), so K needs
        # no placed copy; V does, below)
        s_past = self.scores(b, qbd, f"past_key_{i}", None, p + "/scores_past")  # [Hq*T, S]
        s_new = self.scores(b, qbd, new_k, None, p + "/scores_new")  # [Hq*T, T]
        if "anc_cols" in ctx:  # token trees: row r's ancestors' scores moved to the columns a chain
            # would have them at (past_len + depth): its softmax row is the chain's bit for bit
            s_new = b.op("GatherElements", [s_new, ctx["anc_cols"]], p + "/s_depth", axis=1)
        scores = b.op(
            "Where", [ctx["is_new_row"], b.op("Pad", [s_new, ctx["pad_cols"]], p + "/s_place"), s_past], p + "/scores"
        )
        probs = b.op("Softmax", [b.op("Add", [scores, ctx["mask"]], p + "/masked")], p + "/Softmax", axis=-1)
        if "to_node" in ctx:  # ... and the probabilities back to the slots the new values sit at
            # (node order), exact zeros for non-ancestors: the same non-zero terms in the same order
            probs = b.op("GatherElements", [probs, ctx["to_node"]], p + "/p_node", axis=1)
        att = b.op("Gemm", [probs, v_full], p + "/ctx")  # [Hq*T, Hkv*D]
        # keep each query head's own kv block: [Hq, T, Hkv, D] * head_mask, summed over Hkv
        att = b.op("Reshape", [att, "shape_ctx4"], p + "/ctx4")
        att = b.op(
            "ReduceSum", [b.op("Mul", [att, "head_mask"], p + "/ctx_blocks"), "axis2"], p + "/ctx_sum", keepdims=0
        )  # [Hq, T, D]
        att = b.op(
            "Reshape", [b.op("Transpose", [att], p + "/ctx_T", perm=[1, 0, 2]), "shape_hidden_q"], p + "/ctx_flat"
        )  # [T, Hq*D]
        att = self.pad_rows(b, ctx, att, p + "/ctx_rows")
        return self.linear(b, att, f"l{i}.o"), new_k, new_v

    def _qkv(self, b: GraphBuilder, i: int, h: str, ctx: dict, p: str) -> tuple[str, str, str]:
        """Layer i's queries [T, Hq, D] (normed and rotated as the family does), new keys and values
        [T, Hkv*D] of the T real rows."""
        a = self.arch
        n_q, n_kv, d = a.n_heads, a.n_kv_heads, a.head_dim
        qkv = self.real_rows(b, ctx, self.linear(b, h, f"l{i}.qkv"), p + "/qkv_rows")  # the T real rows
        if a.qkv_bias:
            qkv = b.op("Add", [qkv, b.weight(f"l{i}.qkv_b")], p + "/qkv_bias")
        q, k, v = b.op(
            "Split",
            [qkv, b.const(f"qkv_split_{i}", np.array([n_q * d, n_kv * d, n_kv * d], np.int64))],
            p + "/Split",
            n_out=3,
            axis=-1,
        )
        q = b.op("Reshape", [q, "shape_q"], p + "/q_heads")  # [T, Hq, D]
        k = b.op("Reshape", [k, "shape_kv"], p + "/k_heads")  # [T, Hkv, D]
        if a.qk_norm:
            q = self.rms_norm(b, q, f"l{i}.q_norm", p + "/q_norm")
            k = self.rms_norm(b, k, f"l{i}.k_norm", p + "/k_norm")
        if i not in a.nope_layers:
            q = self.rotary(b, q, n_q, ctx, p + "/q_rope")
            k = self.rotary(b, k, n_kv, ctx, p + "/k_rope")
        new_k = b.op("Reshape", [k, "shape_rows"], p + "/new_k")  # [T, Hkv*D]
        return q, new_k, v

    # ---- once per call ---------------------------------------------------------------------------
    def prologue(self, b: GraphBuilder) -> dict:
        """Constants, the [Hq*T, S] causal mask, the new-slot placement and rope rows of the
        positions (ctx: slots, mask, cos, sin; "sliding": the sliding layers' mask, cos, sin where
        they differ, layer_ctx)."""
        a = self.arch
        self._constants(b)
        # T from the input; slot j of the window [S] is visible to new row t iff j <= positions[t]
        # (a chain: positions[t] = past_len + t; a tree: past_len + depth(t), columns in depth order)
        t_len = b.op("Gather", [b.op("Shape", ["input_ids"], "/T/shape"), "axis1"], "/T/T")  # [1]
        s_len = b.op("Gather", [b.op("Shape", ["past_key_0"], "/mask/shape"), "axis0"], "/mask/S")
        j_idx = b.op("Range", ["zero_i", b.op("Squeeze", [s_len], "/mask/S_scalar"), "one_i"], "/mask/slots")
        pos_flat = b.op("Reshape", ["positions", b.const("shape_T", np.array([-1], np.int64))], "/pos_flat")
        mask, sliding = self._masks(b, j_idx, pos_flat)
        ctx = self._new_slots(b, j_idx, s_len, t_len)
        if self.opts.trees:
            ctx |= self._tree_gathers(b, pos_flat, j_idx, ctx["is_new_row"], ctx["pad_cols"], a.n_heads)
        for name in ("cos", "sin"):  # [T, 1, D]
            rows = b.op("Gather", [b.weight(f"rope_{name}"), pos_flat], f"/rope/{name}")
            ctx[name] = b.op("Unsqueeze", [rows, "axis1"], f"/rope/{name}_unsq")
            if a.local_rope:
                rows = b.op("Gather", [b.weight(f"rope_{name}_local"), pos_flat], f"/rope_local/{name}")
                sliding[name] = b.op("Unsqueeze", [rows, "axis1"], f"/rope_local/{name}_unsq")
        if sliding:
            ctx["sliding"] = sliding
        return ctx | {"mask": mask}

    def _constants(self, b: GraphBuilder) -> None:
        """The constants every layer's ops name (shapes, axes, the GQA head mask)."""
        a, f = self.arch, self.dtype
        n_q, n_kv, d = a.n_heads, a.n_kv_heads, a.head_dim
        kv_w = n_kv * d
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

    def _masks(self, b: GraphBuilder, j_idx: str, pos_flat: str) -> tuple[str, dict]:
        """(the causal mask [Hq*T, S], row h*T + t; {"mask": the sliding layers'} where they have a
        window, which also hides the slots j <= positions[t] - window)."""
        a, f = self.arch, self.dtype
        last_visible = b.op("Unsqueeze", [pos_flat, "axis1"], "/mask/last")  # [T, 1]
        j_row = b.op("Unsqueeze", [j_idx, "axis0"], "/mask/j_row")  # [1, S]
        hidden_slot = b.op("Greater", [j_row, last_visible], "/mask/hidden")  # [T, S]
        ninf = b.const("ninf_f", np.array(NEG_INF[f.name], f))
        zero_f = b.const("zero_f", np.array(0.0, f))
        tile_heads = b.const("tile_heads", np.array([a.n_heads, 1], np.int64))
        bias = b.op("Where", [hidden_slot, ninf, zero_f], "/mask/bias")
        mask = b.op("Tile", [bias, tile_heads], "/mask/rows")  # [Hq*T, S], row = h*T + t
        sliding = {}  # the sliding layers' masks and rotary rows (layer_ctx)
        if a.sliding_window:
            first = b.op(
                "Sub", [last_visible, b.const("window_m1", np.array(a.sliding_window - 1, np.int64))], "/window/first"
            )  # [T, 1]
            hidden_local = b.op(
                "Or", [hidden_slot, b.op("Less", [j_row, first], "/window/old")], "/window/hidden"
            )  # [T, S]
            bias_local = b.op("Where", [hidden_local, ninf, zero_f], "/window/bias")
            sliding["mask"] = b.op("Tile", [bias_local, tile_heads], "/window/rows")  # [Hq*T, S]
        return mask, sliding

    def _new_slots(self, b: GraphBuilder, j_idx: str, s_len: str, t_len: str) -> dict:
        """Where the T new rows go in the window (row index j - past_len, valid for past_len <= j <
        past_len + T): is_new [S, 1] / is_new_row [1, S], the pads placing [T, W] rows and [Hq*T, T]
        columns, and for two-row int4 calls the pads adding a row."""
        rel = b.op("Sub", [j_idx, "past_len"], "/slots/rel")  # [S]
        is_new = b.op(
            "And",
            [b.op("GreaterOrEqual", [rel, "zero_i"], "/slots/ge"), b.op("Less", [rel, t_len], "/slots/lt")],
            "/slots/is_new",
        )
        # the T new rows padded out to the window: past_len before, S - past_len - T after
        after = b.op("Sub", [b.op("Sub", [s_len, "past_len"], "/slots/rest"), t_len], "/slots/after")  # [1]
        zero1 = b.const("zero_1", np.array([0], np.int64))
        pad_rows = b.op("Concat", ["past_len", zero1, after, zero1], "/slots/pad_rows", axis=0)  # for [T, W]
        pad_cols = b.op("Concat", [zero1, "past_len", zero1, after], "/slots/pad_cols", axis=0)  # for [Hq*T, T]
        ctx = {
            "is_new": b.op("Unsqueeze", [is_new, "axis1"], "/slots/is_new_col"),  # [S, 1]
            "is_new_row": b.op("Unsqueeze", [is_new, "axis0"], "/slots/is_new_row"),  # [1, S]
            "pad_rows": pad_rows,
            "pad_cols": pad_cols,
            "t_len": t_len,
        }
        if self.opts.two_row_matmuls and self.opts.precision == "int4":
            # rows added below a [T, W] activation so that MatMulNBits sees max(T, 2) rows: [0, 0, max(2-T, 0), 0]
            extra = b.op(
                "Max",
                [b.op("Sub", [b.const("two_1", np.array([2], np.int64)), t_len], "/two_rows/sub"), zero1],
                "/two_rows/extra",
            )
            ctx["two_rows"] = b.op("Concat", [zero1, zero1, extra, zero1], "/two_rows/pads", axis=0)
        return ctx

    def _tree_gathers(self, b: GraphBuilder, pos: str, j_idx: str, is_new_row: str, pad_cols: str, n_q: int) -> dict:
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
        at_depth = b.op(
            "Cast",
            [
                b.op(
                    "Equal",
                    [
                        b.op("Unsqueeze", [depth, "axis1"], "/tree/d_col"),
                        b.op("Unsqueeze", [t_idx, "axis0"], "/tree/d_row"),
                    ],
                    "/tree/eq",
                )
            ],
            "/tree/onehot",
            to=TensorProto.FLOAT,
        )  # [t, d]
        anc_t = b.op(
            "Mul",
            [
                b.op("Cast", [anc], "/tree/anc_f", to=TensorProto.FLOAT),
                b.op("Cast", [b.op("Unsqueeze", [t_idx, "axis0"], "/tree/t_row")], "/tree/t_f", to=TensorProto.FLOAT),
            ],
            "/tree/anc_t",
        )  # [r, t]
        anc_at = b.op(
            "Cast", [b.op("MatMul", [anc_t, at_depth], "/tree/anc_at_f")], "/tree/anc_at", to=TensorProto.INT64
        )  # [r, d]
        n_heads = b.const("tile_tree", np.array([n_q, 1], np.int64))
        j_row = b.op("Unsqueeze", [j_idx, "axis0"], "/tree/j_row")  # [1, S]
        d_slot = b.op("Add", [b.op("Unsqueeze", [depth, "axis0"], "/tree/depth_row"), "past_len"], "/tree/d_slot")
        zero_slot = b.op("Sub", [b.op("Add", ["past_len", t_len], "/tree/end"), "one_i"], "/tree/zero_slot")  # [1]
        node_cols = b.op("Where", [anc, d_slot, zero_slot], "/tree/node_cols")  # [r, t]
        to_node = b.op(
            "Where", [is_new_row, b.op("Pad", [node_cols, pad_cols], "/tree/d_place"), j_row], "/tree/to_node"
        )
        return {
            "anc_cols": b.op("Tile", [anc_at, n_heads], "/tree/anc_cols_h"),
            "to_node": b.op("Tile", [to_node, n_heads], "/tree/to_node_h"),
        }
