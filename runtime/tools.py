"""Tool calls (OpenAI's `tools` / `tool_choice`) through the engine folder's own chat template.

A request's tools reach the model the way its template expects them, and its answer is parsed back
into OpenAI's `tool_calls` (tool_calls.py). The call syntax is read off the template's text, as llama.cpp's server
reads it:

  hermes   `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>` (Qwen 2.5 / 3, SmolLM3, Hermes)
  llama3   a bare `{"name": ..., "parameters": {...}}` (Llama 3.1 / 3.2 / 3.3)
  mistral  `[TOOL_CALLS][{"name": ..., "arguments": {...}}]`
  granite  `<|tool_call|>[{"name": ..., "arguments": {...}}]`
  json     a template that takes `tools` in a syntax none of the above: a bare call object
  generic  a template that takes no `tools` (SmolLM2, Gemma 3): the tools are described in the system
           message, JSON Schemas and all, and the model is asked to answer `{"tool_call": {"name": ...,
           "arguments": {...}}}` (llama.cpp's generic format); earlier calls and tool results are
           written into the messages as that JSON (assistant turns; results as a user turn)

`tool_choice` "required" or a named function constrains the answer to calls in that syntax by a Lark
grammar (grammar.py, llguidance): each call is its name followed by arguments under the function's
own JSON Schema, so they always parse and validate, and speculation stays lossless as it does for
response_format. "auto" leaves the model free (it may answer in text); "none" sends no tools.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field

from edgespec.runtime.grammar import JSON_OPTIONS, Grammar, GrammarError, grammar_from

MAX_TOOLS = 128  # OpenAI's limit: past it a request is refused (each schema is compiled to check it)
NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")  # OpenAI's function names
CHOICES = ("none", "auto", "required")


class ToolError(ValueError):
    """Tools, tool_choice or tool messages that cannot be used, naming the field (`param`)."""

    def __init__(self, msg: str, param: str) -> None:
        super().__init__(msg)
        self.param = param


@dataclass(frozen=True)
class Tool:
    """One function the model may call."""

    name: str  # what the call names ([A-Za-z0-9_-]{1,64})
    description: str  # shown to the model
    parameters: dict  # JSON Schema of the arguments (an object)
    strict: bool = False  # JSON Schema keywords llguidance does not implement are refused, not ignored

    def as_openai(self) -> dict:
        """The shape chat templates take (transformers' apply_chat_template(tools=...))."""
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.parameters},
        }


@dataclass(frozen=True)
class ToolCall:
    """One call the model made."""

    name: str  # the function
    arguments: str  # its arguments as JSON text (OpenAI's function.arguments)
    id: str = field(default_factory=lambda: "call_" + uuid.uuid4().hex[:24])  # what the tool message answers

    def as_openai(self) -> dict:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


@dataclass(frozen=True)
class ToolPlan:
    """What a request asks of its tools (tool_choice "none" has no plan: no tools are sent)."""

    tools: tuple[Tool, ...]  # the functions offered
    choice: str  # "auto" (the model may answer in text), "required", or the one function's name it must call
    parallel: bool = False  # under a grammar: one or more calls (else exactly one), as parallel_tool_calls

    @property
    def forced(self) -> bool:
        """Is the answer constrained to calls (required / a named function)?"""
        return self.choice != "auto"

    def callable(self) -> tuple[Tool, ...]:
        """The tools a constrained answer may call."""
        if self.choice in ("auto", "required"):
            return self.tools
        return tuple(t for t in self.tools if t.name == self.choice)


# ---- the request's fields ---------------------------------------------------------------------------
def parse_tools(tools, param: str = "tools") -> tuple[Tool, ...]:
    """OpenAI's `tools` checked: [{type: function, function: {name, description?, parameters?, strict?}}],
    each schema compiled (an invalid one is refused here, naming it), names unique."""
    if not isinstance(tools, list):
        raise ToolError(f"'{param}' must be a list of {{type: 'function', function: {{...}}}} objects", param)
    if len(tools) > MAX_TOOLS:
        raise ToolError(f"'{param}' has {len(tools)} tools; at most {MAX_TOOLS} are taken (as OpenAI takes)", param)
    out, seen = [], {}
    for i, t in enumerate(tools):
        where = f"{param}[{i}]"
        f = t.get("function") if isinstance(t, dict) and t.get("type", "function") == "function" else None
        if not isinstance(f, dict):
            shape = "{type: 'function', function: {name, description, parameters}}"
            raise ToolError(f"{where} must be {shape}, got {str(t)[:80]}", where)
        name = f.get("name")
        if not isinstance(name, str) or not NAME.match(name):
            what = f"{where}.function.name"
            raise ToolError(f"{what} {str(name)[:80]!r}: give 1-64 letters, digits, '_' or '-'", what)
        if name in seen:
            raise ToolError(
                f"{where}.function.name {name!r} is also {param}[{seen[name]}]'s: tool names must be unique",
                f"{where}.function.name",
            )
        seen[name] = i
        desc = f.get("description", "")
        if not isinstance(desc, str):
            raise ToolError(f"{where}.function.description must be a string", f"{where}.function.description")
        strict = f.get("strict") or False
        if not isinstance(strict, bool):
            raise ToolError(f"{where}.function.strict must be true or false", f"{where}.function.strict")
        params = f.get("parameters")
        if params is None:
            params = {"type": "object", "properties": {}}
        p_where = f"{where}.function.parameters"
        if not isinstance(params, dict) or params.get("type", "object") != "object":
            raise ToolError(f"{p_where} must be a JSON Schema of an object, got {str(params)[:80]}", p_where)
        try:
            grammar_from(json_schema=params, strict=strict)
        except GrammarError as e:
            raise ToolError(f"{p_where}: {e}", p_where) from None
        out.append(Tool(name, desc, params, strict))
    return tuple(out)


def parse_tool_choice(choice, tools: tuple[Tool, ...], param: str = "tool_choice") -> str:
    """OpenAI's tool_choice: "none", "auto", "required" or {type: function, function: {name}} (the
    name of one of `tools`). Absent: "auto" with tools, "none" without."""
    if choice is None:
        return "auto" if tools else "none"
    if isinstance(choice, str):
        if choice not in CHOICES:
            raise ToolError(f"'{param}' {choice[:80]!r}: choose one of {', '.join(CHOICES)}, or a function", param)
        name = None
    else:
        f = choice.get("function") if isinstance(choice, dict) and choice.get("type") == "function" else None
        name = f.get("name") if isinstance(f, dict) else None
        if not isinstance(name, str):
            raise ToolError(
                f"'{param}' must be none, auto, required or {{type: 'function', function: {{name}}}}, got "
                f"{str(choice)[:80]}",
                param,
            )
    if choice != "none" and not tools:
        raise ToolError(f"'{param}' {str(choice)[:80]} needs a non-empty 'tools' list", param)
    if name is not None and all(t.name != name for t in tools):
        raise ToolError(
            f"'{param}' names {name[:80]!r}, which is none of the tools ({', '.join(t.name for t in tools)[:200]})",
            param,
        )
    return name or choice


def plan(tools, tool_choice=None, parallel=None) -> ToolPlan | None:
    """The checked ToolPlan of OpenAI's tools / tool_choice / parallel_tool_calls (None: no tools)."""
    parsed = parse_tools(tools) if tools is not None else ()
    choice = parse_tool_choice(tool_choice, parsed)
    if parallel is not None and not isinstance(parallel, bool):
        raise ToolError("'parallel_tool_calls' must be true or false", "parallel_tool_calls")
    return ToolPlan(parsed, choice, bool(parallel)) if choice != "none" else None


def check_messages(messages: list[dict]) -> None:
    """Tool messages answer calls: each role `tool` message names the id of a call an earlier
    assistant message made (`tool_call_id`)."""
    ids: set[str] = set()
    for i, m in enumerate(messages):
        for c in m.get("tool_calls") or ():
            ids.add(c.get("id") if isinstance(c, dict) else None)
        if m.get("role") == "tool" and m.get("tool_call_id") not in ids:
            got = m.get("tool_call_id")
            raise ToolError(
                f"messages[{i}].tool_call_id {str(got)[:80]!r} answers no call of an earlier assistant message"
                + (f" (their ids: {', '.join(sorted(ids))[:200]})" if ids else " (none made a call)"),
                f"messages[{i}].tool_call_id",
            )


# ---- the template's syntax ----------------------------------------------------------------------------
@dataclass(frozen=True)
class ToolFormat:
    """How one chat template writes tool calls."""

    name: str  # hermes | llama3 | mistral | granite | json | generic (module docstring)
    native: bool  # the template takes `tools` (else: the generic description in the system message)
    key: str = "arguments"  # the call object's key for the arguments ("parameters": Llama 3.x)
    open: str = ""  # text before each call (hermes) or the list of calls (mistral, granite)
    close: str = ""  # text after each call (hermes)
    listed: bool = False  # the calls are one JSON list (after `open`)

    @property
    def anywhere(self) -> bool:
        """May a call start after some text (else only at the start of the answer)?"""
        return self.name == "hermes"


FORMATS = {
    "hermes": ToolFormat("hermes", True, open="<tool_call>\n", close="\n</tool_call>"),
    "llama3": ToolFormat("llama3", True, key="parameters"),
    "mistral": ToolFormat("mistral", True, open="[TOOL_CALLS]", listed=True),
    "granite": ToolFormat("granite", True, open="<|tool_call|>", listed=True),
    "json": ToolFormat("json", True),
    "generic": ToolFormat("generic", False),
}


def tool_format(template: str | None, takes_tools: bool) -> ToolFormat:
    """The call syntax of a chat template (its text), by the markers each family's template writes."""
    if not takes_tools or template is None:
        return FORMATS["generic"]
    if "<tool_call>" in template:
        return FORMATS["hermes"]
    if "[TOOL_CALLS]" in template:
        return FORMATS["mistral"]
    if "<|tool_call|>" in template:
        return FORMATS["granite"]
    if "<|python_tag|>" in template or ("ipython" in template and "parameters" in template):
        return FORMATS["llama3"]
    return FORMATS["json"]


GENERIC_PROMPT = (
    "You can call these tools (each function's arguments as a JSON Schema):\n{tools}\n"
    'To call a tool, answer with one JSON object and nothing else: {{"tool_call": {{"name": "<function name>", '
    '"arguments": {{<its arguments>}}}}}}. {then}'
)
GENERIC_THEN = {
    "auto": "Otherwise answer the user in plain text.",
    "required": "You must call one of them now.",
}


def _arguments(text) -> dict | str:
    """A call's arguments for a template: the JSON object its text holds (templates write them with
    tojson), else the text as sent."""
    if isinstance(text, dict):
        return text
    try:
        value = json.loads(text)
    except (TypeError, ValueError):
        return text
    return value if isinstance(value, dict) else text


def _function(f: dict) -> dict:
    return {"name": f["name"], "arguments": _arguments(f["arguments"])}


def template_messages(messages: list[dict], plan: ToolPlan | None, fmt: ToolFormat) -> tuple[list[dict], list | None]:
    """(messages, tools) for the template: a native template gets the tools and the messages as
    OpenAI sends them (a call's arguments as an object, a tool result with its function's name);
    a generic one gets the tools described in the system message and calls / results as JSON text."""
    names = {c["id"]: c["function"]["name"] for m in messages for c in m.get("tool_calls") or ()}
    out: list[dict] = []
    for m in messages:
        calls = m.get("tool_calls")
        if m.get("content") is None:  # an assistant message with calls only
            m = m | {"content": ""}
        if fmt.native:
            m = dict(m)
            if calls:
                m["tool_calls"] = [
                    {"id": c["id"], "type": "function", "function": _function(c["function"])} for c in calls
                ]
            if m["role"] == "tool":
                m["name"] = names.get(m.get("tool_call_id"), "")
            out.append(m)
        elif calls:
            body = [_function(c["function"]) for c in calls]
            call = {"tool_call": body[0]} if len(body) == 1 else {"tool_calls": body}
            text = (m["content"] + "\n" if m["content"] else "") + json.dumps(call, ensure_ascii=False)
            out.append({"role": "assistant", "content": text})
        elif m["role"] == "tool":
            result = {"tool_response": {"name": names.get(m.get("tool_call_id"), ""), "content": m["content"]}}
            text = json.dumps(result, ensure_ascii=False)
            if out and out[-1].get("tool_results"):  # results of one turn's calls: one user message
                out[-1]["content"] += "\n" + text
            else:
                out.append({"role": "user", "content": text, "tool_results": True})
        else:
            out.append(m)
    for m in out:
        m.pop("tool_results", None)
    if fmt.native:
        return out, [t.as_openai() for t in plan.tools] if plan is not None else None
    if plan is not None:
        listed = json.dumps([t.as_openai()["function"] for t in plan.tools], ensure_ascii=False)
        then = GENERIC_THEN.get(plan.choice, f"You must call {plan.choice} now.")
        prompt = GENERIC_PROMPT.format(tools=listed, then=then)
        if out and out[0]["role"] == "system":
            out[0] = {"role": "system", "content": out[0]["content"] + "\n\n" + prompt}
        else:
            out.insert(0, {"role": "system", "content": prompt})
    return out, None


# ---- the constraint -----------------------------------------------------------------------------------
def _lit(s: str) -> str:
    return json.dumps(s)  # a Lark string literal (the same escapes)


def tool_grammar(plan: ToolPlan, fmt: ToolFormat, special=lambda s: False) -> Grammar:
    """The Lark grammar a required / named tool_choice constrains the answer to: calls in the
    template's syntax, each `{"name": NAME, "<key>": ARGS}` with ARGS under the function's schema.
    special(text): is the text one special token of the tokenizer (then the model's own marker,
    which decoding hides, is left out: the calls are recognised without it)."""
    rules, alts = [], []
    for i, t in enumerate(plan.callable()):
        opts = JSON_OPTIONS | {"lenient": not t.strict}
        # no other arguments than the schema lists unless it says so (llama.cpp's grammars do the same):
        # a model free to add keys can add them until max_tokens
        schema = {"additionalProperties": False} | t.parameters | {"x-guidance": opts}
        head = f'{{"name": {json.dumps(t.name)}, "{fmt.key}": '
        rules += [f"call_{i}: {_lit(head)} args_{i} {_lit('}')}", f"args_{i}: %json {json.dumps(schema)}"]
        alts.append(f"call_{i}")
    rules.append("call: " + " | ".join(alts))
    sep = ", "
    many = plan.parallel
    if fmt.name == "hermes":
        one = f"{_lit(fmt.open)} call {_lit(fmt.close)}"
        start = f"{one} ({_lit(chr(10))} {one})*" if many else one
    elif fmt.listed:
        opener = "" if special(fmt.open) else _lit(fmt.open) + " "
        start = f"{opener}{_lit('[')} call " + (f"({_lit(sep)} call)* " if many else "") + _lit("]")
    elif fmt.name == "generic":
        key = "tool_calls" if many else "tool_call"
        opener, closer = _lit("{" + json.dumps(key) + (": [" if many else ": ")), _lit("]}" if many else "}")
        start = f"{opener} call " + (f"({_lit(sep)} call)* " if many else "") + closer
    else:  # llama3, json: one bare call object
        start = "call"
    text = "\n".join([f"start: {start}", *rules])
    try:
        g = grammar_from(grammar=text)
    except GrammarError as e:
        raise ToolError(f"tools: {e}", "tools") from None
    return Grammar(g.text, "tools")
