"""The EAGLE head as a static-shape ONNX graph, built from the same pieces as the decoders.

  inputs   input_ids [1, T] (token_{j+1}), positions [1, T] (j), past_len [1],
           features [1, T, H] (f_j: the target's hidden state, or the head's own prediction),
           past_key_0, past_value_0 [S, Hkv*D] (the head's one layer of KV)
  outputs  logits [1, T, Vd] over the draft vocabulary (map with d2t), new_kv [1, 2, T, Hkv*D],
           hidden [1, T, H] (the predicted feature f^_{j+1}, fed back for the next draft step)
The embedding is the target's: the graph reads it from the target's weights file (one mapped
copy). fc, the layer and the draft-vocabulary LM head rows live in the head's own weights file,
int4 when the target is int4 (a draft only has to be cheap and usually right).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import onnx
from onnx import helper

from edgespec.engines.manifest import FUSED_PREFIX
from edgespec.export.arch import ArchSpec
from edgespec.export.graph import NP_TO_ONNX, GraphBuilder, GraphOptions, ModelWriter, decoder_layer
from edgespec.export.layer_ops import Stream

_LAYER = "layers.0."


class EagleGraphWriter(ModelWriter):
    def __init__(self, target_arch: ArchSpec, head_cfg, arrays: dict[str, np.ndarray], lm_head: np.ndarray,
                 opts: GraphOptions) -> None:
        """head_cfg / arrays: from eagle.read_head (float32, d2t absolute); lm_head [V, H]: the
        target's LM head as its engine computes with it."""
        self.head_cfg = head_cfg
        self.d2t = arrays["d2t"]
        self._lm_rows = lm_head[self.d2t]  # [Vd, H]
        arch = dataclasses.replace(
            target_arch, n_layers=1, n_heads=head_cfg.num_attention_heads, n_kv_heads=head_cfg.num_key_value_heads,
            head_dim=head_cfg.head_dim, intermediate_size=head_cfg.intermediate_size, qkv_bias=False, qk_norm=False)
        super().__init__(arch, arrays, dataclasses.replace(opts, int4_lm_head=True, two_row_matmuls=False), n_layers=1)

    def _prepare(self, w: dict[str, np.ndarray]) -> None:
        f = self.dtype
        self._linear("fc", w["fc.weight"], "fc.weight")  # [H, 2H]: [embed ; feature] -> H
        self.store.add("fc_b", w["fc.bias"].astype(f))
        if self.head_cfg.input_layernorm:
            self.store.add("l0.ln1", w[_LAYER + "input_layernorm.weight"].astype(f))
        self.store.add("l0.ln2", w[_LAYER + "post_attention_layernorm.weight"].astype(f))
        if self.head_cfg.final_norm:
            self.store.add("final_norm", w["norm.weight"].astype(f))
        names = [_LAYER + f"self_attn.{n}_proj.weight" for n in "qkv"]
        self._linear("l0.qkv", np.concatenate([w[n] for n in names]), names)
        self._linear("l0.o", w[_LAYER + "self_attn.o_proj.weight"], _LAYER + "self_attn.o_proj.weight")
        names = [_LAYER + "mlp.gate_proj.weight", _LAYER + "mlp.up_proj.weight"]
        self._linear("l0.gate_up", np.concatenate([w[n] for n in names]), names)
        self._linear("l0.down", w[_LAYER + "mlp.down_proj.weight"], _LAYER + "mlp.down_proj.weight")
        self._linear("lm_head_d", self._lm_rows, "lm_head_d")
        self.layer_ops().store_tables()

    def _ref_rows(self, hf_name: str) -> int:
        if hf_name == "lm_head_d":
            return len(self.d2t)
        return super()._ref_rows(hf_name)

    def build(self, weights_location: str, offsets: dict[str, int],
              embed: tuple[str, int, np.ndarray] | None = None) -> onnx.ModelProto:
        """embed: (file, offset, array) of the target's embedding table [V, H]."""
        H = self.arch.hidden_size
        ops = self.layer_ops()
        b = GraphBuilder(self.store, self.dtype)
        ctx = ops.prologue(b)
        emb = ops.embed(b)
        feat = ops.rows_in(b, "features", H, "/feat_flat")
        x = ops.linear(b, b.op("Concat", [emb, feat], "/fc/Concat", axis=-1), "fc")  # [(1,) T, H]
        x = b.op("Add", [x, b.weight("fc_b")], "/fc/bias")
        s, rows = decoder_layer(ops, b, 0, Stream(x), ctx, ln1=self.head_cfg.input_layernorm)
        if self.head_cfg.final_norm:
            x, _ = ops.norm(b, s, "final_norm", "/final_norm")
        else:
            x = ops.resolve(b, s, "/res2").x
        logits = ops.linear(b, x, "lm_head_d")  # [(1,) T, Vd]
        feats_in = helper.make_tensor_value_info("features", NP_TO_ONNX[self.dtype], [1, "T", H])
        return self._token_model(ops, b, n_layers=1, new_rows=rows, logits=logits, hidden=x, n_logits=len(self.d2t),
                                 weights_location=weights_location, offsets=offsets, extra_inputs=[feats_in],
                                 locations={"embed": embed} if embed else None)


def fuse_with_target(target: onnx.ModelProto, head: onnx.ModelProto) -> onnx.ModelProto:
    """The target graph with the head appended: one call verifies AND catches the head up.

    Head row t is the pair (f_t, token after t) at target row t's own position, so the head shares
    the target's positions, past_len and tree_mask and its KV stays aligned with the target's:
      f_t        the target's `hidden` output of row t
      token      eagle/input_ids[t] for t < eagle/n_given (a prefill chunk: the prompt's next tokens),
                 else argmax(logits_t). Greedy: for every accepted row and for the first rejected one
                 (or the bonus row) that IS the next token, so after committing rows 0..n_acc the head
                 is caught up, and row n_acc's logits draft d_1 of the next step with no head call.
    The head's names are prefixed with FUSED_PREFIX; its inputs become eagle/input_ids [1, T],
    eagle/n_given [1] and eagle/past_key_0, eagle/past_value_0 [S, Hkv*D]; its outputs
    eagle/logits [1, T, Vd], eagle/new_kv [1, 2, T, Hkv*D] and eagle/hidden [1, T, H]. The target's
    ops are untouched (its outputs must stay bitwise those of the plain graph: the exporter checks)."""
    p = FUSED_PREFIX
    shared = {"positions": "positions", "past_len": "past_len", "tree_mask": "tree_mask",
              "features": "hidden", "input_ids": p + "ids"}

    def rename(name: str) -> str:
        return shared.get(name, p + name) if name else name

    g = onnx.GraphProto()
    g.CopyFrom(target.graph)
    g.name = "edgespec_decoder_eagle"
    # the head's input token of each row: given (n_given first rows) or the target's argmax
    T = "T"
    g.input.extend([helper.make_tensor_value_info(p + "input_ids", onnx.TensorProto.INT64, [1, T]),
                    helper.make_tensor_value_info(p + "n_given", onnx.TensorProto.INT64, [1])])
    g.initializer.extend([helper.make_tensor(p + "c0", onnx.TensorProto.INT64, [], [0]),
                          helper.make_tensor(p + "c1", onnx.TensorProto.INT64, [], [1])])
    g.node.extend([
        helper.make_node("ArgMax", ["logits"], [p + "argmax"], name=p + "ArgMax", axis=-1, keepdims=0),  # [1, T]
        helper.make_node("Shape", ["input_ids"], [p + "shape"], name=p + "Shape"),
        helper.make_node("Gather", [p + "shape", p + "c1"], [p + "T"], name=p + "T", axis=0),  # scalar T
        helper.make_node("Range", [p + "c0", p + "T", p + "c1"], [p + "rows"], name=p + "Range"),  # [T]
        helper.make_node("Less", [p + "rows", p + "n_given"], [p + "is_given"], name=p + "Less"),
        helper.make_node("Where", [p + "is_given", p + "input_ids", p + "argmax"], [p + "ids"], name=p + "Where"),
    ])
    for node in head.graph.node:
        n = g.node.add()
        n.CopyFrom(node)
        n.name = p + node.name
        n.input[:] = [rename(x) for x in node.input]
        n.output[:] = [rename(x) for x in node.output]
    for init in head.graph.initializer:
        t = g.initializer.add()
        t.CopyFrom(init)
        t.name = rename(init.name)
    for kind, values in ((g.input, [x for x in head.graph.input if x.name not in shared]),
                         (g.output, head.graph.output)):
        for x in values:
            io = kind.add()
            io.CopyFrom(x)
            io.name = rename(x.name)
    model = helper.make_model(g, opset_imports=list(target.opset_import), producer_name="edgespec")
    model.ir_version = target.ir_version
    return model
