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
import queue
import re
import time
import uuid

import numpy as np
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from edgespec.runtime.apps.chat_page import PAGE_HEADERS, chat_page
from edgespec.runtime.apps.server_config import ServeConfig, host_name, origin_host
from edgespec.runtime.apps.server_schema import Abilities, BadRequest, Speculation, parse_request, parse_speculation
from edgespec.runtime.apps.server_worker import END, STARTED, Job, Metrics, Worker, log
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
# a JSON escape of a UTF-16 surrogate (\ud800-\udfff): a body without one cannot hold a lone surrogate
SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


class SiteGuard:
    """ASGI middleware in front of every route: the server refuses cross-site use.

    A web page the user visits can send this loopback server a `text/plain` POST without the
    browser asking first (no CORS preflight), and can reach it under its own name by DNS rebinding.
    So, with or without an API key: a Host that is not one of this server's names is 403 (the
    rebinding case; any Host when bound to every interface), an Origin (sent by browsers on POSTs
    and cross-origin fetches) whose host is not one of them nor in --allow-origin is 403, and a
    body whose Content-Type is not application/json is 415 (such a POST needs a preflight, which a
    foreign page fails). Clients that are not browsers (the openai client, curl) send no Origin and
    their own Host. It reads the headers only: O(headers) per request."""

    def __init__(self, app, cfg: ServeConfig) -> None:
        self.app, self.hosts, self.origins, self.origin_hosts = app, cfg.hosts(), cfg.origins(), cfg.origin_hosts()

    def refusal(self, scope) -> BadRequest | None:
        host = origin = ctype = None
        for name, value in scope["headers"]:
            if name == b"host":
                host = value.decode("latin-1")
            elif name == b"origin":
                origin = value.decode("latin-1")
            elif name == b"content-type":
                ctype = value.decode("latin-1")
        # a request without Host is HTTP/1.0 from a program: browsers always send one
        if host is not None and self.hosts is not None and host_name(host) not in self.hosts:
            return BadRequest(
                f"Host {host[:80]!r} is not a name of this server ({', '.join(sorted(self.hosts))}): refused so "
                "that a web page cannot reach it by DNS rebinding. Hint: serve --allow-origin "
                "http://NAME:PORT for another name, or --host 0.0.0.0 to answer any",
                None,
                403,
                "forbidden_host",
            )
        if origin is not None and origin.strip().lower().rstrip("/") not in self.origins:
            if origin_host(origin) not in self.origin_hosts:
                return BadRequest(
                    f"Origin {origin[:80]!r} may not call this server: a web page from another site cannot drive "
                    f"it. Hint: serve --allow-origin {origin.strip().lower()[:80]} if that page is yours",
                    None,
                    403,
                    "forbidden_origin",
                )
        if scope["method"] not in ("GET", "HEAD", "OPTIONS"):
            media = (ctype or "").partition(";")[0].strip().lower()
            if media != "application/json":
                what = f"Content-Type {ctype[:80]!r} is not JSON" if ctype else "no Content-Type"
                return BadRequest(
                    f"{what}: send the body as JSON with 'Content-Type: application/json' (other types are "
                    "refused so that a web page cannot post here without the browser asking first)",
                    None,
                    415,
                    "unsupported_media_type",
                )
        return None

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http" and (refused := self.refusal(scope)) is not None:
            await error(refused)(scope, receive, send)
            return
        await self.app(scope, receive, send)


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


async def read_json(request: Request, limit: int):
    """The body as JSON, refused with 413 past `limit` bytes (by Content-Length, else while reading)."""
    length = request.headers.get("content-length", "")
    if length.isdigit() and (len(length) > 18 or int(length) > limit):  # 18 digits: int() never balks
        raise BadRequest(
            f"request body is {length[:40]} bytes; this server takes at most {limit} (serve --max-body-bytes)",
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
    raw = b"".join(chunks)
    try:
        body = json.loads(raw)
    except (ValueError, RecursionError) as e:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise BadRequest(f"request body is not valid JSON: {str(e)[:120]}", None, 400, "invalid_json") from e
    # a C scan of the bytes, so most bodies skip the walk; UTF-16 or UTF-32 JSON (json.loads takes
    # them; their escapes are not these bytes) has NULs, which UTF-8 JSON never has, and is walked
    if SURROGATE_ESCAPE.search(raw) or b"\x00" in raw:
        refuse_surrogates(body)
    return body


def refuse_surrogates(body) -> None:
    """A lone UTF-16 surrogate ("\\ud800" is valid JSON but not Unicode text) anywhere in the body is
    a 400 naming its place: the tokenizer, the grammar engine and UTF-8 itself fail on one, each in
    its own way. Iterative, so a body nested as deep as json.loads allows cannot overflow the stack."""
    if isinstance(body, str) and not _is_text(body):
        raise _surrogate(body, "the body", None)
    stack = [(body, "")] if isinstance(body, (dict, list)) else []
    while stack:
        value, path = stack.pop()
        items = value.items() if isinstance(value, dict) else enumerate(value)
        for key, v in items:
            where = f"{path}[{key}]" if isinstance(value, list) else f"{path}.{key}" if path else key
            if isinstance(key, str) and not _is_text(key):
                raise _surrogate(key, f"a key in {path or 'the body'}", path or None)
            if isinstance(v, str):
                if not _is_text(v):
                    raise _surrogate(v, where, where)
            elif isinstance(v, (dict, list)):
                stack.append((v, where))


def _is_text(s: str) -> bool:
    if s.isascii():
        return True
    try:
        s.encode()
    except UnicodeEncodeError:
        return False
    return True


def _surrogate(s: str, where: str, param: str | None) -> BadRequest:
    at = next(i for i, c in enumerate(s) if 0xD800 <= ord(c) <= 0xDFFF)
    return BadRequest(
        f"{where} holds a lone UTF-16 surrogate (\\u{ord(s[at]):04x} at character {at}), which is not "
        "text: send UTF-8, or a surrogate pair for a character past U+FFFF",
        param,
    )


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

    def prepare(body, chat: bool):
        """(the checked request, its chat's messages and tools as the template takes them)."""
        req = parse_request(body, chat, model_name, worker.default, ab, cfg.max_tokens_default, cfg.strict_model)
        if not chat:
            return req, None
        try:
            return req, gen.chat_tools(req.prompt, req.tools)
        except ToolError as e:
            raise BadRequest(str(e), e.param) from None

    async def tokenize(req, tools) -> np.ndarray:
        at_least = -(-req.n_bytes // bytes_per_token)
        if at_least > prompt_limit:  # refused by size alone: nothing to tokenize
            raise BadRequest(
                f"prompt is {req.n_bytes} bytes, so at least {at_least} tokens; this server takes "
                f"prompts up to {prompt_limit} tokens (engine context {ab.context}, prompt + output)",
                "messages",
                400,
                "context_length_exceeded",
            )
        prompt, listed = (tools.messages, tools.template_tools) if tools is not None else (req.prompt, None)
        try:
            ids = await asyncio.to_thread(gen.codec.encode, prompt, listed)  # releases the GIL (TextCodec.encode)
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
        # off the event loop: compiling a large grammar (up to the body cap) holds it for a second or more
        req, tools = await asyncio.to_thread(prepare, body, chat)
        ids = await tokenize(req, tools)
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
        offsets = [0] * req.n  # completions' logprobs: characters of each choice's tokens so far

        def logprobs(i: int, lps: list | None):
            """A choice's logprobs field for these tokens (None: not asked for)."""
            if lps is None:
                return None
            if chat:
                return {"content": lps}
            starts = []
            for t in lps:
                starts.append(offsets[i])
                offsets[i] += len(t["token"])
            return {
                "tokens": [t["token"] for t in lps],
                "token_logprobs": [t["logprob"] for t in lps],
                "top_logprobs": [{a["token"]: a["logprob"] for a in t["top_logprobs"]} for t in lps],
                "text_offset": starts,
            }

        if req.stream:

            def chunk(i: int, delta: dict | None, text: str | None, finish=None, lps=None) -> str:
                if chat:
                    c = {"index": i, "delta": delta or {}, "finish_reason": finish}
                    if lps is not None:
                        c["logprobs"] = logprobs(i, lps)
                else:
                    c = {"index": i, "text": text or "", "finish_reason": finish, "logprobs": logprobs(i, lps)}
                return json.dumps(head | {"choices": [c]})

            async def events():
                try:
                    begun, ended = -1, None  # the last choice whose role chunk went out; the last that ended
                    while (item := await job.out.get()) is not END:
                        if isinstance(item, Exception):
                            # one clean event ends the stream: a refused request's own body (e.g. a
                            # grammar that failed mid-stream), else one line (details in the server log)
                            if isinstance(item, BadRequest):
                                err = item.body()
                            else:
                                msg = (str(item).strip().splitlines() or [type(item).__name__])[0][:300]
                                err = {"error": {"message": f"generation failed: {msg}", "type": "server_error"}}
                                err["error"] |= {"param": None, "code": None}
                            yield f"data: {json.dumps(err)}\n\n"
                            continue
                        i = item[0] if isinstance(item, tuple) else item.get("index", begun)
                        if chat and i > begun:
                            begun = i
                            yield f"data: {chunk(i, {'role': 'assistant', 'content': ''}, None)}\n\n"
                        if isinstance(item, tuple):  # a piece with its origins and running counts (an extension)
                            _, text, progress, lps = item
                            piece = json.loads(chunk(i, {"content": text}, text, None, lps))
                            yield f"data: {json.dumps(piece | {'edgespec': progress})}\n\n"
                        elif "index" in item:  # a choice ends: its calls, then its finish reason
                            if item["tool_calls"]:
                                calls = [{"index": j} | c for j, c in enumerate(item["tool_calls"])]
                                yield f"data: {chunk(i, {'tool_calls': calls}, None)}\n\n"
                            ended = item
                            if i < req.n - 1:  # (the last choice's finish goes out with the stats)
                                yield f"data: {chunk(i, None, None, item['finish_reason'])}\n\n"
                        else:  # the request ends: the last finish with edgespec's stats, and usage
                            last = json.loads(chunk(ended["index"], None, None, ended["finish_reason"]))
                            last["edgespec_stats"] = item["stats"]
                            if req.include_usage:  # OpenAI's form: usage alone in a last chunk
                                yield f"data: {json.dumps(last)}\n\n"
                                last = head | {"choices": [], "usage": item["usage"]}
                            else:
                                last["usage"] = item["usage"]
                            yield f"data: {json.dumps(last)}\n\n"
                    yield "data: [DONE]\n\n"
                finally:
                    job.cancel.set()  # no-op when finished; stops the generation if the client left

            return StreamingResponse(events(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        texts, lps, ends, final = [[] for _ in range(req.n)], [[] for _ in range(req.n)], {}, None
        while (item := await job.out.get()) is not END:
            if isinstance(item, BadRequest):
                return error(item)
            if isinstance(item, Exception):
                return error(BadRequest(f"generation failed: {item}", None, 500))
            if isinstance(item, tuple):
                texts[item[0]].append(item[1])
                lps[item[0]] += item[3] or []
            elif "index" in item:
                ends[item["index"]] = item
            else:
                final = item
        if final is None:  # cancelled: the client has gone
            return Response(status_code=499)
        choices = []
        for i in range(req.n):
            text, end = "".join(texts[i]), ends[i]
            lp = logprobs(i, lps[i]) if req.logprobs is not None else None
            if chat:
                message = {"role": "assistant", "content": text or (None if end["tool_calls"] else "")}
                if end["tool_calls"]:
                    message["tool_calls"] = end["tool_calls"]
                choices.append({"index": i, "message": message, "finish_reason": end["finish_reason"], "logprobs": lp})
            else:
                choices.append({"index": i, "text": text, "finish_reason": end["finish_reason"], "logprobs": lp})
        return JSONResponse(head | {"choices": choices, "usage": final["usage"], "edgespec_stats": final["stats"]})

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
    app = Starlette(
        middleware=middleware,
        routes=[
            Route("/", page, methods=["GET"]),
            Route("/v1/chat/completions", guarded(chat_route), methods=["POST"]),
            Route("/v1/completions", guarded(completion_route), methods=["POST"]),
            Route("/v1/models", guarded(models), methods=["GET"]),
            Route("/admin/speculation", guarded(speculation), methods=["GET", "POST"]),
            Route("/health", health, methods=["GET"]),
            Route("/metrics", metrics_route, methods=["GET"]),
        ],
    )
    app.state.metrics = metrics
    app.state.jobs = jobs
    app.state.worker = worker
    return app


def serve(gen: Generator, cfg: ServeConfig) -> None:
    import uvicorn

    uvicorn.run(create_app(gen, cfg), host=cfg.host, port=cfg.port, log_level="info")
