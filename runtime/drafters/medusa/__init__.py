"""The `medusa` drafter: K Medusa heads on the target's last hidden state, one small call for all K
drafts (chains, or trees of each head's top tokens by path probability)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from edgespec.engines.manifest import HeadsSpec, Manifest, check_head
from edgespec.runtime.drafters import DrafterPlugin, Option, register
from edgespec.runtime.drafters._head import HeadDrafter
from edgespec.runtime.state import SeqState, chain

MIN_CONFIDENCE = 0.4  # chain cut-off on each head's own probability (docs/results)


@dataclass(frozen=True)
class MedusaSection:
    """The manifest section of a folder exported with Medusa heads."""

    heads: HeadsSpec  # the heads' graph: feature [1, H] -> logits [K, Vd]

    def models(self) -> dict[str, HeadsSpec]:
        return {"medusa": self.heads}

    def check(self, m: Manifest) -> None:
        check_head(m, self.heads, "Medusa heads", "re-export with heads trained for this target")


class MedusaDrafter(HeadDrafter):
    """Medusa: K heads on the target's feature of the last verified position (the one whose own
    next token is the pending bonus token) draft the K tokens after it in one call. Head i does not
    see the drafts before its own (so its q is its own distribution, still a valid proposal for
    lossless sampling). Nothing to roll back: the heads keep no state."""

    name = "medusa"

    def __init__(self, heads, tgt_features: np.ndarray, target_vocab: int, min_confidence: float = 0.0) -> None:
        super().__init__(heads.d2t, target_vocab, min_confidence, heads.n_heads)
        self.heads = self.engine = heads
        self.tgt_features = tgt_features

    def propose(self, seq: SeqState, k: int):
        k = min(k, self.heads.n_heads)
        logits = self.heads.forward(self.tgt_features[seq.n - 2])  # [K, Vd]; f of the last verified token
        slots = seq.draft_slots(k)
        for i in range(k):
            slots[i], conf = self._choose(logits[i], seq, i)
            if conf < self.min_confidence:
                k = i  # not confident: propose d_1..d_i only
                break
        return chain(seq, k, None if self.sampling.greedy or k == 0 else self._q[:k])

    def propose_tree(self, seq: SeqState, tree, cfg) -> None:
        """Medusa's tree, chosen per step: depth d takes head d-1's top-`branch` tokens under each of
        the `beam` best nodes of depth d-1, best path probability first while the node budget
        lasts (a static tree is the special case where scores never cut it short)."""
        logits = self.heads.forward(self.tgt_features[seq.n - 2])  # [K, Vd]
        frontier = [0]
        for d in range(1, min(cfg.depth, self.heads.n_heads) + 1):
            frontier = self._add_children(tree, frontier, lambda u, d=d: logits[d - 1], cfg)[: cfg.beam]
            if not frontier or tree.n >= tree.limit:
                break


class MedusaPlugin(DrafterPlugin):
    name = "medusa"
    order = 6
    summary = "K Medusa heads on the target's last hidden state, one small call for all K drafts"
    section = MedusaSection
    export_hint = "--medusa HEADS_DIR (the default model's export includes them)"
    trees = True
    draft_cost = 0.03
    options = (
        Option(
            "medusa_min_confidence",
            float,
            None,
            "medusa: stop a draft chain at the first head whose "
            f"probability of its token is below this (default: the folder's, else {MIN_CONFIDENCE})",
            fallback=MIN_CONFIDENCE,
        ),
    )

    def build(self, ctx) -> MedusaDrafter:
        heads = ctx.engines.models["medusa"]
        return MedusaDrafter(heads, ctx.tgt_rows.features, ctx.target_vocab, ctx.cfg.medusa_min_confidence)

    def needs_features(self, cfg) -> bool:
        return True

    def load(self, manifest: Manifest, section: MedusaSection, ctx):
        from edgespec.runtime.drafters.medusa.engine import OrtHeads

        return OrtHeads(manifest, section.heads, ctx.head_provider, ctx.threads)

    def prime(self, heads, widths, manifest: Manifest) -> None:
        heads.load()

    def max_chain(self, heads) -> int:
        return heads.n_heads


PLUGIN = register(MedusaPlugin())
