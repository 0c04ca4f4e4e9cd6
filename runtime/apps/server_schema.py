"""What `edgespec serve` accepts: an OpenAI request body checked field by field into a `Request`
before anything is tokenized or queued, so a bad input is a 400 naming the field, never a 500.

The engine folder's abilities (`Abilities`: its drafters, largest k, token trees, context) bound
the `speculative` extension field and the `/admin/speculation` body alike.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass

from edgespec.runtime.drafters import UnknownDrafterError, spec_of
from edgespec.runtime.grammar import Grammar, GrammarError, grammar_from, json_object
from edgespec.runtime.logprobs import MAX_TOP
from edgespec.runtime.sampling import SamplingConfig
from edgespec.runtime.tools import ToolError, ToolPlan, check_messages, plan
from edgespec.runtime.tree import TreeConfig

# message roles the chat template is given ("developer" is OpenAI's newer name for "system")
ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant", "tool": "tool"}
N_MAX = 16  # most choices (n) one request may ask for: they run one after another
ERROR_TYPES = {
    401: "invalid_request_error",
    403: "invalid_request_error",
    404: "invalid_request_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    500: "server_error",
    503: "overloaded",
}


class BadRequest(ValueError):
    """A request the server refuses, with the fields of OpenAI's error body."""

    def __init__(self, msg: str, param: str | None = None, status: int = 400, code: str | None = None) -> None:
        super().__init__(msg)
        self.param, self.status, self.code = param, status, code

    def body(self) -> dict:
        return {
            "error": {
                "message": str(self),
                "type": ERROR_TYPES.get(self.status, "invalid_request_error"),
                "param": self.param,
                "code": self.code,
            }
        }


@dataclass(frozen=True)
class Abilities:
    """What one loaded engine folder can be asked for."""

    drafters: tuple[str, ...]  # the drafters this folder and backend can run
    tree_drafters: tuple[str, ...]  # those that can draft token trees with this folder's graphs
    k_max: int  # largest num_speculative_tokens (verify graphs of widths 2..k_max+1)
    context: int  # KV slots: prompt + output tokens


@dataclass(frozen=True)
class Speculation:
    """How one request is decoded (the server's default, or a request's `speculative` field)."""

    drafter: str  # a registered drafter the folder can run (Abilities.drafters)
    k: int  # num_speculative_tokens (kept with drafter none, for a later switch back)
    tree: TreeConfig = TreeConfig()  # token trees when nodes > 0, else chains

    def to_dict(self) -> dict:
        return {"drafter": self.drafter, "k": self.k, "tree": self.tree.label if self.tree.nodes else None}


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


# no integer field means more than this; past it float() overflows on a huge JSON integer and numpy's
# int64 wraps, so it is checked before any conversion
INT_LIMIT = 2**63 - 1
TREE_SPEC_CHARS = 64  # a --tree spec is a few small numbers: a longer one is refused before parsing


def _shown(v) -> str:
    """v for a message: an integer too long to print whole by its size (the reply stays one line)."""
    if isinstance(v, int) and not isinstance(v, bool) and abs(v) > INT_LIMIT:
        return f"an integer of {len(str(abs(v)))} digits"
    return repr(v) if isinstance(v, str) else str(v)


def _number(
    body: dict,
    key: str,
    default,
    integer: bool = False,
    lo=None,
    hi=None,
    lo_open: bool = False,
    param: str | None = None,
):
    """body[key] checked: a finite number (an integer when asked) in [lo, hi] ((lo, hi] when lo_open)."""
    v, param = body.get(key), param or key
    if v is None:
        return default
    kind = "an integer" if integer else "a number"
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise BadRequest(f"'{param}' must be {kind}, got {_shown(v)[:80]}", param)
    # a JSON integer is a Python int of any size: math.isfinite and float() would overflow on 10**400,
    # while comparing an int with a float is exact, so the bounds come first and convert nothing
    if isinstance(v, float) and not math.isfinite(v):
        raise BadRequest(f"'{param}' must be a finite number, got {v}", param)
    if integer and isinstance(v, float) and not v.is_integer():
        raise BadRequest(f"'{param}' must be an integer, got {v}", param)
    if (lo is not None and (v <= lo if lo_open else v < lo)) or (hi is not None and v > hi):
        low = f"({lo}" if lo_open else f"[{lo}"
        raise BadRequest(f"'{param}' must be in {low}, {'inf' if hi is None else hi}], got {_shown(v)}", param)
    if abs(v) > INT_LIMIT:  # only integer fields without their own bound get here with such a value
        raise BadRequest(f"'{param}' must be at most {INT_LIMIT} (2**63 - 1), got {_shown(v)}", param)
    return int(v) if integer else float(v)


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
        raise BadRequest(f"{param} must be a list of calls, got {_shown(calls)[:80]}", param)
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


def _bounded_tree(tree: TreeConfig) -> TreeConfig:
    """A parsed tree made safe to run. A branch past the drafter's vocabulary would fail mid-answer
    (the heads' top-b), and a parent never gets more than nodes-1 children, so branch is read as at
    most nodes-1: the same tree. Depth and beam past the size are harmless (the drafters stop when
    the tree is full) and kept. min_score is a path probability: nan would cut nothing, inf all."""
    if not tree.nodes:
        return tree
    if not 0.0 <= tree.min_score <= 1.0:  # also refuses nan
        raise ValueError(f"min_score={tree.min_score} outside [0, 1]: it is a path probability (0 = off)")
    return dataclasses.replace(tree, branch=min(tree.branch, tree.nodes - 1))


def parse_speculation(spec, default: Speculation, ab: Abilities, param: str = "speculative") -> Speculation:
    """`{"drafter", "k", "tree"}` over `default` (a field left out keeps the default's; a drafter
    that cannot draft trees gets chains)."""
    if not isinstance(spec, dict) or set(spec) - {"drafter", "k", "tree"}:
        raise BadRequest(
            f"'{param}' must be an object with optional 'drafter', 'k' and 'tree', got {_shown(spec)[:80]}", param
        )
    name = spec.get("drafter", default.drafter)
    try:  # an alias answers as its drafter (prompt_lookup is ngram), as on the CLI (drafters.spec_of)
        drafter = spec_of(name).name if isinstance(name, str) else None
    except UnknownDrafterError:
        drafter = None
    if drafter is None:
        raise BadRequest(
            f"{param}.drafter {_shown(name)[:80]}: choose one of {', '.join(ab.drafters)}", f"{param}.drafter"
        )
    if drafter not in ab.drafters:
        raise BadRequest(
            f"{param}.drafter {name!r} is not available in this engine folder (it has {', '.join(ab.drafters)})",
            f"{param}.drafter",
        )
    k = _number(spec, "k", default.k, integer=True, param=f"{param}.k")
    # drafter none keeps k for a later switch back, so a k given with it is checked as well: a bad one
    # would stick in the server's default and make every later change that leaves k out fail
    if (drafter != "none" or "k" in spec) and not 1 <= k <= ab.k_max:
        raise BadRequest(
            f"{param}.k={k} outside 1..{ab.k_max}: this folder has verify graphs up to "
            f"num_speculative_tokens={ab.k_max}",
            f"{param}.k",
        )
    tree = default.tree if "tree" not in spec else spec["tree"]
    if tree in (None, "", "none"):
        tree = TreeConfig()
    elif isinstance(tree, str):
        try:
            if len(tree) > TREE_SPEC_CHARS:
                raise ValueError(f"a spec of {len(tree)} characters; at most {TREE_SPEC_CHARS} are read")
            tree = TreeConfig.parse(tree)
            tree.check(ab.k_max + 1)
            tree = _bounded_tree(tree)
        except ValueError as e:
            raise BadRequest(f"{param}.tree: {e}", f"{param}.tree") from e
    elif not isinstance(tree, TreeConfig):
        raise BadRequest(
            f"{param}.tree must be a string NODES[:DEPTH[:BRANCH[:BEAM[:MIN_SCORE]]]], e.g. "
            f"'6:5:1:1', or null for chains; got {_shown(tree)[:80]}",
            f"{param}.tree",
        )
    if tree.nodes and drafter not in ab.tree_drafters:
        if "tree" in spec:
            raise BadRequest(
                f"{param}.tree: drafter {drafter!r} cannot draft token trees with this folder (these "
                f"can: {', '.join(ab.tree_drafters) or 'none'})",
                f"{param}.tree",
            )
        tree = TreeConfig()  # the default's tree belongs to a tree drafter; this one drafts chains
    return Speculation(drafter, k, tree if drafter != "none" else TreeConfig())


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
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise BadRequest(f"'model' must be a string, got {model!r}", "model")
    if strict_model and model not in (None, model_name):
        raise BadRequest(
            f"model {model!r} not found; this server serves {model_name!r} (serve --strict-model)",
            "model",
            404,
            "model_not_found",
        )
    tools = None
    if chat:
        prompt = _messages(body.get("messages"))
        n_bytes = sum(len(m["content"].encode()) + len(str(m.get("tool_calls") or "")) for m in prompt)
        try:
            tools = plan(body.get("tools"), body.get("tool_choice"), body.get("parallel_tool_calls"))
        except ToolError as e:
            raise BadRequest(str(e), e.param) from None
        if tools is not None:
            n_bytes += len(json.dumps([t.as_openai() for t in tools.tools]))
    else:
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
        n_bytes = len(prompt.encode())
    for key, field in UNSUPPORTED.items():
        if key in body and body[key] is not None and body[key] not in field.noops:
            raise BadRequest(
                f"'{key}' is not supported by this server ({field.why}); got {_shown(body[key])[:80]}", key
            )
    grammar = parse_response_format(body.get("response_format"))
    if grammar is not None and tools is not None and tools.forced:
        raise BadRequest(
            "tool_choice required or a function constrains the answer to calls: drop response_format, "
            "or use tool_choice auto",
            "response_format",
        )
    n = _number(body, "n", 1, integer=True, lo=1, hi=N_MAX)
    logprobs = _logprobs(body, chat)
    max_tokens = _number(body, "max_completion_tokens", None, integer=True, lo=1)
    if max_tokens is None:
        max_tokens = _number(body, "max_tokens", max_tokens_default, integer=True, lo=1)
    sampling = SamplingConfig(
        temperature=_number(body, "temperature", 1.0, lo=0.0, hi=2.0),
        top_k=_number(body, "top_k", 0, integer=True, lo=0),
        top_p=_number(body, "top_p", 1.0, lo=0.0, hi=1.0, lo_open=True),
        seed=_number(body, "seed", None, integer=True, lo=0),
        repetition_penalty=_number(body, "repetition_penalty", 1.0, lo=0.0, hi=10.0, lo_open=True),
    )
    stop = body.get("stop") or []
    stop = [stop] if isinstance(stop, str) else stop
    if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop):
        raise BadRequest(f"'stop' must be a string or a list of non-empty strings, got {stop!r}", "stop")
    stream = body.get("stream") or False
    if not isinstance(stream, bool):
        raise BadRequest(f"'stream' must be true or false, got {stream!r}", "stream")
    opts = body.get("stream_options") or {}
    if not isinstance(opts, dict) or not isinstance(opts.get("include_usage", False), bool):
        raise BadRequest(
            f"'stream_options' must be an object {{'include_usage': bool}}, got {opts!r}", "stream_options"
        )
    spec = parse_speculation(body["speculative"], default, ab) if body.get("speculative") is not None else None
    usage = opts.get("include_usage", False)
    return Request(prompt, n_bytes, max_tokens, sampling, stop, spec, stream, usage, grammar, tools, logprobs, n)


def _logprobs(body: dict, chat: bool) -> int | None:
    """The alternatives per token asked for with log-probabilities (None: none asked). Chat:
    logprobs true/false and top_logprobs 0..MAX_TOP; completions: logprobs 0..MAX_TOP."""
    if not chat:
        return _number(body, "logprobs", None, integer=True, lo=0, hi=MAX_TOP)
    on = body.get("logprobs")
    if on is not None and not isinstance(on, bool):
        raise BadRequest(f"'logprobs' must be true or false, got {_shown(on)[:80]}", "logprobs")
    top = _number(body, "top_logprobs", None, integer=True, lo=0, hi=MAX_TOP)
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
