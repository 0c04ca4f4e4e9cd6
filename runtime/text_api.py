"""The text side of the Generator (a mixin it inherits): prompts in, text pieces out, with stop
strings, per-character origins (which drafter's tokens a piece came from) and structured output.
The token loop it drives is runtime/generator.py's generate_ids."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from edgespec.runtime.constrain import Constraint, Grammar, GrammarError, grammar_from, grammar_tokenizer
from edgespec.runtime.constraint import NO_CONSTRAINT, OutputConstraint
from edgespec.runtime.sampling import SamplingConfig, check_max_new_tokens
from edgespec.runtime.text import TARGET, Origins, StreamDecoder


class TextAPI:
    """stream / stream_text / generate over a Generator's generate_ids."""

    def stream(
        self,
        prompt,
        max_new_tokens: int = 256,
        temperature: float = 0.0,
        top_k: int = 0,
        top_p: float = 1.0,
        seed: int | None = None,
        stop: list[str] | None = None,
        repetition_penalty: float = 1.0,
        typical_epsilon: float = 0.0,
        json_schema=None,
        grammar: str | None = None,
        regex: str | None = None,
    ) -> Iterator[str]:
        """Stream text for a raw prompt (str) or chat messages (list of {role, content}). At most
        one of json_schema (dict or JSON text), grammar (Lark) and regex constrains the output."""
        sampling = SamplingConfig(temperature, top_k, top_p, seed, repetition_penalty, typical_epsilon)
        sampling.check()  # here too: a bad setting fails at the call, not at the first next()
        check_max_new_tokens(max_new_tokens)
        fmt = grammar_from(json_schema, grammar, regex)
        self.constraint(fmt)  # a grammar this vocabulary cannot run fails here too
        return self.stream_text(self.codec.encode(prompt), max_new_tokens, sampling, stop, fmt)

    def constraint(self, grammar: Grammar | None, greedy: bool = True) -> OutputConstraint:
        """The generator's Constraint started on grammar for a greedy or sampled call (None: the
        null constraint). GrammarError when the grammar cannot run on this vocabulary, or
        llguidance is missing."""
        if grammar is None:
            return NO_CONSTRAINT
        if self.structured is None:
            if self.codec is None:
                raise GrammarError("structured output needs the folder's tokenizer (this generator has no codec)")
            if not len(self.eos):  # before the tokenizer wrapper, which hands llguidance the first one
                raise GrammarError(
                    "structured output needs the folder's EOS token, and its manifest.json lists none "
                    "(eos_token_ids: []). Hint: re-export the folder, or give eos_token_ids its model's EOS id"
                )
            tok = grammar_tokenizer(self.codec.tokenizer, self.engines.target.vocab_size, self.eos)
            self.structured = Constraint(tok, self.engines.target.vocab_size, self.eos, max(self.engines.target.widths))
        self.structured.begin(grammar, greedy)
        return self.structured

    def stream_text(
        self,
        ids: np.ndarray,
        max_new_tokens: int,
        sampling: SamplingConfig,
        stop: list[str] | None = None,
        grammar: Grammar | None = None,
    ) -> Iterator[str]:
        """Text pieces of generate_ids: whole characters only, cut before the first stop string
        (held back while a stop string could still be straddling two pieces)."""
        decoder, origins = StreamDecoder(self.codec), Origins()
        eos = {int(t) for t in self.eos}
        stop = stop or []
        hold = max((len(x) for x in stop), default=1) - 1
        text, emitted = "", 0
        gen = self.generate_ids(ids, max_new_tokens, sampling, grammar)
        try:
            for new in gen:
                runs = self._draft_runs(min(self.last_step[1], len(new)))  # the step's kept drafts come first
                n_dft = sum(n for n, _ in runs)  # (<= the kept tokens: a grammar's forced ones are no drafts)
                at = 0
                for n, label in (*runs, (len(new) - n_dft, TARGET)):  # every token of `new`, once
                    if n:
                        piece = decoder.push([t for t in new[at : at + n] if int(t) not in eos])
                        origins.add(len(piece), label)  # text held back by the decoder goes to the later part
                        text += piece
                        at += n
                cut = min((i for i in (text.find(x) for x in stop) if i >= 0), default=-1)
                if cut >= 0:
                    if cut > emitted:
                        self.last_origins = origins.take(cut)
                        yield text[emitted:cut]
                    gen.close()
                    self.last_stats.finish_reason = "stop"
                    return
                if len(text) - hold > emitted:
                    self.last_origins = origins.take(len(text) - hold)
                    yield text[emitted : len(text) - hold]
                    emitted = len(text) - hold
            if len(text) > emitted:
                self.last_origins = origins.take(len(text))
                yield text[emitted:]
        finally:
            gen.close()

    def _draft_runs(self, n_kept: int) -> list[tuple[int, str]]:
        """Who drafted this step's n_kept kept tokens, as runs (count, label): the drafter, or the
        source it chose (hybrid: suffix or the head) or used per token (merged: its lookup, recycle)."""
        if not n_kept:
            return []
        name, head = self.drafter.name, self.cfg.hybrid_head
        return [(n, (head if src == "head" else src) or name) for n, src in self.drafter.kept_sources(n_kept)]

    def generate(self, prompt, **kwargs) -> str:
        return "".join(self.stream(prompt, **kwargs))
