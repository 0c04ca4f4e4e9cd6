"""What the drafting heads' graphs share (EAGLE, EAGLE-3; DFlash takes the writer's shape only).

`HeadGraphWriter`: a drafter's graph writer on the target's architecture with the drafter's own
layer shapes and the target's LM-head rows (or its own) of a draft vocabulary; for one-layer heads
on the token-graph I/O (`build`), the graph around the layer: the prologue, the target's embedding
read in place and a `features` input in, logits over the draft vocabulary, new KV rows and the
layer's output (fed back) out; `write`: a head's checkpoint cut to the export's draft vocabulary
(`head_source`), written as its files and manifest entry. `validate_head` checks its graph against
the PyTorch head call by call.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
from onnx import helper

from edgespec.export.target import spec as es
from edgespec.export.target.arch import PLAIN_LAYERS, ArchSpec
from edgespec.export.target.graph.builder import NP_TO_ONNX, GraphBuilder, GraphOptions
from edgespec.export.target.graph.writer import ModelWriter


class HeadGraphWriter(ModelWriter):
    """A graph writer for a drafter over a draft vocabulary (`d2t`, its target ids) with the config `cfg`
    (its layers' shapes under the names `layer_fields`; `n_layers` where it has more than one)."""

    own_lm_head = False  # its LM head is its own (checkpoint array lm_head.weight [Vd, H], trained), not the
    #                      target's rows of its draft tokens (`lm_head` below)
    opt_changes: dict = {}  # GraphOptions it changes beyond the LM head's (features it does not output)
    # cfg's names of its query heads, KV heads, head width and MLP width (a one-layer head's: LlamaConfig's)
    layer_fields = ("num_attention_heads", "num_key_value_heads", "head_dim", "intermediate_size")

    def __init__(
        self,
        target_arch: ArchSpec,
        cfg,
        arrays: dict[str, np.ndarray],
        opts: GraphOptions,
        lm_head: np.ndarray | None = None,
    ) -> None:
        """cfg / arrays: from the drafter's checkpoint reader (float32, d2t absolute); lm_head [V, H]: the
        target's LM head as its engine computes with it, for a drafter that reads its rows of the draft
        tokens. Its layers are plain Llama layers of its own shapes; its LM head is int4 at int4 (a draft
        only has to be cheap and usually right) and never padded to two rows (its rows need not match
        any other call's)."""
        self.cfg = cfg
        self.d2t = arrays["d2t"]
        if lm_head is not None:
            self._lm_rows = lm_head[self.d2t]  # [Vd, H]
        n_layers = getattr(cfg, "n_layers", 1)
        shape = zip(("n_heads", "n_kv_heads", "head_dim", "intermediate_size"), self.layer_fields, strict=True)
        arch = dataclasses.replace(
            target_arch,
            n_layers=n_layers,
            **{ours: getattr(cfg, theirs) for ours, theirs in shape},
            qkv_bias=False,
            qk_norm=False,
            **PLAIN_LAYERS,
        )
        opts = dataclasses.replace(opts, int4_lm_head=True, two_row_matmuls=False, **self.opt_changes)
        super().__init__(arch, arrays, opts, n_layers=n_layers)

    def _ref_rows(self, hf_name: str) -> int:
        if hf_name == ("lm_head.weight" if self.own_lm_head else "lm_head_d"):  # the draft vocabulary's rows
            return len(self.d2t)
        return super()._ref_rows(hf_name)

    def stored(self) -> dict[str, np.ndarray]:
        """Arrays its weights file holds beside the graph's, for the runtime: its draft tokens' target ids."""
        return {"d2t": self.d2t}

    def entry_fields(self) -> dict:
        """More fields of its manifest entry (token_head_spec's extra)."""
        return {}

    @classmethod
    def write(cls, ctx, role: str, head_dir: Path, read: Callable[[], tuple]):
        """The one-layer head `read()` gives ((config, arrays) of its checkpoint), cut to the export's
        draft vocabulary (`head_source`), as <role>.weights + <role>.onnx (reading the target's embedding
        in place) for the export `ctx` (export/drafters/base.py ExportContext); (graph writer, its
        files, its manifest entry)."""
        from edgespec.export.target.write import head_info, token_head_spec, write_drafter

        rows = ("d2t", "lm_head.weight") if cls.own_lm_head else ("d2t",)
        cfg, arrays, trained_vocab = head_source(read, ctx.cfg.eagle_draft_vocab, rows)
        lm_head = None if cls.own_lm_head else ctx.writer.reference["lm_head.weight"]
        w = cls(ctx.arch, cfg, arrays, ctx.head_opts, lm_head)
        files = write_drafter(w, ctx.folder, role, w.stored(), target=(ctx.writer, ctx.index_t))
        info = head_info(head_dir, ctx.arch.vocab_size, trained_vocab, role)
        entry = token_head_spec(role, w, files, ctx.widths, ctx.chunk, len(w.d2t), info, **w.entry_fields())
        return w, files, entry

    def build(
        self, weights_location: str, offsets: dict[str, int], embed: tuple[str, int, np.ndarray] | None = None
    ) -> onnx.ModelProto:
        """The one-layer head's token graph; embed: (file, offset, array) of the target's embedding table [V, H]."""
        H = self.arch.hidden_size
        ops = self.layer_ops()
        b = GraphBuilder(self.store, self.dtype)
        ctx = ops.prologue(b)
        emb = ops.embed(b)  # [(1,) T, H]
        feat = ops.rows_in(b, "features", H, "/feat_flat")
        rows, logits, hidden = self._layer(ops, b, ctx, emb, feat)
        feats_in = helper.make_tensor_value_info("features", NP_TO_ONNX[self.dtype], [1, "T", H])
        return self._token_model(
            ops,
            b,
            n_layers=1,
            new_rows=rows,
            logits=logits,
            hidden=hidden,
            n_logits=len(self.d2t),
            weights_location=weights_location,
            offsets=offsets,
            extra_inputs=[feats_in],
            locations={"embed": embed} if embed else None,
        )

    def _layer(self, ops, b: GraphBuilder, ctx, emb: str, feat: str) -> tuple:
        """The head between its inputs (the embedded tokens, the features) and its outputs: (new KV
        rows, logits [(1,) T, Vd], the output fed back [(1,) T, H])."""
        raise NotImplementedError


def head_source(read: Callable[[], tuple], draft_vocab: int | None, rows: tuple[str, ...] = ("d2t",)) -> tuple:
    """(config, arrays, its trained draft-vocabulary size) of a head read by `read()` ((config,
    arrays)), cut to `draft_vocab` tokens (None: the export's default for heads that record their
    tokens' frequency order, else all; 0: all). rows: the arrays indexed by draft token. A head in
    a bad layout, or one whose order does not allow the cut, is an ExportError."""
    from edgespec.export.train.checkpoint import CheckpointError, prune_draft_vocab

    try:
        hc, arrays = read()
        trained_vocab = hc.draft_vocab_size
        if draft_vocab is None:
            draft_vocab = es.EAGLE_DRAFT_VOCAB if hc.d2t_by_frequency else 0
        hc, arrays = prune_draft_vocab(hc, arrays, draft_vocab, rows=rows)
    except CheckpointError as e:
        raise es.ExportError(str(e)) from e
    return hc, arrays, trained_vocab


def validate_head(
    folder: Path, role: str, title: str, head, tokens: np.ndarray, feats: np.ndarray, fed: np.ndarray, tol: float
) -> dict[str, float]:
    """The head graph of `role` against the PyTorch `head` (same weights, int4 dequantized), per width.
    feats [N, F]: what the PyTorch head reads at each position; fed [N, H]: what the graph is fed there
    (the same, or what the runtime makes of it)."""
    import torch

    from edgespec.engines.context import for_checks
    from edgespec.engines.manifest import load_manifest
    from edgespec.engines.ort import OrtModel
    from edgespec.export.target.checks.validate import compare, schedule

    man = for_checks(load_manifest(folder))
    engine = OrtModel(man, man.models()[role])
    n = len(tokens) - 1  # the head reads token j+1 beside the features of j
    with torch.no_grad():
        out = head(
            torch.from_numpy(tokens[1:][None]),
            torch.from_numpy(feats[:n][None]),
            torch.arange(n)[None],
            torch.ones(1, n, dtype=torch.bool),
            n_steps=1,
        )[0]
        ref = head.logits(out)[0].numpy()  # [n, Vd]

    def calls():
        for label, past, w in schedule(man.models()[role], man.prefill_chunk, n):
            got = engine.forward(tokens[1 + past : 1 + past + w], past, features=fed[past : past + w])
            yield label, got, ref[past : past + w]
            engine.commit(past, w)

    return compare(f"{title} graph", calls(), tol, "Please report it with the head's config.json.")
