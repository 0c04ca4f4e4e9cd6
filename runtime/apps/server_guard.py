"""What a request to `edgespec serve` passes before it reaches a route: the site guard (Host,
Origin and Content-Type, against cross-site use), the API key, and a body capped in size that is
JSON without lone surrogates. Each refusal is OpenAI's error body with its status."""

from __future__ import annotations

import hmac
import json
import re

from starlette.requests import Request
from starlette.responses import JSONResponse

from edgespec.runtime.apps.server_config import ServeConfig, host_name, origin_host
from edgespec.runtime.apps.server_schema import BadRequest
from edgespec.runtime.apps.server_worker import log

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


def guarded(handler, key: bytes):
    """handler behind the API key (when one is set): `Authorization: Bearer KEY`. A BadRequest it
    raises is its error body; any other exception is a bug of ours: logged, a JSON 500."""

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


def error(e: BadRequest, **headers) -> JSONResponse:
    return JSONResponse(e.body(), e.status, headers=headers)
