"""What `edgespec serve` accepts as a completion: an OpenAI request body (chat `messages` or a raw
`prompt`) checked field by field into a `Request` before anything is tokenized or queued, so a bad
input is a 400 naming the field, never a 500. Fields it does not implement are refused by name
(`UNSUPPORTED`), not ignored.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from edgespec.runtime.apps.server_schema import (
    Abilities,
    BadRequest,
    Speculation,
    number_field,
    parse_speculation,
    shown,
)
from edgespec.runtime.grammar import Grammar, GrammarError, grammar_from, json_object
from edgespec.runtime.logprobs import MAX_TOP
from edgespec.runtime.sampling import SamplingConfig
from edgespec.runtime.tools import ToolError, ToolPlan, check_messages, plan

# message roles the chat template is given ("developer" is OpenAI's newer name for "system")
ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant", "tool": "tool"}
N_MAX = 16  # most choices (n) one request may ask for: they run one after another


@dataclass(frozen=True)
class Request:
    """A checked completion request."""

    prompt: str | list  # raw text, or chat messages [{role, content: str}] for the template
    n_bytes: int  # UTF-8 bytes of the prompt's text: bounds its token count before tokenizing
    max_tokens: int  # most tokens to generate (>= 1)
    sampling: SamplingConfig  # temperature, top_k, top_p, seed, repetition_penalty
    stop: list[str]  # stop strings (cut before them)
    speculation: Speculation | None  # the request's `speculative` over the default (None: no such field)
    stream: bool  # server-sent events
    include_usage: bool  # streaming: a last chunk with usage and no choices (stream_options)
    grammar: Grammar | None = None  # what response_format constrains the output to (None: free text)
    tools: ToolPlan | None = None  # the tools offered and tool_choice (None: none, or tool_choice none)
    logprobs: int | None = None  # alternatives per token with each token's log-probability (None: off)
    n: int = 1  # choices, sampled one after another (the prompt's KV reused)


def _content(c, param: str, calls: bool = False) -> str:
    """A message's text: a string, or OpenAI's content parts [{type: text, text}] joined by newlines
    (null: "" for an assistant message that makes calls)."""
    if isinstance(c, str):
        return c
    if c is None and calls:
        return ""
    if not isinstance(c, list) or not c:
        raise BadRequest(
            f"{param} must be a string or a non-empty list of text parts, got {c!r} (null content is taken "
            "only from an assistant message with tool_calls)",
            param,
        )
    texts = []
    for j, part in enumerate(c):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind != "text" or not isinstance(part.get("text"), str):
            raise BadRequest(
                f"{param}[{j}] must be {{'type': 'text', 'text': str}}, got {str(part)[:80]}: this "
                "server serves a text-only model",
                f"{param}[{j}]",
            )
        texts.append(part["text"])
    return "\n".join(texts)


def _messages(msgs) -> list[dict]:
    if not isinstance(msgs, list) or not msgs:
        raise BadRequest("'messages' must be a non-empty list of {role, content} objects", "messages")
    out = []
    for i, m in enumerate(msgs):
        if not isinstance(m, dict):
            raise BadRequest(f"messages[{i}] must be an object {{role, content}}, got {str(m)[:80]}", f"messages[{i}]")
        role = m.get("role")
        if not isinstance(role, str) or role not in ROLES:
            raise BadRequest(f"messages[{i}].role {role!r}: choose one of {', '.join(ROLES)}", f"messages[{i}].role")
        calls = _tool_calls(m.get("tool_calls"), f"messages[{i}].tool_calls") if role == "assistant" else None
        msg = {"role": ROLES[role], "content": _content(m.get("content"), f"messages[{i}].content", bool(calls))}
        if calls:
            msg["tool_calls"] = calls
        if role == "tool":
            msg["tool_call_id"] = m.get("tool_call_id")
        out.append(msg)
    try:
        check_messages(out)
    except ToolError as e:
        raise BadRequest(str(e), e.param) from None
    return out


def _tool_calls(calls, param: str) -> list[dict] | None:
    """An assistant message's tool_calls: [{id, type: function, function: {name, arguments: JSON text}}]."""
    if calls is None or calls == []:
        return None
    if not isinstance(calls, list):
        raise BadRequest(f"{param} must be a list of calls, got {shown(calls)[:80]}", param)
    out = []
    for j, c in enumerate(calls):
        f = c.get("function") if isinstance(c, dict) else None
        if (
            not isinstance(f, dict)
            or not isinstance(c.get("id"), str)
            or not isinstance(f.get("name"), str)
            or not isinstance(f.get("arguments"), str)
        ):
            raise BadRequest(
                f"{param}[{j}] must be {{id, type: 'function', function: {{name, arguments}}}} with strings, got "
                f"{str(c)[:80]}",
                f"{param}[{j}]",
            )
        out.append({"id": c["id"], "type": "function", "function": {"name": f["name"], "arguments": f["arguments"]}})
    return out


@dataclass(frozen=True)
class Unsupported:
    """An OpenAI (or vLLM) request field this server does not implement: refused with a 400 naming it
    rather than ignored, since an answer that ignores it is silently not what was asked for."""

    noops: tuple  # values that ask for nothing (SDKs may send them): taken and ignored, as null is
    why: str  # the reason and what to do instead, in the 400's message


LEGACY = Unsupported((), "use tools and tool_choice, which replace functions and function_call")
PENALTY = Unsupported((0,), "use repetition_penalty, the CTRL rule as in transformers")
GUIDED = Unsupported((), "use response_format: json_schema, grammar or regex")
UNSUPPORTED = {
    "functions": LEGACY,
    "function_call": LEGACY,
    "logit_bias": Unsupported(({},), "not implemented; response_format constrains the output instead"),
    "presence_penalty": PENALTY,
    "frequency_penalty": PENALTY,
    "echo": Unsupported((False,), "the prompt is not echoed: prepend it yourself"),
    "best_of": Unsupported((1,), "one sequence at a time"),
    "suffix": Unsupported(("",), "no fill-in-the-middle: the model continues the prompt only"),
    "modalities": Unsupported((["text"],), "text only"),
    "audio": Unsupported((), "text only"),
    "min_p": Unsupported((0,), "use top_p or top_k"),
    "min_tokens": Unsupported((0,), "not implemented; the model stops at its end-of-text token"),
    "ignore_eos": Unsupported((False,), "not implemented; the model stops at its end-of-text token"),
    "stop_token_ids": Unsupported(([],), "use stop strings"),
    "use_beam_search": Unsupported((False,), "no beam search: one sequence at a time"),
    "guided_json": GUIDED,
    "guided_regex": GUIDED,
    "guided_grammar": GUIDED,
    "guided_choice": GUIDED,
}


def parse_request(
    body,
    chat: bool,
    model_name: str,
    default: Speculation,
    ab: Abilities,
    max_tokens_default: int,
    strict_model: bool = False,
) -> Request:
    """The checked request of a chat (`messages`) or completions (`prompt`) body. Any model name is
    taken (the one folder served answers) unless strict_model."""
    if not isinstance(body, dict):
        raise BadRequest(f"request body must be a JSON object, got {type(body).__name__}")
    _check_model(body.get("model"), model_name, strict_model)
    prompt, n_bytes, tools = _chat_prompt(body) if chat else _raw_prompt(body)
    for key, field in UNSUPPORTED.items():
        if key in body and body[key] is not None and body[key] not in field.noops:
            raise BadRequest(f"'{key}' is not supported by this server ({field.why}); got {shown(body[key])[:80]}", key)
    grammar = parse_response_format(body.get("response_format"))
    if grammar is not None and tools is not None and tools.forced:
        raise BadRequest(
            "tool_choice required or a function constrains the answer to calls: drop response_format, "
            "or use tool_choice auto",
            "response_format",
        )
    n = number_field(body, "n", 1, integer=True, lo=1, hi=N_MAX)
    logprobs = _logprobs(body, chat)
    max_tokens = number_field(body, "max_completion_tokens", None, integer=True, lo=1)
    if max_tokens is None:
        max_tokens = number_field(body, "max_tokens", max_tokens_default, integer=True, lo=1)
    sampling = _sampling(body)
    stop = body.get("stop") or []
    stop = [stop] if isinstance(stop, str) else stop
    if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop):
        raise BadRequest(f"'stop' must be a string or a list of non-empty strings, got {stop!r}", "stop")
    stream, usage = _streaming(body)
    spec = parse_speculation(body["speculative"], default, ab) if body.get("speculative") is not None else None
    return Request(prompt, n_bytes, max_tokens, sampling, stop, spec, stream, usage, grammar, tools, logprobs, n)


def _check_model(model, model_name: str, strict_model: bool) -> None:
    if model is not None and not isinstance(model, str):
        raise BadRequest(f"'model' must be a string, got {model!r}", "model")
    if strict_model and model not in (None, model_name):
        raise BadRequest(
            f"model {model!r} not found; this server serves {model_name!r} (serve --strict-model)",
            "model",
            404,
            "model_not_found",
        )


def _chat_prompt(body: dict) -> tuple[list, int, ToolPlan | None]:
    """(messages, their UTF-8 bytes with the tools' JSON, the tool plan) of a chat body."""
    prompt = _messages(body.get("messages"))
    n_bytes = sum(len(m["content"].encode()) + len(str(m.get("tool_calls") or "")) for m in prompt)
    try:
        tools = plan(body.get("tools"), body.get("tool_choice"), body.get("parallel_tool_calls"))
    except ToolError as e:
        raise BadRequest(str(e), e.param) from None
    if tools is not None:
        n_bytes += len(json.dumps([t.as_openai() for t in tools.tools]))
    return prompt, n_bytes, tools


def _raw_prompt(body: dict) -> tuple[str, int, None]:
    """(prompt, its UTF-8 bytes, no tools) of a completions body."""
    for key in ("tools", "tool_choice", "parallel_tool_calls"):
        if body.get(key) not in (None, [], "none", False):
            raise BadRequest(f"'{key}' needs chat messages: send it to /v1/chat/completions", key)
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1:
        prompt = prompt[0]
    if not isinstance(prompt, str):
        raise BadRequest(f"'prompt' must be a string, got {str(prompt)[:80]}", "prompt")
    if not prompt:
        raise BadRequest("'prompt' is empty: give some text to continue", "prompt")
    return prompt, len(prompt.encode()), None


def _sampling(body: dict) -> SamplingConfig:
    return SamplingConfig(
        temperature=number_field(body, "temperature", 1.0, lo=0.0, hi=2.0),
        top_k=number_field(body, "top_k", 0, integer=True, lo=0),
        top_p=number_field(body, "top_p", 1.0, lo=0.0, hi=1.0, lo_open=True),
        seed=number_field(body, "seed", None, integer=True, lo=0),
        repetition_penalty=number_field(body, "repetition_penalty", 1.0, lo=0.0, hi=10.0, lo_open=True),
    )


def _streaming(body: dict) -> tuple[bool, bool]:
    """(stream, include_usage) of a body."""
    stream = body.get("stream") or False
    if not isinstance(stream, bool):
        raise BadRequest(f"'stream' must be true or false, got {stream!r}", "stream")
    opts = body.get("stream_options") or {}
    if not isinstance(opts, dict) or not isinstance(opts.get("include_usage", False), bool):
        raise BadRequest(
            f"'stream_options' must be an object {{'include_usage': bool}}, got {opts!r}", "stream_options"
        )
    return stream, opts.get("include_usage", False)


def _logprobs(body: dict, chat: bool) -> int | None:
    """The alternatives per token asked for with log-probabilities (None: none asked). Chat:
    logprobs true/false and top_logprobs 0..MAX_TOP; completions: logprobs 0..MAX_TOP."""
    if not chat:
        return number_field(body, "logprobs", None, integer=True, lo=0, hi=MAX_TOP)
    on = body.get("logprobs")
    if on is not None and not isinstance(on, bool):
        raise BadRequest(f"'logprobs' must be true or false, got {shown(on)[:80]}", "logprobs")
    top = number_field(body, "top_logprobs", None, integer=True, lo=0, hi=MAX_TOP)
    if top and not on:
        raise BadRequest("'top_logprobs' needs 'logprobs': true", "top_logprobs")
    return (top or 0) if on else None


FORMATS = "text, json_object, json_schema, or edgespec's grammar (Lark) and regex"


def parse_response_format(fmt) -> Grammar | None:
    """OpenAI's response_format: {"type": "text"} (or absent): free text; {"type": "json_object"}:
    any JSON object; {"type": "json_schema", "json_schema": {"name", "schema", "strict"}}: that
    schema (strict: keywords llguidance does not implement are refused; else they are ignored);
    edgespec's {"type": "grammar", "grammar": LARK} and {"type": "regex", "regex": RE}."""
    if fmt is None:
        return None
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind not in ("text", "json_object", "json_schema", "grammar", "regex"):
        raise BadRequest(
            f"'response_format' must be an object whose 'type' is one of {FORMATS}; got {str(fmt)[:80]}",
            "response_format",
        )
    try:
        if kind == "text":
            return None
        if kind == "json_object":
            return json_object()
        if kind in ("grammar", "regex"):
            if not isinstance(fmt.get(kind), str):
                raise BadRequest(f"response_format.{kind} must be a string", f"response_format.{kind}")
            return grammar_from(**{kind: fmt[kind]})
        js = fmt.get("json_schema")
        if not isinstance(js, dict) or not isinstance(js.get("schema", {}), dict):
            raise BadRequest(
                "response_format.json_schema must be an object {name, schema, strict}, with 'schema' a "
                f"JSON Schema object; got {str(js)[:80]}",
                "response_format.json_schema",
            )
        strict = js.get("strict")
        if strict is not None and not isinstance(strict, bool):
            raise BadRequest(
                f"response_format.json_schema.strict must be true or false, got {strict!r}",
                "response_format.json_schema.strict",
            )
        return grammar_from(json_schema=js.get("schema", {}), strict=bool(strict))
    except GrammarError as e:
        raise BadRequest(f"response_format: {e}", "response_format") from e
