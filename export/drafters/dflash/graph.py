"""The DFlash drafter as a static-shape ONNX graph: one call drafts a block.

  inputs   block_ids [1, b] (the anchor, then the mask token), ctx_aux [1, C, n*H] (the target's
           low/mid/high features of the C rows verified since the last call; rows past the real
           ones are padding), positions [1, C + b] (context rows, then block rows),
           attn_bias [b, S + C + b] float (0: the block row sees that key, -1e30: it does not;
           keys are the S cached context slots, the C new context rows, the b block rows),
           past_key_{l}, past_value_{l} [S, Hkv*D] (the drafter's context K/V per layer)
  outputs  logits [1, b - 1, Vd] (block rows 1.., over the draft vocabulary: map with d2t),
           new_kv [Ld, 2, C, Hkv*D] (the new context rows' K/V: `commit` keeps the real ones)
The host builds attn_bias (it knows how many rows are real), so the graph computes no shapes.
The embedding is the target's (read in place from its weights file); fc, the layers and the
draft-vocabulary LM-head rows live in the drafter's own weights file, int4 when the target is int4.
Standard ONNX ops only (plus MatMulNBits for int4 weights).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import onnx
from onnx import TensorProto, helper

from edgespec.export.drafters._graph import HeadGraphWriter
from edgespec.export.target.arch import ArchSpec
from edgespec.export.target.graph.builder import NP_TO_ONNX, GraphBuilder, GraphOptions
from edgespec.export.target.graph.layer_ops import Stream
from edgespec.export.target.graph.writer import LlamaGraphWriter

NEG = -1e30  # additive bias of a key a row must not see
_MLP_NAMES = ("gu_split", "sig", "silu", "act")  # node names of its SwiGLU (layer_ops.LayerOps.mlp)


class DFlashGraphWriter(HeadGraphWriter):
    """cfg / arrays: from dflash.model.read_dflash; it reads the target's LM-head rows (lm_head)."""

    opt_changes = {"trees": False, "aux_layers": ()}  # a chain drafter; it reads hidden_aux, outputs none
    layer_fields = ("n_heads", "n_kv_heads", "head_dim", "intermediate_size")

    def __init__(self, target_arch: ArchSpec, cfg, arrays: dict, opts: GraphOptions, lm_head=None) -> None:
        """As HeadGraphWriter's, with the drafter's own RoPE (its config's theta and scaling) in place
        of the target's: its rope tables rotate its queries and keys."""
        own = dataclasses.replace(
            target_arch, rope_theta=cfg.rope_theta, rope_type=cfg.rope_type, rope_params=tuple(cfg.rope_params)
        )
        super().__init__(own, cfg, arrays, opts, lm_head)

    def _prepare(self, w: dict[str, np.ndarray]) -> None:
        f = self.dtype
        self._linear("fc", w["fc.weight"], "fc.weight")  # [H, n*H]
        for name in ("hidden_norm", "norm"):
            self.store.add(name, w[name + ".weight"].astype(f))
        for i in range(self.cfg.n_layers):
            p = f"layers.{i}."
            for ours, hf in (
                ("ln1", "input_layernorm"),
                ("ln2", "post_attention_layernorm"),
                ("q_norm", "self_attn.q_norm"),
                ("k_norm", "self_attn.k_norm"),
            ):
                self.store.add(f"l{i}.{ours}", w[p + hf + ".weight"].astype(f))
            for ours in ("q", "k", "v", "o"):
                hf = p + f"self_attn.{ours}_proj.weight"
                self._linear(f"l{i}.{ours}", w[hf], hf)
                if self.cfg.attention_bias:
                    self.store.add(f"l{i}.{ours}_bias", w[hf.removesuffix("weight") + "bias"].astype(f))
            names = [p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight"]
            self._linear(f"l{i}.gate_up", np.concatenate([w[n] for n in names]), names)
            self._linear(f"l{i}.down", w[p + "mlp.down_proj.weight"], p + "mlp.down_proj.weight")
        self._linear("lm_head_d", self._lm_rows, "lm_head_d")
        self.layer_ops().standard().store_tables()

    def _ref_rows(self, hf_name: str) -> int:
        if hf_name == "fc.weight":
            return self.arch.hidden_size
        return super()._ref_rows(hf_name)

    def build(
        self, weights_location: str, offsets: dict[str, int], embed: tuple[str, int, np.ndarray] | None = None
    ) -> onnx.ModelProto:
        """embed: (file, offset, array) of the target's embedding table [V, H]."""
        c = self.cfg
        ops = self.layer_ops().standard()  # the block attention has one form, in standard ops
        b = GraphBuilder(self.store, self.dtype)
        self._constants(b)
        g = _Block(b, ops, c)
        # context rows: hidden_norm(fc(features)) [C, H]
        feats = b.op("Reshape", ["ctx_aux", "rows_feat"], "/ctx/rows")
        ctx = g.rms(ops.linear(b, feats, "fc"), "hidden_norm", "/ctx/norm")
        s = Stream(self._block_embedding(b))  # [b, H]
        pos = b.op("Reshape", ["positions", "ids_flat"], "/pos")  # [C + b]
        cos = b.op("Unsqueeze", [b.op("Gather", [b.weight("rope_cos"), pos], "/cos", axis=0), "one"], "/cos3")
        sin = b.op("Unsqueeze", [b.op("Gather", [b.weight("rope_sin"), pos], "/sin", axis=0), "one"], "/sin3")
        rope_q = {"cos": g.rows(cos, "block_at", "big", "/cos_q"), "sin": g.rows(sin, "block_at", "big", "/sin_q")}
        new_rows: list[str] = []
        for i in range(c.n_layers):
            s = g.layer(i, s, ctx, {"cos": cos, "sin": sin}, rope_q, new_rows)
        self._outputs(g, s, new_rows)
        inputs, outputs = self._io()
        return self._model(
            b,
            "edgespec_dflash",
            inputs,
            outputs,
            weights_location,
            offsets,
            {"embed": embed} if embed else None,
            ops.OPSET,
        )

    def _constants(self, b: GraphBuilder) -> None:
        """The shapes and scalars the graph's nodes read."""
        c, f = self.cfg, self.dtype
        H, d, n_q, n_kv = c.hidden_size, c.head_dim, c.n_heads, c.n_kv_heads
        rep, kv_w, b_rows = n_q // n_kv, n_kv * d, c.block_size
        n_feat = len(c.target_layer_ids) * H
        for name, arr in (
            ("two", np.array(2.0, f)),
            ("eps", np.array(c.rms_norm_eps, f)),
            ("scale", np.array(1.0 / np.sqrt(d), f)),
            ("rope_split", np.array([d // 2, d // 2], np.int64)),
            ("rows_feat", np.array([-1, n_feat], np.int64)),
            ("rows_h", np.array([-1, H], np.int64)),
            ("heads_q", np.array([-1, n_q, d], np.int64)),
            ("heads_kv", np.array([-1, n_kv, d], np.int64)),
            ("rows_kv", np.array([-1, kv_w], np.int64)),
            ("rows_q", np.array([-1, n_q * d], np.int64)),
            ("q_groups", np.array([n_kv, rep, b_rows, d], np.int64)),
            ("kv_groups", np.array([-1, n_kv, 1, d], np.int64)),
            ("ids_flat", np.array([-1], np.int64)),
            ("zero", np.array([0], np.int64)),
            ("one", np.array([1], np.int64)),
            ("block_at", np.array([-b_rows], np.int64)),
            ("big", np.array([1 << 30], np.int64)),
            ("axis0", np.array([0], np.int64)),
            ("shape_new_kv", np.array([c.n_layers, 2, -1, kv_w], np.int64)),
            ("shape_logits", np.array([1, b_rows - 1, len(self.d2t)], np.int64)),
        ):
            b.const(name, arr)

    def _block_embedding(self, b: GraphBuilder) -> str:
        """The block's tokens looked up in the target's embedding table [b, H] (scaled where z-lab's is)."""
        c, f = self.cfg, self.dtype
        emb = b.op("Gather", [b.weight("embed"), b.op("Reshape", ["block_ids", "ids_flat"], "/ids")], "/embed", axis=0)
        if c.embed_scale != 1.0:  # z-lab's input_embedding_scale
            emb = b.op("Mul", [emb, b.const("embed_scale", np.array(c.embed_scale, f))], "/embed/scale")
        return emb

    def _outputs(self, g: _Block, s: Stream, new_rows: list[str]) -> None:
        """logits (rows 1.. of the block through the final norm and the draft LM head, z-lab's scale and
        softcap) and new_kv (the context rows' K/V of every layer)."""
        b, c, f = g.b, self.cfg, self.dtype
        out = g.rms(g.rows(s.x, "one", "big", "/drafted"), "norm", "/norm")  # rows 1.. [b - 1, H]
        logits = g.ops.linear(b, out, "lm_head_d")
        if f != np.float32:
            logits = b.op("Cast", [logits], "/logits/Cast", to=TensorProto.FLOAT)
        if c.logit_scale != 1.0:  # z-lab's output_multiplier
            logits = b.op("Mul", [logits, b.const("logit_scale", np.array(c.logit_scale, np.float32))], "/logits/scale")
        if c.logit_softcap > 0:  # z-lab's final_logit_softcapping: cap * tanh(logits / cap)
            cap = b.const("logit_cap", np.array(c.logit_softcap, np.float32))
            capped = b.op("Tanh", [b.op("Div", [logits, cap], "/logits/div_cap")], "/logits/tanh")
            logits = b.op("Mul", [capped, cap], "/logits/softcap")
        b.nodes.append(helper.make_node("Reshape", [logits, "shape_logits"], ["logits"], name="/logits"))
        kv = b.op("Concat", new_rows, "/new_kv/Concat", axis=0)  # [2Ld, C, Hkv*D]
        b.nodes.append(helper.make_node("Reshape", [kv, "shape_new_kv"], ["new_kv"], name="/new_kv"))

    def _io(self) -> tuple[list, list]:
        """The graph's inputs and outputs (C context rows, S cached slots, K keys: dynamic)."""
        c = self.cfg
        kv_w, b_rows = c.n_kv_heads * c.head_dim, c.block_size
        n_feat = len(c.target_layer_ids) * c.hidden_size
        ft, C, S = NP_TO_ONNX[self.dtype], "C", "S"
        inputs = [
            helper.make_tensor_value_info("block_ids", TensorProto.INT64, [1, b_rows]),
            helper.make_tensor_value_info("ctx_aux", ft, [1, C, n_feat]),
            helper.make_tensor_value_info("positions", TensorProto.INT64, [1, "P"]),
            helper.make_tensor_value_info("attn_bias", ft, [b_rows, "K"]),
        ]
        for i in range(c.n_layers):
            inputs += [
                helper.make_tensor_value_info(f"past_key_{i}", ft, [S, kv_w]),
                helper.make_tensor_value_info(f"past_value_{i}", ft, [S, kv_w]),
            ]
        outputs = [
            helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, b_rows - 1, len(self.d2t)]),
            helper.make_tensor_value_info("new_kv", ft, [c.n_layers, 2, C, kv_w]),
        ]
        return inputs, outputs


@dataclasses.dataclass(frozen=True)
class _Block:
    """The block graph's builder, layer ops and config, with the steps each decoder layer repeats."""

    b: GraphBuilder  # the graph being built
    ops: object  # its layer ops (standard ONNX ops)
    c: object  # the drafter's config (dflash.model.DFlashConfig)

    def rms(self, x: str, w: str, name: str) -> str:
        return self.ops.norm(self.b, Stream(x), w, name)[0]

    def rows(self, x: str, start: str, end: str, name: str) -> str:  # x[start:end] along axis 0
        return self.b.op("Slice", [x, start, end, "axis0"], name)

    def proj(self, x: str, layer: int, which: str, name: str) -> str:  # a q/k/v/o projection (+ its bias)
        y = self.ops.linear(self.b, x, f"l{layer}.{which}")
        return self.b.op("Add", [y, self.b.weight(f"l{layer}.{which}_bias")], name) if self.c.attention_bias else y

    def layer(self, i: int, s: Stream, ctx: str, rope: dict, rope_q: dict, new_rows: list[str]) -> Stream:
        """Decoder layer i over the block rows: queries from the block, keys and values from the cache,
        the context rows and the block (the context rows' K/V appended to new_rows)."""
        b, ops, c = self.b, self.ops, self.c
        n_q, n_kv, rms, rows, proj = c.n_heads, c.n_kv_heads, self.rms, self.rows, self.proj
        p = f"/l{i}"
        h, s = ops.norm(b, s, f"l{i}.ln1", p + "/ln1")
        q = b.op("Reshape", [proj(h, i, "q", p + "/q_bias"), "heads_q"], p + "/q3")
        q = ops.rotary(b, rms(q, f"l{i}.q_norm", p + "/q_norm"), n_q, rope_q, p + "/q_rope")  # [b, Hq, D]
        kin = b.op("Concat", [ctx, h], p + "/kin", axis=0)  # [C + b, H]
        k = b.op("Reshape", [proj(kin, i, "k", p + "/k_bias"), "heads_kv"], p + "/k3")
        k = ops.rotary(b, rms(k, f"l{i}.k_norm", p + "/k_norm"), n_kv, rope, p + "/k_rope")
        k = b.op("Reshape", [k, "rows_kv"], p + "/k_rows")  # [C + b, Hkv*D]
        v = proj(kin, i, "v", p + "/v_bias")  # [C + b, Hkv*D]
        new_rows += [rows(k, "zero", "block_at", p + "/k_new"), rows(v, "zero", "block_at", p + "/v_new")]
        keys = b.op("Concat", [f"past_key_{i}", k], p + "/keys", axis=0)  # [S + C + b, Hkv*D]
        vals = b.op("Concat", [f"past_value_{i}", v], p + "/vals", axis=0)
        # GQA without copies: query head g*rep + r reads kv head g
        k4 = b.op("Transpose", [b.op("Reshape", [keys, "kv_groups"], p + "/k4")], p + "/kT", perm=[1, 2, 3, 0])
        v4 = b.op("Transpose", [b.op("Reshape", [vals, "kv_groups"], p + "/v4")], p + "/vT", perm=[1, 2, 0, 3])
        q4 = b.op("Reshape", [b.op("Transpose", [q], p + "/qT", perm=[1, 0, 2]), "q_groups"], p + "/q4")
        scores = b.op("Mul", [b.op("MatMul", [q4, k4], p + "/qk"), "scale"], p + "/scaled")  # [Hkv, rep, b, K]
        w = b.op("Softmax", [b.op("Add", [scores, "attn_bias"], p + "/bias")], p + "/softmax", axis=-1)
        att = b.op("MatMul", [w, v4], p + "/av")  # [Hkv, rep, b, D]
        att = b.op("Reshape", [b.op("Transpose", [att], p + "/attT", perm=[2, 0, 1, 3]), "rows_q"], p + "/att")
        s = ops.add(b, s, proj(att, i, "o", p + "/o_bias"), p + "/res1")
        h, s = ops.norm(b, s, f"l{i}.ln2", p + "/ln2")
        s = ops.add(b, s, ops.mlp(b, i, h, p, names=_MLP_NAMES, sized=False), p + "/res2")
        return s


def write_dflash(
    dflash_dir,
    folder,
    arch: ArchSpec,
    writer: LlamaGraphWriter,
    index_t: dict,
    opts: GraphOptions,
    ctx_widths: list[int],
    aux: tuple[int, ...],
):
    """dflash.weights + dflash.onnx (the drafter reads the target's embedding in place); (graph
    writer, manifest entry). ctx_widths: the context rows C its calls are fed at; aux: the layers
    whose entering stream the target graphs output as hidden_aux (the export's agreed aux layers)."""
    from edgespec.engines.manifest import Architecture, ModelSpec
    from edgespec.export.drafters.dflash.model import DFlashFormatError, read_dflash
    from edgespec.export.target import spec as es
    from edgespec.export.target.write import head_info, write_drafter

    try:
        dc, arrays = read_dflash(dflash_dir, arch.hidden_size, arch.vocab_size, arch.n_layers)
    except DFlashFormatError as e:
        raise es.ExportError(str(e)) from e
    if dc.aux_layers != tuple(aux):
        raise es.ExportError(
            f"{dflash_dir}: the drafter reads the streams entering target layers {list(dc.aux_layers)} "
            f"(target_layer_ids {list(dc.target_layer_ids)}); the target graphs output {list(aux)}"
        )
    dw = DFlashGraphWriter(arch, dc, arrays, opts, writer.reference["lm_head.weight"])
    files = write_drafter(dw, folder, "dflash", {"d2t": dw.d2t}, target=(writer, index_t))
    kv_dtype, b_rows = dw.dtype.name, dc.block_size
    n_feat = len(dc.target_layer_ids) * dc.hidden_size
    head = head_info(dflash_dir, arch.vocab_size, dc.draft_vocab_size, "edgespec")
    spec = ModelSpec(
        role="dflash",
        kind="dflash",
        precision=dw.opts.precision,
        arch=Architecture(**(dw.arch.to_manifest() | {"n_layers": dc.n_layers, "vocab_size": dc.draft_vocab_size})),
        kv_dtype=kv_dtype,
        weights_file="dflash.weights",
        weights=files.weights,
        graph=_graph_spec(dw, ctx_widths),
        d2t=files.spec("d2t"),
        head=head,
    )
    from edgespec.runtime.drafters.dflash import DFlashSection

    return dw, DFlashSection(
        model=spec,
        block_size=b_rows,
        mask_token_id=dc.mask_token_id,
        feature_width=n_feat,
        max_position=int(dw.store.arrays["rope_cos"].shape[0]),
    )


def _graph_spec(dw: DFlashGraphWriter, ctx_widths: list[int]):
    """The manifest's GraphSpec of dflash.onnx, called at the context widths ctx_widths."""
    from edgespec.engines.manifest import GraphSpec, TensorSpec
    from edgespec.export.target import spec as es

    dc = dw.cfg
    kv_dtype, b_rows = dw.dtype.name, dc.block_size
    n_feat, kv_w = len(dc.target_layer_ids) * dc.hidden_size, dc.n_kv_heads * dc.head_dim
    T, S = "T", "S"  # T: context rows of the call (one of the widths), S: cached context slots read
    return GraphSpec(
        "dflash.onnx",
        tuple(ctx_widths),
        {"decode": tuple(ctx_widths)},
        (
            TensorSpec("block_ids", (1, b_rows), "int64"),
            TensorSpec("ctx_aux", (1, T, n_feat), kv_dtype),
            TensorSpec("positions", (1, f"T+{b_rows}"), "int64"),
            TensorSpec("attn_bias", (b_rows, f"S+T+{b_rows}"), kv_dtype),
            TensorSpec(es.KV_TEMPLATE, (S, kv_w), kv_dtype, layers=dc.n_layers),
        ),
        (
            TensorSpec("logits", (1, b_rows - 1, len(dw.d2t)), "float32"),
            TensorSpec("new_kv", (dc.n_layers, 2, T, kv_w), kv_dtype),
        ),
    )


def _reference_arrays(dw: DFlashGraphWriter) -> dict[str, np.ndarray]:
    """The PyTorch drafter's arrays under its checkpoint names, as the graph stores them (norms in the
    graph's dtype, linears dequantized), so the two compute with the same weights."""
    c = dw.cfg
    ref = dict(dw.reference) | {"d2t": dw.d2t}
    for ours, hf in (("hidden_norm", "hidden_norm.weight"), ("norm", "norm.weight")):
        ref[hf] = dw.store.arrays[ours].astype(np.float32)
    for i in range(c.n_layers):
        for ours, hf in (
            ("ln1", "input_layernorm"),
            ("ln2", "post_attention_layernorm"),
            ("q_norm", "self_attn.q_norm"),
            ("k_norm", "self_attn.k_norm"),
        ):
            ref[f"layers.{i}.{hf}.weight"] = dw.store.arrays[f"l{i}.{ours}"].astype(np.float32)
        if c.attention_bias:
            for ours in ("q", "k", "v", "o"):
                ref[f"layers.{i}.self_attn.{ours}_proj.bias"] = dw.store.arrays[f"l{i}.{ours}_bias"].astype(np.float32)
    return ref


def validate_dflash(folder, dw: DFlashGraphWriter, ref_target, tokens: np.ndarray, tol: float) -> dict[str, float]:
    """The drafter graph against the PyTorch drafter (same dequantized weights) on the target's
    real features: a prefill-sized context, then each width appended to it, comparing the block's
    logits after every call (so the cached context K/V is checked too)."""
    import torch

    from edgespec.engines.context import for_checks
    from edgespec.engines.manifest import load_manifest
    from edgespec.export.drafters.dflash.model import build_dflash
    from edgespec.export.target.checks.validate import aux_features, compare
    from edgespec.runtime.drafters.dflash.engine import OrtDFlash

    c = dw.cfg
    man = for_checks(load_manifest(folder))
    engine = OrtDFlash(man, man.section("dflash"))
    aux = aux_features(ref_target, tokens, c.aux_layers)
    ref = _reference_arrays(dw)
    embed = ref_target.model.embed_tokens.weight.detach().float().numpy()
    model = build_dflash(
        c,
        ref,
        embed,
        np.zeros((len(embed), c.hidden_size), np.float32),
        dw.store.arrays["rope_cos"].astype(np.float32),
        dw.store.arrays["rope_sin"].astype(np.float32),
    )
    model.lm_head = torch.from_numpy(dw.reference["lm_head_d"])  # the rows the graph uses (int4: dequantized)

    def expected(n_ctx: int) -> np.ndarray:
        b = c.block_size
        ids = torch.full((1, b), c.mask_token_id, dtype=torch.long)
        ids[0, 0] = int(tokens[n_ctx])
        with torch.no_grad():
            out = model(
                model.context(torch.from_numpy(aux[None, :n_ctx])),
                torch.arange(n_ctx)[None],
                ids,
                torch.arange(n_ctx, n_ctx + b)[None],
                torch.ones(1, b, n_ctx, dtype=torch.bool),
                torch.ones(1, b, b, dtype=torch.bool),
            )
            return model.logits(out[:, 1:])[0].numpy()

    def calls():
        past = 0
        for w in [min(len(tokens) // 2, 3 * max(engine.widths))] + list(engine.widths):
            if past + w + 1 > len(tokens):
                break
            got = engine.draft(aux[past : past + w], past, int(tokens[past + w]))
            yield f"ctx{past}+{w}", got, expected(past + w)
            past += w

    return compare("DFlash drafter graph", calls(), tol, "Please report it with the drafter's config.json.")
