"""`edgespec serve`: an OpenAI-compatible HTTP server for one user on one device.

The engine holds one sequence, so requests are served one at a time, in arrival order, by a
single worker thread (server_worker.py); a bounded queue answers 503 + Retry-After when full. A
client that goes away, streaming or not, cancels its generation at the next step. Bodies are
checked (server_schema.py) and size-capped before anything is tokenized, and tokenizing runs off
the event loop, so /health answers while a large prompt is refused. `/` is a chat page
(chat_page.py) that shows which tokens were drafted and kept: streamed chunks carry each piece's
origins in an `edgespec` field. Starlette + uvicorn (`serve` extra).
"""

from __future__ import annotations

import asyncio
import hmac
import json
import math
import queue
import time
import uuid
from dataclasses import dataclass

import numpy as np
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from edgespec.runtime.backends import check_drafter
from edgespec.runtime.chat_page import PAGE_HEADERS, chat_page
from edgespec.runtime.drafters import registry, spec_of
from edgespec.runtime.generator import Generator
from edgespec.runtime.server_schema import Abilities, BadRequest, Speculation, parse_request, parse_speculation
from edgespec.runtime.server_worker import END, STARTED, Job, Metrics, Worker, log
from edgespec.runtime.text import TemplateError
from edgespec.runtime.tree import TreeConfig

DISCONNECT_POLL_S = 0.2  # how often a waiting non-streaming request checks that its client is still there
# a tokenizer normalizer may shrink text (e.g. composing accents): the byte bound on the token
# count allows for up to this factor before refusing a prompt untokenized
NORMALIZER_SLACK = 2


@dataclass(frozen=True)
class ServeConfig:
    host: str = "127.0.0.1"  # bind address (loopback by default: a single-user local server)
    port: int = 8000  # TCP port
    queue_size: int = 8  # requests waiting behind the running one before 503
    model_name: str = ""  # id reported by /v1/models ("" = the engine folder's name)
    max_tokens_default: int = 256  # when a request gives no max_tokens
    api_key: str | None = None  # Bearer key required on /v1/* and /admin/* (None: open; /health always is)
    max_body_bytes: int = 1 << 20  # larger request bodies get 413 before they are parsed
    max_prompt_tokens: int = 0  # longest prompt taken (0: the engine's context less one output token)
    shadow_rate: float = 0.0  # fraction of greedy speculative requests re-run plainly when idle, ids compared
    shadow_seed: int | None = None  # seeds which requests get a shadow check (tests)

    def check(self) -> None:
        if not 0.0 <= self.shadow_rate <= 1.0 or not math.isfinite(self.shadow_rate):
            raise ValueError(f"--shadow-rate {self.shadow_rate}: give a fraction in [0, 1] (0 = off)")
        if self.max_body_bytes < 1024 or self.max_prompt_tokens < 0 or self.queue_size < 1:
            raise ValueError(
                f"--max-body-bytes {self.max_body_bytes} (>= 1024), --max-prompt-tokens "
                f"{self.max_prompt_tokens} (>= 0, 0 = the context), --queue-size {self.queue_size} "
                "(>= 1; Python's 0 would mean unbounded): one is out of range"
            )
        if self.api_key is not None and (not self.api_key or not self.api_key.isascii()):
            raise ValueError("--api-key must be a non-empty ASCII string")


def abilities(gen: Generator) -> Abilities:
    """What requests may ask of this generator's folder and backend."""
    e, tgt, cfg = gen.engines, gen.engines.target, gen.cfg

    def runs(d: str) -> bool:
        try:
            check_drafter(d, e, cfg.provider, cfg)
        except ValueError:  # disabled, missing from the folder, or not on this backend
            return False
        return True

    def grows_trees(d: str) -> bool:  # every model it drafts with must grow trees on graphs that take them
        spec = spec_of(d)
        needs = [registry()[n] for n in spec.needs(cfg)]
        heads = [h for n in spec.needs(cfg) if (grow := registry()[n].tree_engines) for h in grow(e.models[n])]
        return spec.trees and all(s.trees for s in needs) and all(h.takes_tree for h in heads)

    drafters = tuple(d for d in registry() if runs(d))
    trees = tuple(d for d in drafters if tgt.takes_tree and grows_trees(d))
    k_max = 0  # verify widths 2..k_max+1 must all exist (as Generator.set_drafter requires)
    while k_max + 2 in tgt.widths:
        k_max += 1
    return Abilities(drafters, trees, k_max, tgt.max_len)


def current_speculation(gen: Generator) -> Speculation:
    return Speculation(gen.drafter.name, gen.k or gen.cfg.k, gen.cfg.tree if gen.tree is not None else TreeConfig())


def max_token_bytes(codec) -> int:
    """UTF-8 bytes of the longest vocabulary entry: no token stands for more text than this."""
    return max(len(t.encode()) for t in codec.tokenizer.get_vocab(with_added_tokens=True))


async def read_json(request: Request, limit: int):
    """The body as JSON, refused with 413 past `limit` bytes (by Content-Length, else while reading)."""
    length = request.headers.get("content-length", "")
    if length.isdigit() and int(length) > limit:
        raise BadRequest(
            f"request body is {int(length)} bytes; this server takes at most {limit} (serve --max-body-bytes)",
            None,
            413,
            "request_too_large",
        )
    chunks, n = [], 0
    async for chunk in request.stream():
        n += len(chunk)
        if n > limit:
            raise BadRequest(
                f"request body is over {limit} bytes (serve --max-body-bytes)", None, 413, "request_too_large"
            )
        chunks.append(chunk)
    try:
        return json.loads(b"".join(chunks))
    except (ValueError, RecursionError) as e:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise BadRequest(f"request body is not valid JSON: {str(e)[:120]}", None, 400, "invalid_json") from e


async def watch_disconnect(request: Request, job: Job) -> None:
    """Cancel `job` once its client has gone (Starlette tells only when asked, so this polls)."""
    while not await request.is_disconnected():
        await asyncio.sleep(DISCONNECT_POLL_S)
    job.cancel.set()


def error(e: BadRequest, **headers) -> JSONResponse:
    return JSONResponse(e.body(), e.status, headers=headers)


def create_app(gen: Generator, cfg: ServeConfig = ServeConfig()) -> Starlette:
    cfg.check()
    model_name = cfg.model_name or gen.manifest.name
    ab = abilities(gen)
    prompt_limit = min(cfg.max_prompt_tokens or ab.context, ab.context - 1)  # room for one output token
    bytes_per_token = max_token_bytes(gen.codec) * NORMALIZER_SLACK
    jobs: queue.Queue = queue.Queue(maxsize=cfg.queue_size)
    metrics = Metrics()
    worker = Worker(gen, jobs, metrics, current_speculation(gen), cfg.shadow_rate, cfg.shadow_seed)
    worker.start()
    key = (cfg.api_key or "").encode()

    def guarded(handler):
        """handler behind the API key (when one is set): `Authorization: Bearer KEY`."""

        async def route(request: Request):
            if key:
                scheme, _, token = request.headers.get("authorization", "").partition(" ")
                if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), key):
                    return error(
                        BadRequest(
                            "missing or wrong API key: send the header 'Authorization: Bearer KEY' (serve --api-key)",
                            None,
                            401,
                            "invalid_api_key",
                        ),
                        **{"WWW-Authenticate": "Bearer"},
                    )
            try:
                return await handler(request)
            except BadRequest as e:
                return error(e)
            except Exception as e:  # a bug of ours: logged here, a JSON 500 there
                log.exception("%s %s failed", request.method, request.url.path)
                return error(BadRequest(f"internal error: {type(e).__name__}: {e}", None, 500))

        return route

    async def tokenize(req) -> np.ndarray:
        at_least = -(-req.n_bytes // bytes_per_token)
        if at_least > prompt_limit:  # refused by size alone: nothing to tokenize
            raise BadRequest(
                f"prompt is {req.n_bytes} bytes, so at least {at_least} tokens; this server takes "
                f"prompts up to {prompt_limit} tokens (engine context {ab.context}, prompt + output)",
                "messages",
                400,
                "context_length_exceeded",
            )
        try:
            ids = await asyncio.to_thread(gen.codec.encode, req.prompt)  # releases the GIL (TextCodec.encode)
        except TemplateError as e:
            raise BadRequest(str(e), "messages") from e
        if not len(ids):
            raise BadRequest("the prompt tokenizes to nothing: give some text", "prompt")
        if len(ids) > prompt_limit:
            raise BadRequest(
                f"prompt has {len(ids)} tokens; this server takes prompts up to {prompt_limit} "
                f"tokens (engine context {ab.context}, prompt + output)",
                "messages",
                400,
                "context_length_exceeded",
            )
        return ids

    async def completions(request: Request, chat: bool):
        body = await read_json(request, cfg.max_body_bytes)
        req = parse_request(body, chat, model_name, worker.default, ab, cfg.max_tokens_default)
        ids = await tokenize(req)
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
        job = Job(
            rid,
            ids,
            req.max_tokens,
            req.sampling,
            req.stop,
            req.speculation,
            asyncio.get_running_loop(),
            grammar=req.grammar,
        )
        try:
            jobs.put_nowait(job)
        except queue.Full:
            metrics.add("edgespec:request_rejected_total")
            return error(
                BadRequest(f"server busy: {cfg.queue_size} requests already queued", None, 503, "server_busy"),
                **{"Retry-After": "1"},
            )
        watcher = asyncio.create_task(watch_disconnect(request, job))  # also while queued
        try:
            return await respond(chat, req, job)
        finally:
            watcher.cancel()

    async def respond(chat: bool, req, job: Job):
        first = await job.out.get()
        if first is not STARTED:
            if isinstance(first, BadRequest):
                return error(first)
            if isinstance(first, Exception):
                return error(BadRequest(f"generation failed: {first}", None, 500))
            return Response(status_code=499)  # the client has gone: nobody reads this
        created = int(time.time())
        obj = "chat.completion" if chat else "text_completion"
        head = {
            "id": job.rid,
            "object": obj + (".chunk" if chat and req.stream else ""),
            "created": created,
            "model": model_name,
        }

        def choice(text: str | None, finish, delta: bool):
            if chat:
                key = "delta" if delta else "message"
                content = {"content": text} if delta else {"role": "assistant", "content": text}
                return {"index": 0, key: content if text is not None or not delta else {}, "finish_reason": finish}
            return {"index": 0, "text": text or "", "finish_reason": finish, "logprobs": None}

        if req.stream:

            async def events():
                try:
                    if chat:
                        role = {"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}
                        yield f"data: {json.dumps(head | {'choices': [role]})}\n\n"
                    while (item := await job.out.get()) is not END:
                        if isinstance(item, Exception):
                            err = {"error": {"message": str(item), "type": "server_error", "param": None, "code": None}}
                            yield f"data: {json.dumps(err)}\n\n"
                        elif isinstance(item, dict):
                            last = head | {
                                "choices": [choice(None, item["finish_reason"], True)],
                                "edgespec_stats": item["stats"],
                            }
                            if req.include_usage:  # OpenAI's form: usage alone in a last chunk
                                yield f"data: {json.dumps(last)}\n\n"
                                last = head | {"choices": [], "usage": item["usage"]}
                            else:
                                last["usage"] = item["usage"]
                            yield f"data: {json.dumps(last)}\n\n"
                        else:  # a piece with its origins and running counts (an extension field)
                            piece = head | {"choices": [choice(item[0], None, True)], "edgespec": item[1]}
                            yield f"data: {json.dumps(piece)}\n\n"
                    yield "data: [DONE]\n\n"
                finally:
                    job.cancel.set()  # no-op when finished; stops the generation if the client left

            return StreamingResponse(events(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        pieces, final = [], None
        while (item := await job.out.get()) is not END:
            if isinstance(item, BadRequest):
                return error(item)
            if isinstance(item, Exception):
                return error(BadRequest(f"generation failed: {item}", None, 500))
            if isinstance(item, dict):
                final = item
            else:
                pieces.append(item[0])
        if final is None:  # cancelled: the client has gone
            return Response(status_code=499)
        return JSONResponse(
            head
            | {
                "choices": [choice("".join(pieces), final["finish_reason"], False)],
                "usage": final["usage"],
                "edgespec_stats": final["stats"],
            }
        )

    async def chat_route(request: Request):
        return await completions(request, chat=True)

    async def completion_route(request: Request):
        return await completions(request, chat=False)

    async def models(request: Request):
        return JSONResponse(
            {"object": "list", "data": [{"id": model_name, "object": "model", "created": 0, "owned_by": "edgespec"}]}
        )

    async def speculation(request: Request):
        """GET: the default speculation and what the folder offers; POST {drafter, k, tree}: a new
        default (applied from the next request on; a running one keeps its own)."""
        if request.method == "POST":
            body = await read_json(request, cfg.max_body_bytes)
            worker.default = parse_speculation(body, worker.default, ab, "speculation")
        return JSONResponse(
            worker.default.to_dict()
            | {"drafters": list(ab.drafters), "k_max": ab.k_max, "tree_drafters": list(ab.tree_drafters)}
        )

    async def health(request: Request):
        return JSONResponse({"status": "ok", "queued": jobs.qsize()})

    async def metrics_route(request: Request):
        return PlainTextResponse(metrics.render(), media_type="text/plain; version=0.0.4")

    async def page(request: Request):
        return HTMLResponse(chat_page(), headers=PAGE_HEADERS)

    app = Starlette(
        routes=[
            Route("/", page, methods=["GET"]),
            Route("/v1/chat/completions", guarded(chat_route), methods=["POST"]),
            Route("/v1/completions", guarded(completion_route), methods=["POST"]),
            Route("/v1/models", guarded(models), methods=["GET"]),
            Route("/admin/speculation", guarded(speculation), methods=["GET", "POST"]),
            Route("/health", health, methods=["GET"]),
            Route("/metrics", metrics_route, methods=["GET"]),
        ]
    )
    app.state.metrics = metrics
    app.state.jobs = jobs
    app.state.worker = worker
    return app


def serve(gen: Generator, cfg: ServeConfig) -> None:
    import uvicorn

    uvicorn.run(create_app(gen, cfg), host=cfg.host, port=cfg.port, log_level="info")
