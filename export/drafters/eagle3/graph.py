"""The EAGLE-3 head as a static-shape ONNX graph, its files in the engine folder, its validation.

  inputs   input_ids [1, T] (token_{j+1}), positions [1, T] (j), past_len [1],
           features [1, T, H]: g_j, the head's hidden input: fc(aux_j) for a verified position,
           or the head's own output of the previous draft step
           (tree_mask [T, T]), past_key_0, past_value_0 [S, Hkv*D] (the head's one layer of KV)
  outputs  logits [1, T, Vd] over the draft vocabulary (map with d2t), new_kv [1, 2, T, Hkv*D],
           hidden [1, T, H]: the layer's output before the final norm (fed back next step)
The I/O is the EAGLE-1 head's, so the same engine runs it. fc ([3H] -> [H], no bias) stays out of
the graph: the runtime applies it to the target's hidden_aux rows it keeps anyway (one matmul into
a preallocated buffer), which spares the head graph a second feature input and a per-call switch.
fc is stored transposed ([3H, H] float32) in eagle3.weights and listed as the manifest entry's
`fc`. The embedding is the target's, read from its weights file in place.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import onnx
from onnx import helper

from edgespec.export.target.arch import PLAIN_LAYERS, ArchSpec
from edgespec.export.target.graph import NP_TO_ONNX, GraphBuilder, GraphOptions, LlamaGraphWriter, ModelWriter
from edgespec.export.target.layer_ops import Stream

_ATTN = "midlayer.self_attn."
_MLP = "midlayer.mlp."


class Eagle3GraphWriter(ModelWriter):
    def __init__(self, target_arch: ArchSpec, ec, arrays: dict[str, np.ndarray], opts: GraphOptions) -> None:
        """ec / arrays: from eagle3_head.read_eagle3 (float32, d2t absolute)."""
        self.ec = ec
        self.d2t = arrays["d2t"]
        self.fc_t = np.ascontiguousarray(arrays["fc.weight"].T).astype(np.float32)  # [3H, H]
        arch = dataclasses.replace(
            target_arch,
            n_layers=1,
            n_heads=ec.num_attention_heads,
            n_kv_heads=ec.num_key_value_heads,
            head_dim=ec.head_dim,
            intermediate_size=ec.intermediate_size,
            qkv_bias=False,
            qk_norm=False,
            **PLAIN_LAYERS,
        )
        super().__init__(
            arch, arrays, dataclasses.replace(opts, int4_lm_head=True, two_row_matmuls=False, aux_layers=()), n_layers=1
        )

    def _prepare(self, w: dict[str, np.ndarray]) -> None:
        f = self.dtype
        self.store.add("l0.ln_in", w["midlayer.input_layernorm.weight"].astype(f))
        self.store.add("l0.ln_hidden", w["midlayer.hidden_norm.weight"].astype(f))
        self.store.add("l0.ln2", w["midlayer.post_attention_layernorm.weight"].astype(f))
        self.store.add("final_norm", w["norm.weight"].astype(f))
        names = [_ATTN + f"{n}_proj.weight" for n in "qkv"]
        self._linear("l0.qkv", np.concatenate([w[n] for n in names]), names)  # [*, 2H]
        self._linear("l0.o", w[_ATTN + "o_proj.weight"], _ATTN + "o_proj.weight")
        names = [_MLP + "gate_proj.weight", _MLP + "up_proj.weight"]
        self._linear("l0.gate_up", np.concatenate([w[n] for n in names]), names)
        self._linear("l0.down", w[_MLP + "down_proj.weight"], _MLP + "down_proj.weight")
        self._linear("lm_head_d", w["lm_head.weight"], "lm_head.weight")
        self.layer_ops().store_tables()

    def _ref_rows(self, hf_name: str) -> int:
        if hf_name == "lm_head.weight":
            return len(self.d2t)
        return super()._ref_rows(hf_name)

    def build(
        self, weights_location: str, offsets: dict[str, int], embed: tuple[str, int, np.ndarray] | None = None
    ) -> onnx.ModelProto:
        """embed: (file, offset, array) of the target's embedding table [V, H]."""
        H = self.arch.hidden_size
        ops = self.layer_ops()
        b = GraphBuilder(self.store, self.dtype)
        ctx = ops.prologue(b)
        emb = ops.embed(b)  # [(1,) T, H]
        g = ops.rows_in(b, "features", H, "/feat_flat")
        u = b.op(
            "Concat",
            [
                ops.norm(b, Stream(emb), "l0.ln_in", "/ln_in")[0],
                ops.norm(b, Stream(g), "l0.ln_hidden", "/ln_hidden")[0],
            ],
            "/midlayer/Concat",
            axis=-1,
        )  # [(1,) T, 2H]: q/k/v read [embedding ; hidden]
        attn, k, v = ops.attention(b, 0, u, ctx)
        s = ops.add(b, Stream(g), attn, "/midlayer/res1")
        h, s = ops.norm(b, s, "l0.ln2", "/midlayer/ln2")
        s = ops.add(b, s, ops.mlp(b, 0, h, "/mlp"), "/midlayer/res2")
        normed, s = ops.norm(b, s, "final_norm", "/final_norm")  # s.x: the output, fed back
        logits = ops.linear(b, normed, "lm_head_d")  # [(1,) T, Vd]
        rows = ops.kv_rows(b, k, v, "")
        feats_in = helper.make_tensor_value_info("features", NP_TO_ONNX[self.dtype], [1, "T", H])
        return self._token_model(
            ops,
            b,
            n_layers=1,
            new_rows=rows,
            logits=logits,
            hidden=s.x,
            n_logits=len(self.d2t),
            weights_location=weights_location,
            offsets=offsets,
            extra_inputs=[feats_in],
            locations={"embed": embed} if embed else None,
        )

    def reference_arrays(self) -> dict[str, np.ndarray]:
        """The head's arrays as the graph computes with them (int4: dequantized), fc as the runtime
        applies it: what the PyTorch head is built from for validation."""
        s = self.store.arrays
        ref = dict(self.reference) | {"d2t": self.d2t, "fc.weight": self.fc_t.T}
        norms = (
            ("midlayer.input_layernorm.weight", "l0.ln_in"),
            ("midlayer.hidden_norm.weight", "l0.ln_hidden"),
            ("midlayer.post_attention_layernorm.weight", "l0.ln2"),
            ("norm.weight", "final_norm"),
        )
        for name, key in norms:
            ref[name] = s[key].astype(np.float32)
        return ref


def write_eagle3(
    head_dir: Path,
    folder: Path,
    arch: ArchSpec,
    writer: LlamaGraphWriter,
    index_t: dict,
    opts: GraphOptions,
    widths: list[int],
    chunk: int,
    draft_vocab: int | None,
):
    """eagle3.weights + eagle3.onnx (the head reads the target's embedding in place); (graph
    writer, manifest entry). draft_vocab: keep the head's N most frequent draft tokens (None: the
    export's default for heads that record that order; 0: all)."""
    from edgespec.export.drafters.eagle3.head import Eagle3FormatError, read_eagle3
    from edgespec.export.target import spec as es
    from edgespec.export.target.write import head_info, token_head_spec, write_drafter
    from edgespec.export.train.checkpoint import HeadFormatError, prune_draft_vocab

    try:
        ec, arrays, _ = read_eagle3(head_dir, arch.hidden_size, arch.vocab_size, arch.n_layers)
    except Eagle3FormatError as e:
        raise es.ExportError(str(e)) from e
    trained_vocab = ec.draft_vocab_size
    if draft_vocab is None:
        draft_vocab = es.EAGLE_DRAFT_VOCAB if ec.d2t_by_frequency else 0
    try:
        ec, arrays = prune_draft_vocab(ec, arrays, draft_vocab, rows=("d2t", "lm_head.weight"))
    except HeadFormatError as e:
        raise es.ExportError(str(e)) from e
    ew = Eagle3GraphWriter(arch, ec, arrays, opts)
    files = write_drafter(ew, folder, "eagle3", {"d2t": ew.d2t, "fc_t": ew.fc_t}, target=(writer, index_t))
    from edgespec.runtime.drafters.eagle3 import Eagle3Section

    head = token_head_spec(
        "eagle3",
        ew,
        files,
        widths,
        chunk,
        ec.draft_vocab_size,
        head_info(head_dir, arch.vocab_size, trained_vocab, "eagle3"),
        aux_layers=tuple(ec.aux_layers),
    )
    return ew, Eagle3Section(head=head, fc=files.spec("fc_t"))


def validate_eagle3(
    folder: Path, ew: Eagle3GraphWriter, ref_target, tokens: np.ndarray, tol: float
) -> dict[str, float]:
    """The head graph, fed fc(aux) of the target's real aux features as the runtime feeds it,
    against the PyTorch head (same weights, int4 dequantized) per width."""
    import torch

    from edgespec.engines.manifest import load_manifest
    from edgespec.engines.ort import OrtModel
    from edgespec.export.drafters.eagle3.head import build_eagle3
    from edgespec.export.target.validate import aux_features, compare, schedule

    man = load_manifest(folder)
    engine = OrtModel(man, man.models()["eagle3"])
    aux = torch.from_numpy(aux_features(ref_target, tokens, ew.ec.aux_layers))  # [N, 3H]
    cos, sin = ew.arch.rope_tables()
    embed = ref_target.model.embed_tokens.weight.detach().float().numpy()
    head = build_eagle3(ew.ec, ew.reference_arrays(), embed, cos, sin)
    n = len(tokens) - 1  # the head reads token j+1 beside the features of j
    with torch.no_grad():
        out = head(
            torch.from_numpy(tokens[1:][None]),
            aux[:n][None],
            torch.arange(n)[None],
            torch.ones(1, n, dtype=torch.bool),
            n_steps=1,
        )[0]
        ref = head.logits(out)[0].numpy()  # [n, Vd]
    g = aux[:n].numpy() @ ew.fc_t  # what the runtime feeds: fc applied outside the graph

    def calls():
        for label, past, w in schedule(man.models()["eagle3"], man.prefill_chunk, n):
            got = engine.forward(tokens[1 + past : 1 + past + w], past, features=g[past : past + w])
            yield label, got, ref[past : past + w]
            engine.commit(past, w)

    return compare("EAGLE-3 head graph", calls(), tol, "Please report it with the head's config.json.")
