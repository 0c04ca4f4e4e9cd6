"""The `eagle3` drafter: an EAGLE-3 head: the target's low/mid/high layer features (its hidden_aux
rows) fused by `fc`, one decoder layer, its own draft-vocabulary LM head; EAGLE's chains and trees.
Published heads may RMS-norm the features before fc (the section's `fc_norm`: each target layer's
block, or the whole row; the norm's weight is folded into fc at export), and may be narrower than
the target (fc maps n*Ht features to the head's width)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from edgespec.engines.manifest import Manifest, ManifestError, ModelSpec, WeightSpec, check_decode
from edgespec.runtime.drafters import register
from edgespec.runtime.drafters._head import ChainHeadPlugin
from edgespec.runtime.drafters.eagle import EagleDrafter
from edgespec.runtime.state import SeqState

FC_NORMS = ("none", "per_layer", "whole")  # Eagle3Section.fc_norm's values


def normed_aux(aux: np.ndarray, out: np.ndarray, fc_norm: str, n_blocks: int, eps: float) -> None:
    """out[:] = the aux rows [R, n*Ht] as fc reads them: each divided by its RMS (fc_norm "whole"), or
    each target layer's block by its own ("per_layer"), in float32 as the heads' RMSNorm computes
    (the norm's weight is folded into fc); "none": the rows unchanged."""
    if fc_norm == "none":
        out[:] = aux
        return
    x = aux.astype(np.float32, copy=False)
    if fc_norm == "per_layer":
        x = x.reshape(len(x), n_blocks, -1)
    out.reshape(x.shape)[:] = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + np.float32(eps))


@dataclass(frozen=True)
class Eagle3Section:
    """The manifest section of a folder exported with --eagle3-head."""

    head: ModelSpec  # the head's graph (its features input is fc of the target's hidden_aux rows)
    fc: WeightSpec  # fc transposed [n*Ht, H] float32 (norm weight folded in), applied to the target's hidden_aux rows
    fc_norm: str = "none"  # the RMSNorm before fc: "none" | "per_layer" (each layer's block) | "whole" (the row)
    fc_norm_eps: float = 1e-6  # that norm's epsilon

    def models(self) -> dict[str, ModelSpec]:
        return {"eagle3": self.head}

    def check(self, m: Manifest) -> None:
        check_decode(m, self.head)
        head, target = self.head, m.target
        if head.d2t is None or head.d2t.shape != (head.vocab_size,):
            raise ManifestError(f"{m.folder}: EAGLE-3 head without a d2t map of {head.vocab_size} entries; re-export")
        if self.fc_norm not in FC_NORMS or not self.fc_norm_eps > 0:
            raise ManifestError(
                f"{m.folder}: EAGLE-3 section's fc_norm {self.fc_norm!r} (eps {self.fc_norm_eps}) is not one of "
                f"{', '.join(FC_NORMS)} with a positive epsilon; re-export with --eagle3-head"
            )
        if head.aux_layers != target.aux_layers or self.fc.shape != (target.aux_width, head.hidden_size):
            raise ManifestError(
                f"{m.folder}: EAGLE-3 head (layers {head.aux_layers}, fc {self.fc.shape}, width {head.hidden_size}) "
                f"does not fit the target (hidden size {target.hidden_size}, hidden_aux of layers "
                f"{target.aux_layers}); re-export with --eagle3-head"
            )


class Eagle3Drafter(EagleDrafter):
    """EAGLE-3: EAGLE's chain and tree drafting on a head that reads the target's low/mid/high
    layer features. Head row j's feature input is fc(a_j), a_j the target's hidden_aux row of
    position j (`tgt_aux`: the generator's TargetRows.aux), made at catch-up into a buffer of its
    own (one matmul, no allocation); speculative rows feed the head its own output, as in EAGLE.
    No fused target+head graph."""

    name = "eagle3"

    def __init__(
        self,
        head,
        tgt_aux: np.ndarray,
        target_vocab: int,
        min_confidence: float = 0.0,
        fc_norm: str = "none",
        fc_norm_eps: float = 1e-6,
    ) -> None:
        from edgespec.engines.projection import OrtProjection

        fc_t = head.fc_t  # [n*Ht, H]
        super().__init__(head, np.zeros((len(tgt_aux), fc_t.shape[1]), np.float32), target_vocab, min_confidence)
        self.tgt_aux = tgt_aux
        self.fc = OrtProjection(fc_t)  # on ONNX Runtime's threads, not OpenBLAS's (see OrtProjection)
        self.fc_norm, self.fc_norm_eps = fc_norm, fc_norm_eps
        self.n_blocks = len(head.spec.aux_layers) if fc_norm == "per_layer" else 1
        # the normed aux rows fc reads (a head with an fc norm; else fc reads tgt_aux itself)
        self._aux_in = np.zeros(tgt_aux.shape, np.float32) if fc_norm != "none" else None

    def _catch_up(self, seq: SeqState, feat_out: np.ndarray) -> np.ndarray:
        j0, n = self.dft_past, seq.n
        aux = self.tgt_aux[j0 : n - 1]
        if self._aux_in is not None:
            normed_aux(aux, self._aux_in[j0 : n - 1], self.fc_norm, self.n_blocks, self.fc_norm_eps)
            aux = self._aux_in[j0 : n - 1]
        self.fc(aux, self.tgt_features[j0 : n - 1])  # g_j = fc(a_j)
        return super()._catch_up(seq, feat_out)


class Eagle3Plugin(ChainHeadPlugin):
    name = "eagle3"
    order = 7
    summary = (
        "an EAGLE-3 head: the target's low/mid/high layer features fused by fc, one decoder "
        "layer, its own draft-vocabulary LM head"
    )
    section = Eagle3Section
    export_hint = "--eagle3-head HEAD_DIR (from `edgespec train-eagle3`)"
    trees = True
    reads_aux = True

    def build(self, ctx) -> Eagle3Drafter:
        head = ctx.engines.models["eagle3"]
        return Eagle3Drafter(
            head,
            ctx.tgt_rows.aux,
            ctx.target_vocab,
            ctx.cfg.eagle_min_confidence,
            fc_norm=getattr(head, "fc_norm", "none"),  # the section's (set by load; a test's fake head has none)
            fc_norm_eps=getattr(head, "fc_norm_eps", 1e-6),
        )

    def load(self, manifest: Manifest, section: Eagle3Section, ctx):
        from edgespec.engines.ort import OrtModel
        from edgespec.engines.session import read_weight

        head = OrtModel(manifest, section.head, ctx.head_provider, ctx.threads)
        head.fc_t = read_weight(manifest, section.head, section.fc)  # [n*Ht, H] (mapped)
        head.fc_norm, head.fc_norm_eps = section.fc_norm, section.fc_norm_eps
        return head

    def prime(self, head, widths, manifest: Manifest) -> None:
        head.load_widths(widths)

    def tree_engines(self, head) -> tuple:
        return (head,)

    def aux_width(self, head) -> int:
        return head.fc_t.shape[0]


PLUGIN = register(Eagle3Plugin())
