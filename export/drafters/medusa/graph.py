"""Medusa heads as one static-shape ONNX graph (all K heads in one call).

  inputs   features [1, H] (the target's hidden state at the last verified position)
  outputs  logits [K, Vd] over the draft vocabulary (map with d2t); row i drafts the token i + 2
           places past the feature's position
Block 0 of every head reads the same feature, so the K heads' first blocks are one MatMul of
[H, K*H] (MatMulNBits when int4); later blocks (n_layers > 1) are one batched MatMul over heads;
n_layers 0: every head is the feature itself. The LM head rows of the draft vocabulary are the
target's, one MatMul for all heads, or (heads published with their own, Medusa's layout) each
head's own rows, one MatMul per head; stored in the heads' own weights file (int4 when the target
is int4, as for the EAGLE head). Also here: its files and manifest entry
(`write_medusa`) and its check against PyTorch (`validate_medusa`).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

from edgespec.export.target.arch import ArchSpec
from edgespec.export.target.graph.builder import NP_TO_ONNX, GraphBuilder, GraphOptions
from edgespec.export.target.graph.writer import LlamaGraphWriter, ModelWriter


class MedusaGraphWriter(ModelWriter):
    def __init__(
        self, target_arch: ArchSpec, mc, arrays: dict[str, np.ndarray], lm_head: np.ndarray, opts: GraphOptions
    ) -> None:
        """mc / arrays: from checkpoint.read_any (float32, d2t absolute; "{i}.lm_head" [V, H] with
        mc.own_lm_heads); lm_head [V, H]: the target's LM head as its engine computes with it."""
        self.mc = mc
        self.d2t = arrays["d2t"]
        self._lm_rows = lm_head[self.d2t]  # [Vd, H]
        super().__init__(target_arch, arrays, dataclasses.replace(opts, int4_lm_head=True), n_layers=1)

    def _prepare(self, w: dict[str, np.ndarray]) -> None:
        f, K = self.dtype, self.mc.n_heads
        if self.mc.n_layers:
            names = [f"{i}.0.linear.weight" for i in range(K)]
            self._linear("blocks0", np.concatenate([w[n] for n in names]), names)  # [K*H, H]
            self.store.add("blocks0_b", np.concatenate([w[f"{i}.0.linear.bias"] for i in range(K)]).astype(f))
        for j in range(1, self.mc.n_layers):  # [K, H_in, H_out] and [K, 1, H]
            self.store.add(f"blocks{j}", np.stack([w[f"{i}.{j}.linear.weight"].T for i in range(K)]).astype(f))
            self.store.add(f"blocks{j}_b", np.stack([w[f"{i}.{j}.linear.bias"][None] for i in range(K)]).astype(f))
            for i in range(K):
                self.reference[f"{i}.{j}.linear.weight"] = w[f"{i}.{j}.linear.weight"].astype(f).astype(np.float32)
        if self.mc.own_lm_heads:  # each head's own rows of the draft vocabulary
            for i in range(K):
                self._linear(f"lm_head_{i}", w[f"{i}.lm_head"][self.d2t], f"lm_head_{i}")
        else:
            self._linear("lm_head_d", self._lm_rows, "lm_head_d")

    def _ref_rows(self, hf_name: str) -> int:
        return len(self.d2t) if hf_name.startswith("lm_head") else self.mc.hidden_size

    def build(self, weights_location: str, offsets: dict[str, int]) -> onnx.ModelProto:
        K, H, Vd = self.mc.n_heads, self.mc.hidden_size, len(self.d2t)
        ops = self.layer_ops().standard()  # rows [1, H] or [K, H]: the blocks have one form, in standard ops
        b = GraphBuilder(self.store, self.dtype)
        feat = b.op("Reshape", ["features", b.const("shape_feat", np.array([1, H], np.int64))], "/feat")
        shape_heads = b.const("shape_heads", np.array([K, H], np.int64))
        if self.mc.n_layers:
            # block 0 of all heads at once: SiLU(f W^T + b) reshaped [K, H], plus the residual f
            y = b.op("Add", [ops.linear(b, feat, "blocks0"), b.weight("blocks0_b")], "/blocks0/bias")
            y = ops.silu(b, y, "/blocks0/Sigmoid", "/blocks0/SiLU")
            h = b.op("Add", [b.op("Reshape", [y, shape_heads], "/blocks0/heads"), feat], "/blocks0/res")  # [K, H]
        else:  # no blocks: every head reads the feature itself
            h = b.op("Expand", [feat, shape_heads], "/heads/Expand")
        for j in range(1, self.mc.n_layers):  # per head: [K, 1, H] x [K, H, H], float weights
            h3 = b.op("Reshape", [h, b.const(f"shape_k1h_{j}", np.array([K, 1, H], np.int64))], f"/blocks{j}/in")
            y = b.op(
                "Add",
                [b.op("MatMul", [h3, b.weight(f"blocks{j}")], f"/blocks{j}/MatMul"), b.weight(f"blocks{j}_b")],
                f"/blocks{j}/bias",
            )
            y = ops.silu(b, y, f"/blocks{j}/Sigmoid", f"/blocks{j}/SiLU")
            h = b.op("Reshape", [b.op("Add", [h3, y], f"/blocks{j}/res"), shape_heads], f"/blocks{j}/out")
        if self.mc.own_lm_heads:  # head i's row through its own LM head: K products [1, H] x [H, Vd]
            rows = [
                ops.linear(
                    b,
                    b.op("Gather", [h, b.const(f"head_{i}", np.array([i], np.int64))], f"/lm_head_{i}/row", axis=0),
                    f"lm_head_{i}",
                )
                for i in range(K)
            ]
            logits = b.op("Concat", rows, "/lm_heads/Concat", axis=0) if K > 1 else rows[0]  # [K, Vd]
        else:
            logits = ops.linear(b, h, "lm_head_d")  # [K, Vd]
        if self.dtype != np.float32:
            logits = b.op("Cast", [logits], "/logits/Cast", to=TensorProto.FLOAT)
        b.nodes.append(helper.make_node("Identity", [logits], ["logits"], name="/logits"))
        return self._model(
            b,
            "edgespec_medusa",
            [helper.make_tensor_value_info("features", NP_TO_ONNX[self.dtype], [1, H])],
            [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [K, Vd])],
            weights_location,
            offsets,
            opset=ops.OPSET,
        )


def write_medusa(
    heads: Path, folder: Path, arch: ArchSpec, writer: LlamaGraphWriter, opts: GraphOptions, target_lm: np.ndarray
):
    """medusa.weights + medusa.onnx; (graph writer, manifest entry). heads: any layout `--medusa` reads;
    target_lm [V, H]: the target's LM head as loaded (heads whose own LM heads are copies of it share it)."""
    from edgespec.engines.manifest import HeadsSpec, TensorSpec
    from edgespec.export.drafters.medusa.checkpoint import MedusaFormatError, read_any
    from edgespec.export.target.spec import ExportError
    from edgespec.export.target.write import head_info, write_drafter

    try:
        mc, arrays = read_any(heads, arch.hidden_size, arch.vocab_size)
    except MedusaFormatError as e:
        raise ExportError(str(e)) from e
    mc, arrays = share_target_lm(mc, arrays, target_lm)
    mw = MedusaGraphWriter(arch, mc, arrays, writer.reference["lm_head.weight"], opts)
    files = write_drafter(mw, folder, "medusa", {"d2t": mw.d2t})
    spec = HeadsSpec(
        role="medusa",
        precision=mw.opts.precision,
        n_heads=mc.n_heads,
        n_layers=mc.n_layers,
        hidden_size=mc.hidden_size,
        vocab_size=mc.draft_vocab_size,
        file="medusa.onnx",
        inputs=(TensorSpec("features", (1, mc.hidden_size), mw.dtype.name),),
        outputs=(TensorSpec("logits", (mc.n_heads, mc.draft_vocab_size), "float32"),),
        weights_file="medusa.weights",
        weights=files.weights,
        d2t=files.spec("d2t"),
        head=head_info(heads, arch.vocab_size, mc.draft_vocab_size, "medusa"),
    )
    return mw, spec


def validate_medusa(
    folder: Path, mw: MedusaGraphWriter, ref_target, tokens: np.ndarray, tol: float
) -> dict[str, float]:
    """The Medusa heads graph against the PyTorch heads (same dequantized weights) on 8 of the
    target's real features."""
    import torch

    from edgespec.engines.context import for_checks
    from edgespec.engines.manifest import load_manifest
    from edgespec.export.target.checks.validate import compare, target_features
    from edgespec.runtime.drafters.medusa.engine import OrtHeads

    man = for_checks(load_manifest(folder))
    engine = OrtHeads(man, man.models()["medusa"])
    feats = target_features(ref_target, tokens)  # [N, H]
    heads = torch_heads(mw)
    rows = np.linspace(0, len(feats) - 1, 8).astype(int)
    with torch.no_grad():
        ref = heads.logits(heads(torch.from_numpy(feats[rows]))).numpy()  # [8, K, Vd]
    got = np.stack([engine.forward(feats[r]).copy() for r in rows])
    return compare("Medusa heads graph", [("heads", got, ref)], tol, "Please report it with the heads' config.json.")


def torch_heads(mw: MedusaGraphWriter):
    """The PyTorch heads computing with exactly the weights the graph uses (int4: dequantized)."""
    import torch

    from edgespec.export.drafters.medusa.head import build_heads

    K, mc = mw.mc.n_heads, dataclasses.replace(mw.mc, own_lm_heads=False)
    arrays = dict(mw.reference) | {"d2t": mw.d2t}
    if mc.n_layers:
        b0 = mw.store.arrays["blocks0_b"].astype(np.float32).reshape(K, -1)
    for i in range(K):
        if mc.n_layers:
            arrays[f"{i}.0.linear.bias"] = b0[i]
        for j in range(1, mc.n_layers):
            arrays[f"{i}.{j}.linear.bias"] = mw.store.arrays[f"blocks{j}_b"][i, 0].astype(np.float32)
    heads = build_heads(mc, arrays, np.zeros((mc.vocab_size, mc.hidden_size), np.float32))
    if mw.mc.own_lm_heads:  # the rows the graph uses (int4: dequantized)
        heads.lm_head = torch.from_numpy(np.stack([mw.reference[f"lm_head_{i}"] for i in range(K)]))
    else:
        heads.lm_head = torch.from_numpy(mw.reference["lm_head_d"])
    return heads


def share_target_lm(mc, arrays: dict[str, np.ndarray], target_lm: np.ndarray | None):
    """(mc, arrays) with the heads' own LM heads dropped when every one of them is the target's LM head
    bit for bit (a head edgespec published in this layout, read back): one product for all heads, as
    before publishing. Otherwise unchanged."""
    from dataclasses import replace

    if not mc.own_lm_heads or target_lm is None:
        return mc, arrays
    own = [arrays[f"{i}.lm_head"] for i in range(mc.n_heads)]
    if any(w.shape != target_lm.shape or not np.array_equal(w[:8], target_lm[:8]) for w in own):
        return mc, arrays  # the first rows differ: trained heads (the usual case), no full comparison
    if not all(np.array_equal(w, target_lm) for w in own):
        return mc, arrays
    return replace(mc, own_lm_heads=False), {k: v for k, v in arrays.items() if not k.endswith(".lm_head")}
