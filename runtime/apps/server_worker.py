"""The server's single worker thread: queued requests one at a time on the one Generator, each
with its own `Speculation` and the server default restored after it; when the queue is empty, the
shadow checks (a sampled greedy request re-run with plain decoding, ids compared); and the
Prometheus counters.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import queue
import random
import threading
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from edgespec.runtime.apps.server_schema import BadRequest, Speculation
from edgespec.runtime.generator import Generator, PromptTooLongError
from edgespec.runtime.grammar import Grammar, GrammarError
from edgespec.runtime.sampling import SamplingConfig
from edgespec.runtime.text_api import ChatTools

log = logging.getLogger("edgespec.serve")
TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
ITL_BUCKETS = (0.002, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28)
SHADOW_BACKLOG = 16  # shadow checks waiting for idle time; the oldest are dropped beyond this
IDLE_S = 0.05  # an empty queue for this long counts as idle (shadow checks may run)
STARTED, END = object(), object()  # markers on a job's output queue: generation began; nothing more


@dataclass
class Job:
    rid: str  # the response id, named in logs
    ids: np.ndarray  # prompt token ids
    max_tokens: int  # most tokens to generate
    sampling: SamplingConfig  # how tokens are chosen
    stop: list[str]  # stop strings
    speculation: Speculation | None  # how this request is decoded (None: the server's default then)
    loop: asyncio.AbstractEventLoop  # the event loop that reads `out`
    # STARTED, then per choice its pieces (index, text, progress, logprobs) and its end {index, finish_reason,
    # tool_calls}, then {usage, stats}, END
    out: asyncio.Queue = field(default_factory=asyncio.Queue)
    cancel: threading.Event = field(default_factory=threading.Event)  # set when the client went away
    grammar: Grammar | None = None  # response_format's or tool_choice's constraint (None: free text)
    tools: ChatTools | None = None  # a chat's tools (None: a completion)
    logprobs: int | None = None  # alternatives per token with its log-probability (None: off)
    n: int = 1  # choices, one after another


@dataclass(frozen=True)
class ShadowCheck:
    rid: str  # the request checked
    speculation: Speculation  # how it was decoded
    ids: np.ndarray  # its prompt ids
    output: np.ndarray  # the ids it emitted
    sampling: SamplingConfig  # greedy; the repetition penalty as asked
    grammar: Grammar | None = None  # its response_format constraint (the plain re-run follows it too)


def first_difference(a: np.ndarray, b: np.ndarray) -> int | None:
    """The first position where two id sequences differ (a length difference counts), else None."""
    n = min(len(a), len(b))
    diff = np.flatnonzero(a[:n] != b[:n])
    if len(diff):
        return int(diff[0])
    return None if len(a) == len(b) else n


class Histogram:
    def __init__(self, name: str, help_: str, buckets) -> None:
        self.name, self.help, self.buckets = name, help_, buckets
        self.counts = [0] * len(buckets)
        self.total, self.n = 0.0, 0

    def observe(self, v: float) -> None:
        for i, b in enumerate(self.buckets):
            if v <= b:
                self.counts[i] += 1
        self.total += v
        self.n += 1

    def render(self) -> list[str]:
        lines = [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} histogram"]
        lines += [f'{self.name}_bucket{{le="{b}"}} {c}' for b, c in zip(self.buckets, self.counts, strict=True)]
        lines += [
            f'{self.name}_bucket{{le="+Inf"}} {self.n}',
            f"{self.name}_sum {self.total}",
            f"{self.name}_count {self.n}",
        ]
        return lines


class Metrics:
    """Counters named as vLLM names its speculative-decoding metrics (prefix edgespec:)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.counters = {
            "edgespec:request_success_total": 0,
            "edgespec:request_rejected_total": 0,
            "edgespec:request_cancelled_total": 0,
            "edgespec:prompt_tokens_total": 0,
            "edgespec:generation_tokens_total": 0,
            "edgespec:spec_decode_num_drafts_total": 0,
            "edgespec:spec_decode_num_draft_tokens_total": 0,
            "edgespec:spec_decode_num_accepted_tokens_total": 0,
            "edgespec:shadow_checks_total": 0,
            "edgespec:shadow_mismatches_total": 0,
        }
        self.verify_calls = 0
        self.verify_tokens = 0
        self.ttft = Histogram("edgespec:time_to_first_token_seconds", "Time to first token.", TTFT_BUCKETS)
        self.itl = Histogram("edgespec:inter_token_latency_seconds", "Per-token latency after the first.", ITL_BUCKETS)

    def add(self, name: str, v: int = 1) -> None:
        with self.lock:
            self.counters[name] += v

    def record(self, st) -> None:
        with self.lock:
            c = self.counters
            c["edgespec:prompt_tokens_total"] += st.n_prompt
            c["edgespec:generation_tokens_total"] += st.n_output
            c["edgespec:spec_decode_num_drafts_total"] += int(st.drafted_at[0])
            c["edgespec:spec_decode_num_draft_tokens_total"] += st.n_drafted
            c["edgespec:spec_decode_num_accepted_tokens_total"] += st.n_accepted
            self.verify_calls += st.n_target_calls
            self.verify_tokens += st.n_step_tokens
            self.ttft.observe(st.ttft_s)
            for x in st.itl_s:
                self.itl.observe(x)

    def render(self) -> str:
        with self.lock:
            lines = []
            for name, v in self.counters.items():
                lines += [f"# TYPE {name} counter", f"{name} {v}"]
            mal = self.verify_tokens / self.verify_calls if self.verify_calls else 0.0
            lines += [
                "# HELP edgespec:spec_decode_mean_acceptance_length Tokens per target verify call, "
                "bonus token included.",
                "# TYPE edgespec:spec_decode_mean_acceptance_length gauge",
                f"edgespec:spec_decode_mean_acceptance_length {mal}",
            ]
            lines += self.ttft.render() + self.itl.render()
        return "\n".join(lines) + "\n"


def progress(g: Generator) -> dict:
    """What a streamed piece carries besides its text (the `edgespec` field of a chunk): who made
    each of its characters, and the request's running counts."""
    st = g.last_stats
    return {
        "origin": g.last_origins,
        "tokens": st.n_output,
        "target_calls": st.n_target_calls,
        "drafted": int(st.n_drafted),
        "accepted": int(st.n_accepted),
    }


def token_logprobs(codec, entries: list[tuple]) -> list[dict]:
    """OpenAI's chat logprobs content of (id, logprob, top ids, top logprobs) entries: each token's
    text and UTF-8 bytes (a byte-level token may hold part of a character) with its alternatives."""

    def one(i: int, lp: float) -> dict:
        b = codec.token_bytes(i)
        return {"token": b.decode("utf-8", "replace"), "logprob": lp, "bytes": list(b)}

    return [
        one(i, lp) | {"top_logprobs": [one(j, x) for j, x in zip(ids, lps, strict=True)]} for i, lp, ids, lps in entries
    ]


class Worker(threading.Thread):
    """Runs queued jobs one at a time on the single Generator; shadow checks when idle."""

    def __init__(
        self,
        gen: Generator,
        jobs: queue.Queue,
        metrics: Metrics,
        default: Speculation,
        shadow_rate: float = 0.0,
        seed: int | None = None,
    ) -> None:
        super().__init__(daemon=True)
        self.gen, self.jobs, self.metrics = gen, jobs, metrics
        self.default = default  # the server's default; /admin/speculation replaces it between jobs
        self.current = default  # what the generator is set to now (only this thread changes it)
        self.shadow_rate = shadow_rate
        self.shadows: deque[ShadowCheck] = deque(maxlen=SHADOW_BACKLOG)
        self.rng = random.Random(seed)  # which greedy requests get a shadow check

    def run(self) -> None:
        while True:
            try:
                job = self.jobs.get(timeout=IDLE_S) if self.shadows else self.jobs.get()
            except queue.Empty:  # idle: the server has time for a shadow check
                self._shadow(self.shadows.popleft())
                continue
            if job is None:
                return
            send = job.loop.call_soon_threadsafe
            try:
                self._run(job)
            except BadRequest as e:
                send(job.out.put_nowait, e)
            except Exception as e:  # report to the client instead of killing the worker
                log.exception("request %s failed", job.rid)
                send(job.out.put_nowait, e)
            finally:
                send(job.out.put_nowait, END)

    def _use(self, spec: Speculation) -> None:
        """Set the generator's drafter, k and tree (a no-op when already so)."""
        if spec == self.current:
            return
        cur, g = self.current, self.gen
        try:
            g.reconfigure(drafter=spec.drafter, k=spec.k, tree=spec.tree)
        except ValueError as e:
            g.reconfigure(drafter=cur.drafter, k=cur.k, tree=cur.tree)  # back to a known state
            raise BadRequest(f"speculative: {e}", "speculative") from e
        self.current = spec

    def _run(self, job: Job) -> None:
        g, send = self.gen, job.loop.call_soon_threadsafe
        if job.cancel.is_set():  # the client left while queued
            self.metrics.add("edgespec:request_cancelled_total")
            return
        spec = job.speculation or self.default
        try:
            self._use(spec)
        except BadRequest:
            if job.speculation is not None:
                raise
            # a default set through /admin that this generator refuses after all
            log.error("default speculation %s refused; keeping %s", self.default, self.current)
            self.default = spec = self.current
        # the constraint's field: tool_choice's grammar, else response_format's
        what = "tool_choice" if job.tools is not None and job.tools.grammar is not None else "response_format"
        n_output = 0
        try:
            try:
                g.constraint(job.grammar)  # a grammar this vocabulary cannot run: a 400 before anything streams
            except GrammarError as e:
                raise BadRequest(f"{what}: {e}", what) from e
            send(job.out.put_nowait, STARTED)
            for i in range(job.n):  # choice i of a seeded request: seed + i (the same seed, the same output)
                st = self._choice(job, i, what)
                if st is None:  # the client went away
                    return
                if i == 0:
                    self._maybe_shadow(job, spec)
                self.metrics.record(st)
                n_output += st.n_output
                calls = [c.as_openai() for c in g.last_tool_calls]
                send(job.out.put_nowait, {"index": i, "finish_reason": st.finish_reason, "tool_calls": calls})
        finally:
            self._use(self.default)
        self.metrics.add("edgespec:request_success_total")
        usage = {
            "prompt_tokens": st.n_prompt,
            "completion_tokens": n_output,
            "total_tokens": st.n_prompt + n_output,
        }
        send(job.out.put_nowait, {"usage": usage, "stats": st.to_dict()})

    def _choice(self, job: Job, i: int, what: str):
        """Generate choice i of job, sending its pieces; its stats, or None when the client went away
        (then it stops at the step it noticed). what: the field that holds the job's grammar."""
        g, send = self.gen, job.loop.call_soon_threadsafe
        seed = job.sampling.seed
        sampling = dataclasses.replace(job.sampling, seed=seed + i) if i and seed is not None else job.sampling
        pieces = g.stream_text(job.ids, job.max_tokens, sampling, job.stop, job.grammar, job.tools, job.logprobs)
        try:
            for piece in pieces:
                if job.cancel.is_set():  # the client went away: stop at this step
                    self.metrics.add("edgespec:request_cancelled_total")
                    return None
                if not piece and not g.last_logprobs:  # (a tool call held back: nothing to send yet)
                    continue
                lps = token_logprobs(g.codec, g.last_logprobs) if job.logprobs is not None else None
                send(job.out.put_nowait, (i, piece, progress(g), lps))
        except PromptTooLongError as e:
            raise BadRequest(str(e), None, 400, "context_length_exceeded") from e
        except GrammarError as e:
            # the grammar hit llguidance's limits past the start check (constrain.Constraint._start):
            # the request's fault, not a bug of ours. Streaming: a clean error event ends the stream
            log.warning("request %s: %s", job.rid, e)
            raise BadRequest(f"{what}: {e}", what, 400, "grammar_failed") from e
        finally:
            pieces.close()
        return g.last_stats

    # ---- quality watch ------------------------------------------------------------------------------
    def _maybe_shadow(self, job: Job, spec: Speculation) -> None:
        """Keep a sampled greedy speculative request for a plain re-run when the server is idle."""
        if (
            not self.shadow_rate
            or not job.sampling.greedy
            or spec.drafter == "none"
            or self.rng.random() >= self.shadow_rate
        ):
            return
        output = self.gen.last_output_ids()
        self.shadows.append(ShadowCheck(job.rid, spec, job.ids, output, job.sampling, job.grammar))

    def plain_ids(self, check: ShadowCheck) -> np.ndarray | None:
        """check's prompt decoded plainly (drafter none) for as many tokens as it emitted; None when
        a request arrived meanwhile (it goes first)."""
        g = self.gen
        self._use(Speculation("none", self.default.k))
        g.forget()  # prefill afresh: no KV rows written by the speculative run's verifier
        out, n = np.empty(len(check.output), np.int64), 0
        steps = g.generate_ids(check.ids, len(check.output), check.sampling, check.grammar)
        try:
            for new in steps:
                if not self.jobs.empty():
                    return None
                m = min(len(new), len(out) - n)
                out[n : n + m] = new[:m]
                n += m
        finally:
            steps.close()
            self._use(self.default)
        return out[:n]

    def _shadow(self, check: ShadowCheck) -> None:
        try:
            plain = self.plain_ids(check)
        except Exception:  # a failed check must not stop the server
            log.exception("shadow check of request %s failed", check.rid)
            return
        if plain is None:
            self.shadows.appendleft(check)  # try again at the next idle time
            return
        self.metrics.add("edgespec:shadow_checks_total")
        pos = first_difference(check.output, plain)
        if pos is not None:
            self.metrics.add("edgespec:shadow_mismatches_total")
            s = check.speculation
            log.warning(
                "shadow check: request %s (%s, k=%d%s) differs from plain greedy decoding at output "
                "token %d: %s vs plain %s",
                check.rid,
                s.drafter,
                s.k,
                f", tree {s.tree.label}" if s.tree.nodes else "",
                pos,
                check.output[pos : pos + 4].tolist(),
                plain[pos : pos + 4].tolist(),
            )
