"""`edgespec serve`: an OpenAI-compatible HTTP server for one user on one device.

The engine holds one sequence, so requests are served one at a time, in arrival order, by a
single worker thread (server_worker.py); a bounded queue answers 503 + Retry-After when full. A
client that goes away, streaming or not, cancels its generation at the next step. Requests pass
the site guard, the API key and a size cap (server_guard.py), bodies are checked (server_request.py)
before anything is tokenized, and tokenizing runs off the event loop, so /health answers while a
large prompt is refused; answers are shaped in server_response.py. `/` is a chat page
(chat_page.py) that shows which tokens were drafted and kept: streamed chunks carry each piece's
origins in an `edgespec` field. Starlette + uvicorn (`serve` extra).
"""

from __future__ import annotations

import asyncio
import queue
import uuid

import numpy as np
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, PlainTextResponse
from starlette.routing import Route

from edgespec.runtime.apps.chat_page import PAGE_HEADERS, chat_page
from edgespec.runtime.apps.server_config import ServeConfig
from edgespec.runtime.apps.server_guard import SiteGuard, error, guarded, read_json
from edgespec.runtime.apps.server_request import parse_request
from edgespec.runtime.apps.server_response import respond
from edgespec.runtime.apps.server_schema import Abilities, BadRequest, Speculation, parse_speculation
from edgespec.runtime.apps.server_worker import Job, Metrics, Worker
from edgespec.runtime.backends import runnable_drafters
from edgespec.runtime.drafters import registry, spec_of
from edgespec.runtime.generator import Generator
from edgespec.runtime.text import TemplateError
from edgespec.runtime.tools import ToolError
from edgespec.runtime.tree import TreeConfig

DISCONNECT_POLL_S = 0.2  # how often a waiting non-streaming request checks that its client is still there
# a tokenizer normalizer may shrink text (e.g. composing accents): the byte bound on the token
# count allows for up to this factor before refusing a prompt untokenized
NORMALIZER_SLACK = 2


def abilities(gen: Generator) -> Abilities:
    """What requests may ask of this generator's folder and backend."""
    e, tgt, cfg = gen.engines, gen.engines.target, gen.cfg

    def grows_trees(d: str) -> bool:  # every model it drafts with must grow trees on graphs that take them
        spec = spec_of(d)
        needs = [registry()[n] for n in spec.needs(cfg)]
        heads = [h for n in spec.needs(cfg) if (grow := registry()[n].tree_engines) for h in grow(e.models[n])]
        return spec.trees and all(s.trees for s in needs) and all(h.takes_tree for h in heads)

    drafters = runnable_drafters(e, cfg)
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


async def watch_disconnect(request: Request, job: Job) -> None:
    """Cancel `job` once its client has gone (Starlette tells only when asked, so this polls)."""
    while not await request.is_disconnected():
        await asyncio.sleep(DISCONNECT_POLL_S)
    job.cancel.set()


class Api:
    """The routes of one server over its state: the generator and what its folder can be asked for,
    the bounded job queue, the worker thread that serves it, the metrics."""

    def __init__(self, gen: Generator, cfg: ServeConfig) -> None:
        self.gen, self.cfg = gen, cfg
        self.model_name = cfg.model_name or gen.manifest.name
        self.ab = abilities(gen)
        self.prompt_limit = min(
            cfg.max_prompt_tokens or self.ab.context, self.ab.context - 1
        )  # room for one output token
        self.bytes_per_token = max_token_bytes(gen.codec) * NORMALIZER_SLACK
        self.jobs: queue.Queue = queue.Queue(maxsize=cfg.queue_size)
        self.metrics = Metrics()
        self.worker = Worker(gen, self.jobs, self.metrics, current_speculation(gen), cfg.shadow_rate, cfg.shadow_seed)

    def routes(self) -> list[Route]:
        key = (self.cfg.api_key or "").encode()
        return [
            Route("/", self.page, methods=["GET"]),
            Route("/v1/chat/completions", guarded(self.chat, key), methods=["POST"]),
            Route("/v1/completions", guarded(self.completion, key), methods=["POST"]),
            Route("/v1/models", guarded(self.models, key), methods=["GET"]),
            Route("/admin/speculation", guarded(self.speculation, key), methods=["GET", "POST"]),
            Route("/health", self.health, methods=["GET"]),
            Route("/metrics", self.metrics_text, methods=["GET"]),
        ]

    # ---- completions -------------------------------------------------------------------------------
    def prepare(self, body, chat: bool):
        """(the checked request, its chat's messages and tools as the template takes them)."""
        cfg = self.cfg
        req = parse_request(
            body, chat, self.model_name, self.worker.default, self.ab, cfg.max_tokens_default, cfg.strict_model
        )
        if not chat:
            return req, None
        try:
            return req, self.gen.chat_tools(req.prompt, req.tools)
        except ToolError as e:
            raise BadRequest(str(e), e.param) from None

    async def tokenize(self, req, tools) -> np.ndarray:
        limit, context = self.prompt_limit, self.ab.context
        at_least = -(-req.n_bytes // self.bytes_per_token)
        if at_least > limit:  # refused by size alone: nothing to tokenize
            raise BadRequest(
                f"prompt is {req.n_bytes} bytes, so at least {at_least} tokens; this server takes "
                f"prompts up to {limit} tokens (engine context {context}, prompt + output)",
                "messages",
                400,
                "context_length_exceeded",
            )
        prompt, listed = (tools.messages, tools.template_tools) if tools is not None else (req.prompt, None)
        try:
            ids = await asyncio.to_thread(self.gen.codec.encode, prompt, listed)  # releases the GIL (TextCodec.encode)
        except TemplateError as e:
            if tools is not None and tools.plan is not None and not tools.format.native:
                raise BadRequest(
                    f"{e}: this model's chat template takes no tools, and it refused them described in a "
                    "system message (edgespec's fallback); send the request without tools",
                    "tools",
                ) from e
            raise BadRequest(str(e), "messages") from e
        if not len(ids):
            raise BadRequest("the prompt tokenizes to nothing: give some text", "prompt")
        if len(ids) > limit:
            raise BadRequest(
                f"prompt has {len(ids)} tokens; this server takes prompts up to {limit} "
                f"tokens (engine context {context}, prompt + output)",
                "messages",
                400,
                "context_length_exceeded",
            )
        return ids

    async def completions(self, request: Request, chat: bool):
        body = await read_json(request, self.cfg.max_body_bytes)
        # off the event loop: compiling a large grammar (up to the body cap) holds it for a second or more
        req, tools = await asyncio.to_thread(self.prepare, body, chat)
        ids = await self.tokenize(req, tools)
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
        job = Job(
            rid,
            ids,
            req.max_tokens,
            req.sampling,
            req.stop,
            req.speculation,
            asyncio.get_running_loop(),
            grammar=(tools.grammar if tools is not None else None) or req.grammar,
            tools=tools,
            logprobs=req.logprobs,
            n=req.n,
        )
        try:
            self.jobs.put_nowait(job)
        except queue.Full:
            self.metrics.add("edgespec:request_rejected_total")
            return error(
                BadRequest(f"server busy: {self.cfg.queue_size} requests already queued", None, 503, "server_busy"),
                **{"Retry-After": "1"},
            )
        watcher = asyncio.create_task(watch_disconnect(request, job))  # also while queued
        try:
            return await respond(chat, req, job, self.model_name)
        finally:
            watcher.cancel()

    async def chat(self, request: Request):
        return await self.completions(request, chat=True)

    async def completion(self, request: Request):
        return await self.completions(request, chat=False)

    # ---- the rest ----------------------------------------------------------------------------------
    async def models(self, request: Request):
        return JSONResponse(
            {
                "object": "list",
                "data": [{"id": self.model_name, "object": "model", "created": 0, "owned_by": "edgespec"}],
            }
        )

    async def speculation(self, request: Request):
        """GET: the default speculation and what the folder offers; POST {drafter, k, tree}: a new
        default (applied from the next request on; a running one keeps its own)."""
        ab, worker = self.ab, self.worker
        if request.method == "POST":
            body = await read_json(request, self.cfg.max_body_bytes)
            worker.default = parse_speculation(body, worker.default, ab, "speculation")
        return JSONResponse(
            worker.default.to_dict()
            | {"drafters": list(ab.drafters), "k_max": ab.k_max, "tree_drafters": list(ab.tree_drafters)}
        )

    async def health(self, request: Request):
        return JSONResponse({"status": "ok", "queued": self.jobs.qsize()})

    async def metrics_text(self, request: Request):
        return PlainTextResponse(self.metrics.render(), media_type="text/plain; version=0.0.4")

    async def page(self, request: Request):
        return HTMLResponse(chat_page(), headers=PAGE_HEADERS)


def create_app(gen: Generator, cfg: ServeConfig = ServeConfig()) -> Starlette:
    cfg.check()
    api = Api(gen, cfg)
    api.worker.start()
    middleware = [Middleware(SiteGuard, cfg=cfg)]  # outermost: before the API key and every route
    if cfg.allow_origin:  # pages from those origins need CORS to read answers and to post JSON
        middleware.append(
            Middleware(
                CORSMiddleware,
                allow_origins=sorted(cfg.origins()),
                allow_methods=["GET", "POST"],
                allow_headers=["Authorization", "Content-Type"],
            )
        )
    app = Starlette(middleware=middleware, routes=api.routes())
    app.state.metrics = api.metrics
    app.state.jobs = api.jobs
    app.state.worker = api.worker
    return app


def serve(gen: Generator, cfg: ServeConfig) -> None:
    import uvicorn

    uvicorn.run(create_app(gen, cfg), host=cfg.host, port=cfg.port, log_level="info")
