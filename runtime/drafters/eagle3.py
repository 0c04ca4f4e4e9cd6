"""The `eagle3` drafter: an EAGLE-3 head: the target's low/mid/high layer features (its hidden_aux
rows) fused by `fc`, one decoder layer, its own draft-vocabulary LM head; EAGLE's chains and trees."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from edgespec.engines.manifest import Manifest, ManifestError, ModelSpec, WeightSpec, check_decode, check_head
from edgespec.runtime.drafters import DrafterSpec, register
from edgespec.runtime.drafters.eagle import MIN_CONFIDENCE_OPTION, EagleDrafter
from edgespec.runtime.state import SeqState


@dataclass(frozen=True)
class Eagle3Section:
    """The manifest section of a folder exported with --eagle3-head."""

    head: ModelSpec  # the head's graph (its features input is fc of the target's hidden_aux rows)
    fc: WeightSpec  # fc transposed [n*H, H] float32, which the runtime applies to the target's hidden_aux rows

    def models(self) -> dict[str, ModelSpec]:
        return {"eagle3": self.head}

    def check(self, m: Manifest) -> None:
        check_decode(m, self.head)
        head, target = self.head, m.target
        check_head(m, head, "EAGLE-3 head", "re-export with --eagle3-head")
        if head.aux_layers != target.aux_layers or self.fc.shape != (target.aux_width, target.hidden_size):
            raise ManifestError(
                f"{m.folder}: EAGLE-3 head (layers {head.aux_layers}, fc {self.fc.shape}) does not "
                f"fit the target (hidden size {target.hidden_size}, hidden_aux of layers "
                f"{target.aux_layers}); re-export with --eagle3-head"
            )


class Eagle3Drafter(EagleDrafter):
    """EAGLE-3: EAGLE's chain and tree drafting on a head that reads the target's low/mid/high
    layer features. Head row j's feature input is fc(a_j), a_j the target's hidden_aux row of
    position j (`tgt_aux`: the generator's TargetRows.aux), made at catch-up into a buffer of its
    own (one matmul, no allocation); speculative rows feed the head its own output, as in EAGLE.
    No fused target+head graph."""

    name = "eagle3"

    def __init__(self, head, tgt_aux: np.ndarray, target_vocab: int, min_confidence: float = 0.0) -> None:
        from edgespec.engines.ort import OrtProjection

        fc_t = head.fc_t  # [n*H, H]
        super().__init__(head, np.zeros((len(tgt_aux), fc_t.shape[1]), np.float32), target_vocab, min_confidence)
        self.tgt_aux = tgt_aux
        self.fc = OrtProjection(fc_t)  # on ONNX Runtime's threads, not OpenBLAS's (see OrtProjection)

    def _catch_up(self, seq: SeqState, feat_out: np.ndarray) -> np.ndarray:
        j0, n = self.dft_past, seq.n
        self.fc(self.tgt_aux[j0 : n - 1], self.tgt_features[j0 : n - 1])  # g_j = fc(a_j)
        return super()._catch_up(seq, feat_out)


def _load(manifest: Manifest, section: Eagle3Section, ctx):
    from edgespec.engines.ort import OrtModel
    from edgespec.engines.session import read_weight

    head = OrtModel(manifest, section.head, ctx.head_provider, ctx.threads)
    head.fc_t = read_weight(manifest, section.head, section.fc)  # [n*H, H] (mapped)
    return head


SPEC = register(
    DrafterSpec(
        name="eagle3",
        order=7,
        summary="an EAGLE-3 head: the target's low/mid/high layer features fused by fc, one decoder "
        "layer, its own draft-vocabulary LM head",
        build=lambda ctx: Eagle3Drafter(
            ctx.engines.models["eagle3"], ctx.tgt_rows.aux, ctx.target_vocab, ctx.cfg.eagle_min_confidence
        ),
        section=Eagle3Section,
        load=_load,
        warm=lambda head, widths, manifest: head.load_widths(widths),
        trees=True,
        tree_engines=lambda head: [head],
        draft_cost=0.1,
        pairs=True,
        aux_width=lambda head: head.fc_t.shape[0],
        options=(MIN_CONFIDENCE_OPTION,),
        export_hint="--eagle3-head HEAD_DIR (from `edgespec train-eagle3`)",
    )
)
