"""The EAGLE head as a static-shape ONNX graph, built from the same pieces as the decoders.

  inputs   input_ids [1, T] (token_{j+1}), positions [1, T] (j), past_len [1],
           features [1, T, H] (f_j: the target's hidden state, or the head's own prediction),
           past_key_0, past_value_0 [S, Hkv*D] (the head's one layer of KV)
  outputs  logits [1, T, Vd] over the draft vocabulary (map with d2t), new_kv [1, 2, T, Hkv*D],
           hidden [1, T, H] (the predicted feature f^_{j+1}, fed back for the next draft step)
The embedding is the target's: the graph reads it from the target's weights file (one mapped
copy). fc, the layer and the draft-vocabulary LM head rows live in the head's own weights file,
int4 when the target is int4 (a draft only has to be cheap and usually right).

Also here: the head's files and manifest entry (`write_eagle`), the target graph with the head
appended (`fuse_with_target`, `write_eagle_fused`) and their checks (`validate_eagle`,
`validate_fused`).
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import helper

from edgespec.engines.manifest import FUSED_PREFIX, ModelSpec
from edgespec.export.drafters._graph import HeadGraphWriter, validate_head
from edgespec.export.drafters.eagle.fused import fused_spec
from edgespec.export.target import spec as es
from edgespec.export.target.graph.layer_ops import Stream
from edgespec.export.target.graph.writer import decoder_layer

_LAYER = "layers.0."


class EagleGraphWriter(HeadGraphWriter):
    """cfg / arrays: from checkpoint.read_head; it reads the target's LM-head rows (lm_head). Its layer
    has the head's own attention and norms: q/k/v biases where the head has them (heads for Qwen2
    targets), the head's RoPE (cfg.rope_theta; None: the target's) and RMSNorm epsilon, whatever the
    target's are."""

    def _prepare(self, w: dict[str, np.ndarray]) -> None:
        c, f = self.cfg, self.dtype
        own_rope = {}
        if c.rope_theta is not None:
            own_rope = dict(rope_theta=c.rope_theta, rope_type=c.rope_type, rope_params=c.rope_params)
        self.arch = dataclasses.replace(self.arch, qkv_bias=c.qkv_bias, rms_norm_eps=c.rms_norm_eps, **own_rope)
        self._linear("fc", w["fc.weight"], "fc.weight")  # [H, 2H]: [embed ; feature] -> H
        self.store.add("fc_b", w["fc.bias"].astype(f))
        if self.cfg.input_layernorm:
            self.store.add("l0.ln1", w[_LAYER + "input_layernorm.weight"].astype(f))
        self.store.add("l0.ln2", w[_LAYER + "post_attention_layernorm.weight"].astype(f))
        if self.cfg.final_norm:
            self.store.add("final_norm", w["norm.weight"].astype(f))
        names = [_LAYER + f"self_attn.{n}_proj.weight" for n in "qkv"]
        self._linear("l0.qkv", np.concatenate([w[n] for n in names]), names)
        if c.qkv_bias:
            qkv_b = np.concatenate([w[_LAYER + f"self_attn.{n}_proj.bias"] for n in "qkv"])
            self.store.add("l0.qkv_b", qkv_b.astype(f))
        self._linear("l0.o", w[_LAYER + "self_attn.o_proj.weight"], _LAYER + "self_attn.o_proj.weight")
        names = [_LAYER + "mlp.gate_proj.weight", _LAYER + "mlp.up_proj.weight"]
        self._linear("l0.gate_up", np.concatenate([w[n] for n in names]), names)
        self._linear("l0.down", w[_LAYER + "mlp.down_proj.weight"], _LAYER + "mlp.down_proj.weight")
        self._linear("lm_head_d", self._lm_rows, "lm_head_d")
        self.layer_ops().store_tables()

    def _layer(self, ops, b, ctx, emb, feat):
        x = ops.linear(b, b.op("Concat", [emb, feat], "/fc/Concat", axis=-1), "fc")  # [(1,) T, H]
        x = b.op("Add", [x, b.weight("fc_b")], "/fc/bias")
        s, rows = decoder_layer(ops, b, 0, Stream(x), ctx, ln1=self.cfg.input_layernorm)
        if self.cfg.final_norm:
            x, _ = ops.norm(b, s, "final_norm", "/final_norm")
        else:
            x = ops.resolve(b, s, "/res2").x
        return rows, ops.linear(b, x, "lm_head_d"), x  # logits [(1,) T, Vd]; the predicted feature


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
    shared = {
        "positions": "positions",
        "past_len": "past_len",
        "tree_mask": "tree_mask",
        "features": "hidden",
        "input_ids": p + "ids",
    }
    g = onnx.GraphProto()
    g.CopyFrom(target.graph)
    g.name = "edgespec_decoder_eagle"
    _add_head_input_ids(g, p)
    _append_head(g, head.graph, p, shared)
    model = helper.make_model(g, opset_imports=list(target.opset_import), producer_name="edgespec")
    model.ir_version = target.ir_version
    return model


def _add_head_input_ids(g: onnx.GraphProto, p: str) -> None:
    """The head's input token of each row, p + "ids" [1, T]: given (the n_given first rows) or the
    target's argmax."""
    T = "T"
    g.input.extend(
        [
            helper.make_tensor_value_info(p + "input_ids", onnx.TensorProto.INT64, [1, T]),
            helper.make_tensor_value_info(p + "n_given", onnx.TensorProto.INT64, [1]),
        ]
    )
    g.initializer.extend(
        [
            helper.make_tensor(p + "c0", onnx.TensorProto.INT64, [], [0]),
            helper.make_tensor(p + "c1", onnx.TensorProto.INT64, [], [1]),
        ]
    )
    g.node.extend(
        [
            helper.make_node("ArgMax", ["logits"], [p + "argmax"], name=p + "ArgMax", axis=-1, keepdims=0),  # [1, T]
            helper.make_node("Shape", ["input_ids"], [p + "shape"], name=p + "Shape"),
            helper.make_node("Gather", [p + "shape", p + "c1"], [p + "T"], name=p + "T", axis=0),  # scalar T
            helper.make_node("Range", [p + "c0", p + "T", p + "c1"], [p + "rows"], name=p + "Range"),  # [T]
            helper.make_node("Less", [p + "rows", p + "n_given"], [p + "is_given"], name=p + "Less"),
            helper.make_node("Where", [p + "is_given", p + "input_ids", p + "argmax"], [p + "ids"], name=p + "Where"),
        ]
    )


def _append_head(g: onnx.GraphProto, head: onnx.GraphProto, p: str, shared: dict[str, str]) -> None:
    """The head's nodes, initializers, inputs (but the shared ones) and outputs, named p + name except
    the names `shared` maps to the target's."""

    def rename(name: str) -> str:
        return shared.get(name, p + name) if name else name

    for node in head.node:
        n = g.node.add()
        n.CopyFrom(node)
        n.name = p + node.name
        n.input[:] = [rename(x) for x in node.input]
        n.output[:] = [rename(x) for x in node.output]
    for init in head.initializer:
        t = g.initializer.add()
        t.CopyFrom(init)
        t.name = rename(init.name)
    for kind, values in ((g.input, [x for x in head.input if x.name not in shared]), (g.output, head.output)):
        for x in values:
            io = kind.add()
            io.CopyFrom(x)
            io.name = rename(x.name)


def write_eagle(head_dir: Path, ctx):
    """eagle.weights + eagle.onnx for the export `ctx` (HeadGraphWriter.write); (graph writer, manifest
    entry). An official head's copy of the embedding is checked against the target's first."""
    from edgespec.export.drafters.eagle import rope_base
    from edgespec.export.drafters.eagle.checkpoint import check_embedding, inspect_head, load_head
    from edgespec.export.train.checkpoint import CheckpointError

    arch = ctx.arch
    try:
        hf = inspect_head(head_dir, arch.hidden_size, arch.vocab_size)
        check_embedding(hf, ctx.writer.embedding_table())  # what the head graph reads
    except CheckpointError as e:
        raise es.ExportError(str(e)) from e
    theta, source = rope_base(hf.hc, ctx.cfg.eagle_rope_theta, arch.rope_theta)
    hc = hf.hc
    if ctx.cfg.eagle_rope_theta is not None:  # the base overridden; a head on its target's RoPE keeps its scaling
        own = {} if hc.rope_theta is not None else dict(rope_type=arch.rope_type, rope_params=arch.rope_params)
        hc = dataclasses.replace(hc, rope_theta=theta, **own)
    ew, _, entry = EagleGraphWriter.write(ctx, "eagle", head_dir, lambda: (hc, load_head(hf)))
    head = dataclasses.replace(entry.head, rope_theta=float(ew.arch.rope_theta), rope_theta_from=source)
    return ew, dataclasses.replace(entry, head=head)


def write_eagle_fused(folder: Path, target: ModelSpec, eagle: ModelSpec) -> ModelSpec:
    """target_eagle.onnx: the target graph with the head appended, on the same weights files."""
    fused = fuse_with_target(
        onnx.load(folder / target.graph.file, load_external_data=False),
        onnx.load(folder / eagle.graph.file, load_external_data=False),
    )
    onnx.save(fused, folder / "target_eagle.onnx")
    return fused_spec("target_eagle.onnx", target, eagle)


def validate_eagle(folder: Path, ew: EagleGraphWriter, ref_target, tokens: np.ndarray, tol: float) -> dict[str, float]:
    """The EAGLE head graph against the PyTorch head (same dequantized weights) on the target's
    real features, per width."""
    import torch

    from edgespec.export.drafters.eagle.head import build_head
    from edgespec.export.target.checks.validate import target_features

    feats = target_features(ref_target, tokens)  # [N, H]
    ref_arrays = dict(ew.reference) | {
        "fc.bias": ew.store.arrays["fc_b"].astype(np.float32),
        "d2t": ew.d2t,
        "layers.0.post_attention_layernorm.weight": ew.store.arrays["l0.ln2"].astype(np.float32),
    }
    if ew.cfg.input_layernorm:
        ref_arrays["layers.0.input_layernorm.weight"] = ew.store.arrays["l0.ln1"].astype(np.float32)
    if ew.cfg.final_norm:
        ref_arrays["norm.weight"] = ew.store.arrays["final_norm"].astype(np.float32)
    if ew.cfg.qkv_bias:
        q, kv = ew.arch.n_heads * ew.arch.head_dim, ew.arch.n_kv_heads * ew.arch.head_dim
        qkv_b = np.split(ew.store.arrays["l0.qkv_b"].astype(np.float32), [q, q + kv])
        ref_arrays |= {_LAYER + f"self_attn.{n}_proj.bias": b for n, b in zip("qkv", qkv_b, strict=True)}
    cos, sin = ew.arch.rope_tables()  # the head's own (EagleGraphWriter's arch)
    embed = ref_target.model.embed_tokens.weight.detach().float().numpy()
    head = build_head(ew.cfg, ref_arrays, embed, np.zeros_like(embed), cos, sin)
    head.lm_head = torch.from_numpy(ew.reference["lm_head_d"])  # the rows the graph uses (int4: dequantized)
    return validate_head(folder, "eagle", "EAGLE head", head, tokens, feats, feats, tol)


class _NotBitwise(Exception):
    """The fused graph's target logits differ from the plain target's."""


def validate_fused(folder: Path, tokens: np.ndarray, tol: float) -> dict[str, float] | None:
    """The fused graph against the plain target and the standalone head, call by call at every
    width: its target logits must be BITWISE the plain graph's (greedy eagle output = plain output
    rests on it), its head logits close to the head's own graph. None (with a warning) if the
    target part differs: the folder then runs EAGLE with separate head calls."""
    from edgespec.engines.context import for_checks
    from edgespec.engines.manifest import load_manifest
    from edgespec.engines.ort import OrtModel
    from edgespec.export.target.checks.validate import compare, schedule
    from edgespec.runtime.drafters.eagle.fused import FusedVerifier

    man = for_checks(load_manifest(folder))
    plain, head = OrtModel(man, man.target), OrtModel(man, man.models()["eagle"])
    fused = FusedVerifier(man, man.models()["eagle_fused"], OrtModel(man, man.models()["eagle"]))

    def calls():
        for label, past, w in schedule(man.target, man.prefill_chunk, len(tokens)):
            ids, nxt = tokens[past : past + w], tokens[past + 1 : past + w + 1]
            n = len(nxt)  # rows whose next token is known (the very last row's is not)
            want = plain.forward(ids, past).copy()
            fused.give_next(nxt)
            got = fused.forward(ids, past)
            if not np.array_equal(got, want):
                raise _NotBitwise(
                    f"the fused target+EAGLE graph's logits at {label} differ from the plain "
                    f"target's by {np.abs(got - want).max():.3g}"
                )
            head_want = head.forward(nxt, past, features=plain.last_hidden(n))
            yield f"head_{label}", fused.last_head_logits(n), head_want
            if n < w:
                return
            for e in (plain, head, fused):
                e.commit(past, w)

    try:
        return compare(
            "fused target+EAGLE graph",
            calls(),
            tol,
            "Please report it.",
            what="max |head logits - the head's own graph's|",
        )
    except _NotBitwise as e:
        print(f"edgespec: warning: {e}; left out (eagle uses separate head calls)", file=sys.stderr)
        return None
