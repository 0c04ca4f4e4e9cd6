"""Issue 54: tool calls through the folder's own chat template, log-probabilities read from the verify
rows, n > 1, any model name: the Python API and `edgespec serve` driven by the `openai` client, on a
tiny folder whose template takes tools (Qwen-style <tool_call>) and one whose template takes none
(the generic fallback)."""

import json
import shutil

import numpy as np
import pytest

from edgespec.runtime.config import RuntimeConfig
from edgespec.runtime.generator import Generator
from edgespec.runtime.sampling import SamplingConfig
from edgespec.runtime.tool_calls import ToolStream, parse_calls
from edgespec.runtime.tools import FORMATS, ToolError, plan, tool_format
from edgespec.runtime.tree import TreeConfig

# a Qwen 2.5-style template: tools listed in a system turn, calls as <tool_call> JSON, results as tool turns
HERMES = """{%- if tools %}<system>Functions:
{% for t in tools %}{{ t | tojson }}
{% endfor %}Call one as <tool_call>
{"name": NAME, "arguments": ARGS}
</tool_call>
{% endif %}
{%- for m in messages %}
{%- if m.role == 'assistant' and m.tool_calls %}<assistant>{{ m.content }}{% for c in m.tool_calls %}<tool_call>
{{ {"name": c.function.name, "arguments": c.function.arguments} | tojson }}
</tool_call>{% endfor %}
{%- elif m.role == 'tool' %}<tool_response>{{ m.content }}</tool_response>
{%- else %}<{{ m.role }}>{{ m.content }}
{%- endif %}
{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}"""

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "the weather in a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "enum": ["Paris", "Rome", "Oslo"]},
                "days": {"type": "integer", "minimum": 1, "maximum": 7},
            },
            "required": ["city", "days"],
        },
    },
}
CLOCK = {
    "type": "function",
    "function": {
        "name": "clock",
        "description": "the time",
        "parameters": {
            "type": "object",
            "properties": {"zone": {"type": "string", "maxLength": 6}, "utc": {"type": "boolean"}},
            "required": ["utc"],
        },
    },
}
TOOLS = [WEATHER, CLOCK]
USER = [{"role": "user", "content": "weather in Paris?"}]
DRAFTERS = [("none", 4, ""), ("ngram", 4, ""), ("draft", 3, ""), ("suffix", 4, ""), ("recycle", 4, "")]
DRAFTERS += [("merged", 4, ""), ("eagle", 4, ""), ("medusa", 4, ""), ("ngram", 4, "6:4:2:2"), ("eagle", 4, "6:4:2:2")]


def _fuse_tokenizer(folder) -> None:
    """The tiny char-level tokenizer with newlines and no spaces between characters when decoded
    (tests/tiny.py's spaces them and has no newline), its record in the manifest updated."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    from edgespec.engines.manifest import sha256_of_file

    vocab = {"<0>": 0, "<1>": 1} | {chr(i): i for i in range(2, 256)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<0>"))
    tok.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    tok.decoder = decoders.Fuse()
    tok.add_special_tokens([AddedToken("<0>", special=True), AddedToken("<1>", special=True)])
    path = folder / "tokenizer.json"
    tok.save(str(path))
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["files"]["tokenizer.json"] = {"size": path.stat().st_size, "sha256": sha256_of_file(path)}
    (folder / "manifest.json").write_text(json.dumps(manifest))


@pytest.fixture(scope="module")
def generic_folder(tiny_models, tmp_path_factory):
    """A tiny folder with every drafter and room for tool descriptions (max_len 1024); its template
    (tests/tiny.py's) takes no tools."""
    from tiny import TINY_EXPORT, tiny_eagle_head, tiny_medusa_heads

    from edgespec.export.target.exporter import ExportConfig, export

    root = tmp_path_factory.mktemp("tools")
    head, _, _ = tiny_eagle_head(tiny_models["llama"], root / "head", draft_vocab=48, noise=0.01)
    heads, _, _ = tiny_medusa_heads(tiny_models["llama"], root / "heads", n_heads=4)
    kw = TINY_EXPORT | {"max_len": 1024, "k": 6, "validate": False}
    out = export(
        ExportConfig(
            target=str(tiny_models["llama"]),
            draft="self:1",
            eagle=str(head),
            medusa=str(heads),
            out=str(root / "generic"),
            **kw,
        )
    )
    _fuse_tokenizer(out)
    return out


@pytest.fixture(scope="module")
def hermes_folder(generic_folder, tmp_path_factory):
    out = tmp_path_factory.mktemp("hermes") / "engine"
    shutil.copytree(generic_folder, out)
    (out / "chat_template.jinja").write_text(HERMES)
    return out


@pytest.fixture(scope="module")
def hermes(hermes_folder):
    return Generator.load(hermes_folder, RuntimeConfig(drafter="ngram", k=4))


@pytest.fixture(scope="module")
def generic(generic_folder):
    return Generator.load(generic_folder, RuntimeConfig(drafter="ngram", k=4))


def _use(g, drafter, k, tree):
    g.reconfigure(drafter=drafter, k=k, tree=TreeConfig.parse(tree) if tree else TreeConfig())


def _validate(call, tools=TOOLS):
    jsonschema = pytest.importorskip("jsonschema")
    schema = next(t["function"]["parameters"] for t in tools if t["function"]["name"] == call.name)
    jsonschema.validate(json.loads(call.arguments), schema)


# ---- the syntax: parsing, streaming, formats ------------------------------------------------------------
def test_formats_are_read_off_the_templates():
    assert tool_format(HERMES, True).name == "hermes"
    assert tool_format("{{ '<|python_tag|>' }}{{ tools }}", True).name == "llama3"
    assert tool_format("[TOOL_CALLS]{{ tools }}", True).name == "mistral"
    assert tool_format("<|tool_call|>{{ tools }}", True).name == "granite"
    assert tool_format("{{ tools }}", True).name == "json"
    assert tool_format("{{ messages }}", False).name == "generic" and not FORMATS["generic"].native


@pytest.mark.parametrize(
    "fmt, text, content, calls",
    [
        ("hermes", 'Sure.\n<tool_call>\n{"name": "clock", "arguments": {"utc": true}}\n</tool_call>', "Sure.", 1),
        (
            "hermes",
            '<tool_call>{"name": "clock", "arguments": {}}</tool_call><tool_call>{"name": "clock", '
            '"arguments": {"utc": false}}</tool_call>',
            "",
            2,
        ),
        ("hermes", '<tool_call>\n{"name": "clock", "arguments": {"utc": true}}', "", 1),  # unclosed at EOS
        ("hermes", '<tool_call>\n{"name": "nope", "arguments": {}}\n</tool_call>', None, 0),  # no such tool
        ("hermes", "<tool_call>\n{broken", None, 0),
        ("llama3", '{"name": "clock", "parameters": {"utc": true}}', "", 1),
        ("llama3", '<|python_tag|>{"name": "clock", "parameters": {"utc": true}}', "", 1),
        ("mistral", '[TOOL_CALLS][{"name": "clock", "arguments": {"utc": true}}]', "", 1),
        ("mistral", '[{"name": "clock", "arguments": {}}, {"name": "get_weather", "arguments": {}}]', "", 2),
        ("generic", '{"tool_call": {"name": "clock", "arguments": {"utc": true}}}', "", 1),
        ("generic", '{"tool_calls": [{"name": "clock", "arguments": "{\\"utc\\": true}"}]}', "", 1),
        ("generic", '{"response": "hi"}', "hi", 0),
        ("generic", "plain text", None, 0),
    ],
)
def test_calls_are_parsed_from_each_syntax(fmt, text, content, calls):
    got_content, got = parse_calls(text, FORMATS[fmt], plan(TOOLS).tools)
    assert len(got) == calls
    assert got_content == (text if content is None else content)
    for c in got:
        assert isinstance(json.loads(c.arguments), dict) and c.id.startswith("call_")


@pytest.mark.parametrize("fmt", ["hermes", "generic"])
def test_streamed_text_holds_back_only_what_may_be_a_call(fmt):
    """Cut anywhere into pieces, the text before a call streams, the call is held and parsed."""
    call = '{"tool_call": {"name": "clock", "arguments": {"utc": true}}}'
    if fmt == "hermes":
        call = '<tool_call>\n{"name": "clock", "arguments": {"utc": true}}\n</tool_call>'
    for text, before in (
        (f"Let me look. {call}" if fmt == "hermes" else call, "Let me look." if fmt == "hermes" else ""),
        ("no call < here {x}", None),
    ):
        for cut in range(1, len(text)):
            s = ToolStream(plan(TOOLS), FORMATS[fmt])
            sent = s.push(text[:cut]) + s.push(text[cut:])
            rest, calls = s.finish()
            if before is None:
                assert sent + rest == text and not calls
            else:
                assert len(calls) == 1 and (sent + rest).strip() == before, (cut, sent, rest)


def test_a_forced_answer_is_held_from_the_start():
    s = ToolStream(plan(TOOLS, "required"), FORMATS["hermes"])
    assert s.push('<tool_call>\n{"name": "clock", "arguments": {"utc": true}}\n</tool_call>') == ""
    assert s.finish()[1][0].name == "clock"


# ---- bad input --------------------------------------------------------------------------------------------
BAD_SCHEMA = {"type": "object", "properties": {"a": {"type": "foo"}}}
BAD_TOOLS = [
    (
        {"tools": [WEATHER | {"function": WEATHER["function"] | {"parameters": BAD_SCHEMA}}]},
        "tools[0].function.parameters",
        "Invalid type",
    ),
    (
        {"tools": [WEATHER | {"function": WEATHER["function"] | {"parameters": {"type": "string"}}}]},
        "tools[0].function.parameters",
        "object",
    ),
    ({"tools": [WEATHER, WEATHER]}, "tools[1].function.name", "unique"),
    ({"tools": [CLOCK] * 1000}, "tools", "at most 128"),
    ({"tools": [{"type": "function", "function": {"name": "a b"}}]}, "tools[0].function.name", "letters"),
    ({"tools": "x"}, "tools", "list"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice", "none of"),
    ({"tools": TOOLS, "tool_choice": "sometimes"}, "tool_choice", "choose one of"),
    ({"tool_choice": "required"}, "tool_choice", "non-empty 'tools'"),
    ({"tools": TOOLS, "parallel_tool_calls": "yes"}, "parallel_tool_calls", "true or false"),
]


@pytest.mark.parametrize("body, param, words", BAD_TOOLS, ids=[b[1] + str(i) for i, b in enumerate(BAD_TOOLS)])
def test_bad_tools_name_the_field(body, param, words):
    with pytest.raises(ToolError) as e:
        plan(body.get("tools"), body.get("tool_choice"), body.get("parallel_tool_calls"))
    assert e.value.param == param and words in str(e.value), str(e.value)


def test_tool_choice_none_sends_no_tools():
    assert plan(TOOLS, "none") is None and plan(None) is None
    assert plan(TOOLS).choice == "auto" and plan(TOOLS, "required").forced


# ---- the Python API ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("which", ["hermes", "generic"])
def test_required_calls_parse_and_validate_on_every_drafter(which, request):
    """30 requests with tool_choice required (greedy and sampled, every drafter): every answer is a
    call whose arguments parse and validate against its function's schema."""
    g = request.getfixturevalue(which)
    cities = ["Paris", "Rome", "Oslo", "Nice", "Bern", "Kyiv"]
    for i in range(30):
        drafter, k, tree = DRAFTERS[i % len(DRAFTERS)]
        _use(g, drafter, k, tree)
        temp = 0.0 if i % 3 == 0 else 0.9
        msgs = [{"role": "user", "content": f"weather in {cities[i % 6]} for {i % 7 + 1} days?"}]
        text = "".join(g.stream(msgs, 200, temperature=temp, seed=i, tools=TOOLS, tool_choice="required"))
        assert text == "" and len(g.last_tool_calls) == 1, (drafter, text)
        assert g.last_stats.finish_reason == "tool_calls"
        _validate(g.last_tool_calls[0])


@pytest.mark.parametrize("which", ["hermes", "generic"])
def test_greedy_tool_calls_equal_plain_constrained_decoding(which, request):
    g = request.getfixturevalue(which)
    choice = {"type": "function", "function": {"name": "clock"}}
    ctx = g.chat_tools(USER, plan(TOOLS, choice))
    ids = g.codec.encode(ctx.messages, ctx.template_tools)

    def run():
        g.forget()
        return np.concatenate([c.copy() for c in g.generate_ids(ids, 120, SamplingConfig(), ctx.grammar)]).tolist()

    _use(g, "none", 4, "")
    ref = run()
    for drafter, k, tree in DRAFTERS[1:]:
        _use(g, drafter, k, tree)
        assert run() == ref, drafter
    text = g.codec.decode(ref)
    content, calls = parse_calls(text, ctx.format, ctx.plan.tools)
    assert [c.name for c in calls] == ["clock"], text


def test_tool_messages_go_back_through_the_template(hermes, generic):
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Rome"}'}}
    msgs = USER + [
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21C"},
    ]
    ctx = hermes.chat_tools(msgs, plan(TOOLS))
    text = hermes.codec.render_chat(ctx.messages, ctx.template_tools)
    assert '"name": "get_weather"' in text and '{"name": "get_weather", "arguments": {"city": "Rome"}}' in text
    assert "<tool_response>sunny, 21C</tool_response>" in text and "None" not in text
    ctx = generic.chat_tools(msgs, plan(TOOLS))
    text = generic.codec.render_chat(ctx.messages, ctx.template_tools)
    assert text.startswith("<system>You can call these tools")  # the fallback's description
    assert '{"tool_call": {"name": "get_weather", "arguments": {"city": "Rome"}}}' in text
    assert '<user>{"tool_response": {"name": "get_weather", "content": "sunny, 21C"}}' in text
    with pytest.raises(ToolError, match="answers no call") as e:
        hermes.chat_tools(USER + [{"role": "tool", "tool_call_id": "call_9", "content": "x"}], plan(TOOLS))
    assert e.value.param == "messages[1].tool_call_id"


def test_auto_may_answer_in_text(hermes):
    _use(hermes, "ngram", 4, "")
    text = "".join(hermes.stream(USER, 30, tools=TOOLS))
    assert text and hermes.last_tool_calls == [] and hermes.last_stats.finish_reason == "length"


# ---- logprobs ---------------------------------------------------------------------------------------------
def _logprobs(g, ids, sampling, grammar=None, n=60):
    g.forget()
    out = np.concatenate([c.copy() for c in g.generate_ids(ids, n, sampling, grammar, logprobs=5)]).tolist()
    r = g.token_logprobs
    return out, r.logprobs[: len(out)], r.top_ids[: len(out)], r.top_logprobs[: len(out)]


@pytest.mark.parametrize(
    "sampling",
    [SamplingConfig(), SamplingConfig(repetition_penalty=1.3), SamplingConfig(temperature=0.8, top_p=0.9, seed=3)],
    ids=["greedy", "penalty", "seeded"],
)
def test_logprobs_are_bitwise_equal_for_plain_and_every_drafter(generic, sampling):
    g = generic
    ids = g.codec.encode("hello hello world, hello world again and again; hello")
    _use(g, "none", 4, "")
    ref = _logprobs(g, ids, sampling)
    for drafter, k, tree in DRAFTERS[1:]:
        _use(g, drafter, k, tree)
        got = _logprobs(g, ids, sampling)
        assert got[0] == ref[0], drafter  # same ids
        assert got[1:] == ref[1:], drafter  # same values, bit for bit
    grammar = g.chat_tools(USER, plan(TOOLS, "required")).grammar  # forced tokens and masked rows too
    _use(g, "none", 4, "")
    ref = _logprobs(g, ids, sampling, grammar)
    _use(g, "eagle", 4, "")
    assert _logprobs(g, ids, sampling, grammar) == ref


def test_logprobs_are_the_targets_distribution(generic):
    """Greedy: each token is its row's most likely, its logprob the first alternative's, the
    alternatives in order, the values log_softmax of the target's own rows; sampled with top-k 2:
    the tokens cut have -9999 (OpenAI's floor)."""
    g = generic
    _use(g, "ngram", 4, "")
    ids = g.codec.encode("hello hello world")
    out, lps, top, top_lps = _logprobs(g, ids, SamplingConfig(), n=30)
    for t, lp, ti, tl in zip(out, lps, top, top_lps, strict=True):
        assert ti[0] == t and tl[0] == lp and tl == sorted(tl, reverse=True) and lp < 0
        assert sum(np.exp(tl)) <= 1 + 1e-9
    rows = []  # the target's rows as plain decoding commits them (prompt, then one per token)
    _use(g, "none", 4, "")
    g.tap = lambda past, logits, hidden, aux: rows.extend(np.array(logits, np.float64))
    try:
        out, lps, top, top_lps = _logprobs(g, ids, SamplingConfig(), n=30)
    finally:
        g.tap = None
    for i, t in enumerate(out):  # token i comes from row len(ids) - 1 + i: log_softmax there, in float64
        x = rows[len(ids) - 1 + i]
        want = x - x.max() - np.log(np.exp(x - x.max()).sum())
        assert abs(lps[i] - want[t]) < 1e-6 and np.allclose(top_lps[i], np.sort(want)[::-1][:5], atol=1e-6)
    _use(g, "ngram", 4, "")
    out, lps, top, top_lps = _logprobs(g, ids, SamplingConfig(temperature=1.0, top_k=2, seed=1), n=30)
    assert all(tl[2:] == [-9999.0] * 3 and max(tl) < 0 for tl in top_lps) and all(lp > -9999.0 for lp in lps)


def test_top_alternatives_are_exact_with_ties():
    from edgespec.runtime.logprobs import _starts, _top

    rng = np.random.default_rng(0)
    for vocab in (3, 256, 300, 49152):
        for it in range(20):
            row = rng.standard_normal(vocab).astype(np.float32)
            if it % 3 == 0:  # ties at the top, across blocks
                row[rng.integers(0, vocab, 10)] = row.max()
            if it % 5 == 0:  # a sampled row's cut tokens
                row[rng.integers(0, vocab, vocab // 2)] = -np.inf
            for k in (0, 1, 5, 8):
                want = np.lexsort((np.arange(vocab), -row))[:k]
                assert _top(row, np.maximum.reduceat(row, _starts(vocab)), k).tolist() == want.tolist()


def test_streamed_pieces_carry_their_tokens_logprobs(generic):
    g = generic
    _use(g, "ngram", 4, "")
    pieces = [(p, list(g.last_logprobs)) for p in g.stream("hello hello world", 40, logprobs=2)]
    assert "".join(p for p, _ in pieces) == g.codec.decode([e[0] for _, es in pieces for e in es])
    assert sum(len(es) for _, es in pieces) == g.last_stats.n_output - (g.last_stats.finish_reason == "stop")
    with pytest.raises(ValueError, match="0..8"):
        g.stream("hi", 4, logprobs=9)


# ---- the server, driven by the openai client --------------------------------------------------------------
openai = pytest.importorskip("openai")


@pytest.fixture(scope="module")
def served(hermes_folder):
    pytest.importorskip("uvicorn")
    from helpers.serving import serving

    gen = Generator.load(hermes_folder, RuntimeConfig(drafter="ngram", k=4))
    with serving(gen) as (url, app):
        yield url, gen


@pytest.fixture(scope="module")
def client(served):
    return openai.OpenAI(base_url=served[0] + "/v1", api_key="unused", max_retries=0, timeout=60)


def _answer(name: str, args: dict) -> str:
    """What the test's tools return."""
    if name == "clock":
        return "12:00 UTC" if args["utc"] else "14:00"
    return f"{args['city']}: sunny for {args['days']} days"


@pytest.mark.parametrize("stream", [False, True])
def test_a_tool_loop_with_the_openai_client(client, stream):
    """The model calls a function (tool_choice required), the test answers it, the model finishes
    (tool_choice none): the client's own types all the way."""
    msgs = list(USER)
    kw = dict(model="whatever-the-editor-says", max_tokens=200, temperature=0, tools=TOOLS)
    if stream:
        calls, finish = {}, None
        for chunk in client.chat.completions.create(messages=msgs, tool_choice="required", stream=True, **kw):
            for c in chunk.choices:
                finish = c.finish_reason or finish
                for d in c.delta.tool_calls or ():
                    calls[d.index] = d
        assert finish == "tool_calls" and len(calls) == 1
        call = calls[0]
    else:
        r = client.chat.completions.create(messages=msgs, tool_choice="required", **kw)
        assert r.model == "tiny" and r.choices[0].finish_reason == "tool_calls"
        assert r.choices[0].message.content is None
        call = r.choices[0].message.tool_calls[0]
    assert call.type == "function" and call.id.startswith("call_")
    _validate(call.function)
    msgs += [
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump(exclude={"index"})]},
        {
            "role": "tool",
            "tool_call_id": call.id,
            "content": _answer(call.function.name, json.loads(call.function.arguments)),
        },
    ]
    r = client.chat.completions.create(messages=msgs, tool_choice="none", **kw | {"max_tokens": 10})
    assert r.choices[0].finish_reason == "length" and r.choices[0].message.content
    assert not r.choices[0].message.tool_calls


def test_a_named_function_is_called(client):
    r = client.chat.completions.create(
        model="tiny",
        messages=USER,
        max_tokens=200,
        temperature=0.7,
        tools=TOOLS,
        tool_choice={"type": "function", "function": {"name": "clock"}},
    )
    (call,) = r.choices[0].message.tool_calls
    assert call.function.name == "clock" and isinstance(json.loads(call.function.arguments)["utc"], bool)


def test_chat_logprobs_streamed_and_not(client, served):
    kw = dict(model="tiny", messages=USER, max_tokens=12, temperature=0, logprobs=True, top_logprobs=3)
    r = client.chat.completions.create(**kw)
    content = r.choices[0].logprobs.content
    assert "".join(t.token for t in content) == r.choices[0].message.content and len(content) == 12
    assert all(len(t.top_logprobs) == 3 and t.top_logprobs[0].logprob == t.logprob for t in content)
    assert all(bytes(t.bytes).decode() == t.token for t in content)
    streamed = [
        t
        for c in client.chat.completions.create(stream=True, **kw)
        for ch in c.choices
        if ch.logprobs
        for t in ch.logprobs.content
    ]
    assert [(t.token, t.logprob) for t in streamed] == [(t.token, t.logprob) for t in content]


def test_completions_logprobs_and_n(client):
    r = client.completions.create(model="x", prompt="hello hello", max_tokens=8, temperature=0, logprobs=2)
    lp = r.choices[0].logprobs
    assert "".join(lp.tokens) == r.choices[0].text and len(lp.token_logprobs) == 8
    assert all(len(t) == 2 for t in lp.top_logprobs) and lp.text_offset[0] == 0
    r = client.completions.create(model="x", prompt="hello hello", max_tokens=6, temperature=1.0, seed=5, n=3)
    assert [c.index for c in r.choices] == [0, 1, 2] and r.usage.completion_tokens == 18
    one = client.completions.create(model="x", prompt="hello hello", max_tokens=6, temperature=1.0, seed=6)
    assert one.choices[0].text == r.choices[1].text  # choice i of seed s is seed s + i's


def test_chat_n_streamed(client, served):
    chunks = list(
        client.chat.completions.create(
            model="tiny",
            messages=USER,
            max_tokens=5,
            temperature=0,
            n=2,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    texts, finishes = ["", ""], {}
    for c in chunks:
        for ch in c.choices:
            texts[ch.index] += ch.delta.content or ""
            if ch.finish_reason:
                finishes[ch.index] = ch.finish_reason
    assert texts[0] == texts[1] and texts[0] and finishes == {0: "length", 1: "length"}
    assert chunks[-1].usage.completion_tokens == 10


def test_strict_model_refuses_other_names(hermes):
    from helpers.serving import serving

    httpx = pytest.importorskip("httpx")
    with serving(hermes, strict_model=True) as (url, _):
        body = {"model": "gpt-4o", "prompt": "hi", "max_tokens": 1}
        r = httpx.post(url + "/v1/completions", json=body)
        assert r.status_code == 404 and "--strict-model" in r.json()["error"]["message"]
        r = httpx.post(url + "/v1/completions", json=body | {"model": "tiny"})
        assert r.status_code == 200


SERVER_BAD = [
    (
        {"tools": [WEATHER | {"function": WEATHER["function"] | {"parameters": BAD_SCHEMA}}]},
        "tools[0].function.parameters",
    ),
    ({"tools": [WEATHER, WEATHER]}, "tools[1].function.name"),
    ({"tools": [CLOCK] * 1000}, "tools"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
    ({"messages": USER + [{"role": "tool", "tool_call_id": "call_x", "content": "1"}]}, "messages[1].tool_call_id"),
    (
        {"messages": USER + [{"role": "assistant", "content": None, "tool_calls": [{"id": 5}]}]},
        "messages[1].tool_calls[0]",
    ),
    ({"logprobs": True, "top_logprobs": 9}, "top_logprobs"),
    ({"logprobs": True, "top_logprobs": -1}, "top_logprobs"),
    ({"top_logprobs": 2}, "top_logprobs"),
    ({"n": 0}, "n"),
    ({"n": 1e9}, "n"),
    ({"tools": TOOLS, "tool_choice": "required", "response_format": {"type": "json_object"}}, "response_format"),
]


@pytest.mark.parametrize("body, param", SERVER_BAD, ids=[p + str(i) for i, (_, p) in enumerate(SERVER_BAD)])
def test_bad_input_is_a_400_naming_the_field(served, body, param):
    httpx = pytest.importorskip("httpx")
    r = httpx.post(served[0] + "/v1/chat/completions", json={"messages": USER, "max_tokens": 2} | body)
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
    r = httpx.post(served[0] + "/v1/completions", json={"prompt": "x", "logprobs": 9})
    assert r.status_code == 400 and r.json()["error"]["param"] == "logprobs"
    r = httpx.post(served[0] + "/v1/completions", json={"prompt": "x", "tools": TOOLS})
    assert r.status_code == 400 and r.json()["error"]["param"] == "tools"


def test_the_chat_page_shows_tool_calls_and_sends_results(served, browser):  # noqa: F811
    """In a real browser (skipped without one): tools pasted in, a required call shown as a call, the
    next message sent as its result, and the model answers after it."""
    from helpers.browser import Page, until

    page = Page(browser, served[0], key="")
    until(lambda: page.text("model") == "tiny", "the model name")
    page.d.find_element(page.By.CSS_SELECTOR, "#tools-box summary").click()
    page.fill("tools", json.dumps(TOOLS))
    page.choose("tool-choice", "required")
    page.fill("max-tokens", 200)
    answer = page.ask("weather in Paris?")
    call = answer.find_element(page.By.CSS_SELECTOR, ".call").text
    assert call.startswith(("→ get_weather({", "→ clock({")), call
    assert "tool's result" in page.el("prompt").get_attribute("placeholder")
    page.choose("tool-choice", "none")
    page.fill("max-tokens", 8)
    answer = page.ask("sunny")
    assert "result of" in page.all(".msg.user")[-1].text
    assert answer.find_element(page.By.CSS_SELECTOR, ".text").text and not page.all(".msg .error")


@pytest.mark.slow
def test_a_tool_loop_on_the_default_model(default_engine):
    """SmolLM2-135M-Instruct's template takes no tools (the generic fallback): the openai client
    gets a required call that validates, answers it, and the model goes on in text."""
    from helpers.serving import serving

    tools = [
        WEATHER
        | {
            "function": WEATHER["function"]
            | {
                "parameters": {
                    "type": "object",
                    "properties": {"city": {"type": "string", "maxLength": 40}},
                    "required": ["city"],
                }
            }
        }
    ]
    gen = Generator.load(default_engine, RuntimeConfig())
    with serving(gen) as (url, _):
        c = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=600)
        msgs = [{"role": "user", "content": "What is the weather like in Paris today?"}]
        kw = dict(model="gpt-4o-mini", max_tokens=60, temperature=0, tools=tools)
        r = c.chat.completions.create(messages=msgs, tool_choice="required", **kw)
        (call,) = r.choices[0].message.tool_calls
        assert r.choices[0].finish_reason == "tool_calls" and call.function.name == "get_weather"
        _validate(call.function, tools)
        msgs += [
            {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
            {"role": "tool", "tool_call_id": call.id, "content": '{"sky": "sunny", "celsius": 21}'},
        ]
        r = c.chat.completions.create(messages=msgs, tool_choice="none", **kw)
        assert r.choices[0].message.content and r.choices[0].finish_reason in ("stop", "length")
