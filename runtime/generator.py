"""The Python API and the speculative loop.

    g = Generator.load("engines/smollm2-135m-instruct", drafter="ngram", k=4)
    for text in g.stream("def fib(n):", max_new_tokens=128):
        print(text, end="")
    print(g.last_stats.line())
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from edgespec.engines.base import decode_rows_match_verify_rows, prefill, tree_chain_prefix
from edgespec.engines.manifest import Manifest, load_manifest
from edgespec.runtime.adaptive import AdaptiveK
from edgespec.runtime.drafters import NgramConfig, make_drafter
from edgespec.runtime.state import SeqState
from edgespec.runtime.stats import GenerationStats
from edgespec.runtime.text import StreamDecoder, TextCodec
from edgespec.runtime.tree import TokenTree, TreeConfig, accept_tree_greedy, accept_tree_sampled
from edgespec.runtime.verify import SamplingConfig, accept_greedy, accept_sampled, penalize, probs, sample

# EAGLE chain cut-off on the head's path probability (the product of its confidences so far): a
# draft row costs ~17% of a decode here, so rows below ~1 in 4 to be kept do not pay (README, stop 14)
EAGLE_MIN_CONFIDENCE = 0.25
MEDUSA_MIN_CONFIDENCE = 0.4  # Medusa chain cut-off: k=3 1.12x -> 1.26x of plain, 8 HumanEval prompts (README)


class PromptTooLongError(ValueError):
    """The prompt does not fit the engine's context."""


@dataclass(frozen=True)
class GeneratorConfig:
    drafter: str = "ngram"  # none | ngram | draft | eagle | hybrid | medusa
    k: int = 4  # num_speculative_tokens per step (<= the folder's num_speculative_tokens)
    provider: str = "cpu"  # cpu | cuda | tensorrt (ONNX Runtime execution provider)
    threads: int | None = None  # intra-op threads (None: physical cores)
    ngram: NgramConfig = NgramConfig()  # prompt-lookup sizes
    reuse_kv: bool = True  # keep KV rows across calls and skip prefilling a shared prompt prefix
    adaptive: bool = False  # choose k per step from measured costs and acceptance (k = the maximum)
    eagle_min_confidence: float = 0.0  # EAGLE: stop drafting when the head's own p(d_1..d_i) is lower
    tree: TreeConfig = TreeConfig()  # token trees (nodes > 0) instead of chains: ngram, eagle, hybrid, medusa
    medusa_min_confidence: float = 0.0  # Medusa: stop the chain at the first head whose p(token) is lower
    fuse_head: bool = True  # eagle/hybrid on the CPU: verify with the folder's target+head graph, which
    #                         catches the head up inside the verify call (greedy: no head call for d_1)


def make_heads(manifest: Manifest, provider: str, threads: int | None):
    """The folder's Medusa heads through ONNX Runtime (a small graph: on the native TensorRT
    path it runs on ORT's CPU provider next to the engines)."""
    from edgespec.engines.ort import OrtHeads

    return OrtHeads(manifest, manifest.medusa, "cpu" if provider == "trt" else provider, threads)


def make_engine(manifest: Manifest, spec, provider: str, threads: int | None):
    """cpu / cuda / tensorrt: ONNX Runtime with that execution provider; trt: native TensorRT."""
    if provider == "trt":
        from edgespec.engines.trt import TrtModel

        return TrtModel(manifest, spec)
    from edgespec.engines.ort import OrtModel

    return OrtModel(manifest, spec, provider, threads)


class Generator:
    def __init__(self, manifest: Manifest, target, cfg: GeneratorConfig, draft_engine=None,
                 codec: TextCodec | None = None, eagle_engine=None, medusa_heads=None, eagle_fused=None) -> None:
        self.manifest = manifest
        self.target = target  # the engine the loop verifies with: the plain target or the fused one
        self.plain_target = target
        self.fused_target = eagle_fused  # target + EAGLE head in one graph, sharing the target's KV (eagle/hybrid)
        self._verify_costs: dict[bool, dict[int, float]] = {}  # per engine (fused?): width -> seconds
        self.draft_engine = draft_engine
        self.eagle_engine = eagle_engine
        self.medusa_heads = medusa_heads
        self.codec = codec
        self.cfg = cfg
        self.last_stats = GenerationStats()
        n_slots = target.max_len + max(target.widths)
        # the target's hidden state at every position (EAGLE and Medusa draft from them), kept
        # current by prefill and after every verify whatever the drafter, so a drafter switch finds them
        self._tgt_features = None
        if eagle_engine is not None or medusa_heads is not None:
            self._tgt_features = np.zeros((n_slots, (eagle_engine or medusa_heads).hidden_size), np.float32)
        self.set_drafter(cfg.drafter, cfg.k)
        self._tokens = np.zeros(n_slots, np.int64)  # the sequence buffer, reused by every call
        self.last_step = (0, 0)  # (drafted, accepted) of the step whose tokens were last yielded
        self._tgt_valid = 0  # target KV rows that hold self._tokens[:_tgt_valid] (prefix reuse)

    @classmethod
    def load(cls, folder: str | Path, drafter: str | None = None, k: int | None = None,
             provider: str = "cpu", threads: int | None = None, ngram: NgramConfig = NgramConfig(),
             adaptive: bool | None = None, draft_provider: str | None = None,
             eagle_min_confidence: float | None = None, tree: TreeConfig = TreeConfig(),
             medusa_min_confidence: float | None = None, fuse_head: bool = True):
        manifest = load_manifest(folder)
        drafter = drafter or manifest.defaults.get("drafter", "ngram")
        k = k if k is not None else manifest.defaults.get("k", 4)
        adaptive = manifest.defaults.get("adaptive", False) if adaptive is None else adaptive
        if eagle_min_confidence is None:
            eagle_min_confidence = manifest.defaults.get("eagle_min_confidence", EAGLE_MIN_CONFIDENCE)
        if medusa_min_confidence is None:
            medusa_min_confidence = manifest.defaults.get("medusa_min_confidence", MEDUSA_MIN_CONFIDENCE)
        cfg = GeneratorConfig(drafter, k, provider, threads, ngram, adaptive=adaptive,
                              eagle_min_confidence=eagle_min_confidence, tree=tree,
                              medusa_min_confidence=medusa_min_confidence, fuse_head=fuse_head)
        target = make_engine(manifest, manifest.target, provider, threads)
        draft = None
        if manifest.draft:  # the draft may run elsewhere (draft_provider: e.g. CPU beside a GPU target)
            draft = make_engine(manifest, manifest.draft, draft_provider or provider, threads)
        eagle = None
        if manifest.eagle:  # the head alternates with the target: same placement rule as a draft
            eagle = make_engine(manifest, manifest.eagle, draft_provider or provider, threads)
        medusa = make_heads(manifest, draft_provider or provider, threads) if manifest.medusa else None
        fused = None
        on_cpu = provider == (draft_provider or provider) == "cpu"  # the fused graph reads both KVs on the host
        if eagle is not None and manifest.eagle_fused and fuse_head and on_cpu:
            from edgespec.engines.ort import OrtModel

            fused = OrtModel(manifest, manifest.eagle_fused, provider, threads, kv=target.kv, head=eagle)
        g = cls(manifest, target, cfg, draft, TextCodec(manifest), eagle, medusa, fused)
        # only the engine this drafter verifies with gets a session now (the other on first use)
        g.target.load_widths([1, manifest.prefill_chunk] + list(range(2, max(g.k, tree.nodes - 1) + 2)))
        if manifest.target.precision == "int4" and provider == "cpu" and not manifest.raw.get("two_row_matmuls"):
            if not decode_rows_match_verify_rows(g.target):  # a folder exported on a CPU that did not need it
                warnings.warn(f"{folder}: on this CPU a 1-token call computes other bits than the same token in a "
                              "verify call, so greedy speculative output can drift from plain decoding. Hint: "
                              "re-export the folder on this machine (`edgespec export --two-row-matmuls auto` "
                              "pads 1-token calls where the CPU needs it)", RuntimeWarning, stacklevel=2)
        if draft is not None and drafter == "draft":
            draft.load_widths([1, manifest.prefill_chunk])
        if eagle is not None and drafter in ("eagle", "hybrid"):
            eagle.load_widths([1, manifest.prefill_chunk] + list(range(2, max(g.k, tree.nodes - 1) + 2)))
        if medusa is not None and drafter == "medusa":
            medusa.load()
        return g

    def set_drafter(self, name: str, k: int | None = None) -> None:
        """Switch drafter / k between calls (the engines stay loaded)."""
        k = self.cfg.k if k is None else k
        k_max = 0  # verify widths 2..k_max+1 must all exist (a draft may come up short)
        while k_max + 2 in self.target.widths:
            k_max += 1
        if name != "none" and not 1 <= k <= k_max:
            raise ValueError(f"k={k} outside 1..{k_max}: this folder has verify graphs up to "
                             f"num_speculative_tokens={k_max}. Hint: re-export with a larger --k")
        def head(engine, min_confidence):  # what a drafter from the target's features needs
            return None if engine is None else (engine, engine.d2t, self._tgt_features, self.target.vocab_size,
                                                min_confidence)

        self.drafter = make_drafter(name, self.draft_engine, self.cfg.ngram,
                                    head(self.eagle_engine, self.cfg.eagle_min_confidence),
                                    head(self.medusa_heads, self.cfg.medusa_min_confidence))
        fused = self.fused_target if name in ("eagle", "hybrid") and self.cfg.fuse_head else None
        self.target = fused if fused is not None else self.plain_target
        if fused is not None:  # the EAGLE drafter (hybrid wraps one) reads d_1 from the verify call
            getattr(self.drafter, "eagle", self.drafter).fused = fused
        self.k = 0 if name == "none" else k
        self.tree = None  # the step's token tree (preallocated), when trees are on
        if self.cfg.tree.nodes and name != "none":
            self.cfg.tree.check(k_max + 1)
            if not hasattr(self.drafter, "propose_tree"):
                raise ValueError(f"drafter {name!r} drafts chains only; trees work with ngram, eagle, hybrid, "
                                 "medusa")
            engines = [self.target] + ([self.eagle_engine] if name in ("eagle", "hybrid") else [])
            if not all(getattr(e, "takes_tree", True) for e in engines):
                raise ValueError("this engine folder's graphs verify chains only (exported with --no-trees or by an "
                                 "older edgespec); token trees need a folder re-exported without --no-trees")
            self.tree = TokenTree(self.cfg.tree.nodes)
        self.adaptive = None
        if self.cfg.adaptive and self.k > 0 and self.tree is None:
            self.adaptive = AdaptiveK(self.k, self.verify_costs(range(1, self.k + 2)))

    def verify_costs(self, widths, repeats: int = 3) -> dict[int, float]:
        """Median seconds of one call of the verifying engine per width (measured once, then cached)."""
        cache = self._verify_costs.setdefault(self.target is self.fused_target, {})
        probe = np.zeros(max(self.target.widths), np.int64)
        for w in widths:
            if w not in cache:
                times = []
                for _ in range(repeats + 1):  # the first run warms up
                    t0 = time.perf_counter()
                    self.target.forward(probe[:w], 0)
                    times.append(time.perf_counter() - t0)
                cache[w] = float(np.median(times[1:]))
        self._tgt_valid = 0  # the probes wrote nothing, but do not trust a prefix across them
        return {w: cache[w] for w in widths}

    def forget(self) -> None:
        """Drop the KV prefix kept from the last call (the next prompt is prefilled in full)."""
        self._tgt_valid = 0
        if hasattr(self.drafter, "dft_past"):
            self.drafter.dft_past = 0

    # ---- the loop ----------------------------------------------------------------------------------
    def generate_ids(self, prompt_ids: np.ndarray, max_new_tokens: int = 256,
                     sampling: SamplingConfig = SamplingConfig()) -> Iterator[np.ndarray]:
        """Yield the new tokens of each step (a view; copy to keep). Stats land in last_stats."""
        sampling.check()
        tgt, drafter, n_prompt = self.target, self.drafter, len(prompt_ids)
        if n_prompt == 0:
            raise ValueError("empty prompt")
        if n_prompt + 1 > tgt.max_len:
            raise PromptTooLongError(f"prompt has {n_prompt} tokens but the engine's context is {tgt.max_len} "
                                     f"(max_len); shorten it or re-export with --max-len > {n_prompt}")
        rng = np.random.default_rng(sampling.seed)
        if hasattr(drafter, "configure"):
            drafter.configure(sampling, rng)
        st = self.last_stats = GenerationStats(drafter=drafter.name, k=self.k, n_prompt=n_prompt,
                                                   adaptive=self.adaptive is not None and sampling.greedy,
                                                   tree=self.cfg.tree.label if self.tree is not None else "")
        eos = np.array(self.manifest.eos_token_ids if self.manifest else [], np.int64)
        dft_engine = {"eagle": self.eagle_engine, "hybrid": self.eagle_engine,
                      "medusa": self.medusa_heads}.get(drafter.name, self.draft_engine)
        dft_calls0 = getattr(dft_engine, "n_calls", 0)
        t_start = time.perf_counter()
        self._seq = None
        try:
            yield from self._loop(prompt_ids, max_new_tokens, sampling, rng, st, eos)
        finally:
            self._tgt_valid = self._seq.tgt_past if self._seq is not None else 0
            st.n_draft_calls = getattr(dft_engine, "n_calls", 0) - dft_calls0
            st.total_s = time.perf_counter() - t_start
            st.finish_reason = st.finish_reason or ("stop" if st.n_output < max_new_tokens else "length")

    def _loop(self, prompt_ids, max_new_tokens, sampling, rng, st, eos) -> Iterator[np.ndarray]:
        """prefill, then draft -> verify -> accept -> commit until EOS / max_new_tokens / context."""
        tgt, drafter, n_prompt = self.target, self.drafter, len(prompt_ids)
        # adaptive k follows measured times; under sampling that would make the RNG draws, and so
        # a seeded output, depend on timing: sampled runs keep the fixed k
        adaptive = self.adaptive if sampling.greedy else None
        tree = self.tree
        n_nodes = 0
        t_start = time.perf_counter()

        # prefill: the prompt into the target KV, first token from the last logits. Rows kept
        # from the previous call are reused for the common prefix (a chat's earlier turns).
        n_cached = 0
        if self.cfg.reuse_kv:
            old = self._tokens[:min(self._tgt_valid, n_prompt - 1)]
            diff = np.flatnonzero(old != prompt_ids[:len(old)])
            n_cached = int(diff[0]) if len(diff) else len(old)
        self._tgt_valid = n_cached
        seq = SeqState(tokens=self._tokens, n=n_prompt, n_prompt=n_prompt, tgt_past=0)
        self._seq = seq
        seq.tokens[:n_prompt] = prompt_ids
        feats = self._tgt_features
        seq.tgt_past, last = prefill(tgt, seq.tokens[n_cached:n_prompt], n_cached, hidden_out=feats)
        if sampling.repetition_penalty != 1.0:
            last = penalize(last[None], seq.tokens, n_prompt, sampling.repetition_penalty)[0]
        first = int(last.argmax()) if sampling.greedy else sample(probs(last, sampling), rng)
        seq.tokens[seq.n] = first
        seq.n += 1
        drafter.start(seq, n_cached)
        st.n_prompt_cached = n_cached
        st.prefill_s = st.ttft_s = time.perf_counter() - t_start
        st.n_output = 1
        self.last_step = (0, 0)  # (drafted, accepted) behind the tokens just yielded
        yield seq.tokens[seq.n - 1:seq.n]
        done = first in eos or max_new_tokens <= 1
        t_prev = time.perf_counter()
        while not done:
            k = adaptive.choose() if adaptive else self.k
            k = min(k, tgt.max_len - seq.n - 1)  # room for the verify rows
            if k < 0 or seq.n >= tgt.max_len:
                st.finish_reason = "length"
                break
            t0 = time.perf_counter()
            rows = None  # K/V rows to commit: the first n_acc+1 (chain) or the tree's accepted path
            if tree is None:
                m, dft_q = drafter.propose(seq, k) if k > 0 else (0, None)  # draft
                t1 = time.perf_counter()
                tgt_logits = tgt.forward(seq.verify_window(m), seq.tgt_past)  # verify: [m+1, V]
                t2 = time.perf_counter()
                n_acc, nxt = self._accept(seq, seq.draft_slots(m), dft_q, tgt_logits, sampling, rng)  # accept
            else:
                m, n_nodes, (n_acc, nxt) = self._tree_step(seq, tree, sampling, rng)  # draft, verify, accept
                t1, t2 = tree.t_drafted, tree.t_verified
                rows = tree.path
            tgt.commit(seq.tgt_past, n_acc + 1, rows)  # commit: rows of [pending, d_1..d_n_acc]
            if feats is not None and rows is None:  # their features too (EAGLE's catch-up reads them)
                feats[seq.tgt_past:seq.tgt_past + n_acc + 1] = tgt.last_hidden(n_acc + 1)
            elif feats is not None:  # a tree: the accepted path's rows
                hidden = tgt.last_hidden(n_nodes)
                for i in range(n_acc + 1):
                    feats[seq.tgt_past + i] = hidden[rows[i]]
            n_old = seq.n
            seq.tokens[n_old + n_acc] = nxt
            seq.n += n_acc + 1
            seq.tgt_past += n_acc + 1
            drafter.accepted(seq, n_old, n_acc)
            new = seq.tokens[n_old:seq.n]
            # stop conditions: EOS inside the new tokens, max_new_tokens
            hit = np.flatnonzero(np.isin(new, eos)) if len(eos) else ()
            n_emit = int(hit[0]) + 1 if len(hit) else len(new)
            n_emit = min(n_emit, max_new_tokens - st.n_output)
            done = len(hit) > 0 or st.n_output + n_emit >= max_new_tokens
            t3 = time.perf_counter()
            st.draft_s += t1 - t0
            st.verify_s += t2 - t1
            st.record_step(m, n_acc, n_emit, t3 - t_prev, n_nodes - 1 if rows is not None else m)
            if adaptive:
                adaptive.observe(k, m, n_acc, t2 - t1, t1 - t0)
            t_prev = t3
            st.n_output += n_emit
            self.last_step = (m, n_acc)
            yield new[:n_emit]

    def _accept(self, seq: SeqState, draft, dft_q, tgt_logits, sampling: SamplingConfig, rng):
        """(n accepted, next token) of a chain."""
        if sampling.repetition_penalty != 1.0:  # row i's context: tokens[:n + i]
            tgt_logits = penalize(tgt_logits, seq.tokens, seq.n, sampling.repetition_penalty)
        if sampling.greedy:
            return accept_greedy(draft, tgt_logits)
        return accept_sampled(draft, dft_q, tgt_logits, sampling, rng)

    def _tree_step(self, seq: SeqState, tree: TokenTree, sampling: SamplingConfig, rng):
        """Draft a tree under the pending token, verify all its nodes in one call, walk it:
        (depth of the tree, nodes, (n accepted, next token)); the accepted tokens are written
        into seq.tokens and tree.path holds their nodes."""
        tree.reset(seq.pending, self.target.max_len - seq.tgt_past)
        self.drafter.propose_tree(seq, tree, self.cfg.tree)
        tree.keep_chain_prefix(tree_chain_prefix(seq.tgt_past, tree.n))
        n = tree.n
        tree.t_drafted = time.perf_counter()
        tgt_logits = self.target.forward(tree.tokens[:n], seq.tgt_past, parents=tree.parents[:n])  # [n, V]
        tree.t_verified = time.perf_counter()
        if sampling.greedy:
            n_acc, nxt = accept_tree_greedy(tree, tgt_logits, seq.tokens, seq.n, sampling.repetition_penalty)
        else:
            n_acc, nxt = accept_tree_sampled(tree, tgt_logits, sampling, rng, seq.tokens, seq.n)
        return tree.max_depth, n, (n_acc, nxt)

    # ---- text API -----------------------------------------------------------------------------------
    def stream(self, prompt, max_new_tokens: int = 256, temperature: float = 0.0, top_k: int = 0,
               top_p: float = 1.0, seed: int | None = None, stop: list[str] | None = None,
               repetition_penalty: float = 1.0, typical_epsilon: float = 0.0) -> Iterator[str]:
        """Stream text for a raw prompt (str) or chat messages (list of {role, content})."""
        sampling = SamplingConfig(temperature, top_k, top_p, seed, repetition_penalty, typical_epsilon)
        return self.stream_text(self.codec.encode(prompt), max_new_tokens, sampling, stop)

    def stream_text(self, ids: np.ndarray, max_new_tokens: int, sampling: SamplingConfig,
                    stop: list[str] | None = None) -> Iterator[str]:
        """Text pieces of generate_ids: whole characters only, cut before the first stop string
        (held back while a stop string could still be straddling two pieces)."""
        decoder = StreamDecoder(self.codec)
        eos = set(self.manifest.eos_token_ids) if self.manifest else set()
        stop = stop or []
        hold = max((len(x) for x in stop), default=1) - 1
        text, emitted = "", 0
        gen = self.generate_ids(ids, max_new_tokens, sampling)
        try:
            for new in gen:
                text += decoder.push([t for t in new if int(t) not in eos])
                cut = min((i for i in (text.find(x) for x in stop) if i >= 0), default=-1)
                if cut >= 0:
                    if cut > emitted:
                        yield text[emitted:cut]
                    gen.close()
                    self.last_stats.finish_reason = "stop"
                    return
                if len(text) - hold > emitted:
                    yield text[emitted:len(text) - hold]
                    emitted = len(text) - hold
            if len(text) > emitted:
                yield text[emitted:]
        finally:
            gen.close()

    def generate(self, prompt, **kwargs) -> str:
        return "".join(self.stream(prompt, **kwargs))
