"""The text side of the Generator (a mixin it inherits): prompts in, text pieces out, with stop
strings, per-character origins (which drafter's tokens a piece came from), structured output, tool
calls (runtime/tools.py) and log-probabilities (runtime/logprobs.py). The token loop it drives is
runtime/generator.py's generate_ids."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from edgespec.runtime.constrain import Constraint
from edgespec.runtime.constraint import NO_CONSTRAINT, OutputConstraint
from edgespec.runtime.grammar import Grammar, GrammarError, grammar_from, grammar_tokenizer
from edgespec.runtime.logprobs import MAX_TOP
from edgespec.runtime.sampling import SamplingConfig, check_max_new_tokens
from edgespec.runtime.text import TARGET, Origins, StreamDecoder
from edgespec.runtime.tool_calls import ToolStream
from edgespec.runtime.tools import (
    ToolCall,
    ToolFormat,
    ToolPlan,
    check_messages,
    plan,
    template_messages,
    tool_format,
    tool_grammar,
)


@dataclass(frozen=True)
class ChatTools:
    """A chat request's tools as the loop runs them (TextAPI.chat_tools)."""

    plan: ToolPlan | None  # the tools offered and tool_choice (None: none offered, or tool_choice none)
    format: ToolFormat  # how this folder's template writes calls
    messages: list  # the messages for the template (tools.template_messages)
    template_tools: list | None  # the `tools` the template takes (None: none, or a template that takes none)
    grammar: Grammar | None  # the constraint of a required / named tool_choice (None: free)


class TextAPI:
    """stream / stream_text / generate over a Generator's generate_ids."""

    last_tool_calls: list[ToolCall] = []  # the calls the last stream_text answer made (tools given)
    last_logprobs: list[tuple] = []  # stream_text: (id, logprob, top ids, top logprobs) per token of its last piece

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
        tools: list[dict] | None = None,
        tool_choice=None,
        parallel_tool_calls: bool | None = None,
        logprobs: int | None = None,
    ) -> Iterator[str]:
        """Stream text for a raw prompt (str) or chat messages (list of {role, content}). At most
        one of json_schema (dict or JSON text), grammar (Lark) and regex constrains the output.
        tools (OpenAI's [{type: function, function: {name, description, parameters}}]) and
        tool_choice (auto, none, required or {type: function, function: {name}}) take chat messages
        (assistant tool_calls and role tool messages included): the text before the calls streams,
        the calls land in self.last_tool_calls and finish_reason is "tool_calls". logprobs (0..8):
        each piece's tokens with their log-probabilities and that many alternatives in
        self.last_logprobs (None: off)."""
        sampling = SamplingConfig(temperature, top_k, top_p, seed, repetition_penalty, typical_epsilon)
        sampling.check()  # here too: a bad setting fails at the call, not at the first next()
        check_max_new_tokens(max_new_tokens)
        check_logprobs(logprobs)
        fmt = grammar_from(json_schema, grammar, regex)
        calls = None
        if tools is not None or tool_choice is not None or isinstance(prompt, list):
            if tools is not None and isinstance(prompt, str):
                raise ValueError("tools need chat messages (a list of {role, content}), not a raw prompt")
            if isinstance(prompt, list):
                calls = self.chat_tools(prompt, plan(tools, tool_choice, parallel_tool_calls))
                if calls.grammar is not None and fmt is not None:
                    raise ValueError(
                        "tool_choice required / a function constrains the answer: give no other constraint"
                    )
                prompt, fmt = calls.messages, calls.grammar or fmt
        self.constraint(fmt)  # a grammar this vocabulary cannot run fails here too
        ids = self.codec.encode(prompt, calls.template_tools if calls else None)
        return self.stream_text(ids, max_new_tokens, sampling, stop, fmt, calls, logprobs)

    def chat_tools(self, messages: list[dict], tool_plan: ToolPlan | None) -> ChatTools:
        """How chat messages and a tool plan reach this folder's template (runtime/tools.py): ToolError
        (a ValueError naming the field) for a tool message that answers no call, or a template that
        cannot take tools (none at all)."""
        codec = self.codec
        check_messages(messages)
        fmt = tool_format(codec.template_text, codec.takes_tools)
        msgs, template_tools = template_messages(messages, tool_plan, fmt)
        grammar = None
        if tool_plan is not None and tool_plan.forced:
            grammar = tool_grammar(tool_plan, fmt, codec.is_special)
        return ChatTools(tool_plan, fmt, msgs, template_tools, grammar)

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
        tools: ChatTools | None = None,
        logprobs: int | None = None,
    ) -> Iterator[str]:
        """Text pieces of generate_ids: whole characters only, cut before the first stop string
        (held back while a stop string could still be straddling two pieces). With tools, text
        that may be a call is held back to the end (tool_calls.ToolStream; empty pieces meanwhile): the
        calls it makes go to self.last_tool_calls. self.last_origins and self.last_logprobs describe each piece."""
        self.last_tool_calls, self.last_logprobs = [], []
        pieces = self._pieces(ids, max_new_tokens, sampling, stop, grammar, logprobs)
        if tools is None or tools.plan is None:
            for text, self.last_origins, self.last_logprobs in pieces:
                yield text
            return
        held, calls = _Held(), ToolStream(tools.plan, tools.format)
        try:
            for text, origins, lps in pieces:
                held.add(text, origins, lps)
                out, self.last_origins, self.last_logprobs = held.take(len(calls.push(text)))
                yield out  # ("" while a call is held: the consumer may stop the generation meanwhile)
        finally:
            pieces.close()
        content, self.last_tool_calls = calls.finish()
        if self.last_tool_calls:
            self.last_stats.finish_reason = "tool_calls"
        if content:
            text, self.last_origins, self.last_logprobs = held.take(len(content))
            if text != content:  # text the calls' syntax wrapped (generic's {"response": ...})
                self.last_origins = [[len(content), TARGET]]
            yield content

    def _pieces(
        self,
        ids: np.ndarray,
        max_new_tokens: int,
        sampling: SamplingConfig,
        stop: list[str] | None,
        grammar: Grammar | None,
        logprobs: int | None,
    ) -> Iterator[tuple[str, list, list]]:
        """stream_text's pieces as (text, origins, logprobs of its tokens)."""
        decoder, origins = StreamDecoder(self.codec), Origins()
        eos = {int(t) for t in self.eos}
        stop = stop or []
        hold = max((len(x) for x in stop), default=1) - 1
        text, emitted = "", 0
        starts: list[int] = []  # logprobs: where each emitted token's text starts in text (-1: an EOS)
        lp = _TokenEntries(self, starts) if logprobs is not None else None
        gen = self.generate_ids(ids, max_new_tokens, sampling, grammar, logprobs=logprobs)
        try:
            for new in gen:
                runs = self._draft_runs(min(self.last_step[1], len(new)))  # the step's kept drafts come first
                n_dft = sum(n for n, _ in runs)  # (<= the kept tokens: a grammar's forced ones are no drafts)
                at = 0
                for n, label in (*runs, (len(new) - n_dft, TARGET)):  # every token of `new`, once
                    if n:
                        toks = [t for t in new[at : at + n].tolist() if t not in eos]
                        if lp is None:
                            piece = decoder.push(toks)
                        else:  # token by token: where each one's text starts
                            piece = ""
                            for t in new[at : at + n].tolist():
                                starts.append(-1 if t in eos else len(text) + len(piece))
                                piece += decoder.push([t]) if t not in eos else ""
                        origins.add(len(piece), label)  # text held back by the decoder goes to the later part
                        text += piece
                        at += n
                cut = min((i for i in (text.find(x) for x in stop) if i >= 0), default=-1)
                if cut >= 0:
                    if cut > emitted:
                        yield text[emitted:cut], origins.take(cut), lp.take(cut) if lp else []
                    gen.close()
                    self.last_stats.finish_reason = "stop"
                    return
                if len(text) - hold > emitted:
                    end = len(text) - hold
                    yield text[emitted:end], origins.take(end), lp.take(end) if lp else []
                    emitted = end
            if len(text) > emitted or (lp and lp.left()):
                yield text[emitted:], origins.take(len(text)), lp.take(None) if lp else []
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


def check_logprobs(n) -> None:
    """logprobs (the alternatives per token) must be None or an integer in 0..MAX_TOP."""
    if n is not None and (isinstance(n, bool) or not isinstance(n, (int, np.integer)) or not 0 <= n <= MAX_TOP):
        raise ValueError(f"logprobs={n!r}: give the number of alternatives per token, 0..{MAX_TOP} (None: off)")


class _TokenEntries:
    """The recorded log-probabilities of a call's emitted tokens, handed out by where their text starts."""

    def __init__(self, gen, starts: list[int]) -> None:
        self.gen, self.starts, self.at = gen, starts, 0

    def left(self) -> bool:
        return self.at < len(self.starts)

    def take(self, end: int | None) -> list[tuple]:
        """(id, logprob, top ids, top logprobs) of the tokens not handed out whose text starts before
        end (None: all); EOS tokens are passed over."""
        rec, out = self.gen.token_logprobs, []
        while self.at < len(self.starts) and (end is None or self.starts[self.at] < end):
            i = self.at
            if self.starts[i] >= 0:
                out.append((rec.ids[i], rec.logprobs[i], rec.top_ids[i], rec.top_logprobs[i]))
            self.at += 1
        return out


class _Held:
    """Pieces held back (tool calls may be in them): text with its origins and token log-probabilities."""

    def __init__(self) -> None:
        self.parts: deque[list] = deque()  # [text, origins runs [[n_chars, label]], logprob entries]

    def add(self, text: str, origins: list, lps: list) -> None:
        if text or lps:
            self.parts.append([text, [list(r) for r in origins], list(lps)])

    def take(self, n: int) -> tuple[str, list, list]:
        """The next n characters, with their origins and the log-probabilities of their pieces."""
        text, runs, lps = "", [], []
        while self.parts and (len(text) < n or not self.parts[0][0]):
            part = self.parts[0]
            k = min(n - len(text), len(part[0]))
            text += part[0][:k]
            lps += part[2]
            part[2] = []
            left = k
            while left and part[1]:
                m = min(left, part[1][0][0])
                runs.append([m, part[1][0][1]])
                part[1][0][0] -= m
                left -= m
                if not part[1][0][0]:
                    part[1].pop(0)
            part[0] = part[0][k:]
            if not part[0]:
                self.parts.popleft()
        return text, runs, lps
