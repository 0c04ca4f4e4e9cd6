"""What `edgespec serve` answers a completion request with, read from its job's queue (what the
worker sends: STARTED, then pieces (choice, text, progress, logprobs), a choice's end {index,
finish_reason, tool_calls}, the request's end {usage, stats}, END): one JSON body, or server-sent
events, in OpenAI's shapes (chat.completion / text_completion and their chunks). Streamed pieces
carry their origins and running counts in an `edgespec` field (the chat page reads them)."""

from __future__ import annotations

import json
import time

from starlette.responses import JSONResponse, Response, StreamingResponse

from edgespec.runtime.apps.server_guard import error
from edgespec.runtime.apps.server_request import Request
from edgespec.runtime.apps.server_schema import BadRequest
from edgespec.runtime.apps.server_worker import END, STARTED, Job


async def respond(chat: bool, req: Request, job: Job, model_name: str) -> Response:
    """The answer to req once its job starts: an error body when it could not, 499 when the client left."""
    first = await job.out.get()
    if first is not STARTED:
        if isinstance(first, BadRequest):
            return error(first)
        if isinstance(first, Exception):
            return error(BadRequest(f"generation failed: {first}", None, 500))
        return Response(status_code=499)  # the client has gone: nobody reads this
    reply = Reply(chat, req, job, model_name)
    if req.stream:
        return StreamingResponse(reply.events(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
    return await reply.whole()


class Reply:
    """One started request's answer: the fields every chunk or body shares, and each choice's
    completions logprobs offsets so far."""

    def __init__(self, chat: bool, req: Request, job: Job, model_name: str) -> None:
        self.chat, self.req, self.job = chat, req, job
        obj = "chat.completion" if chat else "text_completion"
        self.head = {
            "id": job.rid,
            "object": obj + (".chunk" if chat and req.stream else ""),
            "created": int(time.time()),
            "model": model_name,
        }
        self.offsets = [0] * req.n  # completions' logprobs: characters of each choice's tokens so far

    def logprobs(self, i: int, lps: list | None):
        """A choice's logprobs field for these tokens (None: not asked for)."""
        if lps is None:
            return None
        if self.chat:
            return {"content": lps}
        starts = []
        for t in lps:
            starts.append(self.offsets[i])
            self.offsets[i] += len(t["token"])
        return {
            "tokens": [t["token"] for t in lps],
            "token_logprobs": [t["logprob"] for t in lps],
            "top_logprobs": [{a["token"]: a["logprob"] for a in t["top_logprobs"]} for t in lps],
            "text_offset": starts,
        }

    # ---- streaming ---------------------------------------------------------------------------------
    def chunk(self, i: int, delta: dict | None, text: str | None, finish=None, lps=None) -> str:
        if self.chat:
            c = {"index": i, "delta": delta or {}, "finish_reason": finish}
            if lps is not None:
                c["logprobs"] = self.logprobs(i, lps)
        else:
            c = {"index": i, "text": text or "", "finish_reason": finish, "logprobs": self.logprobs(i, lps)}
        return json.dumps(self.head | {"choices": [c]})

    async def events(self):
        """The server-sent events of the answer, `data: [DONE]` last."""
        chat, req, job = self.chat, self.req, self.job
        try:
            begun, ended = -1, None  # the last choice whose role chunk went out; the last that ended
            while (item := await job.out.get()) is not END:
                if isinstance(item, Exception):
                    yield f"data: {json.dumps(_error_event(item))}\n\n"
                    continue
                i = item[0] if isinstance(item, tuple) else item.get("index", begun)
                if chat and i > begun:
                    begun = i
                    yield f"data: {self.chunk(i, {'role': 'assistant', 'content': ''}, None)}\n\n"
                if isinstance(item, tuple):  # a piece with its origins and running counts (an extension)
                    _, text, progress, lps = item
                    piece = json.loads(self.chunk(i, {"content": text}, text, None, lps))
                    yield f"data: {json.dumps(piece | {'edgespec': progress})}\n\n"
                elif "index" in item:  # a choice ends: its calls, then its finish reason
                    if item["tool_calls"]:
                        calls = [{"index": j} | c for j, c in enumerate(item["tool_calls"])]
                        yield f"data: {self.chunk(i, {'tool_calls': calls}, None)}\n\n"
                    ended = item
                    if i < req.n - 1:  # (the last choice's finish goes out with the stats)
                        yield f"data: {self.chunk(i, None, None, item['finish_reason'])}\n\n"
                else:
                    for last in self._last_chunks(ended, item):
                        yield f"data: {json.dumps(last)}\n\n"
            yield "data: [DONE]\n\n"
        finally:
            job.cancel.set()  # no-op when finished; stops the generation if the client left

    def _last_chunks(self, ended: dict, end: dict) -> list[dict]:
        """The request ends: the last choice's finish with edgespec's stats, and usage (OpenAI's
        form with include_usage: alone in a last chunk without choices)."""
        last = json.loads(self.chunk(ended["index"], None, None, ended["finish_reason"]))
        last["edgespec_stats"] = end["stats"]
        if self.req.include_usage:
            return [last, self.head | {"choices": [], "usage": end["usage"]}]
        last["usage"] = end["usage"]
        return [last]

    # ---- one body ----------------------------------------------------------------------------------
    async def whole(self) -> Response:
        """The answer as one JSON body once generation ends (499 when the client left first)."""
        n = self.req.n
        texts, lps, ends, final = [[] for _ in range(n)], [[] for _ in range(n)], {}, None
        while (item := await self.job.out.get()) is not END:
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
        choices = [self._choice(i, "".join(texts[i]), ends[i], lps[i]) for i in range(n)]
        return JSONResponse(self.head | {"choices": choices, "usage": final["usage"], "edgespec_stats": final["stats"]})

    def _choice(self, i: int, text: str, end: dict, lps: list) -> dict:
        lp = self.logprobs(i, lps) if self.req.logprobs is not None else None
        if not self.chat:
            return {"index": i, "text": text, "finish_reason": end["finish_reason"], "logprobs": lp}
        message = {"role": "assistant", "content": text or (None if end["tool_calls"] else "")}
        if end["tool_calls"]:
            message["tool_calls"] = end["tool_calls"]
        return {"index": i, "message": message, "finish_reason": end["finish_reason"], "logprobs": lp}


def _error_event(item: Exception) -> dict:
    """One clean event ends the stream: a refused request's own body (e.g. a grammar that failed
    mid-stream), else one line (details in the server log)."""
    if isinstance(item, BadRequest):
        return item.body()
    msg = (str(item).strip().splitlines() or [type(item).__name__])[0][:300]
    err = {"error": {"message": f"generation failed: {msg}", "type": "server_error"}}
    err["error"] |= {"param": None, "code": None}
    return err
