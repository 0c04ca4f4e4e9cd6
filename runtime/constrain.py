"""Structured output: a JSON Schema, Lark grammar or regex constrains what the loop emits, and
speculation stays lossless under it. The grammar engine is llguidance (the `structured` extra);
this module only drives it: one token mask per position, forced tokens, advance and rollback.

Constrained decoding, the rule plain and speculative decoding share, position by position:
  forced   the grammar allows one continuation: the library's fast-forward tokens (their first),
           or EOS once the grammar is complete. That token is taken, no target choice.
  choice   else the target's logits with the tokens the grammar forbids set to -inf: greedy takes
           the masked argmax, sampling draws from the masked, renormalised distribution.

A speculative step under the grammar (chains only; a tree drafter drafts a chain here):
  shape    before the verify call the matcher walks the drafts. A forced position takes the forced
           token (a draft that differs ends the drafts: those after it were drafted for another
           context); a draft the grammar forbids is cut with all after it (it could never be kept,
           so it costs no row); forced tokens after the last draft extend the chain, so they ride
           in the verify call for their KV. A drafter that reads only tokens (prompt lookup,
           suffix) or runs its own model over them (draft) drafts again after forced tokens its
           drafts missed or ran out before. Drafts are checked with the matcher (greedy) or
           against each choice row's mask (sampling, which needs the masks anyway).
  accept   forced positions are kept. Greedy keeps a draft iff it is its row's masked argmax.
           Sampling verifies with p' (masked target) and q' = the drafter's q restricted to the
           allowed tokens and renormalised: a draft that survived the cut is distributed as q',
           and a cut draft's position is sampled from p' outright, so every position follows p'.
  commit   the matcher rolls back the rejected tail and takes the step's last token.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from edgespec.runtime.constraint import OutputConstraint
from edgespec.runtime.drafters import spec_of
from edgespec.runtime.sampling import SamplingConfig, penalize, probs, sample
from edgespec.runtime.state import Proposal, SeqState, SparseQ, chain
from edgespec.runtime.verify import accept_sampled

INSTALL_HINT = "pip install 'edgespec[structured]'"
# JSON as one line, spaced like Python's json.dumps: the separators are then forced tokens, and a
# small model cannot wander off into whitespace. A schema's own "x-guidance" options override it.
JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
KINDS = ("json_schema", "json_object", "lark", "regex")
# drafters that can draft after tokens the target has not verified yet (they read only the token
# sequence, or run their own model over what is behind): they draft again after forced tokens
# byte b of a packed mask -> its 8 tokens (bit i = token 8b + i): True where the token is forbidden
_FORBID = np.array([[not (b >> i) & 1 for i in range(8)] for b in range(256)], bool)
_SOURCE_LINE = re.compile(r"^\s*(\d+ \|.*|\^+)\s*$")  # a grammar error's quoted source line or caret
# where llguidance's matcher errors append its parser state ("<state>...", or "<non-verbose/>" with
# verbose_errors off): internal detail, never shown to a client
_STATE_DUMP = re.compile(r"^\s*<(state|non-verbose)\b")
# llguidance's resource limits, for validation and every matcher (LLParserLimits; defaults otherwise).
# initial_lexer_fuel bounds how far one step walks a forced run: at the default (1e6) a regex like
# (((a{100}){100}){100}) holds the GIL for over a second on its first token before it fails anyway
# (200k: ~0.1 s; JSON schemas and the tests' grammars use a few thousand). verbose_errors off: no
# parser state in error messages.
LEXER_FUEL = 200_000
# the loop's first steps the start check takes (Constraint._start): a step's limits are spent on
# the forced run ahead, so a grammar over them fails at its first or second token
START_STEPS = 2
# llguidance compiles a Lark grammar recursing once per nested rule (~3 KB of stack each): a chain of
# ~2,700 rules (r0: r1, r1: r2, ...) overflows an 8 MiB stack, ~650 a 2 MiB thread stack, and the
# process dies (SIGSEGV: no exception to catch). So grammars are compiled on one thread with a large
# stack (`_deep`), and a Lark grammar may define at most MAX_LARK_RULES rules and terminals (a chain
# cannot be deeper than that): 4x under what DEEP_STACK holds, far above hand-written grammars.
DEEP_STACK = 64 << 20
MAX_LARK_RULES = 5_000
_DEFINITION = re.compile(r"^[ \t]*[?!]?[A-Za-z_][A-Za-z0-9_]*(\.-?\d+)?[ \t]*:", re.M)  # a Lark rule or terminal
_deep_pool: ThreadPoolExecutor | None = None
_deep_lock = threading.Lock()


def _forget_deep_pool() -> None:  # a forked child has no grammar thread: it makes its own
    global _deep_pool, _deep_lock
    _deep_pool, _deep_lock = None, threading.Lock()


os.register_at_fork(after_in_child=_forget_deep_pool)
HINT = "shorten long repetitions, split rules with thousands of alternatives, give each recursive rule a base case"


class GrammarError(ValueError):
    """A JSON Schema, grammar or regex that cannot constrain the output (the library's reason)."""


def _llg():
    try:
        import llguidance
    except ImportError:
        raise GrammarError(f"structured output needs llguidance, which is not installed: {INSTALL_HINT}") from None
    return llguidance


def _library(kind: str, fn, *args, **kwargs):
    """fn(*args, **kwargs) of llguidance on the grammar thread (`_deep`), its failures as
    GrammarError: its errors, and a panic of its Rust code (which pyo3 raises as PanicException, a
    BaseException)."""
    try:
        return _deep(fn, *args, **kwargs)
    except (ValueError, TypeError, RecursionError) as e:
        raise GrammarError(f"{kind}: {_one_line(str(e))}") from None
    except BaseException as e:
        if type(e).__name__ != "PanicException":
            raise
        raise GrammarError(f"{kind}: llguidance failed on it ({_one_line(str(e))[:200]})") from None


def _deep(fn, *args, **kwargs):
    """fn(*args, **kwargs) on the grammar thread (DEEP_STACK of stack; made at the first call).
    llguidance drops the GIL while it compiles, so the thread hop costs ~0.1 ms and no parallelism."""
    global _deep_pool
    with _deep_lock:
        if _deep_pool is None:
            old = threading.stack_size(DEEP_STACK)  # process-wide, for threads started meanwhile too
            try:
                pool = ThreadPoolExecutor(1, thread_name_prefix="edgespec-grammar")
                pool.submit(int).result()  # its one thread starts now, with the large stack
            finally:
                threading.stack_size(old)
            _deep_pool = pool
    return _deep_pool.submit(fn, *args, **kwargs).result()


def _one_line(msg: str) -> str:
    """llguidance's message as one line: no quoted source lines or carets, nothing from its state dump on."""
    lines = []
    for s in msg.splitlines():
        if _STATE_DUMP.match(s):
            break
        if s.strip() and not _SOURCE_LINE.match(s):
            lines.append(s.strip())
    return " ".join(lines)[:300]


def _limits():
    return _llg().LLParserLimits(initial_lexer_fuel=LEXER_FUEL, verbose_errors=False)


def _label(kind: str) -> str:
    """How an error names the constraint: the request's own word for it."""
    return "grammar" if kind == "lark" else kind


@dataclass(frozen=True)
class Grammar:
    """A checked output constraint: llguidance's grammar text and what it was made from."""

    text: str  # the grammar as llguidance's LLMatcher takes it
    kind: str  # json_schema | json_object | lark | regex


def grammar_from(
    json_schema=None, grammar: str | None = None, regex: str | None = None, strict: bool = True
) -> Grammar | None:
    """The Grammar of at most one of: a JSON Schema (dict, or its JSON text), a Lark grammar
    (llguidance's dialect), a regex. None when none is given. strict=False ignores JSON Schema
    keywords the library does not implement instead of refusing them (OpenAI's strict: false).
    Raises GrammarError (one line, the library's reason)."""
    given = [
        name for name, v in (("json_schema", json_schema), ("grammar", grammar), ("regex", regex)) if v is not None
    ]
    if not given:
        return None
    if len(given) > 1:
        raise GrammarError(f"give one output constraint, not {' and '.join(given)}")
    llg = _llg()
    if json_schema is not None:
        if isinstance(json_schema, str):
            try:
                json_schema = json.loads(json_schema)
            except (ValueError, RecursionError) as e:
                raise GrammarError(f"json_schema is not JSON: {e}") from None
        if not isinstance(json_schema, dict):
            raise GrammarError(f"json_schema must be a JSON object (a schema), got {type(json_schema).__name__}")
        kind = "json_schema"
        options = JSON_OPTIONS | {"lenient": not strict}
        try:
            # as text: llguidance's parser of JSON text stops at 128 levels, its reader of a dict
            # recurses without a limit (a dict 20,000 levels deep kills the process)
            schema_text = json.dumps(json_schema)
        except (ValueError, TypeError, RecursionError) as e:
            raise GrammarError(f"json_schema cannot be written as JSON: {e}") from None
        text = _library(kind, llg.LLMatcher.grammar_from_json_schema, schema_text, defaults=options)
    elif grammar is not None:
        if not isinstance(grammar, str) or not grammar.strip():
            raise GrammarError("grammar must be a non-empty Lark grammar string")
        n_rules = len(_DEFINITION.findall(grammar))
        if n_rules > MAX_LARK_RULES:
            raise GrammarError(
                f"grammar: {n_rules} rules and terminals, over the {MAX_LARK_RULES} llguidance can compile "
                "safely (its compiler recurses once per nested rule): merge rules, or use a regex terminal"
            )
        kind, text = "lark", llg.LLMatcher.grammar_from_lark(grammar)
    else:
        if not isinstance(regex, str):
            raise GrammarError(f"regex must be a string, got {type(regex).__name__}")
        kind, text = "regex", llg.LLMatcher.grammar_from_regex(regex)
    is_error, msgs = _library(kind, llg.LLMatcher.validate_grammar_with_warnings, text, None, limits=_limits())
    if is_error:
        raise GrammarError(f"{_label(kind)}: {_one_line(msgs[0])}")
    return Grammar(text, kind)


def json_object() -> Grammar:
    """Any JSON object (OpenAI's response_format json_object)."""
    return Grammar(grammar_from(json_schema={"type": "object"}).text, "json_object")


def chain_cap(widths) -> int:
    """The longest chain (after the pending token) one verify call takes: widths 2..m+1 all exist."""
    m = 0
    while m + 2 in widths:
        m += 1
    return m


class TokenTable:
    """What llguidance's TokenizerWrapper reads, for a tokenizer it cannot load by itself (no
    byte-level or byte-fallback decoder): each token's bytes, its special ids, an encoder."""

    def __init__(self, tokens: list[bytes], eos: int, special: list[int], encode) -> None:
        self.tokens, self.eos_token_id, self.bos_token_id = tokens, eos, None
        self.special_token_ids, self._encode = special, encode

    def __call__(self, text) -> list[int]:
        return self._encode(text.decode("utf-8", "replace") if isinstance(text, bytes) else text)


def grammar_tokenizer(tokenizer, vocab_size: int, eos_ids):
    """llguidance's view of a `tokenizers` Tokenizer (no transformers): its own reader of the
    tokenizer.json, else a token-by-token table made by decoding each id alone."""
    llg = _llg()
    eos = [int(i) for i in eos_ids]
    try:
        return llg.LLTokenizer(tokenizer.to_str(), n_vocab=vocab_size, eos_token=eos)
    except ValueError:
        n = tokenizer.get_vocab_size(with_added_tokens=True)
        special = sorted({i for i, t in tokenizer.get_added_tokens_decoder().items() if t.special} | set(eos))
        table = TokenTable(
            [tokenizer.decode([i], skip_special_tokens=False).encode() for i in range(n)],
            eos[0],
            special,
            lambda s: tokenizer.encode(s, add_special_tokens=False).ids,
        )
        return llg.LLTokenizer(llg.TokenizerWrapper(table), n_vocab=vocab_size, eos_token=eos)


class Constraint(OutputConstraint):
    """The grammar side of the loop for one generator: a matcher per call (`begin`), the mask
    buffers every call reuses (rows: the widest verify call) and the counters of the call."""

    trees_ok = False  # the matcher walks one path: a tree drafter drafts a chain here

    def __init__(self, tokenizer, vocab_size: int, eos_ids, n_rows: int) -> None:
        if not len(eos_ids):
            raise GrammarError("structured output needs the folder's EOS token (its manifest lists none)")
        self.llg, self.tokenizer = _llg(), tokenizer
        self.vocab, self.eos, self._eos_ids = vocab_size, int(eos_ids[0]), {int(i) for i in eos_ids}
        n_words = (vocab_size + 31) // 32
        self.bits = np.zeros((n_rows, n_words), np.int32)  # llguidance's packed masks, one per verify row
        self.forbid = np.zeros((n_rows, n_words * 32), bool)  # the same unpacked: True = masked out
        self._unpacked = np.zeros(n_rows, bool)  # forbid[i] is current for bits[i]
        self._row_bytes = self.bits.strides[0]
        self._ptr = [self.bits.ctypes.data + i * self._row_bytes for i in range(n_rows)]
        self.forced = np.zeros(n_rows, bool)  # chain slot j (position j+1) holds a forced token
        self._has_q = np.zeros(n_rows, bool)  # draft slot j's q row is in _q (else its q is one-hot)
        self._q: np.ndarray | None = None  # [n_rows, V] the drafter's q restricted (made at the first need)
        self._logits: np.ndarray | None = None  # a copy of read-only logits (engines that hand those out)
        self.matcher = None
        self.grammar: Grammar | None = None

    def begin(self, grammar: Grammar, greedy: bool = True) -> None:
        """A matcher at the grammar's start for one call (the last call's, reset, when its grammar
        was the same: its lexer states are built already). A new matcher is started first
        (`_start`): GrammarError when this vocabulary cannot run the grammar, it fails within its
        first steps or admits no output. greedy: a row's full mask is computed only when the
        target's own argmax there is forbidden (sampling needs every choice row's mask)."""
        m = self.matcher
        if m is None or self.grammar is None or grammar.text != self.grammar.text or not m.reset() or m.is_error():
            m = _library(grammar.kind, self.llg.LLMatcher, self.tokenizer, grammar.text, log_level=0, limits=_limits())
            if m.is_error():
                raise GrammarError(f"{_label(grammar.kind)}: {_one_line(m.get_error())}")
            self._start(m, grammar.kind)
        self.matcher, self.grammar, self.greedy = m, grammar, greedy
        self.n_forced = self.n_cut = self.n_masks = self.n_redrafts = 0  # the call's counters
        self.n_forced_rows = 0  # forced tokens that rode in verify calls (kept or not)
        self.seconds = 0.0  # host time in shape() and accept()
        self.shape_s = 0.0  # the last shape()'s part of it
        self._n_chain = self._same = 0
        self._bonus = -1

    def _start(self, m, kind: str) -> None:
        """Take the loop's first START_STEPS steps on a new matcher (forced token, else the first
        token its mask allows), then roll them back. llguidance builds its lexer and parser lazily
        and spends a step's limits on the forced run ahead, so a huge repetition (a{1000000}), a
        rule of 30,000 alternatives or a recursion without a base case passes validation and only
        fails at the first or second token: here that is a GrammarError before anything is sent.
        A grammar whose first mask allows nothing but EOS is refused too: it admits no output, or
        only the empty string, and the call would answer "" with finish_reason stop."""
        taken, eos = 0, np.array(sorted(self._eos_ids))
        for step in range(START_STEPS):
            ff = m.compute_ff_tokens()
            if m.is_error():
                break
            if ff:
                tok = ff[0]
            else:
                m.unsafe_compute_mask_ptr(self._ptr[0], self._row_bytes)
                self._unpacked[0] = False
                allowed = np.flatnonzero(~self._forbidden(0))
                allowed = allowed[~np.isin(allowed, eos)]
                if not len(allowed):
                    # nothing but EOS may follow: the grammar is complete (after a first token), or
                    # admits nothing at all (llguidance then stops with NoExtensionBias, no error of ours)
                    if step == 0 and (not m.is_error() or m.get_error().startswith("NoExtensionBias")):
                        what = "only the empty string" if m.is_accepting() else "no output (no text matches it)"
                        raise GrammarError(f"{_label(kind)}: the grammar admits {what}: nothing to generate")
                    break
                tok = int(allowed[0])
            if not m.consume_token(tok):
                break
            taken += 1
            if m.is_stopped():
                break
        if m.is_error() or not m.rollback(taken):
            raise GrammarError(f"{_label(kind)}: llguidance cannot run it: {_one_line(m.get_error())} (hint: {HINT})")

    def forget(self) -> None:
        """Drop the matcher kept for a next call with the same grammar (its lexer states too)."""
        self.matcher = self.grammar = None

    # ---- the rule ----------------------------------------------------------------------------------
    def _forced_token(self) -> int:
        """The token the grammar forces next, or -1 when the target chooses."""
        m = self.matcher
        if m.is_stopped():
            return self.eos
        ff = m.compute_ff_tokens()
        return ff[0] if ff else -1

    def _consume(self, tok: int) -> None:
        if not self.matcher.consume_token(int(tok)):
            # a limit hit past the start check's steps (or a bug of ours feeding a forbidden token)
            kind, reason = _label(self.grammar.kind), _one_line(self.matcher.get_error())
            raise GrammarError(f"{kind}: the grammar failed during generation: {reason} (hint: {HINT})")

    def _mask(self, row: int) -> None:
        self.matcher.unsafe_compute_mask_ptr(self._ptr[row], self._row_bytes)
        self._unpacked[row] = False
        self.n_masks += 1

    def _forbidden(self, row: int) -> np.ndarray:
        """Row's mask as a bool row [V] (True = forbidden), unpacked on first use."""
        if not self._unpacked[row]:
            np.take(_FORBID, self.bits[row].view(np.uint8), axis=0, out=self.forbid[row].reshape(-1, 8))
            self._unpacked[row] = True
        return self.forbid[row, : self.vocab]

    def _allowed(self, row: int, tok: int) -> bool:
        """Does row's computed mask allow tok?"""
        return bool((int(self.bits[row, tok >> 5]) >> (tok & 31)) & 1)

    def _valid(self, tok: int) -> bool:
        """May the matcher take tok now? (No mask needed: about a microsecond.)"""
        return self.matcher.validate_tokens([int(tok)]) == 1

    def _draft_allowed(self, row: int, tok: int) -> bool:
        return self._valid(tok) if self.greedy else self._allowed(row, tok)

    def _argmax(self, logits: np.ndarray, row: int) -> int:
        """The masked argmax where the matcher stands: the plain argmax when the grammar allows it
        (the first maximum, so the same index masking would give), else the argmax of the row
        masked (mask computed into buffer row `row`)."""
        x = int(logits.argmax())
        if self._valid(x):
            return x
        self._mask(row)
        np.copyto(logits, -np.inf, where=self._forbidden(row))
        return int(logits.argmax())

    def _writable(self, logits: np.ndarray) -> np.ndarray:
        if logits.flags.writeable:
            return logits
        if self._logits is None or self._logits.shape[0] < len(logits):
            self._logits = np.empty((len(self.bits), logits.shape[-1]), np.float32)
        out = self._logits[: len(logits)]
        out[:] = logits
        return out

    # ---- what the loop calls -----------------------------------------------------------------------
    @property
    def kind(self) -> str:
        return self.grammar.kind

    def drafter_sampling(self, sampling: SamplingConfig) -> SamplingConfig:
        # masked rows: the token after a verified row need not be its argmax (a fused head assumes it)
        return dataclasses.replace(sampling, masked=True)

    def first(self, logits: np.ndarray, sampling: SamplingConfig, rng) -> int:
        """The first output token from the prompt's last logits [V] (repetition penalty applied)."""
        tok = self._forced_token()
        logits = self._writable(logits[None])[0]
        if tok >= 0:
            self.n_forced += 1
        elif sampling.greedy:
            tok = self._argmax(logits, 0)
        else:
            self._mask(0)
            np.copyto(logits, -np.inf, where=self._forbidden(0))
            tok = sample(probs(logits, sampling), rng)
        self._consume(tok)
        return tok

    def shape(self, prop: Proposal, seq: SeqState, tgt, drafter=None, k: int = 0) -> Proposal:
        """The chain to verify (module docstring): forced tokens in, forbidden drafts out, at most
        as many tokens after the pending one as a verify call of the engine tgt takes and its
        context holds. A drafter that can draft past unverified tokens (its DrafterPlugin says
        `redrafts`) drafts again after forced tokens its drafts missed or ran out before, up to k
        drafts in all. The matcher then stands after the whole chain."""
        cap = min(chain_cap(tgt.widths), tgt.max_len - seq.n - 1)
        t0 = time.perf_counter()
        slots = seq.tokens[seq.n : seq.n + cap]
        # slots[base:m]: the latest proposal's tokens; slots[:same]: the chain prefix the drafter made
        # or saw (its own state past it holds other tokens)
        n = same = base = used = 0
        m = prop.n_drafted
        proposed, budget, q_src = m, k, prop.q
        redraft = drafter is not None and spec_of(drafter.name).redrafts
        self._bonus = -1
        self.drafted = 0  # choice slots holding drafts (each is verified)
        while True:
            tok = self._forced_token()
            if tok >= 0:
                if n == cap:  # no room: the step's last token is this forced one
                    self._bonus = tok
                    break
                if n == same and n < m and slots[n] == tok:
                    same, used = same + 1, used + 1
                slots[n] = tok
                self.forced[n] = True
            else:
                if not self.greedy:  # row n chooses position n+1 (the bonus row when the chain ends here)
                    self._mask(n)
                if (n != same or n >= m) and redraft and base < n < cap and budget > 0:
                    # the drafts missed a forced token or ran out before one: draft again after the chain
                    if n != same:
                        drafter.accepted(seq, seq.n, same)  # its rows past `same` hold other tokens
                    n0, seq.n = seq.n, seq.n + n
                    try:
                        again = drafter.propose(seq, min(budget, cap - n))
                    finally:
                        seq.n = n0
                    base, same, m, q_src = n, n, n + again.n_drafted, again.q
                    proposed += again.n_drafted
                    self.n_redrafts += 1
                if n != same or n >= m or not self._draft_allowed(n, int(slots[n])):
                    break
                self.forced[n] = False
                self._has_q[n] = q_src is not None
                if isinstance(q_src, SparseQ):  # kept now: a drafter may reuse its q buffer when it drafts again
                    q_src.dense_row(n - base, self._q_rows()[n])
                elif q_src is not None:
                    np.copyto(self._q_rows()[n], q_src[n - base])
                same, used, budget = same + 1, used + 1, budget - 1
                self.drafted += 1
            self._consume(slots[n])
            n += 1
            if self.matcher.is_stopped():  # complete (only EOS may follow) or EOS taken (the output ends)
                self._bonus = self.eos
                break
        self._n_chain, self._same = n, same
        self.n_forced_rows += n - self.drafted
        self.cut = proposed - used  # drafts dropped: forbidden, or past a forced token they missed
        self.n_cut += self.cut
        self.shape_s = time.perf_counter() - t0
        self.seconds += self.shape_s
        return chain(seq, n)

    def accept(
        self, prop: Proposal, tgt_logits: np.ndarray, seq: SeqState, sampling: SamplingConfig, rng
    ) -> tuple[int, int]:
        """(n accepted, the step's last token) for the chain of shape() verified as tgt_logits
        [n+1, V]; the matcher then stands after the accepted tokens and that last one."""
        t0 = time.perf_counter()
        n, slots = self._n_chain, seq.tokens[seq.n : seq.n + self._n_chain]
        if sampling.repetition_penalty != 1.0:  # row i's context: tokens[:n + i]
            tgt_logits = penalize(tgt_logits, seq.tokens, seq.n, sampling.repetition_penalty)
        else:
            tgt_logits = self._writable(tgt_logits)
        if sampling.greedy:
            n_acc, nxt = self._accept_greedy(tgt_logits, slots)
        else:
            n_acc, nxt = self._accept_sampled(tgt_logits, slots, sampling, rng)
            self.matcher.rollback(n - n_acc)
        ended = n_acc > 0 and int(slots[n_acc - 1]) in self._eos_ids  # an EOS was kept: nothing follows it
        if not ended:
            self._consume(nxt)
        self.forced_kept = int(np.count_nonzero(self.forced[:n_acc]))  # forced tokens among the kept
        self.forced_last = int(n_acc == n and self._bonus >= 0 and not ended)  # the step's last token was forced
        self.accepted = n_acc - self.forced_kept  # drafts kept
        self.n_forced += self.forced_kept + self.forced_last
        self.seconds += time.perf_counter() - t0
        return n_acc, nxt

    def _accept_greedy(self, logits: np.ndarray, slots: np.ndarray) -> tuple[int, int]:
        """A draft is kept iff it is its row's masked argmax: the plain argmax when they agree (the
        draft is allowed), else the masked choice where the matcher stands at that position. The
        matcher is left after the kept tokens."""
        n = self._n_chain
        for j in range(n):
            if self.forced[j] or int(logits[j].argmax()) == slots[j]:
                continue
            self.matcher.rollback(n - j)
            y = self._argmax(logits[j], j)
            if y != slots[j]:
                return j, y
            for t in slots[j:n]:  # the draft was the masked argmax after all: back to the chain's end
                self._consume(t)
        return n, (self._bonus if self._bonus >= 0 else self._argmax(logits[n], n))

    def _accept_sampled(self, logits: np.ndarray, slots: np.ndarray, sampling: SamplingConfig, rng):
        """Rejection sampling over the masked rows: a forced position's row (and q) one-hot on its
        token, so it is always kept; q' = the drafter's q restricted to the allowed tokens."""
        n = self._n_chain
        for j in range(n + 1):
            forced = self._bonus if j == n else (int(slots[j]) if self.forced[j] else -1)
            if forced >= 0:
                logits[j].fill(-np.inf)
                logits[j, forced] = 0.0
            else:
                np.copyto(logits[j], -np.inf, where=self._forbidden(j))
        q = None  # one-hot q: a deterministic drafter, and forced slots
        if any(self._has_q[j] and not self.forced[j] for j in range(n)):
            q = self._q[:n]  # the drafts' q rows, copied in by shape()
            for j in range(n):
                if self.forced[j] or not self._has_q[j]:
                    q[j].fill(0.0)
                    q[j, slots[j]] = 1.0
                else:
                    self._restrict(q[j], j)
        return accept_sampled(slots, q, logits[: n + 1], sampling, rng)

    def _q_rows(self) -> np.ndarray:
        if self._q is None:  # [n_rows, V] float64: made at the first sampled call with a drafter's q
            self._q = np.zeros((len(self.bits), self.vocab), np.float64)
        return self._q

    def _restrict(self, q: np.ndarray, row: int) -> None:
        """q [V] restricted to row's allowed tokens and renormalised (in place)."""
        np.copyto(q, 0.0, where=self._forbidden(row))
        q /= q.sum()  # > 0: the drafted token is allowed and had q > 0

    def drafter_kept(self, n_acc: int) -> int:
        """How many of the drafter's own tokens were kept (its rows past them hold other tokens)."""
        return min(n_acc, self._same)

    def drafts(self, prop: Proposal) -> int:
        return self.drafted

    def drafts_kept(self, n_acc: int) -> int:
        return self.accepted

    def depth(self, prop: Proposal) -> int:
        return self.drafted  # per-position stats count the drafts, forced rows apart
