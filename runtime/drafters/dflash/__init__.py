"""The `dflash` drafter: one drafter call per step proposes a whole block (DFlash).

The target has verified tokens 0..n-2 (its hidden_aux rows are in `tgt_aux`, kept current by the
generator) and token n-1 is pending. One call of the block drafter appends the features it has
not seen yet (positions ctx_len..n-2) to its context cache and drafts positions n..n+b-2 from
[token n-1, MASK, ...] in parallel. Its context only ever holds verified positions, so a rejected
draft costs no rollback. The chain is cut where the product of the drafter's top probabilities
falls below `min_confidence` (like EAGLE's path probability): that product depends only on the
block's logits, never on the tokens drawn, so sampling stays lossless with q = the drafter's
softmax at each position (each position's q is fixed before any of the block is drawn).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from edgespec.engines.manifest import Manifest, ManifestError, ModelSpec, check_head
from edgespec.runtime.drafters import register
from edgespec.runtime.drafters._head import ChainHeadPlugin, HeadDrafter
from edgespec.runtime.state import Proposal, SeqState, chain


@dataclass(frozen=True)
class DFlashSection:
    """The manifest section of a folder exported with --dflash."""

    model: ModelSpec  # the drafter's graph (its widths are context rows C)
    block_size: int  # b: rows per drafting call (the anchor + b-1 drafts)
    mask_token_id: int  # the token whose embedding fills the rows to draft
    feature_width: int  # n*H: the target's hidden_aux width it reads (ctx_aux's last axis)
    max_position: int  # rows of the drafter's rope table (positions past it reuse the last row)

    def models(self) -> dict[str, ModelSpec]:
        return {"dflash": self.model}

    def check(self, m: Manifest) -> None:
        check_head(m, self.model, "DFlash drafter", "re-export with --dflash")
        if self.feature_width != m.target.aux_width:
            raise ManifestError(
                f"{m.folder}: DFlash drafter (features {self.feature_width} wide) does not fit the "
                f"target (hidden_aux {m.target.aux_width} wide); re-export with --dflash"
            )


class DFlashDrafter(HeadDrafter):
    name = "dflash"
    drafts_trees = False

    def __init__(self, engine, tgt_aux: np.ndarray, target_vocab: int, min_confidence: float = 0.0) -> None:
        super().__init__(engine.d2t, target_vocab, min_confidence, engine.block_size)
        self.dflash = self.engine = engine
        self.tgt_aux = tgt_aux  # [slots, n*H] the target's hidden_aux rows (runtime.state.TargetRows)
        self.ctx_len = 0  # positions 0..ctx_len-1 are in the drafter's context cache
        self.expected = 0.0  # sum over the proposed drafts of the chain's probability (hybrid-style estimate)

    def forget(self) -> None:
        self.ctx_len = 0

    def start(self, seq: SeqState, n_cached: int = 0) -> None:
        # a context row j is still right if the target's rows up to j were reused (prefix match)
        self.ctx_len = min(self.ctx_len, n_cached)

    def propose(self, seq: SeqState, k: int) -> Proposal:
        n = seq.n
        k = min(k, self.dflash.block_size - 1, self.dflash.max_len - n)
        self.expected = 0.0
        if k <= 0:
            return chain(seq, 0)
        logits = self.dflash.draft(self.tgt_aux[self.ctx_len : n - 1], self.ctx_len, int(seq.tokens[n - 1]))
        self.ctx_len = n - 1
        slots = seq.draft_slots(k)
        path = 1.0  # the drafter's probability of d_1..d_{i+1} all being right
        for i in range(k):
            slots[i], conf = self._choose(logits[i], seq, i)
            path *= conf
            if path < self.min_confidence:
                k = i
                break
            self.expected += path
        return chain(seq, k, None if self.sampling.greedy or k == 0 else self._q[:k])

    def accepted(self, seq: SeqState, n_old: int, n_acc: int) -> None:
        pass  # the context holds verified positions only: nothing to roll back


class DFlashPlugin(ChainHeadPlugin):
    name = "dflash"
    order = 8
    summary = (
        "a DFlash block drafter: ONE call drafts a whole block from [last token, MASK...] with "
        "the target's low/mid/high features injected as keys/values"
    )
    section = DFlashSection
    export_hint = "--dflash DIR (z-lab's published DFlash drafters, or `edgespec train-dflash`)"
    reads_aux = True

    def build(self, ctx) -> DFlashDrafter:
        engine = ctx.engines.models["dflash"]
        return DFlashDrafter(engine, ctx.tgt_rows.aux, ctx.target_vocab, ctx.cfg.eagle_min_confidence)

    def load(self, manifest: Manifest, section: DFlashSection, ctx):
        from edgespec.runtime.drafters.dflash.engine import OrtDFlash

        return OrtDFlash(manifest, section, ctx.head_provider, ctx.threads)

    def prime(self, engine, widths, manifest: Manifest) -> None:
        engine.load()

    def aux_width(self, engine) -> int:
        return engine.feature_width


PLUGIN = register(DFlashPlugin())
