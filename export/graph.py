"""Static-shape ONNX graphs for Llama-family decoders, written op by op with onnx.helper.

Why by hand and not torch.onnx: the graph is small and regular, and writing it directly gives
exact control over the ops each phase runs (the kernel path decides decode/verify parity), one
shared weights file, and standard ops only (TensorRT takes it). PyTorch stays the reference:
the exporter checks every graph against the Hugging Face model.

The "delta" form of DESIGN.md. One graph per model serves every phase: its token axis T is
symbolic, and the manifest lists the phase widths (prefill chunk P, decode 1, verify 2..k+1) the
runtime feeds it - each a static shape (a TensorRT optimization profile with min = opt = max).
One graph means one ORT session per model, so weights are prepacked once and held once:
  inputs   input_ids [1, T] int64, positions [1, T] int64, past_len [1] int64,
           past_key_<l>, past_value_<l> [S, Hkv*D] for every layer l: the first S slots of the
           cache, S a context bucket >= past_len + T (rows from past_len on are not read)
  outputs  logits [1, T, V] float32, new_kv [L, 2, T, Hkv*D], hidden [1, T, H]
The KV buffer is sequence-major ([S, Hkv*D] per layer) so that the first S rows of the runtime's
[S_max, Hkv*D] buffer are one contiguous slice: attention cost follows the context bucket S, not
max_len, with no copy. Attention over that layout avoids transposing the cache by folding the
heads into one 2-D Gemm (see `_attention`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
from onnx import TensorProto, helper

from edgespec.export.arch import ArchSpec
from edgespec.export.quant import quantize_int4, quantize_int8

OPSET = 17
NEG_INF = {"float32": -1e9, "float16": -3e4}  # additive mask: finite, so no row can turn NaN

_NP_TO_ONNX = {np.dtype(np.float32): TensorProto.FLOAT, np.dtype(np.float16): TensorProto.FLOAT16,
               np.dtype(np.int64): TensorProto.INT64, np.dtype(np.uint8): TensorProto.UINT8}


@dataclass(frozen=True)
class GraphOptions:
    precision: str  # "fp32" | "fp16" | "int4": weights (int4: MatMulNBits, fp32 activations)
    int4_block_size: int = 32  # weights per quantization block along the input dimension
    int4_accuracy_level: int = 4  # MatMulNBits accuracy_level (4 = int8 activations, 0 = fp32)
    int4_lm_head: bool = False  # quantize the LM head too (smaller, faster, worse text)
    int8_lm_head: bool = True  # int4 precision: the LM head as 8-bit MatMulNBits (GGUF's Q8_0 scheme;
    #                            streams a quarter of the fp32 bytes); False: fp32 Gemm on the embedding
    trees: bool = False  # tree_mask input + tree attention (2 more ops per layer, one of them T wide);
    #                      off, the graph serves chains only
    aux_layers: tuple[int, ...] = ()  # also output hidden_aux [1, T, n*H]: the residual stream entering
    #                                   these layers, concatenated (EAGLE-3's low/mid/high features)
    two_row_matmuls: bool = False  # int4: a 1-token call runs the layers' matmuls on 2 rows (a zero row
    #                                added), for CPUs whose 1-row int4 kernel sums differently from the
    #                                n-row one (ORT 1.32 on AVX2): decode rows then equal verify rows bitwise


class WeightStore:
    """Named numpy arrays shared by all graphs of one model (written once as external data)."""

    def __init__(self) -> None:
        self.arrays: dict[str, np.ndarray] = {}

    def add(self, name: str, arr: np.ndarray) -> str:
        if name not in self.arrays:
            self.arrays[name] = np.ascontiguousarray(arr)
        return name


class _Builder:
    def __init__(self, store: WeightStore, dtype: np.dtype) -> None:
        self.nodes: list[onnx.NodeProto] = []
        self.consts: list[onnx.TensorProto] = []
        self.store = store
        self.used_weights: set[str] = set()
        self.dtype = dtype
        self._n = 0

    def op(self, op_type: str, inputs: list[str], name: str, n_out: int = 1, domain: str = "", **attrs):
        self._n += 1
        outs = [f"{name}_out{i}" if n_out > 1 else f"{name}_out" for i in range(n_out)]
        self.nodes.append(helper.make_node(op_type, inputs, outs, name=name, domain=domain or None,
                                           **attrs))
        return outs if n_out > 1 else outs[0]

    def const(self, name: str, arr: np.ndarray) -> str:
        self.consts.append(helper.make_tensor(name, _NP_TO_ONNX[arr.dtype], arr.shape,
                                              arr.flatten().tolist()))
        return name

    def weight(self, name: str) -> str:
        self.used_weights.add(name)
        return name


class LlamaGraphWriter:
    """Builds phase graphs for one model whose weights come as HF-named numpy arrays [out, in]."""

    def __init__(self, arch: ArchSpec, hf_weights: dict[str, np.ndarray], opts: GraphOptions,
                 n_layers: int | None = None) -> None:
        self.arch = arch
        self.opts = opts
        self.n_layers = n_layers or arch.n_layers  # fewer layers: a self-speculative draft
        self.dtype = np.dtype(np.float16 if opts.precision == "fp16" else np.float32)
        self.store = WeightStore()
        # Reference weights: what the exported graphs compute with (int4: dequantized), so the
        # exporter can validate ONNX vs PyTorch at tight tolerance.
        self.reference: dict[str, np.ndarray] = {}
        self._prepare(hf_weights)

    # ---- weights -------------------------------------------------------------------------------
    def _prepare(self, w: dict[str, np.ndarray]) -> None:
        a = self.arch
        f = self.dtype
        self.store.add("embed", w["model.embed_tokens.weight"].astype(f))  # [V, H]
        self.store.add("final_norm", w["model.norm.weight"].astype(f))
        lm_head = w.get("lm_head.weight", w["model.embed_tokens.weight"])
        self._linear("lm_head", lm_head, "lm_head.weight", tied=a.tie_word_embeddings)
        for i in range(self.n_layers):
            p = f"model.layers.{i}."
            self.store.add(f"l{i}.ln1", w[p + "input_layernorm.weight"].astype(f))
            self.store.add(f"l{i}.ln2", w[p + "post_attention_layernorm.weight"].astype(f))
            qkv = np.concatenate([w[p + f"self_attn.{n}_proj.weight"] for n in "qkv"], axis=0)
            self._linear(f"l{i}.qkv", qkv, [p + f"self_attn.{n}_proj.weight" for n in "qkv"])
            if a.qkv_bias:
                b = np.concatenate([w[p + f"self_attn.{n}_proj.bias"] for n in "qkv"])
                self.store.add(f"l{i}.qkv_b", b.astype(f))
            if a.qk_norm:
                self.store.add(f"l{i}.q_norm", w[p + "self_attn.q_norm.weight"].astype(f))
                self.store.add(f"l{i}.k_norm", w[p + "self_attn.k_norm.weight"].astype(f))
            self._linear(f"l{i}.o", w[p + "self_attn.o_proj.weight"], p + "self_attn.o_proj.weight")
            gate_up = np.concatenate([w[p + "mlp.gate_proj.weight"], w[p + "mlp.up_proj.weight"]])
            self._linear(f"l{i}.gate_up", gate_up, [p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight"])
            self._linear(f"l{i}.down", w[p + "mlp.down_proj.weight"], p + "mlp.down_proj.weight")
        cos, sin = self.arch.rope_tables()
        self.store.add("rope_cos", cos.astype(f))  # [max_pos, D]
        self.store.add("rope_sin", sin.astype(f))

    def _linear(self, name: str, w_out_in: np.ndarray, hf_names, tied: bool = False) -> None:
        """Store one linear layer; record the weights the graph really uses as the reference."""
        hf_names = [hf_names] if isinstance(hf_names, str) else hf_names
        bits = self._bits(name)
        if bits:
            codes, scales, zero_points, used = (quantize_int8 if bits == 8 else quantize_int4)(
                w_out_in, self.opts.int4_block_size)
            self.store.add(f"{name}.q{bits}", codes)
            self.store.add(name + ".scales", scales)
            self.store.add(name + ".zp", zero_points)
        elif tied:
            used = w_out_in.astype(self.dtype)  # Gemm(transB=1) on the embedding table itself
        else:
            self.store.add(name, np.ascontiguousarray(w_out_in.T).astype(self.dtype))  # [in, out]
            used = w_out_in.astype(self.dtype)
        rows = 0
        for n in hf_names:
            k = self._ref_rows(n)
            self.reference[n] = used[rows: rows + k].astype(np.float32)
            rows += k

    def _bits(self, name: str) -> int:
        """Weight bits of a linear layer in MatMulNBits, 0 = float. int4 precision: 4 for every
        layer; the LM head (it decides every token; on SmolLM2-135M an int4 one made greedy output
        loop) 8 bits — decode streams it whole every token (in fp32 it was 113 of the default
        model's 180 MB per step) and the default GGUF stores it as Q8_0 anyway — unless
        int4_lm_head (4) or not int8_lm_head (float). 8 bits only with int8 activations: ORT's
        8-bit kernel with fp32 activations was 100x slower here."""
        if self.opts.precision != "int4":
            return 0
        if name != "lm_head" or self.opts.int4_lm_head:
            return 4
        return 8 if self.opts.int8_lm_head and self.opts.int4_accuracy_level == 4 else 0

    def _ref_rows(self, hf_name: str) -> int:
        a = self.arch
        if "q_proj" in hf_name:
            return a.n_heads * a.head_dim
        if "k_proj" in hf_name or "v_proj" in hf_name:
            return a.n_kv_heads * a.head_dim
        if "gate_proj" in hf_name or "up_proj" in hf_name:
            return a.intermediate_size
        if "lm_head" in hf_name:
            return a.vocab_size
        return a.hidden_size

    # ---- ops ------------------------------------------------------------------------------------
    def _matmul(self, b: _Builder, x: str, name: str, n_in: int, n_out: int) -> str:
        bits = self._bits(name)
        if bits:
            return b.op("MatMulNBits", [x, b.weight(f"{name}.q{bits}"), b.weight(name + ".scales"),
                                        b.weight(name + ".zp")],
                        name + "/MatMulNBits", domain="com.microsoft", K=n_in, N=n_out, bits=bits,
                        block_size=self.opts.int4_block_size,
                        accuracy_level=self.opts.int4_accuracy_level)
        if name == "lm_head" and self.arch.tie_word_embeddings:
            return b.op("Gemm", [x, b.weight("embed")], "lm_head/Gemm", transB=1)
        return b.op("MatMul", [x, b.weight(name)], name + "/MatMul")

    def _rms_norm(self, b: _Builder, x: str, weight: str, name: str, eps_name: str) -> str:
        # y = x / sqrt(mean(x^2) + eps) * w  (the pattern ORT fuses into SimplifiedLayerNormalization)
        sq = b.op("Pow", [x, "two"], name + "/Pow")
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

    def _finish(self, b: _Builder, n_layers: int, new_rows: list[str], logits: str, hidden: str, n_logits: int,
                extra_inputs: list, weights_location: str, offsets: dict[str, int],
                locations: dict[str, tuple[str, int]] | None = None, extra_outputs: list | None = None
                ) -> onnx.ModelProto:
        """Outputs logits [1, T, n_logits], new_kv [L, 2, T, Hkv*D], hidden [1, T, H]; the model.
        locations: weights kept in another file (name -> (file, offset, array))."""
        a = self.arch
        f = self.dtype
        L, kv_w = n_layers, a.n_kv_heads * a.head_dim
        if f != np.float32:
            logits = b.op("Cast", [logits], "/logits/Cast", to=TensorProto.FLOAT)
        kv = b.op("Concat", new_rows, "/new_kv/Concat", axis=0)  # [2L, T, Hkv*D]
        b.nodes.append(helper.make_node("Reshape", [kv, b.const("shape_new_kv", np.array(
            [L, 2, -1, kv_w], np.int64))], ["new_kv"], name="/new_kv/Reshape"))
        b.nodes.append(helper.make_node("Reshape", [logits, b.const("shape_logits", np.array(
            [1, -1, n_logits], np.int64))], ["logits"], name="/logits/Reshape"))
        b.nodes.append(helper.make_node("Reshape", [hidden, b.const("shape_hidden", np.array(
            [1, -1, a.hidden_size], np.int64))], ["hidden"], name="/hidden/Reshape"))

        kv_type = _NP_TO_ONNX[f]
        T = "T"
        inputs = [helper.make_tensor_value_info("input_ids", TensorProto.INT64, [1, T]),
                  helper.make_tensor_value_info("positions", TensorProto.INT64, [1, T]),
                  helper.make_tensor_value_info("past_len", TensorProto.INT64, [1])] + extra_inputs
        if self.opts.trees:
            inputs.append(helper.make_tensor_value_info("tree_mask", TensorProto.INT64, [T, T]))
        for i in range(L):
            inputs += [helper.make_tensor_value_info(f"past_key_{i}", kv_type, ["S", kv_w]),
                       helper.make_tensor_value_info(f"past_value_{i}", kv_type, ["S", kv_w])]
        outputs = [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, T, n_logits]),
                   helper.make_tensor_value_info("new_kv", kv_type, [L, 2, T, kv_w]),
                   helper.make_tensor_value_info("hidden", kv_type, [1, T, a.hidden_size])] + (extra_outputs or [])
        inits = []
        locations = locations or {}
        for name in sorted(b.used_weights):
            if name in locations:  # (file, offset, array of the same dtype and shape)
                file, offset, arr = locations[name]
            else:
                file, offset, arr = weights_location, offsets[name], self.store.arrays[name]
            t = TensorProto(name=name, data_type=_NP_TO_ONNX[arr.dtype], dims=arr.shape)
            t.data_location = TensorProto.EXTERNAL
            for key, val in (("location", file), ("offset", str(offset)), ("length", str(arr.nbytes))):
                entry = t.external_data.add()
                entry.key, entry.value = key, val
            inits.append(t)
        graph = helper.make_graph(b.nodes, "edgespec_decoder", inputs, outputs, initializer=b.consts + inits)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET),
                                                        helper.make_opsetid("com.microsoft", 1)],
                                  producer_name="edgespec")
        model.ir_version = 8
        return model

    def build(self, weights_location: str, offsets: dict[str, int]) -> onnx.ModelProto:
        """The model graph (T symbolic); initializers point into the shared weights file.

        The cache window fed as past_key/past_value must cover the new rows: S >= past_len + T.
        """
        a = self.arch
        b = _Builder(self.store, self.dtype)
        slots, mask, cos, sin = self._prologue(b)
        ids = b.op("Reshape", ["input_ids", "shape_T"], "/ids_flat")
        x = b.op("Gather", [b.weight("embed"), ids], "/embed/Gather", axis=0)  # [T, H]
        two_rows = "two_rows" in slots  # the residual stream carries max(T, 2) rows, the extra one zeros

        def real_rows(y: str, name: str) -> str:
            return b.op("Slice", [y, "zero_1", slots["t_len"], "zero_1"], name) if two_rows else y

        if two_rows:
            x = b.op("Pad", [x, slots["two_rows"]], "/two_rows/embed")
        new_rows, aux = [], []
        for i in range(self.n_layers):
            if i in self.opts.aux_layers:
                aux.append(real_rows(x, f"/hidden_aux/rows{i}"))
            x, rows = self._layer(b, i, x, cos, sin, mask, slots)
            new_rows += rows
        x = real_rows(x, "/two_rows/out")
        hidden = self._rms_norm(b, x, "final_norm", "/final_norm", "eps")  # [T, H]
        logits = self._matmul(b, hidden, "lm_head", a.hidden_size, a.vocab_size)  # [T, V]
        extra_out = []
        if aux:
            n_aux = len(aux) * a.hidden_size
            cat = b.op("Concat", aux, "/hidden_aux/Concat", axis=-1)  # [T, n*H]
            b.nodes.append(helper.make_node("Reshape", [cat, b.const("shape_aux", np.array([1, -1, n_aux], np.int64))],
                                            ["hidden_aux"], name="/hidden_aux/Reshape"))
            extra_out.append(helper.make_tensor_value_info("hidden_aux", _NP_TO_ONNX[self.dtype], [1, "T", n_aux]))
        return self._finish(b, self.n_layers, new_rows, logits, hidden, a.vocab_size, [], weights_location, offsets,
                            extra_outputs=extra_out)


def one_row_int4_differs(block_size: int = 32, accuracy_level: int = 4, k: int = 576, n: int = 256) -> bool:
    """Does this CPU's ONNX Runtime compute a 1-row int4 MatMulNBits differently from the same row
    inside a wider call? (ORT 1.32 on the AVX2-only EPYC of stop 15: yes, by ~1e-6, which flips
    greedy tokens after a while; on the CPUs of earlier stops: no, their parity test passed.)
    Random weights and rows, a few tries."""
    from edgespec.engines.ort import model_session

    rng = np.random.default_rng(0)
    codes, scales, zp, _ = quantize_int4(rng.standard_normal((n, k)).astype(np.float32), block_size)
    node = helper.make_node("MatMulNBits", ["x", "w", "s", "z"], ["y"], domain="com.microsoft", K=k, N=n, bits=4,
                            block_size=block_size, accuracy_level=accuracy_level)
    inits = [helper.make_tensor(name, _NP_TO_ONNX[a.dtype], a.shape, a.tobytes(), raw=True)
             for name, a in (("w", codes), ("s", scales), ("z", zp))]
    graph = helper.make_graph([node], "probe", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["M", k])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["M", n])], initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET),
                                                    helper.make_opsetid("com.microsoft", 1)])
    sess = model_session(model.SerializeToString())
    x = rng.standard_normal((8, k)).astype(np.float32)
    wide = sess.run(None, {"x": x})[0]
    return any(not np.array_equal(sess.run(None, {"x": x[i:i + 1]})[0][0], wide[i]) for i in range(len(x)))
