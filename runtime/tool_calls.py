"""Tool calls read back out of an answer (tools.py renders the tools into the prompt and makes the
grammar): `parse_calls` turns a finished answer's text into OpenAI's `tool_calls` in the syntax of
the folder's template, and `ToolStream` holds back streamed text that may be a call until it can
be parsed."""

from __future__ import annotations

import json

from edgespec.runtime.tools import Tool, ToolCall, ToolFormat, ToolPlan

_DECODER = json.JSONDecoder()


def _call(obj, fmt: ToolFormat, names: set[str]) -> ToolCall | None:
    """A ToolCall from a decoded call object {name, arguments | parameters} naming one of the tools."""
    if not isinstance(obj, dict) or obj.get("name") not in names:
        return None
    args = obj.get(fmt.key, obj.get("arguments", obj.get("parameters", {})))
    if isinstance(args, str):  # some models write the arguments as JSON text
        try:
            args = json.loads(args)
        except ValueError:
            return None
    if not isinstance(args, dict):
        return None
    return ToolCall(obj["name"], json.dumps(args, ensure_ascii=False))


def _json_values(text: str) -> list | None:
    """The JSON values text holds, one after another (whitespace, ';' or ',' between), or None."""
    out, i, n = [], 0, len(text)
    while True:
        while i < n and text[i] in " \t\r\n;,":
            i += 1
        if i == n:
            return out
        try:
            v, i = _DECODER.raw_decode(text, i)
        except ValueError:
            return None
        out.append(v)


def parse_calls(text: str, fmt: ToolFormat, tools: tuple[Tool, ...]) -> tuple[str, list[ToolCall]]:
    """(content, calls) of an answer: the calls it makes in fmt's syntax, and the text before them.
    An answer whose calls do not all parse, or name a function not offered, is text: ([text], [])."""
    names = {t.name for t in tools}
    none = (text, [])
    if fmt.name == "hermes":
        at = text.find("<tool_call>")
        if at < 0:
            return none
        calls = []
        for part in text[at:].split("<tool_call>")[1:]:
            body = part.split("</tool_call>")[0]
            values = _json_values(body)
            if not values or len(values) != 1 or (call := _call(values[0], fmt, names)) is None:
                return none
            calls.append(call)
        return text[:at].rstrip(), calls
    body = text.strip()
    if fmt.open and body.startswith(fmt.open):
        body = body[len(fmt.open) :]
    if body.startswith("<|python_tag|>"):
        body = body[len("<|python_tag|>") :]
    values = _json_values(body)
    if not values:
        return none
    if fmt.name == "generic":
        if len(values) != 1 or not isinstance(values[0], dict):
            return none
        v = values[0]
        if set(v) == {"response"} and isinstance(v["response"], str):
            return v["response"], []
        if set(v) == {"tool_call"}:
            values = [v["tool_call"]]
        elif set(v) == {"tool_calls"}:
            values = v["tool_calls"]
        else:
            return none
        if not isinstance(values, list):
            return none
    elif len(values) == 1 and isinstance(values[0], list):
        values = values[0]
    calls = [_call(v, fmt, names) for v in values]
    return none if not calls or None in calls else ("", calls)


class ToolStream:
    """Streamed text with tool calls held back: text is passed on until a call may be starting
    (hermes: its marker anywhere; the other syntaxes: a JSON value or marker opening the answer;
    a constrained answer: from the start), and from there held until the end, when it is parsed
    into calls, or passed on after all if it is none."""

    def __init__(self, plan: ToolPlan, fmt: ToolFormat) -> None:
        self.plan, self.fmt = plan, fmt
        leading = ("{", "[", fmt.open.strip(), "<|python_tag|>")
        self.starts = [fmt.open.strip()] if fmt.anywhere else [s for s in leading if s]
        self.text = ""  # everything pushed
        self.sent = 0  # characters of text passed on
        self.call_at = 0 if plan.forced else -1  # where the held call text starts (-1: none yet)

    def push(self, piece: str) -> str:
        """The part of what has come so far (this piece appended) that is safe to pass on now."""
        self.text += piece
        if self.call_at >= 0:
            return ""
        t = self.text
        if self.fmt.anywhere:
            hits = [i for i in (t.find(s, self.sent) for s in self.starts) if i >= 0]
            if hits:
                self.call_at = min(hits)
                return self._send(self.call_at)
            # a marker may be starting at the end: hold back what could be its beginning
            hold = max((n for s in self.starts for n in range(1, len(s)) if t.endswith(s[:n])), default=0)
            return self._send(len(t) - hold)
        if self.sent == 0:  # the answer's start decides: held while only whitespace has come
            body = t.lstrip()
            if not body:
                return ""
            if any(body.startswith(s) or s.startswith(body) for s in self.starts):
                if any(body.startswith(s) for s in self.starts):
                    self.call_at = 0
                return ""
        return self._send(len(t))

    def _send(self, end: int) -> str:
        out = self.text[self.sent : end]
        self.sent = max(self.sent, end)
        return out

    def finish(self) -> tuple[str, list[ToolCall]]:
        """(the text not passed on yet, the calls made): the held text parsed at the end."""
        rest = self.text[self.sent :]
        self.sent = len(self.text)
        if self.call_at < 0:
            return rest, []
        content, calls = parse_calls(rest, self.fmt, self.plan.tools)
        return (content, calls) if calls else (rest, [])
