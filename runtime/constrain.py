"""Structured output: a JSON Schema, Lark grammar or regex constrains what the loop emits, and
speculation stays lossless under it. The grammar engine is llguidance (the `structured` extra;
grammar.py compiles the grammar): this module drives its matcher inside the loop, one token mask
per position, forced tokens, advance and rollback.

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
import time

import numpy as np

from edgespec.runtime.constraint import OutputConstraint
from edgespec.runtime.drafters import spec_of
from edgespec.runtime.grammar import (
    HINT,
    Grammar,
    GrammarError,
    call_library,
    label,
    llguidance_module,
    one_line,
    parser_limits,
)
from edgespec.runtime.sampling import SamplingConfig, penalize, probs, sample
from edgespec.runtime.state import Proposal, SeqState, SparseQ, chain
from edgespec.runtime.verify import accept_sampled

# byte b of a packed mask -> its 8 tokens (bit i = token 8b + i): True where the token is forbidden
_FORBID = np.array([[not (b >> i) & 1 for i in range(8)] for b in range(256)], bool)
# the loop's first steps the start check takes (Constraint._start): a step's limits are spent on
# the forced run ahead, so a grammar over them fails at its first or second token
START_STEPS = 2


def chain_cap(widths) -> int:
    """The longest chain (after the pending token) one verify call takes: widths 2..m+1 all exist."""
    m = 0
    while m + 2 in widths:
        m += 1
    return m


class Constraint(OutputConstraint):
    """The grammar side of the loop for one generator: a matcher per call (`begin`), the mask
    buffers every call reuses (rows: the widest verify call) and the counters of the call."""

    trees_ok = False  # the matcher walks one path: a tree drafter drafts a chain here

    def __init__(self, tokenizer, vocab_size: int, eos_ids, n_rows: int) -> None:
        if not len(eos_ids):
            raise GrammarError("structured output needs the folder's EOS token (its manifest lists none)")
        self.llg, self.tokenizer = llguidance_module(), tokenizer
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
            m = call_library(
                grammar.kind, self.llg.LLMatcher, self.tokenizer, grammar.text, log_level=0, limits=parser_limits()
            )
            if m.is_error():
                raise GrammarError(f"{label(grammar.kind)}: {one_line(m.get_error())}")
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
                        raise GrammarError(f"{label(kind)}: the grammar admits {what}: nothing to generate")
                    break
                tok = int(allowed[0])
            if not m.consume_token(tok):
                break
            taken += 1
            if m.is_stopped():
                break
        if m.is_error() or not m.rollback(taken):
            raise GrammarError(f"{label(kind)}: llguidance cannot run it: {one_line(m.get_error())} (hint: {HINT})")

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
            kind, reason = label(self.grammar.kind), one_line(self.matcher.get_error())
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
                    again = self._redraft(drafter, seq, n, same, min(budget, cap - n))
                    base, same, m, q_src = n, n, n + again.n_drafted, again.q
                    proposed += again.n_drafted
                if n != same or n >= m or not self._draft_allowed(n, int(slots[n])):
                    break
                self._keep_draft(n, q_src, n - base)
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

    def _redraft(self, drafter, seq: SeqState, n: int, same: int, k: int) -> Proposal:
        """The drafter's proposal of up to k drafts after the chain's first n tokens (its own drafts
        matched the first `same` of them)."""
        if n != same:
            drafter.accepted(seq, seq.n, same)  # its rows past `same` hold other tokens
        n0, seq.n = seq.n, seq.n + n
        try:
            again = drafter.propose(seq, k)
        finally:
            seq.n = n0
        self.n_redrafts += 1
        return again

    def _keep_draft(self, slot: int, q_src, row: int) -> None:
        """Chain slot `slot` holds a draft: its q (row `row` of the proposal's q, None: one-hot) copied in."""
        self.forced[slot] = False
        self._has_q[slot] = q_src is not None
        if isinstance(q_src, SparseQ):  # kept now: a drafter may reuse its q buffer when it drafts again
            q_src.dense_row(row, self._q_rows()[slot])
        elif q_src is not None:
            np.copyto(self._q_rows()[slot], q_src[row])

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
