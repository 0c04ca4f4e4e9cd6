"""The Python API and the speculative loop.

    g = Generator.load("engines/smollm2-135m-instruct", RuntimeConfig(drafter="ngram", k=4))
    for text in g.stream("def fib(n):", max_new_tokens=128):
        print(text, end="")
    print(g.last_stats.line())

One step is draft -> shape -> verify -> accept -> commit over a `Proposal` (`_step`); chains and
trees take the same path, and `verify.accept` picks the rule (greedy or lossless sampling, chain
or tree). Prefill, stop handling, stats and streaming sit around it; the drafter, k, token tree
and the adaptive policies that size each step are set up in speculation.py. Every call has an output
constraint (constraint.py): none hands the proposal through and accepts it with verify.accept; a
grammar (json_schema, grammar, regex: constrain.py) shapes each chain before the verify call and
accepts it on masked logits.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import time
import warnings
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from edgespec.engines.context import at_load
from edgespec.engines.manifest import Manifest, load_manifest
from edgespec.runtime.backends import Engines, check_drafter, make_engines
from edgespec.runtime.config import NoDefaults, RuntimeConfig
from edgespec.runtime.constrain import Constraint
from edgespec.runtime.constraint import NO_CONSTRAINT, OutputConstraint
from edgespec.runtime.drafters import registry, spec_of
from edgespec.runtime.grammar import Grammar
from edgespec.runtime.logprobs import TokenLogprobs
from edgespec.runtime.prefill import decode_rows_match_verify_rows, prefill
from edgespec.runtime.sampling import KeyedDraws, SamplingConfig, check_max_new_tokens, penalize
from edgespec.runtime.speculation import SpeculationSetup
from edgespec.runtime.state import Proposal, SeqState, TargetRows, chain, chain_prefix
from edgespec.runtime.stats import GenerationStats
from edgespec.runtime.text import TextCodec
from edgespec.runtime.text_api import TextAPI
from edgespec.runtime.tree import tree_chain_prefix


class PromptTooLongError(ValueError):
    """The prompt does not fit the engine's context."""


class FolderLoadError(ValueError):
    """An engine folder that failed to load with an error none of the folder checks names (a missing
    package, a damaged file or value they let through): a ValueError, so the CLI reports it in one line
    naming the folder and the original exception, which stays chained (`__cause__`) for a traceback."""


# what loading an edited or damaged folder raises beyond the checks' ValueErrors (np.dtype's TypeError,
# a huge id's OverflowError, an allocation's MemoryError, a backend's missing package)
LOAD_ERRORS = (ImportError, OverflowError, TypeError, MemoryError)


@contextlib.contextmanager
def _folder_errors(folder: str | Path):
    """Turn LOAD_ERRORS raised while loading `folder` into a FolderLoadError naming it and the error."""
    try:
        yield
    except LOAD_ERRORS as e:
        hint = (
            f"install the missing package ({e.name})"
            if isinstance(e, ImportError)
            else f"check it with `edgespec check {folder}`, re-export it (edgespec export --out {folder} --force)"
        )
        raise FolderLoadError(
            f"{folder}: loading the engine folder failed with {type(e).__name__}: {e}. Hint: {hint}"
        ) from e


class Generator(SpeculationSetup, TextAPI):
    _step_class = 0  # the running step's class (Drafter.draft_class), for its policy's observe

    def __init__(
        self,
        manifest: Manifest | None,
        engines: Engines,
        cfg: RuntimeConfig = RuntimeConfig(),
        codec: TextCodec | None = None,
    ) -> None:
        self.manifest, self.engines, self.codec = manifest, engines, codec
        self.cfg = cfg.resolve(manifest.defaults if manifest is not None else NoDefaults())
        tgt = engines.target
        self.eos = np.array(manifest.eos_token_ids if manifest is not None else [], np.int64)
        self._eos = frozenset()  # self.eos as a set, made per call (_emit tests a step's few tokens in Python)
        n_slots = tgt.max_len + max(tgt.widths)
        self._tokens = np.zeros(n_slots, np.int64)  # the sequence buffer, reused by every call
        # the target's rows the loaded drafters read (hidden states, hidden_aux rows), kept by prefill
        # and after every verify whatever the drafter, so a drafter switch finds them
        loaded = {n: registry()[n] for n in engines.models if n in registry()}
        features = any(s.needs_features(self.cfg) for s in loaded.values())
        aux_width = max((s.aux_width(engines.models[n]) for n, s in loaded.items() if s.aux_width), default=0)
        self.tgt_rows = TargetRows(n_slots, tgt.hidden_size, features, aux_width)
        self._verify_costs: dict[bool, dict[int, float]] = {}  # per verifying engine (fused?): width -> seconds
        self._tgt_valid = 0  # target KV rows that hold self._tokens[:_tgt_valid] (prefix reuse)
        self.last_stats = GenerationStats()
        self.last_step = (0, 0)  # (drafted, accepted) of the step whose tokens were last yielded
        self.last_origins: list[list] = []  # stream_text: [[n_chars, drafter or "target"], ...] of its last piece
        self.drafter_store: dict = {}  # what drafters keep across requests and switches (suffix: recent requests)
        self.structured: Constraint | None = None  # the grammar machinery (made at the first constrained call)
        self.token_logprobs: TokenLogprobs | None = None  # the last call's log-probabilities (generate_ids(logprobs=))
        # called with (past, logits [n, V], hidden [n, H], hidden_aux [n, A] or None) of every row the
        # target commits, prefill and verify (export/train/answer_data.py keeps them as training data)
        self.tap = None
        self.load_s = 0.0  # seconds Generator.load took: folder checks, sessions, each width's first call
        self.set_drafter(self.cfg.drafter, self.cfg.k)

    @classmethod
    def load(cls, folder: str | Path, cfg: RuntimeConfig = RuntimeConfig()) -> Generator:
        """The folder's engines on cfg's backend, ready to generate (None fields: the folder's defaults).
        The seconds it took land in load_s."""
        t_load = time.perf_counter()
        cfg.check()
        with _folder_errors(folder):  # (a with block, not a call: the warnings' stack levels stay)
            # the context and KV cache type chosen at load (refused in one line before any allocation)
            manifest = at_load(load_manifest(folder, verify=cfg.verify), cfg.max_len, cfg.kv_dtype, cfg.provider)
            engines = make_engines(manifest, cfg)
            resolved = cfg.resolve(manifest.defaults)
            if cfg.drafter is None and set(spec_of(resolved.drafter).needs(resolved)) & set(engines.broken):
                msg = f"{folder}: the folder's default drafter is disabled (above); using ngram"
                warnings.warn(msg, RuntimeWarning, stacklevel=2)
                cfg = dataclasses.replace(cfg, drafter="ngram")
                resolved = cfg.resolve(manifest.defaults)
            check_drafter(resolved.drafter, engines, cfg.provider, resolved)
            g = cls(manifest, engines, cfg, TextCodec(manifest))
            widths = [1, manifest.prefill_chunk] + list(range(2, max(g.k, g.cfg.tree.nodes - 1) + 2))
            g.target.load_widths(widths)  # only the engine this drafter verifies with gets a session now
            if manifest.target.precision == "int4" and cfg.provider == "cpu" and not manifest.two_row_matmuls:
                if not decode_rows_match_verify_rows(g.target):  # a folder exported on a CPU that did not need it
                    warnings.warn(
                        f"{folder}: on this CPU a 1-token call computes other bits than the same token in a "
                        "verify call, so greedy speculative output can drift from plain decoding. Hint: "
                        "re-export the folder on this machine (`edgespec export --two-row-matmuls auto` "
                        "pads 1-token calls where the CPU needs it)",
                        RuntimeWarning,
                        stacklevel=2,
                    )
            g.prime_drafter(widths)
            g.load_s = time.perf_counter() - t_load
            return g

    def footprint(self) -> dict:
        """What the load cost and holds: load_s, the bytes of the weights files mapped (each once) and
        of the host KV caches (each buffer once; a GPU provider's are in device memory)."""
        from edgespec.engines.session import mapped_bytes

        parts = []  # every engine: the target, each section's (one, or a dataclass of several)
        for e in (self.engines.target, *self.engines.models.values()):
            parts += [getattr(e, f.name) for f in dataclasses.fields(e)] if dataclasses.is_dataclass(e) else [e]
        caches = {id(kv): kv.nbytes for p in parts if isinstance(kv := getattr(p, "kv", None), np.ndarray)}
        return {"load_s": self.load_s, "weights_bytes": mapped_bytes(), "kv_bytes": sum(caches.values())}

    def forget(self) -> None:
        """Drop the KV prefix kept from the last call (the next prompt is prefilled in full)."""
        self._tgt_valid = 0
        self.drafter.forget()

    # ---- the loop ----------------------------------------------------------------------------------
    def _draft(self, seq: SeqState, k: int, trees: bool = True) -> Proposal:
        """Up to k drafts as a chain, or a token tree of at most cfg.tree.nodes nodes (when trees)."""
        if k == 0:
            return chain(seq, 0)
        if self.tree is None or not trees:
            prop = self.drafter.propose(seq, k)
            if self.chain_budget is None or not prop.n_drafted:
                return prop
            sampled = not self.drafter.sampling.greedy  # (drafts drawn from q: a stopping rule)
            m = self._budget.choose_chain(self.drafter.chain_scores(), stopping=sampled) - 1  # the prefix that pays
            self.drafter.chain_verified(m)
            return chain_prefix(seq, prop, m)
        tree = self.tree
        # at most the context's room: n nodes keep at most n - 1 drafts and the target's token, so
        # seq.n + n <= max_len, as a chain's k <= max_len - seq.n - 1 keeps it
        tree.reset(seq.pending, self.target.max_len - seq.n)
        grow, floor = self.cfg.tree, self._budget.floor() if self._budget is not None else 0.0
        if floor > grow.min_score:  # no depths the budget would cut
            grow = dataclasses.replace(grow, min_score=floor)
        self.drafter.propose_tree(seq, tree, grow)
        if self._budget is not None:
            eff = tree.path_scores()
            tree.keep_best(self._budget.choose(eff[1:]), eff)
        tree.keep_chain_prefix(tree_chain_prefix(seq.tgt_past, tree.n))
        return tree.proposal()

    def _step(
        self, seq: SeqState, k: int, sampling: SamplingConfig, rng, con: OutputConstraint = NO_CONSTRAINT
    ) -> tuple[Proposal, int, float, float]:
        """One speculative step: (its proposal, n accepted, perf_counter when drafted, when verified);
        seq then holds the new tokens. con: the call's output constraint (a grammar: forced tokens, masks)."""
        n_old, engines = seq.n, self.engines  # (the verifier, tgt, may follow the drafts: eagle's fused graph, sampled)
        prop = con.shape(self._draft(seq, k, trees=con.trees_ok), seq, engines.target, self.drafter, k)  # draft, shape
        t_drafted, need, tgt = time.perf_counter(), self._verify_logits(sampling, con), self.target  # need: read logits
        tgt_logits = tgt.forward(prop.tokens, seq.tgt_past, parents=prop.parents, logits=need)  # verify: [T, V] / None
        t_verified = time.perf_counter()
        self.drafter.observe(tgt, seq, prop, tgt_logits)  # before acceptance writes over a chain's rejected drafts
        n_acc, nxt = con.accept(prop, tgt_logits, seq, sampling, rng) if need else con.accept_argmax(prop, tgt, seq)
        rows = prop.rows()  # the accepted rows: the first n_acc+1 (chain), the tree's path
        tgt.commit(seq.tgt_past, n_acc + 1, rows)  # commit their K/V ...
        self.tgt_rows.keep(tgt, seq.tgt_past, n_acc + 1, rows, len(prop.tokens))  # ... and what drafters read
        if self.tap is not None:
            self._tap_rows(seq.tgt_past, tgt_logits, n_acc + 1, rows, len(prop.tokens))
        seq.advance(n_acc, nxt)
        self.drafter.accepted(seq, n_old, con.drafter_kept(n_acc))
        return prop, n_acc, t_drafted, t_verified

    def _verify_logits(self, sampling: SamplingConfig, con: OutputConstraint) -> bool:
        """Does a verify call bring its logits [T, V] back? Only for a reader: acceptance (sampling, a
        repetition penalty, a grammar: con.needs_logits), the tap, a drafter's observer; otherwise a
        greedy call accepts from its rows' argmax ids (con.accept_argmax) and on a GPU the logits stay
        there (T x top_k ids come back, not T x V floats)."""
        return con.needs_logits(sampling) or self.tap is not None or self.drafter.needs_logits

    def _tap_rows(self, past: int, logits: np.ndarray, n_rows: int, rows: np.ndarray | None, n_call: int) -> None:
        """Hand the committed rows of a verify call (in sequence order) to self.tap."""
        tgt = self.target
        pick = slice(0, n_rows) if rows is None else rows[:n_rows]
        aux = tgt.last_hidden_aux(n_call)[pick] if tgt.spec.aux_width else None
        self.tap(past, logits[pick], tgt.last_hidden(n_call)[pick], aux)

    def _prefill(
        self,
        seq: SeqState,
        prompt_ids: np.ndarray,
        sampling: SamplingConfig,
        rng,
        con: OutputConstraint = NO_CONSTRAINT,
    ) -> tuple[int, int]:
        """The prompt into the target KV (rows kept from the previous call are reused for the
        common prefix, e.g. a chat's earlier turns); the first token from the last logits, as the
        output constraint con chooses it. Returns (first token, prompt tokens reused)."""
        n_prompt, n_cached = len(prompt_ids), 0
        if self.cfg.reuse_kv:
            old = self._tokens[: min(self._tgt_valid, n_prompt - 1)]
            diff = np.flatnonzero(old != prompt_ids[: len(old)])
            n_cached = int(diff[0]) if len(diff) else len(old)
        self._tgt_valid = n_cached
        seq.tokens[:n_prompt] = prompt_ids
        seq.tgt_past, last = prefill(
            self.target,
            seq.tokens[n_cached:n_prompt],
            n_cached,
            hidden_out=self.tgt_rows.features,
            aux_out=self.tgt_rows.aux,
            tap=self.tap,
            give_next=self._give_next,
            seen=functools.partial(self.drafter.observe_prefill, self.target, seq),
            seen_logits=self.drafter.needs_logits,
        )
        if sampling.repetition_penalty != 1.0:
            last = penalize(last[None], seq.tokens, n_prompt, sampling.repetition_penalty)[0]
        if isinstance(rng, KeyedDraws):
            rng.base = seq.n
        first = con.first(last, sampling, rng)
        seq.tokens[seq.n] = first
        seq.n += 1
        self.drafter.start(seq, n_cached)
        return first, n_cached

    def generate_ids(
        self,
        prompt_ids: np.ndarray,
        max_new_tokens: int = 256,
        sampling: SamplingConfig = SamplingConfig(),
        grammar: Grammar | None = None,
        rng: np.random.Generator | None = None,
        logprobs: int | None = None,
    ) -> Iterator[np.ndarray]:
        """Yield the new tokens of each step (a view; copy to keep). Stats land in last_stats.
        grammar (grammar.grammar_from): the output follows it, speculation stays lossless. rng: draw
        from it by rejection sampling instead (the seed's keyed draws: sampling.KeyedDraws); tests
        of the rejection rule pass one. logprobs: record each chosen token's log-probability and this
        many alternatives (0..8) in self.token_logprobs (runtime/logprobs.py); None: not recorded."""
        con, rng, adaptive, st = self._begin_call(prompt_ids, max_new_tokens, sampling, grammar, rng, logprobs)
        tgt, keyed, n_prompt = self.target, isinstance(rng, KeyedDraws), len(prompt_ids)
        dft_engine = self.drafter.engine
        dft_calls0 = dft_engine.n_calls if dft_engine is not None else 0
        seq = SeqState(tokens=self._tokens, n=n_prompt, n_prompt=n_prompt, tgt_past=0)
        t_start = time.perf_counter()
        try:
            first, st.n_prompt_cached = self._prefill(seq, prompt_ids, sampling, rng, con)
            st.prefill_s = st.ttft_s = time.perf_counter() - t_start
            st.n_output = 1
            self.last_step = (0, 0)
            yield seq.tokens[seq.n - 1 : seq.n]
            done = first in self.eos or max_new_tokens <= 1
            t_prev = time.perf_counter()
            while not done:
                k = min(self._next_k(seq, adaptive, con), tgt.max_len - seq.n - 1)  # room for the rows
                if k < 0 or seq.n >= tgt.max_len:
                    st.finish_reason = "length"
                    break
                n_old, t0 = seq.n, time.perf_counter()
                if keyed:
                    rng.base = seq.n  # (a verify call's row 0 predicts tokens[seq.n])
                prop, n_acc, t1, t2 = self._step(seq, k, sampling, rng, con)
                new = seq.tokens[n_old : seq.n]
                n_emit, done = self._emit(new, max_new_tokens - st.n_output)
                t3 = time.perf_counter()
                self._record_step(st, con, adaptive, prop, n_acc, k, n_emit, t_prev, t0, t1, t2, t3)
                t_prev = t3
                self.last_step = (prop.n_drafted, n_acc)
                yield new[:n_emit]
        finally:
            self._tgt_valid = seq.tgt_past
            st.n_draft_calls = (dft_engine.n_calls - dft_calls0) if dft_engine is not None else 0
            st.total_s = time.perf_counter() - t_start
            st.record_grammar(con)  # (no grammar: its zeros)
            st.finish_reason = st.finish_reason or ("stop" if st.n_output < max_new_tokens else "length")
            self.drafter.finish(seq)  # (suffix: the request it served becomes evidence for the next ones)

    def _begin_call(self, prompt_ids, max_new_tokens: int, sampling: SamplingConfig, grammar, rng, logprobs):
        """A generate_ids call's arguments checked (before any work) and its parts made: (the output
        constraint, the rng, adaptive k or None, the call's GenerationStats in last_stats)."""
        sampling.check()
        check_max_new_tokens(max_new_tokens)
        tgt, n_prompt = self.target, len(prompt_ids)
        if n_prompt == 0:
            raise ValueError("empty prompt")
        if n_prompt + 1 > tgt.max_len:
            raise PromptTooLongError(
                f"prompt has {n_prompt} tokens but the engine's context is {tgt.max_len} "
                f"(max_len); shorten it, or load it with --max-len > {n_prompt} (up to the folder's maximum; "
                "past that, re-export with a larger --max-len)"
            )
        # a seeded call draws each position's token from (seed, position) alone, so its output never depends
        # on the drafter or its state (drafters with a q draw their drafts coupled to those draws)
        fresh = rng is None and sampling.seed is None  # draws from fresh entropy: no output to reproduce
        if rng is None:
            rng = KeyedDraws(sampling.seed) if sampling.keyed else np.random.default_rng(sampling.seed)
        self._eos = frozenset(self.eos.tolist())
        con = self.constraint(grammar, sampling.greedy)
        self.token_logprobs = TokenLogprobs(con, logprobs) if logprobs is not None else None
        con = self.token_logprobs or con  # (it reads every verify row's logits, then hands them to con)
        self.drafter.configure(con.drafter_sampling(sampling), rng)
        adaptive = self._call_policies(sampling, isinstance(rng, KeyedDraws), fresh)
        self.last_stats = GenerationStats(
            drafter=self.drafter.name,
            k=self.k,
            n_prompt=n_prompt,
            adaptive=adaptive is not None or self._budget is not None,
            grammar=con.kind,
            tree=self.cfg.tree.label if self.tree is not None and con.trees_ok else "",
        )
        return con, rng, adaptive, self.last_stats

    def _next_k(self, seq: SeqState, adaptive, con) -> int:
        """k of the next step: the fixed k, or adaptive k for the kind of step the drafter sees
        (Drafter.draft_class, kept in self._step_class; ngram: its match's length). Class -1, nothing
        to draft: a plain step the policy is not asked about, unless a grammar's forced tokens may give
        the drafter something to redraft from (class 0 then)."""
        self._step_class = 0
        if adaptive is None:
            return self.k
        cls = self.drafter.draft_class(seq)
        if cls < 0 and not con.kind:
            return 0
        self._step_class = max(cls, 0)
        return adaptive.choose(self._step_class)

    def _record_step(
        self, st: GenerationStats, con, adaptive, prop: Proposal, n_acc, k, n_emit, t_prev, t0, t1, t2, t3
    ):
        """A step's counts and times into the call's stats and what its policies learn from. t_prev, t0..t3:
        perf_counter at the last step's end, this step's start, drafted, verified, emitted (no tuple: a
        step allocates nothing here)."""
        st.draft_s += t1 - t0 - con.shape_s  # (shaping is grammar time)
        st.verify_s += t2 - t1
        m, n_kept = con.drafts(prop), con.drafts_kept(n_acc)  # the drafter's share (forced tokens apart)
        st.record_step(con.depth(prop), n_kept, n_emit, t3 - t_prev, m, con.forced_kept)
        if m and self.drafter.source:
            st.record_source(self.drafter.source, m, n_kept)
        if adaptive:
            adaptive.observe(k, m, n_kept, t2 - t1, t1 - t0, self._step_class)
        if self._budget is not None and con.trees_ok:  # (a grammar's chains are no tree to learn from)
            self._budget.observe(len(prop.tokens), n_acc, t2 - t1)
        st.n_output += n_emit

    def last_output_ids(self) -> np.ndarray:
        """A copy of the ids the last generate_ids call emitted (its prompt excluded)."""
        st = self.last_stats
        return self._tokens[st.n_prompt : st.n_prompt + st.n_output].copy()

    def _emit(self, new: np.ndarray, room: int) -> tuple[int, bool]:
        """(tokens of `new` to emit, done?): up to and including the first EOS, at most `room`.
        A plain loop over the step's few tokens: np.isin costs ~0.08 ms a step with the caches cold
        after the model call (docs/results/recycle.md, host time per step)."""
        eos = self._eos
        if eos:
            for i, t in enumerate(new.tolist()):
                if t in eos:
                    return min(i + 1, room), True
        n_emit = min(len(new), room)
        return n_emit, n_emit >= room

    def close(self) -> None:
        """Free the engines' device memory (KV caches, CUDA-graph buffers) and sessions now, not when the
        garbage collector gets to them (a server that swaps models); the generator cannot generate after.
        Closing twice does nothing. `with Generator.load(...) as g:` closes on leaving the block."""
        self.engines.close()

    def __enter__(self) -> Generator:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
