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
`fc`; a head that norms the features before fc (fc_norm) has the norm's weight folded into fc's rows
and the runtime divides each row (or each layer's block of it) by its RMS first (the section's
`fc_norm`, runtime/drafters/eagle3.py). The embedding is the target's, read from its weights file
in place, unless the head has its own table (a published head's embed_tokens), stored with the head.
The layer is built with the head's own numbers, not the target's: its width, RMSNorm epsilon and
RoPE (theta and scaling from its config: a head trained with theta 10000 on a theta-500000 target
keeps 10000). Its variants: `norm_before_residual` (the attention's residual is hidden_norm(g)),
`logits_norm` False (no final norm before lm_head), `feed_normed` (the hidden output fed back is
the normed one).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np

from edgespec.export.drafters._graph import HeadGraphWriter, head_source, validate_head
from edgespec.export.target.arch import ArchSpec
from edgespec.export.target.graph.builder import GraphOptions
from edgespec.export.target.graph.layer_ops import Stream

_ATTN = "midlayer.self_attn."
_MLP = "midlayer.mlp."


class Eagle3GraphWriter(HeadGraphWriter):
    own_lm_head = True
    opt_changes = {"aux_layers": ()}

    def __init__(
        self, target_arch: ArchSpec, ec, arrays: dict[str, np.ndarray], opts: GraphOptions, lm_head=None
    ) -> None:
        """ec / arrays: from eagle3.head.read_eagle3 (float32, d2t absolute); its LM head is its own. Its
        layer has its own width, epsilon and RoPE (ec's), whatever the target's are."""
        fc = arrays["fc.weight"]  # [H, n*Ht]
        if ec.fc_norm != "none":  # the norm's weight folded into fc's columns: fc(norm(x) * w) = norm(x) @ (w * fc)^T
            fc = fc * arrays["fc_norm.weight"][None, :]
        self.fc_t = np.ascontiguousarray(fc.T).astype(np.float32)  # [n*Ht, H]
        own = dataclasses.replace(
            target_arch,
            hidden_size=ec.hidden_size,
            rms_norm_eps=ec.rms_norm_eps,
            rope_theta=ec.rope_theta,
            rope_type=ec.rope_type,
            rope_params=ec.rope_params,
        )
        super().__init__(own, ec, arrays, opts)

    def _prepare(self, w: dict[str, np.ndarray]) -> None:
        f = self.dtype
        if self.cfg.own_embed:  # the head's own table (read in place from the target's weights otherwise)
            self.store.add("embed", w["embed_tokens.weight"].astype(f))  # [V, H]
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

    def _layer(self, ops, b, ctx, emb, g):
        c = self.cfg
        g_normed = ops.norm(b, Stream(g), "l0.ln_hidden", "/ln_hidden")[0]
        u = b.op(
            "Concat",
            [ops.norm(b, Stream(emb), "l0.ln_in", "/ln_in")[0], g_normed],
            "/midlayer/Concat",
            axis=-1,
        )  # [(1,) T, 2H]: q/k/v read [embedding ; hidden]
        attn, k, v = ops.attention(b, 0, u, ctx)
        s = ops.add(b, Stream(g_normed if c.norm_before_residual else g), attn, "/midlayer/res1")
        h, s = ops.norm(b, s, "l0.ln2", "/midlayer/ln2")
        s = ops.add(b, s, ops.mlp(b, 0, h, "/mlp"), "/midlayer/res2")
        normed, s = ops.norm(b, s, "final_norm", "/final_norm")  # s.x: the layer's output
        logits = ops.linear(b, normed if c.logits_norm else s.x, "lm_head_d")  # [(1,) T, Vd]
        return ops.kv_rows(b, k, v, ""), logits, normed if c.feed_normed else s.x  # what the next step is fed

    def stored(self) -> dict[str, np.ndarray]:
        return super().stored() | {"fc_t": self.fc_t}  # fc, which the runtime applies to hidden_aux

    def entry_fields(self) -> dict:
        return {"aux_layers": tuple(self.cfg.aux_layers)}

    def reference_arrays(self) -> dict[str, np.ndarray]:
        """The head's arrays as the graph computes with them (int4: dequantized), fc as the runtime
        applies it: what the PyTorch head is built from for validation."""
        s = self.store.arrays
        ref = dict(self.reference) | {"d2t": self.d2t, "fc.weight": self.fc_t.T}
        if self.cfg.fc_norm != "none":  # folded into fc
            ref["fc_norm.weight"] = np.ones(self.fc_t.shape[0], np.float32)
        if self.cfg.own_embed:
            ref["embed_tokens.weight"] = s["embed"].astype(np.float32)
        norms = (
            ("midlayer.input_layernorm.weight", "l0.ln_in"),
            ("midlayer.hidden_norm.weight", "l0.ln_hidden"),
            ("midlayer.post_attention_layernorm.weight", "l0.ln2"),
            ("norm.weight", "final_norm"),
        )
        for name, key in norms:
            ref[name] = s[key].astype(np.float32)
        return ref

    @classmethod
    def write(cls, ctx, role: str, head_dir: Path, read):
        """HeadGraphWriter.write, but a head with its own embedding table keeps it in its own weights
        file (the target's is read in place otherwise)."""
        from edgespec.export.target.write import head_info, token_head_spec, write_drafter

        ec, arrays, trained_vocab = head_source(read, ctx.cfg.eagle_draft_vocab, ("d2t", "lm_head.weight"))
        w = cls(ctx.arch, ec, arrays, ctx.head_opts)
        target = None if ec.own_embed else (ctx.writer, ctx.index_t)
        files = write_drafter(w, ctx.folder, role, w.stored(), target=target)
        info = head_info(head_dir, ctx.arch.vocab_size, trained_vocab, role)
        entry = token_head_spec(role, w, files, ctx.widths, ctx.chunk, len(w.d2t), info, **w.entry_fields())
        return w, files, entry


def write_eagle3(head_dir: Path, ctx):
    """eagle3.weights (fc_t beside the head's) + eagle3.onnx for the export `ctx` (HeadGraphWriter.write);
    (graph writer, manifest section)."""
    from edgespec.export.drafters.eagle3.head import read_eagle3
    from edgespec.export.target.spec import ExportError
    from edgespec.runtime.drafters.eagle3 import Eagle3Section

    arch = ctx.arch

    def read():
        ec, arrays, _ = read_eagle3(head_dir, arch.hidden_size, arch.vocab_size, arch.n_layers)
        if ec.aux_layers != tuple(ctx.opts.aux_layers):
            raise ExportError(
                f"--eagle3-head {head_dir} reads the streams entering layers {list(ec.aux_layers)}; the target graphs "
                f"output those entering {list(ctx.opts.aux_layers)}. Hint: export it without the other drafters that "
                "read aux features"
            )
        return ec, arrays

    ew, files, head = Eagle3GraphWriter.write(ctx, "eagle3", head_dir, read)
    return ew, Eagle3Section(
        head=head, fc=files.spec("fc_t"), fc_norm=ew.cfg.fc_norm, fc_norm_eps=float(ew.cfg.rms_norm_eps)
    )


def validate_eagle3(
    folder: Path, ew: Eagle3GraphWriter, ref_target, tokens: np.ndarray, tol: float
) -> dict[str, float]:
    """The head graph, fed fc(aux) of the target's real aux features as the runtime feeds it,
    against the PyTorch head (same weights, int4 dequantized) per width."""
    from edgespec.export.drafters.eagle3.head import build_eagle3
    from edgespec.export.target.checks.validate import aux_features
    from edgespec.runtime.drafters.eagle3 import normed_aux

    aux = aux_features(ref_target, tokens, ew.cfg.aux_layers)  # [N, 3H]
    cos, sin = ew.arch.rope_tables()  # the head's own RoPE (its arch: Eagle3GraphWriter.__init__)
    embed = ref_target.model.embed_tokens.weight.detach().float().numpy()
    head = build_eagle3(ew.cfg, ew.reference_arrays(), embed, cos, sin)
    n = len(tokens) - 1
    fed = np.zeros((n, aux.shape[1]), np.float32)
    normed_aux(aux[:n], fed, ew.cfg.fc_norm, ew.cfg.n_blocks, ew.cfg.rms_norm_eps)
    g = fed @ ew.fc_t  # what the runtime feeds: the features' norm and fc applied outside the graph
    return validate_head(folder, "eagle3", "EAGLE-3 head", head, tokens, aux, g, tol)
