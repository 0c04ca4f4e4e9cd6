"""The `draft` drafter: a separate draft model (another model, or the target's first N layers:
`self:N`, or the target itself in int4: `self:int4`) run token by token with its own static KV."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from edgespec.engines.manifest import Manifest, ManifestError, ModelSpec, check_decode
from edgespec.runtime.drafters import Drafter, DrafterPlugin, register
from edgespec.runtime.drafters.base import penalized
from edgespec.runtime.prefill import prefill
from edgespec.runtime.sampling import probs, sample
from edgespec.runtime.state import Proposal, SeqState, chain


@dataclass(frozen=True)
class DraftSection:
    """The manifest section of a folder exported with --draft."""

    model: ModelSpec  # the draft model's graph (same vocabulary as the target)

    def models(self) -> dict[str, ModelSpec]:
        return {"draft": self.model}

    def check(self, m: Manifest) -> None:
        check_decode(m, self.model)
        if self.model.vocab_size != m.target.vocab_size:
            raise ManifestError(f"draft vocab {self.model.vocab_size} != target vocab {m.target.vocab_size}")


class ModelDrafter(Drafter):
    """A separate draft model with its own static KV, run token by token (T=1)."""

    name = "draft"

    def __init__(self, engine) -> None:
        super().__init__()
        self.engine = engine
        self.dft_past = 0  # rows in the draft KV; they match seq.tokens[:dft_past]
        self._q = np.zeros((64, engine.vocab_size), np.float64)

    def start(self, seq: SeqState, n_cached: int = 0) -> None:
        past = min(self.dft_past, n_cached)
        self.dft_past, _ = prefill(self.engine, seq.tokens[past : seq.n - 1], past)

    def forget(self) -> None:
        self.dft_past = 0

    def _step(self, token_ids: np.ndarray) -> np.ndarray:
        logits = self.engine.forward(token_ids, self.dft_past)
        self.engine.commit(self.dft_past, len(token_ids))
        self.dft_past += len(token_ids)
        return logits[-1]

    def propose(self, seq: SeqState, k: int) -> Proposal:
        k = min(k, self.engine.max_len - self.dft_past - 2)
        if k <= 0:
            return chain(seq, 0)
        behind = seq.tokens[self.dft_past : seq.n]  # the pending token (+ the last bonus token) ...
        if len(behind) > 2:  # ... or many, after steps that drafted nothing: one chunked call
            self.dft_past, logits = prefill(self.engine, behind, self.dft_past)
        else:
            for i in range(len(behind)):
                logits = self._step(behind[i : i + 1])
        slots = seq.draft_slots(k)
        for i in range(k):
            logits = penalized(logits, seq, i, self.sampling)
            if self.sampling.greedy:
                slots[i] = logits.argmax()
            else:
                self._q[i] = probs(logits, self.sampling)
                slots[i] = sample(self._q[i], self.rng, i)  # (a seeded call: coupled to position i's draw)
            if i + 1 < k:
                logits = self._step(slots[i : i + 1])
        return chain(seq, k, None if self.sampling.greedy else self._q[:k])

    def accepted(self, seq: SeqState, n_old: int, n_acc: int) -> None:
        # rows hold [pending, d_1..d_{k-1}] from slot n_old - 1; d_1..d_{n_acc} survive
        self.dft_past = min(self.dft_past, n_old + n_acc)


class DraftPlugin(DrafterPlugin):
    name = "draft"
    order = 3
    summary = "a separate draft model run token by token with its own static KV"
    section = DraftSection
    export_hint = "--draft SRC (a model, self:N or self:int4)"
    draft_cost = 0.3
    redrafts = True

    def build(self, ctx) -> Drafter:
        return ModelDrafter(ctx.engines.models["draft"])

    def load(self, manifest: Manifest, section: DraftSection, ctx):
        from edgespec.runtime.backends import make_engine  # the draft may run elsewhere (e.g. on the CPU beside a GPU)

        return make_engine(manifest, section.model, ctx.model_provider, ctx.threads, ctx.cuda_graph)

    def prime(self, engine, widths, manifest: Manifest) -> None:
        engine.load_widths([1, manifest.prefill_chunk])


PLUGIN = register(DraftPlugin())
