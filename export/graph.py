"""Static-shape ONNX graphs for Llama-family decoders, written op by op with onnx.helper.

Why by hand and not torch.onnx: the graph is small and regular, and writing it directly gives
exact control over the ops each phase runs (the kernel path decides decode/verify parity) and one
shared weights file. PyTorch stays the reference: the exporter checks every graph against the
Hugging Face model. Two flavours share the weights, the I/O and this writer: portable
(portable_graph.py: standard ops, TensorRT takes it) and lean (lean_graph.py: ONNX Runtime's
fused ops where they keep the rule, 26 nodes per layer instead of 62).

The "delta" form of docs/design.md. One graph per model serves every phase: its token axis T is
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
heads into one 2-D Gemm (portable_graph.PortableLayers._attention).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
from onnx import TensorProto, helper

from edgespec.export.arch import ArchSpec
from edgespec.export.lean_graph import LEAN_OPSET, LeanLayers, host_prologue_inputs
from edgespec.export.portable_graph import PortableLayers
from edgespec.export.quant import quantize_int4, quantize_int8

OPSET = 17

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
    flavour: str = "portable"  # "portable": standard ONNX ops (TensorRT parses it); "lean": ORT contrib ops
    #                            where they keep the rule, fewer nodes per layer (lean_graph.py)
    portable_ops: tuple[str, ...] = ()  # lean: fused ops written in their portable form instead (the
    #                                     export's probe found they break the rule here, or forced): any of
    #                                     lean_graph.LEAN_OPS
    host_prologue: bool = False  # lean target/draft graphs: the per-call masks and indices come in as inputs
    #                              the engine builds (lean_graph.host_prologue_inputs), no shape arithmetic in
    #                              the graph, so ONNX Runtime's CUDA graphs can capture it; heads keep theirs


class WeightStore:
    """Named numpy arrays shared by all graphs of one model (written once as external data)."""

    def __init__(self) -> None:
        self.arrays: dict[str, np.ndarray] = {}

    def add(self, name: str, arr: np.ndarray) -> str:
        if name not in self.arrays:
            self.arrays[name] = np.ascontiguousarray(arr)
        return name


def external_initializers(names, store: WeightStore, weights_location: str, offsets: dict[str, int],
                          locations: dict[str, tuple[str, int, np.ndarray]] | None = None) -> list[TensorProto]:
    """Initializers of the named weights, each pointing at its bytes in a weights file: the model's
    own (`offsets` into `weights_location`) or another model's (`locations`: name -> (file,
    offset, array of the same dtype and shape))."""
    inits = []
    for name in sorted(names):
        file, offset, arr = (locations or {}).get(name) or (weights_location, offsets[name], store.arrays[name])
        t = TensorProto(name=name, data_type=_NP_TO_ONNX[arr.dtype], dims=arr.shape)
        t.data_location = TensorProto.EXTERNAL
        for key, val in (("location", file), ("offset", str(offset)), ("length", str(arr.nbytes))):
            entry = t.external_data.add()
            entry.key, entry.value = key, val
        inits.append(t)
    return inits


class _Builder:
    def __init__(self, store: WeightStore, dtype: np.dtype) -> None:
        self.nodes: list[onnx.NodeProto] = []
        self.consts: list[onnx.TensorProto] = []
        self.store = store
        self.used_weights: set[str] = set()
        self.dtype = dtype
        self._n = 0
        self._const_names: set[str] = set()

    def op(self, op_type: str, inputs: list[str], name: str, n_out: int = 1, domain: str = "", **attrs):
        self._n += 1
        outs = [f"{name}_out{i}" if n_out > 1 else f"{name}_out" for i in range(n_out)]
        self.nodes.append(helper.make_node(op_type, inputs, outs, name=name, domain=domain or None,
                                           **attrs))
        return outs if n_out > 1 else outs[0]

    def const(self, name: str, arr: np.ndarray) -> str:
        """A constant initializer, added once per name (layers share them)."""
        if name in self._const_names:
            return name
        self._const_names.add(name)
        self.consts.append(helper.make_tensor(name, _NP_TO_ONNX[arr.dtype], arr.shape,
                                              arr.flatten().tolist()))
        return name

    def weight(self, name: str) -> str:
        self.used_weights.add(name)
        return name


class LlamaGraphWriter(PortableLayers, LeanLayers):
    """Builds phase graphs for one model whose weights come as HF-named numpy arrays [out, in]."""

    def __init__(self, arch: ArchSpec, hf_weights: dict[str, np.ndarray], opts: GraphOptions,
                 n_layers: int | None = None) -> None:
        self.arch = arch
        self.opts = opts
        self.n_layers = n_layers or arch.n_layers  # fewer layers: a self-speculative draft
        self.lean = opts.flavour == "lean"
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
        self._rope_tables()

    def _rope_tables(self) -> None:
        """The cos/sin tables this flavour's graphs read (only those: they go into the weights file)."""
        if self.lean:
            return self._lean_tables()
        cos, sin = self.arch.rope_tables()
        self.store.add("rope_cos", cos.astype(self.dtype))  # [max_pos, D]
        self.store.add("rope_sin", sin.astype(self.dtype))

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
            if self.lean:  # Gemm takes 2-D rows
                x = b.op("Reshape", [x, b.const("shape_hidden_rows", np.array([-1, n_in], np.int64))], "lm_head/rows")
            return b.op("Gemm", [x, b.weight("embed")], "lm_head/Gemm", transB=1)
        return b.op("MatMul", [x, b.weight(name)], name + "/MatMul")

    # ---- graph ---------------------------------------------------------------------------------
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
        inits = external_initializers(b.used_weights, self.store, weights_location, offsets, locations)
        graph = helper.make_graph(b.nodes, "edgespec_decoder", inputs, outputs, initializer=b.consts + inits)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", self.opset()),
                                                        helper.make_opsetid("com.microsoft", 1)],
                                  producer_name="edgespec")
        model.ir_version = 8
        return model

    def opset(self) -> int:
        """The default-domain opset of this writer's graphs."""
        return LEAN_OPSET if self.lean else OPSET

    def build(self, weights_location: str, offsets: dict[str, int]) -> onnx.ModelProto:
        """The model graph (T symbolic); initializers point into the shared weights file.

        The cache window fed as past_key/past_value must cover the new rows: S >= past_len + T.
        """
        if self.lean:
            return self._build_lean(weights_location, offsets)
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

    def _build_lean(self, weights_location: str, offsets: dict[str, int]) -> onnx.ModelProto:
        """build() in the lean flavour: the stream [1, T, H], each sublayer's output added by the
        next norm."""
        a = self.arch
        b = _Builder(self.store, self.dtype)
        host = self.opts.host_prologue
        ctx = self._lean_prologue(b, host=host)
        extra_in = [helper.make_tensor_value_info(name, _NP_TO_ONNX[np.dtype(dt)], list(shape))
                    for name, shape, dt in host_prologue_inputs(a.n_heads, self.dtype.name, self.opts.trees,
                                                                "two_rows" in ctx)] if host else []
        x = b.op("Gather", [b.weight("embed"), "input_ids"], "/embed/Gather", axis=0)  # [1, T, H]
        two_rows = "two_rows" in ctx

        def real_rows(y: str, name: str) -> str:
            return b.op("Slice", [y, "zero_1", ctx["t_len"], "axis1"], name) if two_rows else y

        if two_rows:
            x = b.op("Pad", [x, ctx["two_rows"]], "/two_rows/embed")
        delta, new_rows, aux = None, [], []
        for i in range(self.n_layers):
            if i in self.opts.aux_layers:  # the stream entering layer i, summed here
                if delta is not None:
                    x, delta = b.op("Add", [x, delta], f"/hidden_aux/sum{i}"), None
                aux.append(real_rows(x, f"/hidden_aux/rows{i}"))
            x, delta, rows = self._lean_layer(b, i, x, delta, ctx)
            new_rows += rows
        hidden, _ = self._lean_norm(b, x, delta, "final_norm", "/final_norm")
        hidden = real_rows(hidden, "/two_rows/out")  # [1, T, H]
        logits = self._matmul(b, hidden, "lm_head", a.hidden_size, a.vocab_size)
        extra_out = []
        if aux:
            n_aux = len(aux) * a.hidden_size
            cat = b.op("Concat", aux, "/hidden_aux/Concat", axis=-1)  # [1, T, n*H]
            b.nodes.append(helper.make_node("Reshape", [cat, b.const("shape_aux", np.array([1, -1, n_aux], np.int64))],
                                            ["hidden_aux"], name="/hidden_aux/Reshape"))
            extra_out.append(helper.make_tensor_value_info("hidden_aux", _NP_TO_ONNX[self.dtype], [1, "T", n_aux]))
        return self._finish(b, self.n_layers, new_rows, logits, hidden, a.vocab_size, extra_in, weights_location,
                            offsets, extra_outputs=extra_out)


def one_row_int4_differs(block_size: int = 32, accuracy_level: int = 4, k: int = 576, n: int = 256) -> bool:
    """Does this CPU's ONNX Runtime compute a 1-row int4 MatMulNBits differently from the same row
    inside a wider call? (ORT 1.32 on an AVX2-only EPYC: yes, by ~1e-6, which flips greedy tokens
    after a while; on an AVX-512 EPYC: no; docs/results/two-row-decode.md.)
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
