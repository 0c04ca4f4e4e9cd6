"""The lean flavour of the decoder graphs: fused ONNX Runtime ops where they keep THE RULE (a
token's logits are the same bits in a decode, verify or prefill call), attention in the fewest
standard ops that keep it, and every mask and index built once per call, shared by all layers.

Per layer (a tree-capable graph, all fused ops kept):
  SkipSimplifiedLayerNormalization   residual add + RMSNorm (layer 0: SimplifiedLayerNormalization)
  MatMulNBits qkv, Split             one packed projection
  RotaryEmbedding x2                 q and k, cos/sin caches as initializers, positions as ids
  Reshape, Mul, Reshape              block-diagonal queries [T*Hq, Hkv*D] (see below)
  Gemm, Reshape, Gemm                scores of the cached slots (masked past past_len) and of the
                                     T new keys (masked to each row's ancestors)
  ScatterElements(max)               the new keys' scores into the columns a chain has them at
  Softmax (+ GatherElements: trees)  probabilities (back to the slots the new values sit at)
  Slice, ScatterND                   the new values into a copy of the value window
  Gemm, Reshape, Gather              context, each head's own kv block
  MatMulNBits o
  SkipSimplifiedLayerNormalization   residual add + RMSNorm
  MatMulNBits gate_up, Split, QuickGelu (Gemma: FastGelu), Mul, MatMulNBits down
  (Gemma 3: a SimplifiedLayerNormalization of each sublayer's output before it joins the stream)

Why attention is not one fused op: GroupQueryAttention, MultiHeadAttention and ONNX Attention
compute a row alone (T=1) with another GEMM path than inside a wider call (ORT 1.32 CPU, ~2e-7),
and none of them can give a tree's row its chain's column order (the softmax sums in position
order), so a fused attention would break greedy speculative == plain. The Gemm form keeps both:
rows are independent in every GEMM, the new keys' scores land in the columns a chain would have
them at, and a row's reduction always sees the same values at the same places.

Over the row kernel's linears (--int4-kernel rowop: linears.RowLinears) attention is edgespec's own
exact op instead, one node per layer (engines/rowop/attention.h: RowAttention, in the same library):
each row's float32 operations are fixed by its keys' positions alone (dots over D in order, a fixed
16-lane exp sum, the context in position order), so it keeps the rule by arithmetic, reads the
sequence-major window as is, and does the work once per kv head (the block-diagonal Gemms do it once
per query head of the group). That flavour's prologue is only the rotary rows (row_prologue).

The residual stream is [1, T, H] throughout (RotaryEmbedding and MatMulNBits take it as is); a
sublayer's output is carried to the next norm, which adds it (SkipSimplifiedLayerNormalization's
sum output is the stream).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
from onnx import ValueInfoProto, helper

from edgespec.export.target.graph.layer_ops import LayerOps, Stream
from edgespec.export.target.graph.lean_prologue import graph_prologue, host_prologue, host_prologue_inputs, row_prologue
from edgespec.export.target.quant.integer_linears import IntegerLinears
from edgespec.export.target.quant.row_linears import RowLinears

if TYPE_CHECKING:
    from edgespec.export.target.graph.builder import GraphBuilder

LEAN_OPS = ("norm", "rotary", "silu", "gelu")  # fused ops the lean flavour uses where the probe allows
LEAN_OPSET = 18  # ScatterElements reduction="max"


class LeanOps(LayerOps):
    """The lean flavour's layer ops (layer_ops.LayerOps); the fused ops of opts.portable_ops are
    written in their portable form."""

    OPSET = LEAN_OPSET
    STREAM_3D = True

    def _fused(self, op: str) -> bool:
        return op not in self.opts.portable_ops

    def _gate_up_split(self, i: int) -> str:
        return "gu_split"

    @property
    def row_attention(self) -> bool:
        """Attention as edgespec's exact op (engines/rowop/attention.h): the linears are the row
        kernel's, so the graph already runs on its library (ONNX Runtime's CPU provider only)."""
        return isinstance(self.linears, RowLinears)

    def store_tables(self) -> None:
        """Half-width caches for RotaryEmbedding, or the full HF tables for the portable rotation."""
        for suffix in ("", "_local") if self.arch.local_rope else ("",):  # _local: the sliding layers'
            local = bool(suffix)
            cos, sin = self.arch.rope_tables(local=local)  # [max_len, D], halves duplicated
            half = self._fused("rotary")
            for part, table in (("cos", cos), ("sin", sin)):
                if half:
                    table = np.ascontiguousarray(table[:, : self.arch.head_dim // 2])
                name = f"rope_{part}{'_half' if half else ''}{suffix}"
                self.store.add(name, self.arch.rope_table(table.astype(self.dtype), part, half, local))

    # ---- once per call ------------------------------------------------------------------------
    def prologue(self, b: GraphBuilder) -> dict:
        """Constants and the per-call masks and indices every layer shares:
          mask_past [1, S]        0 for the cached slots j < past_len, -inf-like from past_len on
          mask_new [T*Hq, T]      0 where the column node is the row node or an ancestor
          cols [T*Hq, T]          the column each new key's score goes to: an ancestor at depth d
                                  to past_len + d (where a chain has it), the other nodes in order
                                  to the columns after the row's own (masked for the row); clamped
                                  into the window, where scores merge by max (a masked score never
                                  wins over a visible one)
          to_node [T*Hq, S]       (trees) probability column of each slot: the inverse of cols on
                                  the T new slots, the identity elsewhere
          v_slots [1, n, 1]       slots of the new values inside the window (n = min(T, S - past_len):
                                  rows padded past the window's end are dropped)
          sliding                 (arch.sliding_layers) their mask_past [T*Hq, S] and mask_new with the
                                  key window applied, their rotary tables (layer_ctx)
        Rows are ordered (t, h): row t*Hq + h is query head h of token t. Built by
        lean_prologue.graph_prologue; opts.host_prologue: these come in as graph inputs
        (host_prologue_inputs), built by the engine (engines/prologue.py) with the same values; the
        window then always holds the T new rows."""
        a, f = self.arch, self.dtype
        n_q, n_kv, d = a.n_heads, a.n_kv_heads, a.head_dim
        kv_w = n_kv * d
        if not self.row_attention:
            b.const("ninf_f", np.array(-1e9, f))  # a masked score: exp gives exactly 0
            b.const("zero_f", np.array(0.0, f))
        b.const("eps", np.array(a.rms_norm_eps, f))
        b.const("two", np.array(2.0, f))
        b.const("axes_last", np.array([-1], np.int64))
        for name, val in (("axis0", [0]), ("axis1", [1]), ("axis2", [2]), ("zero_1", [0])):
            b.const(name, np.array(val, np.int64))
        b.const("zero_i", np.array(0, np.int64))
        b.const("one_i", np.array(1, np.int64))
        b.const("one_1", np.array([1], np.int64))
        if self.row_attention:
            return row_prologue(self, b)
        b.const("shape_q4", np.array([-1, n_q, 1, d], np.int64))
        b.const("shape_rows", np.array([-1, kv_w], np.int64))
        b.const("shape_ctx", np.array([1, -1, n_q * kv_w], np.int64))
        head_mask = np.zeros((n_q, n_kv, 1), f)  # query head h reads kv head h // (Hq / Hkv)
        ctx_idx = np.zeros(n_q * d, np.int64)  # [Hq * Hkv*D] context row -> head h's own block
        for h in range(n_q):
            g = h // (n_q // n_kv)
            head_mask[h, g, 0] = 1
            ctx_idx[h * d : (h + 1) * d] = h * kv_w + g * d + np.arange(d)
        b.const("head_mask", head_mask)
        b.const("ctx_idx", ctx_idx)
        b.const("tile_heads", np.array([1, n_q, 1], np.int64))
        return host_prologue(self, b) if self.opts.host_prologue else graph_prologue(self, b)

    def extra_inputs(self) -> list[ValueInfoProto]:
        """opts.host_prologue: the prologue's tensors (host_prologue_inputs)."""
        if not self.opts.host_prologue:
            return []
        from edgespec.export.target.graph.builder import NP_TO_ONNX

        two_rows = self.opts.two_row_matmuls and self.opts.precision == "int4"
        return [
            helper.make_tensor_value_info(name, NP_TO_ONNX[np.dtype(dt)], list(shape))
            for name, shape, dt in host_prologue_inputs(
                self.arch.n_heads, self.dtype.name, self.opts.trees, two_rows, bool(self.arch.sliding_window)
            )
        ]

    # ---- per layer ------------------------------------------------------------------------------
    def embed(self, b: GraphBuilder) -> str:
        return self.linears.embed_rows(b, "input_ids", 2)  # [1, T, H]

    def rows_in(self, b: GraphBuilder, name: str, width: int, node: str) -> str:
        return name

    def real_rows(self, b: GraphBuilder, ctx: dict, y: str, name: str) -> str:
        return b.op("Slice", [y, "zero_1", ctx["t_len"], "axis1"], name) if "two_rows" in ctx else y

    def norm(self, b: GraphBuilder, s: Stream, weight: str, name: str) -> tuple[str, Stream]:
        """RMSNorm of x + delta: SkipSimplifiedLayerNormalization, whose sum output is the stream."""
        x, delta = s.x, s.delta
        w = b.weight(weight)
        if delta is not None and not self._fused("norm"):
            x = b.op("Add", [x, delta], name + "/residual")
        elif delta is not None:
            out, total = name + "/SkipSLN_out", name + "/SkipSLN_sum"
            b.nodes.append(
                helper.make_node(
                    "SkipSimplifiedLayerNormalization",
                    [delta, x, w],
                    [out, "", "", total],
                    name=name + "/SkipSLN",
                    domain="com.microsoft",
                    epsilon=self.arch.rms_norm_eps,
                )
            )
            return out, Stream(total)
        if not self._fused("norm"):
            return self.rms_norm(b, x, weight, name, axes="axes_last"), Stream(x)
        return b.op(
            "SimplifiedLayerNormalization", [x, w], name + "/SLN", axis=-1, epsilon=self.arch.rms_norm_eps
        ), Stream(x)

    def add(self, b: GraphBuilder, s: Stream, y: str, name: str) -> Stream:
        assert s.delta is None, "one sublayer output pending at a time"
        return Stream(s.x, y)

    def resolve(self, b: GraphBuilder, s: Stream, name: str) -> Stream:
        return Stream(b.op("Add", [s.x, s.delta], name)) if s.delta is not None else s

    def out_norm(self, b: GraphBuilder, ctx: dict, s: Stream, weight: str, name: str) -> str:
        return self.real_rows(b, ctx, self.norm(b, s, weight, name)[0], "/two_rows/out")

    def silu(self, b: GraphBuilder, x: str, sigmoid_name: str, name: str) -> str:
        if self._fused("silu"):
            return b.op("QuickGelu", [x], name, domain="com.microsoft", alpha=1.0)
        return super().silu(b, x, sigmoid_name, name)

    def gelu_tanh(self, b: GraphBuilder, x: str, name: str) -> str:
        if self._fused("gelu"):  # 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), one op
            return b.op("FastGelu", [x], name, domain="com.microsoft")
        return super().gelu_tanh(b, x, name)

    def rotary(self, b: GraphBuilder, x: str, n_heads: int, ctx: dict, name: str) -> str:
        """Rotate x [1, T, heads*D] by the positions."""
        if self._fused("rotary"):
            suffix = ctx.get("rope_suffix", "")  # a sliding layer's own caches (lean_prologue.rope_rows)
            return b.op(
                "RotaryEmbedding",
                [x, "positions", b.weight(f"rope_cos_half{suffix}"), b.weight(f"rope_sin_half{suffix}")],
                name + "/RotaryEmbedding",
                domain="com.microsoft",
                num_heads=n_heads,
                interleaved=0,
            )
        d = self.arch.head_dim
        x4 = b.op(
            "Reshape", [x, b.const(f"shape_heads_{n_heads}", np.array([1, -1, n_heads, d], np.int64))], name + "/heads"
        )
        x1, x2 = b.op(
            "Split",
            [x4, b.const("rope_split", np.array([d // 2, d // 2], np.int64))],
            name + "/Split",
            n_out=2,
            axis=-1,
        )
        rot = b.op("Concat", [b.op("Neg", [x2], name + "/Neg"), x1], name + "/Concat", axis=-1)
        y = b.op(
            "Add",
            [b.op("Mul", [x4, ctx["cos"]], name + "/MulCos"), b.op("Mul", [rot, ctx["sin"]], name + "/MulSin")],
            name + "/Add",
        )
        return b.op(
            "Reshape", [y, b.const(f"shape_flat_{n_heads}", np.array([1, -1, n_heads * d], np.int64))], name + "/flat"
        )

    def _qk_norm(self, b: GraphBuilder, x: str, weight: str, n_heads: int, name: str) -> str:
        """Qwen3's per-head RMSNorm of q or k [1, T, heads*D]."""
        d = self.arch.head_dim
        x4 = b.op(
            "Reshape", [x, b.const(f"shape_heads_{n_heads}", np.array([1, -1, n_heads, d], np.int64))], name + "/heads"
        )
        y, _ = self.norm(b, Stream(x4), weight, name)
        return b.op(
            "Reshape", [y, b.const(f"shape_flat_{n_heads}", np.array([1, -1, n_heads * d], np.int64))], name + "/flat"
        )

    def attention(self, b: GraphBuilder, i: int, h: str, ctx: dict) -> tuple[str, str, str]:
        """(out [1, T, H], new k rows, new v rows [1, T, Hkv*D]). Block-diagonal queries as in the
        portable graph (portable.PortableOps.attention): Qbd [T*Hq, Hkv*D] holds query (t, h)
        in the columns of its kv head, so the sequence-major cache is read by 2-D Gemms as is."""
        a = self.arch
        n_q, n_kv, d = a.n_heads, a.n_kv_heads, a.head_dim
        p = f"/layers.{i}/attn"
        qkv = self.real_rows(b, ctx, self.linear(b, h, f"l{i}.qkv"), p + "/qkv_rows")  # attention: the T real rows
        if a.qkv_bias:
            qkv = b.op("Add", [qkv, b.weight(f"l{i}.qkv_b")], p + "/qkv_bias")
        if self.row_attention and not a.qk_norm and i not in a.nope_layers and self._fused("rotary"):
            return self._row_attention(b, i, [qkv], ctx, p)  # split and RoPE in the op too
        split = b.const("qkv_split", np.array([n_q * d, n_kv * d, n_kv * d], np.int64))
        q, k, v = b.op("Split", [qkv, split], p + "/Split", n_out=3, axis=-1)  # [1, T, *]
        if a.qk_norm:
            q = self._qk_norm(b, q, f"l{i}.q_norm", n_q, p + "/q_norm")
            k = self._qk_norm(b, k, f"l{i}.k_norm", n_kv, p + "/k_norm")
        if i not in a.nope_layers:
            q = self.rotary(b, q, n_q, ctx, p + "/q_rope")
            k = self.rotary(b, k, n_kv, ctx, p + "/k_rope")
        if self.row_attention:
            return self._row_attention(b, i, [q, k, v], ctx, p)
        qbd = b.op(
            "Reshape",
            [b.op("Mul", [b.op("Reshape", [q, "shape_q4"], p + "/q4"), "head_mask"], p + "/q_blocks"), "shape_rows"],
            p + "/qbd",
        )  # [T*Hq, Hkv*D]
        s_past = self.scores(b, qbd, f"past_key_{i}", ctx["mask_past"], p + "/scores_past")  # [T*Hq, S]
        k_rows = b.op("Reshape", [k, "shape_rows"], p + "/k_rows")
        s_new = self.scores(b, qbd, k_rows, ctx["mask_new"], p + "/scores_new")  # [T*Hq, T]
        scores = b.op("ScatterElements", [s_past, ctx["cols"], s_new], p + "/scores", axis=1, reduction="max")
        probs = b.op("Softmax", [scores], p + "/Softmax", axis=-1)
        if "to_node" in ctx:
            probs = b.op("GatherElements", [probs, ctx["to_node"]], p + "/p_node", axis=1)
        v_in = v  # host prologue: the window holds every new row
        if "n_in" in ctx:
            v_in = b.op("Slice", [v, "zero_1", ctx["n_in"], "axis1"], p + "/v_in")  # rows inside the window
        v_full = b.op("ScatterND", [f"past_value_{i}", ctx["v_slots"], v_in], p + "/v_full")  # [S, Hkv*D]
        ctx_rows = b.op("Gemm", [probs, v_full], p + "/ctx")  # [T*Hq, Hkv*D]
        out = b.op(
            "Gather", [b.op("Reshape", [ctx_rows, "shape_ctx"], p + "/ctx_heads"), "ctx_idx"], p + "/ctx_own", axis=2
        )  # [1, T, Hq*D]
        out = self.pad_rows(b, ctx, out, p + "/ctx_rows")
        return self.linear(b, out, f"l{i}.o"), k, v

    def _row_attention(self, b: GraphBuilder, i: int, rows: list[str], ctx: dict, p: str) -> tuple[str, str, str]:
        """Layer i's (attention output after o_proj, new k rows, new v rows) as one node of edgespec's
        op: RowAttention over rows = [q [1, T, Hq*D], k, v [1, T, Hkv*D]] (rotated, normed), or
        RowQkvAttention over rows = [qkv [1, T, (Hq+2Hkv)*D]], which splits it and rotates q and k by
        the positions itself (the RotaryEmbedding caches; its k and v outputs are the new rows); both
        with the window, past_len and (trees) tree_mask; ctx["window"]: a sliding layer's key window
        (row_prologue)."""
        from edgespec.engines.rowop import DOMAIN
        from edgespec.engines.rowop.attention import OP_TYPE, QKV_OP_TYPE

        a = self.arch
        inputs = rows + [f"past_key_{i}", f"past_value_{i}", "past_len"]
        if len(rows) == 1:
            suffix = ctx.get("rope_suffix", "")  # a sliding layer's own caches
            inputs += ["positions", b.weight(f"rope_cos_half{suffix}"), b.weight(f"rope_sin_half{suffix}")]
        op = OP_TYPE if len(rows) == 3 else QKV_OP_TYPE
        tail = ["tree_mask"] if self.opts.trees else []
        if self.half_cache:  # the engine binds its cache to one pair, an empty window to the other
            tail = (tail or [""]) + [f"past_key_f16_{i}", f"past_value_f16_{i}"]
        outs = b.op(
            op,
            inputs + tail,
            f"{p}/{op}",
            n_out=1 if len(rows) == 3 else 3,
            domain=DOMAIN,
            num_heads=a.n_heads,
            kv_heads=a.n_kv_heads,
            head_dim=a.head_dim,
            scale=float(a.attn_scale),
            window=int(ctx.get("window", 0)),
        )
        out, k, v = (outs, rows[1], rows[2]) if len(rows) == 3 else outs  # out: [1, T, Hq*D]
        return self.linear(b, self.pad_rows(b, ctx, out, p + "/ctx_rows"), f"l{i}.o"), k, v

    def mlp(self, b: GraphBuilder, i: int, h: str, name: str, names=None, sized: bool = True) -> str:
        """The row kernel's flavour with SwiGLU: the gate/up Split, SiLU and product as one RowSwiGLU
        node of edgespec's library (its own exp, every path the same bits); else LayerOps.mlp."""
        if not (self.row_attention and self.arch.mlp_act == "silu"):
            return super().mlp(b, i, h, name, *([names] if names else []), sized=sized)
        from edgespec.engines.rowop import DOMAIN
        from edgespec.engines.rowop.attention import SWIGLU_OP_TYPE

        gu = self.linear(b, h, f"l{i}.gate_up")  # [1, T, 2I]
        act = b.op(SWIGLU_OP_TYPE, [gu], f"{name}/{SWIGLU_OP_TYPE}", domain=DOMAIN, inter=self.arch.intermediate_size)
        return self.linear(b, act, f"l{i}.down")

    def kv_rows(self, b: GraphBuilder, k: str, v: str, name: str) -> list[str]:
        return [k, v]


class IntegerOps(LeanOps):
    """The lean layer ops over integer linears (linears.IntegerLinears: int8 weights x int8 rows,
    exact int32 sums), the "integer" flavour of precision int8."""

    LINEARS = IntegerLinears
