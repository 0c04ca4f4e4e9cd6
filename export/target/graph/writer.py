"""The decoder graph writer (target and draft): ModelWriter, each model declared once (its weights in
`_prepare`, its graph in `build` on the flavour's layer ops), and LlamaGraphWriter, the Llama-family decoder."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper

from edgespec.export.target.arch import ArchSpec
from edgespec.export.target.graph.builder import (
    NP_TO_ONNX,
    OPSET,
    GraphBuilder,
    GraphOptions,
    _axes_as_attributes,
    external_initializers,
)
from edgespec.export.target.graph.layer_ops import LayerOps, Stream
from edgespec.export.target.graph.lean import IntegerOps, LeanOps
from edgespec.export.target.graph.portable import PortableOps
from edgespec.export.target.graph.store import WeightStore
from edgespec.export.target.quant.blocks import Blocks, CheckpointWeights
from edgespec.export.target.quant.linears import Part
from edgespec.export.target.quant.row_linears import linears_class

FLAVOURS: dict[str, type[LayerOps]] = {
    "portable": PortableOps,
    "lean": LeanOps,  # GraphOptions.flavour -> ops
    "integer": IntegerOps,
}


class ModelWriter:
    """One model's weights (HF-named numpy arrays [out, in] in, a WeightStore out) and graph.
    Subclasses declare `_prepare` (the weights) and `build` (the graph, on `layer_ops()`)."""

    def __init__(
        self, arch: ArchSpec, hf_weights: dict[str, np.ndarray], opts: GraphOptions, n_layers: int | None = None
    ) -> None:
        self.arch = arch
        self.opts = opts
        self.n_layers = n_layers or arch.n_layers  # fewer layers: a self-speculative draft
        self.dtype = np.dtype(np.float16 if opts.precision == "fp16" else np.float32)
        self.store = WeightStore()
        self.half_cache = False  # build's graph also reads an fp16 cache (the row kernel's attention)
        self.linears = linears_class(FLAVOURS[opts.flavour].LINEARS, opts)(opts, self.dtype, self.store)
        # Reference weights: what the exported graphs compute with (int4: dequantized), so the
        # exporter can validate ONNX vs PyTorch at tight tolerance.
        self.reference: dict[str, np.ndarray] = {}
        self.checkpoint = hf_weights
        self._prepare(hf_weights)

    @property
    def lean(self) -> bool:
        """The lean flavour's layers (or a flavour built on them)."""
        return issubclass(FLAVOURS[self.opts.flavour], LeanOps)

    def layer_ops(self) -> LayerOps:
        """The op choices of this writer's flavour (its current opts)."""
        return FLAVOURS[self.opts.flavour](self.arch, self.opts, self.dtype, self.linears)

    def _prepare(self, w: dict[str, np.ndarray]) -> None:
        raise NotImplementedError

    def _linear(self, name: str, w_out_in: np.ndarray, hf_names, tied: bool = False) -> None:
        """Store one linear layer; record the weights the graph really uses as the reference. Where
        the checkpoint holds quantized blocks of its weights (CheckpointWeights), the linears may
        keep them exactly."""
        hf_names = [hf_names] if isinstance(hf_names, str) else hf_names
        q = self.checkpoint.quantized if isinstance(self.checkpoint, CheckpointWeights) else None
        parts = tuple(
            Part(n, self._ref_rows(n), q.types.get(n, "float"), q.blocks.get(n), q.not_kept.get(n, ""))
            if q
            else Part(n, 0, "float")
            for n in hf_names
        )  # rows: only a kept linear splits by them (a float checkpoint's are not needed)
        used = self.linears.store_linear(name, w_out_in, tied, parts=parts)
        rows = 0
        for n in hf_names:
            k = self._ref_rows(n)
            self.reference[n] = used[rows : rows + k].astype(np.float32)
            rows += k

    def _embedding_blocks(self, table: np.ndarray) -> Blocks | None:
        """The checkpoint's own quantized blocks of the embedding table (the float32 `table` the
        writer read), where they dequantize to it bitwise (CheckpointWeights); else None."""
        q = self.checkpoint.quantized if isinstance(self.checkpoint, CheckpointWeights) else None
        return q.blocks.get("model.embed_tokens.weight") if q else None

    def _ref_rows(self, hf_name: str) -> int:
        a = self.arch
        if "qkv_proj" in hf_name:  # Phi-3's fused q/k/v
            return (a.n_heads + 2 * a.n_kv_heads) * a.head_dim
        if "gate_up_proj" in hf_name:  # Phi-3's fused gate/up
            return 2 * a.intermediate_size
        if "q_proj" in hf_name:
            return a.n_heads * a.head_dim
        if "k_proj" in hf_name or "v_proj" in hf_name:
            return a.n_kv_heads * a.head_dim
        if "gate_proj" in hf_name or "up_proj" in hf_name:
            return a.intermediate_size
        if "lm_head" in hf_name:
            return a.vocab_size
        return a.hidden_size

    def _model(
        self,
        b: GraphBuilder,
        graph_name: str,
        inputs: list,
        outputs: list,
        weights_location: str,
        offsets: dict[str, int],
        locations: dict[str, tuple[str, int, np.ndarray]] | None = None,
        opset: int = OPSET,
    ) -> onnx.ModelProto:
        """The model of b's nodes; initializers point into the weights file (or another model's:
        locations)."""
        inits = external_initializers(b.used_weights, self.store, weights_location, offsets, locations)
        if opset < 18:
            _axes_as_attributes(b)
        graph = helper.make_graph(b.nodes, graph_name, inputs, outputs, initializer=b.consts + inits)
        model = helper.make_model(
            graph,
            opset_imports=[helper.make_opsetid("", opset), helper.make_opsetid("com.microsoft", 1)]
            + [helper.make_opsetid(d, 1) for d in sorted({n.domain for n in b.nodes} - {"", "com.microsoft"})],
            producer_name="edgespec",
        )
        model.ir_version = 8
        return model

    def _token_model(
        self,
        ops: LayerOps,
        b: GraphBuilder,
        *,
        n_layers: int,
        new_rows: list[str],
        logits: str,
        hidden: str,
        n_logits: int,
        weights_location: str,
        offsets: dict[str, int],
        extra_inputs: list | None = None,
        extra_outputs: list | None = None,
        locations: dict[str, tuple[str, int, np.ndarray]] | None = None,
        top_k: int = 0,
    ) -> onnx.ModelProto:
        """A token graph (graph I/O above): outputs logits [1, T, n_logits], new_kv [L, 2, T, Hkv*D],
        hidden [1, T, H]; with top_k also topk_ids [1, T, top_k] int64 and topk_probs [1, T, top_k]
        float32 (`_top_k`)."""
        a = self.arch
        f = self.dtype
        L, kv_w = n_layers, a.n_kv_heads * a.head_dim
        if f != np.float32:
            logits = b.op("Cast", [logits], "/logits/Cast", to=TensorProto.FLOAT)
        kv = b.op("Concat", new_rows, "/new_kv/Concat", axis=0)  # [2L, T, Hkv*D]
        _reshaped_output(b, kv, "new_kv", "shape_new_kv", [L, 2, -1, kv_w])
        _reshaped_output(b, logits, "logits", "shape_logits", [1, -1, n_logits])
        _reshaped_output(b, hidden, "hidden", "shape_hidden", [1, -1, a.hidden_size])
        inputs, outputs = self._token_io(L, n_logits, ops.half_cache)
        inputs[3:3] = extra_inputs or []  # after input_ids, positions, past_len
        outputs += extra_outputs or []
        if top_k:
            outputs += _top_k(b, top_k)
        return self._model(b, "edgespec_decoder", inputs, outputs, weights_location, offsets, locations, ops.OPSET)

    def _token_io(self, n_layers: int, n_logits: int, half_cache: bool) -> tuple[list, list]:
        """A token graph's own inputs (ids, positions, past_len, tree_mask, each layer's cache and
        with half_cache its fp16 copy) and outputs (logits, new_kv, hidden), in graph order."""
        kv_type, kv_w, T = NP_TO_ONNX[self.dtype], self.arch.n_kv_heads * self.arch.head_dim, "T"
        inputs = [
            helper.make_tensor_value_info("input_ids", TensorProto.INT64, [1, T]),
            helper.make_tensor_value_info("positions", TensorProto.INT64, [1, T]),
            helper.make_tensor_value_info("past_len", TensorProto.INT64, [1]),
        ]
        if self.opts.trees:
            inputs.append(helper.make_tensor_value_info("tree_mask", TensorProto.INT64, [T, T]))
        for i in range(n_layers):
            inputs += [
                helper.make_tensor_value_info(f"past_key_{i}", kv_type, ["S", kv_w]),
                helper.make_tensor_value_info(f"past_value_{i}", kv_type, ["S", kv_w]),
            ]
        for i in range(n_layers) if half_cache else ():
            inputs += [
                helper.make_tensor_value_info(f"past_key_f16_{i}", TensorProto.FLOAT16, ["S16", kv_w]),
                helper.make_tensor_value_info(f"past_value_f16_{i}", TensorProto.FLOAT16, ["S16", kv_w]),
            ]
        outputs = [
            helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, T, n_logits]),
            helper.make_tensor_value_info("new_kv", kv_type, [n_layers, 2, T, kv_w]),
            helper.make_tensor_value_info("hidden", kv_type, [1, T, self.arch.hidden_size]),
        ]
        return inputs, outputs


def _reshaped_output(b: GraphBuilder, x: str, out: str, shape_name: str, shape: list[int]) -> None:
    """The graph output `out`: x reshaped to `shape` (a constant named shape_name)."""
    node = helper.make_node(
        "Reshape", [x, b.const(shape_name, np.array(shape, np.int64))], [out], name=f"/{out}/Reshape"
    )
    b.nodes.append(node)


def _top_k(b: GraphBuilder, k: int) -> list:
    """The k most likely next tokens of every row and their probabilities, as outputs read off the
    finished `logits` output: TopK over the logits themselves (largest first; of equal logits the
    lower id first, as ONNX specifies, so topk_ids[..., 0] is the row's first maximum, numpy's argmax:
    the greedy verify accepts from it), topk_ids [1, T, k] int64, and their probabilities
    exp(l - max - log(sum(exp(row - max)))), topk_probs [1, T, k] float32 (the row's max is TopK's first
    value: one V-wide Add, Exp and ReduceSum, no V-wide divide). A Softmax before the TopK would round
    near ties to one probability and could rank a lower id first. Consumers of a graph output leave
    how it is computed alone, so the logits are the same bits with or without them
    (tests/test_recycle.py)."""
    k_in = b.const("top_k", np.array([k], np.int64))
    values = "/topk/values"  # [1, T, k] the top logits, largest first
    b.nodes.append(helper.make_node("TopK", ["logits", k_in], [values, "topk_ids"], name="/topk/TopK", axis=-1))
    zero, one = b.const("topk_zero", np.array([0], np.int64)), b.const("topk_one", np.array([1], np.int64))
    last = b.const("topk_last_axis", np.array([-1], np.int64))
    # x - y written x + (-y) (the same bits): a --host-prologue graph has no Sub (tests take it for shape arithmetic)
    neg_top = b.op("Neg", [b.op("Slice", [values, zero, one, last], "/topk/Max")], "/topk/NegMax")  # [1, T, 1]
    shifted = b.op("Exp", [b.op("Add", ["logits", neg_top], "/topk/Shift")], "/topk/Exp")  # [1, T, V] in (0, 1]
    log_sum = b.op("Log", [b.op("ReduceSum", [shifted, last], "/topk/Sum", keepdims=1)], "/topk/LogSum")  # [1, T, 1]
    top_shifted = b.op("Add", [values, neg_top], "/topk/ShiftTop")  # [1, T, k]
    log_p = b.op("Add", [top_shifted, b.op("Neg", [log_sum], "/topk/NegLogSum")], "/topk/LogProbs")
    b.nodes.append(helper.make_node("Exp", [log_p], ["topk_probs"], name="/topk/Probs"))
    return [
        helper.make_tensor_value_info("topk_ids", TensorProto.INT64, [1, "T", k]),
        helper.make_tensor_value_info("topk_probs", TensorProto.FLOAT, [1, "T", k]),
    ]


def _times(ops: LayerOps, b: GraphBuilder, x: str, factor: float, const: str, name: str) -> str:
    """x times a scalar (Granite's multipliers: an elementwise Mul, the same for every row), the
    constant named `const`; x itself for 1.0."""
    if factor == 1.0:
        return x
    return b.op("Mul", [x, b.const(const, np.array(factor, ops.dtype))], name)


def decoder_layer(
    ops: LayerOps, b: GraphBuilder, i: int, s: Stream, ctx: dict, ln1: bool = True, entering: list | None = None
) -> tuple[Stream, list[str]]:
    """One pre-norm decoder layer on the stream; returns (the stream, [k rows, v rows]). `entering`
    (a list) receives the stream entering the layer: taken from the input norm's own sum output, so a
    graph that outputs it computes bitwise what one without it does."""
    p = f"/layers.{i}"
    if ln1:
        h, s = ops.norm(b, s, f"l{i}.ln1", p + "/ln1")
    else:
        s = ops.resolve(b, s, p + "/res2")
        h = s.x
    if entering is not None:
        entering.append(s.x)
    r = ops.arch.residual_multiplier
    attn, k, v = ops.attention(b, i, h, ops.layer_ctx(ctx, i))
    if ops.arch.sandwich_norms:  # Gemma 3: the sublayer's output normed before it joins the stream
        attn = ops.norm(b, Stream(attn), f"l{i}.post_attn", p + "/post_attn_norm")[0]
    s = ops.add(b, s, _times(ops, b, attn, r, "residual_multiplier", p + "/res1_mult"), p + "/res1")
    h, s = ops.norm(b, s, f"l{i}.ln2", p + "/ln2")
    mlp = ops.mlp(b, i, h, p + "/mlp")
    if ops.arch.sandwich_norms:
        mlp = ops.norm(b, Stream(mlp), f"l{i}.post_mlp", p + "/post_mlp_norm")[0]
    s = ops.add(b, s, _times(ops, b, mlp, r, "residual_multiplier", p + "/res2_mult"), p + "/res2")
    return s, ops.kv_rows(b, k, v, p)


class LlamaGraphWriter(ModelWriter):
    """The target (or draft) decoder: one graph for every phase width."""

    def _prepare(self, w: dict[str, np.ndarray]) -> None:
        a = self.arch
        f = self.dtype

        def norm(name: str, hf_name: str) -> None:  # Gemma's (1 + w) folded into the stored weight (float32 sum)
            off = a.norm_weight_offset
            self.store.add(name, (w[hf_name] + np.float32(off) if off else w[hf_name]).astype(f))

        norm("final_norm", "model.norm.weight")
        lm_head = w.get("lm_head.weight", w["model.embed_tokens.weight"])
        self._linear("lm_head", lm_head, "lm_head.weight", tied=a.tie_word_embeddings)
        del lm_head  # a streamed checkpoint's table is read again below, not held twice
        # [V, H]: the tied head's blocks where they are its rows, else the table's own blocks where the
        # lookup reads their rows bitwise (the row kernel), else "embed" (fp16 / bf16 where exact)
        self.linears.store_embedding(w["model.embed_tokens.weight"], a.tie_word_embeddings, self._embedding_blocks)
        for i in range(self.n_layers):
            p = f"model.layers.{i}."
            norm(f"l{i}.ln1", p + "input_layernorm.weight")
            if a.sandwich_norms:  # Gemma 3: post_attention_layernorm is the attention output's norm
                norm(f"l{i}.ln2", p + "pre_feedforward_layernorm.weight")
                norm(f"l{i}.post_attn", p + "post_attention_layernorm.weight")
                norm(f"l{i}.post_mlp", p + "post_feedforward_layernorm.weight")
            else:
                norm(f"l{i}.ln2", p + "post_attention_layernorm.weight")
            if p + "self_attn.qkv_proj.weight" in w:  # Phi-3: q, k, v rows already packed in this order
                self._linear(f"l{i}.qkv", w[p + "self_attn.qkv_proj.weight"], p + "self_attn.qkv_proj.weight")
            else:
                qkv = np.concatenate([w[p + f"self_attn.{n}_proj.weight"] for n in "qkv"], axis=0)
                self._linear(f"l{i}.qkv", qkv, [p + f"self_attn.{n}_proj.weight" for n in "qkv"])
            if a.qkv_bias:
                b = np.concatenate([w[p + f"self_attn.{n}_proj.bias"] for n in "qkv"])
                self.store.add(f"l{i}.qkv_b", b.astype(f))
            if a.qk_norm:
                norm(f"l{i}.q_norm", p + "self_attn.q_norm.weight")
                norm(f"l{i}.k_norm", p + "self_attn.k_norm.weight")
            self._linear(f"l{i}.o", w[p + "self_attn.o_proj.weight"], p + "self_attn.o_proj.weight")
            if p + "mlp.gate_up_proj.weight" in w:  # Phi-3: gate rows then up rows, already packed
                self._linear(f"l{i}.gate_up", w[p + "mlp.gate_up_proj.weight"], p + "mlp.gate_up_proj.weight")
            else:
                gate_up = np.concatenate([w[p + "mlp.gate_proj.weight"], w[p + "mlp.up_proj.weight"]])
                self._linear(f"l{i}.gate_up", gate_up, [p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight"])
            self._linear(f"l{i}.down", w[p + "mlp.down_proj.weight"], p + "mlp.down_proj.weight")
        self.layer_ops().store_tables()

    def embedding_table(self) -> np.ndarray:
        """The embedding table [V, H] the graphs read, in float32: "embed" where stored, else the
        checkpoint's (the tied head's blocks give its rows bitwise: Linears.store_embedding)."""
        if "embed" in self.store.arrays:
            return np.asarray(self.store.arrays["embed"]).astype(np.float32)
        return np.asarray(self.checkpoint["model.embed_tokens.weight"], np.float32)

    def build(self, weights_location: str, offsets: dict[str, int]) -> onnx.ModelProto:
        """The model graph (T symbolic); initializers point into the shared weights file.

        The cache window fed as past_key/past_value must cover the new rows: S >= past_len + T.
        With opts.aux_layers it also outputs hidden_aux [1, T, n*H]: the stream entering those layers.
        """
        a = self.arch
        ops = self.layer_ops()
        # the row kernel's attention reads an fp16 cache too (engines/context.py picks one at load)
        ops.half_cache = self.half_cache = getattr(ops, "row_attention", False) and self.dtype == np.float32
        b = GraphBuilder(self.store, self.dtype)
        ctx = ops.prologue(b)
        x = _times(ops, b, ops.embed(b), a.embedding_multiplier, "embedding_multiplier", "/embed/mult")
        s = Stream(ops.pad_rows(b, ctx, x, "/two_rows/embed"))  # two-row calls: a zero row below
        new_rows, aux = [], []
        for i in range(self.n_layers):
            entering = [] if i in self.opts.aux_layers else None
            s, rows = decoder_layer(ops, b, i, s, ctx, entering=entering)
            if entering:
                aux.append(ops.real_rows(b, ctx, entering[0], f"/hidden_aux/rows{i}"))
            new_rows += rows
        hidden = ops.out_norm(b, ctx, s, "final_norm", "/final_norm")  # [(1,) T, H]
        logits = ops.linear(b, hidden, "lm_head")  # [(1,) T, V]
        if a.logits_scaling != 1.0:  # Granite: a Div, as the model computes it
            scaling = b.const("logits_scaling", np.array(a.logits_scaling, ops.dtype))
            logits = b.op("Div", [logits, scaling], "/logits/scaling")
        extra_out = []
        if aux:
            n_aux = len(aux) * a.hidden_size
            cat = b.op("Concat", aux, "/hidden_aux/Concat", axis=-1)  # [(1,) T, n*H]
            _reshaped_output(b, cat, "hidden_aux", "shape_aux", [1, -1, n_aux])
            extra_out.append(helper.make_tensor_value_info("hidden_aux", NP_TO_ONNX[self.dtype], [1, "T", n_aux]))
        return self._token_model(
            ops,
            b,
            n_layers=self.n_layers,
            new_rows=new_rows,
            logits=logits,
            hidden=hidden,
            n_logits=a.vocab_size,
            weights_location=weights_location,
            offsets=offsets,
            extra_inputs=ops.extra_inputs(),
            extra_outputs=extra_out,
            top_k=self.opts.writes_top_k,
        )
