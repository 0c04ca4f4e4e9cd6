"""Drafters: cheap proposers of the next tokens, behind one interface (`Drafter`).

  start(seq, n_cached)   after the prompt is prefilled (a draft model prefills its own KV here;
                         its rows for the first n_cached tokens are still valid from the last call)
  propose(seq, k)        write up to k tokens into seq.draft_slots(k); return their Proposal
  propose_tree(seq, tree, cfg)  grow a token tree under the pending token (drafts_trees)
  accepted(seq, n_old, n_acc)   after the target kept n_acc of them (roll back own state)

A proposal's q is the drafter's distribution of each proposed token (needed for lossless
sampling); None means the drafter is deterministic (q is one-hot on its token). Model-free and
draft-model drafters live here, the ones that draft from the target's features in heads.py.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from edgespec.runtime.prefill import prefill
from edgespec.runtime.sampling import SamplingConfig, penalize, probs, sample
from edgespec.runtime.state import Proposal, SeqState, chain

DRAFTERS = ("none", "ngram", "suffix", "draft", "eagle", "hybrid", "medusa", "eagle3", "dflash")
TREE_DRAFTERS = ("ngram", "suffix", "eagle", "hybrid", "medusa", "eagle3")  # the drafters that grow token trees
# the drafters that read the target's hidden states
FEATURE_DRAFTERS = ("eagle", "hybrid", "medusa", "eagle3", "dflash")


def penalized(logits: np.ndarray, seq: SeqState, i: int, sampling: SamplingConfig) -> np.ndarray:
    """The draft's logits for draft position i under the same repetition penalty as the target."""
    if sampling.repetition_penalty == 1.0:
        return logits
    return penalize(logits[None], seq.tokens, seq.n + i, sampling.repetition_penalty)[0]


class Drafter:
    """The interface every drafter implements; the defaults are a drafter with no state."""

    name = "none"
    drafts_trees = False  # propose_tree is available
    engine = None  # the model whose calls count as draft calls (stats); None: no model
    verifier = None  # an engine that runs the target's calls in its place (EAGLE: the fused target+head graph)
    source = ""  # hybrid: which of its drafters made the last proposal ("" for the others, or nothing drafted)

    def __init__(self) -> None:
        self.sampling = SamplingConfig()
        self.rng = np.random.default_rng()

    def configure(self, sampling: SamplingConfig, rng: np.random.Generator) -> None:
        """The generation's sampling settings and RNG (drafts are drawn as the target's tokens are)."""
        self.sampling, self.rng = sampling, rng

    def start(self, seq: SeqState, n_cached: int = 0) -> None:
        pass

    def propose(self, seq: SeqState, k: int) -> Proposal:
        return chain(seq, 0)

    def propose_tree(self, seq: SeqState, tree, cfg) -> None:
        raise NotImplementedError(f"drafter {self.name!r} drafts chains only")

    def accepted(self, seq: SeqState, n_old: int, n_acc: int) -> None:
        pass

    def forget(self) -> None:
        """Drop state kept from the last call (the next prompt is prefilled in full)."""


class NoDrafter(Drafter):
    """Plain decoding: nothing proposed, every step is one T=1 target call (the baseline)."""

    name = "none"


@dataclass(frozen=True)
class NgramConfig:
    min_n: int = 1  # shortest suffix that may match
    max_n: int = 3  # longest suffix tried first


MAX_TREE_MATCHES = 8  # earlier occurrences an n-gram tree merges (per suffix length)


class NgramDrafter(Drafter):
    """Prompt lookup: find the most recent earlier occurrence of the sequence's last n tokens
    (longest n first) in prompt + output, and propose the tokens that followed it."""

    name = "ngram"
    drafts_trees = True

    def __init__(self, cfg: NgramConfig = NgramConfig()) -> None:
        super().__init__()
        if not 1 <= cfg.min_n <= cfg.max_n:
            raise ValueError(f"ngram sizes need 1 <= min_n <= max_n (got {cfg.min_n}, {cfg.max_n})")
        self.cfg = cfg

    def _matches(self, seq: SeqState):
        """(suffix size, starts of its earlier occurrences), longest suffix first; each start j has
        j + size <= n - 1, so at least one token follows the match."""
        toks, n = seq.tokens, seq.n
        for size in range(min(self.cfg.max_n, n - 1), self.cfg.min_n - 1, -1):
            windows = np.lib.stride_tricks.sliding_window_view(toks[:n - 1], size)  # [n-size, size]
            hits = np.flatnonzero((windows == toks[n - size:n]).all(axis=1))
            if len(hits):
                yield size, hits

    def propose(self, seq: SeqState, k: int) -> Proposal:
        for size, hits in self._matches(seq):  # the most recent occurrence of the longest suffix
            start = int(hits[-1]) + size
            m = min(k, seq.n - start)
            seq.draft_slots(m)[:] = seq.tokens[start:start + m]
            return chain(seq, m)
        return chain(seq, 0)

    def propose_tree(self, seq: SeqState, tree, cfg) -> None:
        """A trie of the continuations after several earlier occurrences of the suffix (longest
        suffix first, most recent first), so the chain proposal is its first branch."""
        toks, n = seq.tokens, seq.n
        for size, hits in self._matches(seq):
            for h in hits[::-1][:MAX_TREE_MATCHES]:
                parent = 0
                for j in range(int(h) + size, min(int(h) + size + cfg.depth, n)):
                    parent = tree.add(parent, toks[j])
                    if parent < 0:
                        return


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
        self.dft_past, _ = prefill(self.engine, seq.tokens[past:seq.n - 1], past)

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
        behind = seq.tokens[self.dft_past:seq.n]  # the pending token (+ the last bonus token) ...
        if len(behind) > 2:  # ... or many, after steps that drafted nothing: one chunked call
            self.dft_past, logits = prefill(self.engine, behind, self.dft_past)
        else:
            for i in range(len(behind)):
                logits = self._step(behind[i:i + 1])
        slots = seq.draft_slots(k)
        for i in range(k):
            logits = penalized(logits, seq, i, self.sampling)
            if self.sampling.greedy:
                slots[i] = logits.argmax()
            else:
                self._q[i] = probs(logits, self.sampling)
                slots[i] = sample(self._q[i], self.rng)
            if i + 1 < k:
                logits = self._step(slots[i:i + 1])
        return chain(seq, k, None if self.sampling.greedy else self._q[:k])

    def accepted(self, seq: SeqState, n_old: int, n_acc: int) -> None:
        # rows hold [pending, d_1..d_{k-1}] from slot n_old - 1; d_1..d_{n_acc} survive
        self.dft_past = min(self.dft_past, n_old + n_acc)


def make_drafter(name: str, engines, ngram: NgramConfig, features: np.ndarray | None,
                 eagle_min_confidence: float, medusa_min_confidence: float, fuse_head: bool,
                 suffix_cache=None, hybrid_lookup: str = "suffix", aux: np.ndarray | None = None,
                 hybrid_head: str = "eagle") -> Drafter:
    """The drafter `name` over a generator's engines (runtime.generator.Engines); features
    [slots, H] is the target's hidden-state buffer the head drafters read; suffix_cache the
    process's cache of recent requests (runtime.suffix.SuffixCache); hybrid_lookup what hybrid
    pairs the head with (suffix: per-step choice by expected accepted length; ngram: prompt lookup
    wherever it matches); aux [slots, n*H] the target's hidden_aux buffer (EAGLE-3's and DFlash's
    input); hybrid_head the model drafter hybrid pairs the lookup with (eagle, eagle3 or dflash)."""
    from edgespec.runtime.heads import Eagle3Drafter, EagleDrafter, HybridDrafter, MedusaDrafter
    from edgespec.runtime.hybrid_choice import SuffixHeadHybrid
    from edgespec.runtime.suffix import SuffixDrafter

    if name == "none":
        return NoDrafter()
    if name in ("ngram", "prompt_lookup"):
        return NgramDrafter(ngram)
    if name == "suffix":
        return SuffixDrafter(suffix_cache)
    if name == "draft":
        if engines.draft is None:
            raise ValueError("drafter 'draft' needs an engine folder exported with --draft")
        return ModelDrafter(engines.draft)
    vocab = engines.target.vocab_size
    if name == "hybrid" and hybrid_head != "eagle":
        head = make_drafter(hybrid_head, engines, ngram, features, eagle_min_confidence, medusa_min_confidence,
                            fuse_head, suffix_cache, hybrid_lookup, aux)
        if hybrid_lookup == "ngram":
            return HybridDrafter(NgramDrafter(ngram), head)
        return SuffixHeadHybrid(SuffixDrafter(suffix_cache), head)
    if name in ("eagle", "hybrid"):
        if engines.eagle is None:
            raise ValueError(f"drafter {name!r} needs an engine folder with an EAGLE head (exported with "
                             "--eagle HEAD_DIR; the default model's export includes one)")
        fused = engines.eagle_fused if fuse_head else None
        e = EagleDrafter(engines.eagle, features, vocab, eagle_min_confidence, fused)
        if name == "eagle":
            return e
        if hybrid_lookup == "ngram":
            return HybridDrafter(NgramDrafter(ngram), e)
        return SuffixHeadHybrid(SuffixDrafter(suffix_cache), e)
    if name == "eagle3":
        if engines.eagle3 is None or aux is None:
            raise ValueError("drafter 'eagle3' needs an engine folder with an EAGLE-3 head (exported with "
                             "--eagle3-head HEAD_DIR, from `edgespec train-eagle3`)")
        return Eagle3Drafter(engines.eagle3, aux, vocab, eagle_min_confidence)
    if name == "dflash":
        from edgespec.runtime.dflash import DFlashDrafter

        if engines.dflash is None or aux is None:
            raise ValueError("drafter 'dflash' needs an engine folder with a DFlash drafter (exported with "
                             "--dflash DIR, from `edgespec train-dflash`)")
        return DFlashDrafter(engines.dflash, aux, vocab, eagle_min_confidence)
    if name == "medusa":
        if engines.medusa is None:
            raise ValueError("drafter 'medusa' needs an engine folder with Medusa heads (exported with "
                             "--medusa HEADS_DIR; the default model's export includes them)")
        return MedusaDrafter(engines.medusa, features, vocab, medusa_min_confidence)
    raise ValueError(f"unknown drafter {name!r}; choose one of {', '.join(DRAFTERS)}")
