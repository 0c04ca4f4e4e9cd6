"""`edgespec serve`: an OpenAI-compatible HTTP server for one user on one device.

The engine holds one sequence, so requests are served one at a time, in arrival order, by a
single worker thread; a bounded queue answers 503 + Retry-After when full. A client that goes
away mid-stream cancels its generation at the next step. Starlette + uvicorn (`serve` extra).
"""

from __future__ import annotations

import asyncio
import json
import queue
import threading
import time
import uuid
from dataclasses import dataclass, field

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, StreamingResponse
from starlette.routing import Route

from edgespec.runtime.generator import Generator
from edgespec.runtime.sampling import SamplingConfig
from edgespec.runtime.text import TemplateError

TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
ITL_BUCKETS = (0.002, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28)
_END = object()


class BadRequest(ValueError):
    def __init__(self, msg: str, status: int = 400) -> None:
        super().__init__(msg)
        self.status = status


@dataclass(frozen=True)
class ServeConfig:
    host: str = "127.0.0.1"  # bind address (loopback by default: a single-user local server)
    port: int = 8000  # TCP port
    queue_size: int = 8  # requests waiting behind the running one before 503
    model_name: str = ""  # id reported by /v1/models ("" = the engine folder's name)
    max_tokens_default: int = 256  # when a request gives no max_tokens


@dataclass
class Job:
    ids: object  # prompt token ids
    max_tokens: int
    sampling: SamplingConfig
    stop: list[str]
    speculative: dict  # {"drafter": ..., "k": ...} or {}
    loop: asyncio.AbstractEventLoop
    out: asyncio.Queue = field(default_factory=asyncio.Queue)
    cancel: threading.Event = field(default_factory=threading.Event)


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
        lines += [f'{self.name}_bucket{{le="+Inf"}} {self.n}', f"{self.name}_sum {self.total}",
                  f"{self.name}_count {self.n}"]
        return lines


class Metrics:
    """Counters named as vLLM names its speculative-decoding metrics (prefix edgespec:)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.counters = {"edgespec:request_success_total": 0, "edgespec:request_rejected_total": 0,
                         "edgespec:request_cancelled_total": 0, "edgespec:prompt_tokens_total": 0,
                         "edgespec:generation_tokens_total": 0, "edgespec:spec_decode_num_drafts_total": 0,
                         "edgespec:spec_decode_num_draft_tokens_total": 0,
                         "edgespec:spec_decode_num_accepted_tokens_total": 0}
        self.verify_calls = 0
        self.verify_tokens = 0
        self.ttft = Histogram("edgespec:time_to_first_token_seconds", "Time to first token.", TTFT_BUCKETS)
        self.itl = Histogram("edgespec:inter_token_latency_seconds", "Per-token latency after the first.",
                             ITL_BUCKETS)

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
            lines += ["# HELP edgespec:spec_decode_mean_acceptance_length Tokens per target verify call, "
                      "bonus token included.", "# TYPE edgespec:spec_decode_mean_acceptance_length gauge",
                      f"edgespec:spec_decode_mean_acceptance_length {mal}"]
            lines += self.ttft.render() + self.itl.render()
        return "\n".join(lines) + "\n"


class Worker(threading.Thread):
    """Runs queued jobs one at a time on the single Generator."""

    def __init__(self, gen: Generator, jobs: queue.Queue, metrics: Metrics) -> None:
        super().__init__(daemon=True)
        self.gen, self.jobs, self.metrics = gen, jobs, metrics
        self.default = (gen.drafter.name, gen.k)

    def run(self) -> None:
        while True:
            job = self.jobs.get()
            if job is None:
                return
            try:
                self._run(job)
            except Exception as e:  # report to the client instead of killing the worker
                job.loop.call_soon_threadsafe(job.out.put_nowait, e)
            finally:
                job.loop.call_soon_threadsafe(job.out.put_nowait, _END)

    def _run(self, job: Job) -> None:
        g = self.gen
        if job.cancel.is_set():
            self.metrics.add("edgespec:request_cancelled_total")
            return
        g.set_drafter(job.speculative.get("drafter", self.default[0]), job.speculative.get("k", self.default[1]))
        pieces = g.stream_text(job.ids, job.max_tokens, job.sampling, job.stop)
        try:
            for piece in pieces:
                if job.cancel.is_set():  # the client went away: stop at this step
                    self.metrics.add("edgespec:request_cancelled_total")
                    return
                job.loop.call_soon_threadsafe(job.out.put_nowait, piece)
        finally:
            pieces.close()
            g.set_drafter(*self.default)
        st = g.last_stats
        self.metrics.record(st)
        self.metrics.add("edgespec:request_success_total")
        usage = {"prompt_tokens": st.n_prompt, "completion_tokens": st.n_output,
                 "total_tokens": st.n_prompt + st.n_output}
        job.loop.call_soon_threadsafe(job.out.put_nowait, {"finish_reason": st.finish_reason,
                                                           "usage": usage, "stats": st.to_dict()})


def _parse_common(body: dict, default_max: int) -> tuple[int, SamplingConfig, list[str], dict]:
    def num(key, typ, default, lo=None, hi=None):
        v = body.get(key, default)
        if v is None:
            return default
        if not isinstance(v, (int, float)) or isinstance(v, bool) or (typ is int and int(v) != v):
            raise BadRequest(f"'{key}' must be a {typ.__name__}, got {v!r}")
        if (lo is not None and v < lo) or (hi is not None and v > hi):
            raise BadRequest(f"'{key}' must be in [{lo}, {hi}], got {v}")
        return typ(v)

    if body.get("n", 1) != 1:
        raise BadRequest("only n=1 is supported (one sequence at a time)")
    max_tokens = num("max_completion_tokens", int, None, 1) or num("max_tokens", int, default_max, 1)
    sampling = SamplingConfig(temperature=num("temperature", float, 1.0, 0.0, 2.0),
                              top_p=num("top_p", float, 1.0, 1e-6, 1.0), top_k=num("top_k", int, 0, 0),
                              seed=num("seed", int, None),
                              repetition_penalty=num("repetition_penalty", float, 1.0, 1e-3, 10.0))
    stop = body.get("stop") or []
    stop = [stop] if isinstance(stop, str) else stop
    if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop):
        raise BadRequest("'stop' must be a string or a list of non-empty strings")
    spec = body.get("speculative") or {}
    if not isinstance(spec, dict) or set(spec) - {"drafter", "k"}:
        raise BadRequest("'speculative' must be an object with optional 'drafter' and 'k'")
    if "drafter" in spec and spec["drafter"] not in ("none", "ngram", "draft"):
        raise BadRequest(f"speculative.drafter {spec['drafter']!r}: choose none, ngram or draft")
    return max_tokens, sampling, stop, spec


def create_app(gen: Generator, cfg: ServeConfig = ServeConfig()) -> Starlette:
    model_name = cfg.model_name or gen.manifest.name
    jobs: queue.Queue = queue.Queue(maxsize=cfg.queue_size)
    metrics = Metrics()
    worker = Worker(gen, jobs, metrics)
    worker.start()

    def error(msg: str, status: int, **headers) -> JSONResponse:
        kind = {400: "invalid_request_error", 404: "not_found_error", 503: "overloaded"}.get(status, "error")
        return JSONResponse({"error": {"message": msg, "type": kind, "code": status}}, status, headers=headers)

    async def completions(request: Request, chat: bool):
        try:
            body = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError):
            return error("request body is not valid JSON", 400)
        try:
            if not isinstance(body, dict):
                raise BadRequest("request body must be a JSON object")
            if body.get("model") not in (None, model_name):
                raise BadRequest(f"model {body.get('model')!r} not found; this server serves {model_name!r}", 404)
            if chat:
                msgs = body.get("messages")
                if not isinstance(msgs, list) or not msgs:
                    raise BadRequest("'messages' must be a non-empty list of {role, content}")
                ids = gen.codec.encode(msgs)
            else:
                prompt = body.get("prompt")
                if not isinstance(prompt, str):
                    raise BadRequest("'prompt' must be a string")
                ids = gen.codec.encode(prompt)
            if len(ids) + 1 > gen.target.max_len:
                raise BadRequest(f"prompt has {len(ids)} tokens; this engine's context limit is "
                                 f"{gen.target.max_len} tokens (prompt + output)")
            max_tokens, sampling, stop, spec = _parse_common(body, cfg.max_tokens_default)
        except TemplateError as e:
            return error(str(e), 400)
        except BadRequest as e:
            return error(str(e), e.status)
        job = Job(ids, max_tokens, sampling, stop, spec, asyncio.get_running_loop())
        try:
            jobs.put_nowait(job)
        except queue.Full:
            metrics.add("edgespec:request_rejected_total")
            return error(f"server busy: {cfg.queue_size} requests already queued", 503, **{"Retry-After": "1"})
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
        created = int(time.time())
        obj = "chat.completion" if chat else "text_completion"

        def choice(text: str | None, finish, delta: bool):
            if chat:
                key = "delta" if delta else "message"
                content = {"content": text} if delta else {"role": "assistant", "content": text}
                return {"index": 0, key: content if text is not None or not delta else {}, "finish_reason": finish}
            return {"index": 0, "text": text or "", "finish_reason": finish, "logprobs": None}

        if body.get("stream"):
            async def events():
                try:
                    if chat:
                        first = {"id": rid, "object": obj + ".chunk", "created": created, "model": model_name,
                                 "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                              "finish_reason": None}]}
                        yield f"data: {json.dumps(first)}\n\n"
                    while True:
                        item = await job.out.get()
                        if item is _END:
                            break
                        if isinstance(item, Exception):
                            err = {"error": {"message": str(item), "type": "server_error"}}
                            yield f"data: {json.dumps(err)}\n\n"
                            continue
                        if isinstance(item, dict):
                            chunk = {"id": rid, "object": obj + (".chunk" if chat else ""), "created": created,
                                     "model": model_name, "choices": [choice(None, item["finish_reason"], True)],
                                     "usage": item["usage"]}
                        else:
                            chunk = {"id": rid, "object": obj + (".chunk" if chat else ""), "created": created,
                                     "model": model_name, "choices": [choice(item, None, True)]}
                        yield f"data: {json.dumps(chunk)}\n\n"
                    yield "data: [DONE]\n\n"
                finally:
                    job.cancel.set()  # no-op when finished; stops the generation if the client left

            return StreamingResponse(events(), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache"})
        text, final = "", None
        while True:
            item = await job.out.get()
            if item is _END:
                break
            if isinstance(item, Exception):
                return error(f"generation failed: {item}", 500)
            if isinstance(item, dict):
                final = item
            else:
                text += item
        if final is None:
            return error("generation was cancelled", 500)
        return JSONResponse({"id": rid, "object": obj, "created": created, "model": model_name,
                             "choices": [choice(text, final["finish_reason"], False)], "usage": final["usage"],
                             "edgespec_stats": final["stats"]})

    async def chat_route(request: Request):
        return await completions(request, chat=True)

    async def completion_route(request: Request):
        return await completions(request, chat=False)

    async def models(request: Request):
        return JSONResponse({"object": "list", "data": [{"id": model_name, "object": "model", "created": 0,
                                                         "owned_by": "edgespec"}]})

    async def health(request: Request):
        return JSONResponse({"status": "ok", "queued": jobs.qsize()})

    async def metrics_route(request: Request):
        return PlainTextResponse(metrics.render(), media_type="text/plain; version=0.0.4")

    app = Starlette(routes=[
        Route("/v1/chat/completions", chat_route, methods=["POST"]),
        Route("/v1/completions", completion_route, methods=["POST"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/health", health, methods=["GET"]),
        Route("/metrics", metrics_route, methods=["GET"]),
    ])
    app.state.metrics = metrics
    app.state.jobs = jobs
    return app


def serve(gen: Generator, cfg: ServeConfig) -> None:
    import uvicorn

    uvicorn.run(create_app(gen, cfg), host=cfg.host, port=cfg.port, log_level="info")
