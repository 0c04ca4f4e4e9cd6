"""The OpenAI-compatible server, driven by the official `openai` client against a real uvicorn."""

import json
import logging
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

openai = pytest.importorskip("openai")
uvicorn = pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")

from helpers.serving import KEY, PROMPT, serving  # noqa: E402

from edgespec.runtime.apps.server_schema import Speculation  # noqa: E402
from edgespec.runtime.apps.server_worker import first_difference  # noqa: E402
from edgespec.runtime.config import RuntimeConfig  # noqa: E402
from edgespec.runtime.generator import Generator  # noqa: E402


@pytest.fixture(scope="module")
def server(tiny_engine):
    gen = Generator.load(tiny_engine, RuntimeConfig(drafter="ngram", k=4))
    with serving(gen, queue_size=4) as (url, app):
        yield url, gen, app


@pytest.fixture()
def client(server):
    return openai.OpenAI(base_url=server[0] + "/v1", api_key="unused", max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def full_engine(tiny_models, tmp_path_factory):
    """A tiny folder that ships every drafter: a self:1 draft, an EAGLE head, Medusa heads, trees."""
    from tiny import tiny_eagle_head, tiny_medusa_heads

    from edgespec.export.target.exporter import ExportConfig, export

    root = tmp_path_factory.mktemp("full")
    head, _, _ = tiny_eagle_head(tiny_models["llama"], root / "head", draft_vocab=48, noise=0.01)
    heads, _, _ = tiny_medusa_heads(tiny_models["llama"], root / "heads", n_heads=4)
    return export(
        ExportConfig(
            target=str(tiny_models["llama"]),
            draft="self:1",
            eagle=str(head),
            medusa=str(heads),
            out=str(root / "engine"),
            max_len=256,
            k=6,
            prefill_chunk=16,
            kv_bucket=32,
            precision="fp32",
            trees=True,
            progress=False,
            validate=False,
        )
    )


@pytest.fixture(scope="module")
def full_server(full_engine):
    """Every drafter, behind an API key, every greedy speculative request shadow-checked."""
    gen = Generator.load(full_engine, RuntimeConfig(drafter="ngram", k=4))
    with serving(gen, api_key=KEY, shadow_rate=1.0, max_body_bytes=8 << 20) as (url, app):
        yield url, gen, app


def _metric(url: str, name: str) -> float:
    text = httpx.get(url + "/metrics").text
    return float(next(line.split()[1] for line in text.splitlines() if line.startswith(name + " ")))


def test_models_and_health(server, client):
    assert [m.id for m in client.models.list().data] == ["tiny"]
    assert httpx.get(server[0] + "/health").json()["status"] == "ok"


def test_chat_completion_matches_the_python_api(server, client):
    _, gen, _ = server
    msgs = [{"role": "user", "content": "hi there"}]
    r = client.chat.completions.create(model="tiny", messages=msgs, max_tokens=20, temperature=0)
    ref = Generator.load(gen.manifest.folder, RuntimeConfig(drafter="none")).generate(msgs, max_new_tokens=20)
    assert r.choices[0].message.content == ref
    assert r.usage.completion_tokens == 20 and r.choices[0].finish_reason == "length"


def test_content_parts_are_joined_text(client):
    parts = [{"type": "text", "text": "hi"}, {"type": "text", "text": "there"}]
    a = client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": parts}], max_tokens=8, temperature=0
    )
    b = client.chat.completions.create(
        model="tiny",
        messages=[{"role": "developer", "content": "be brief"}, {"role": "user", "content": "hi\nthere"}],
        max_tokens=8,
        temperature=0,
    )
    c = client.chat.completions.create(
        model="tiny",
        messages=[{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi\nthere"}],
        max_tokens=8,
        temperature=0,
    )
    ref = client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "hi\nthere"}], max_tokens=8, temperature=0
    )
    assert a.choices[0].message.content == ref.choices[0].message.content
    assert b.choices[0].message.content == c.choices[0].message.content  # developer is system


def test_streaming_chat_and_completion(client):
    chunks = list(
        client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "hey"}], max_tokens=16, temperature=0, stream=True
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    full = client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "hey"}], max_tokens=16, temperature=0
    )
    assert text == full.choices[0].message.content
    assert chunks[-1].choices[0].finish_reason == "length"
    stream = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=12, temperature=0, stream=True)
    s_text = "".join(c.choices[0].text for c in stream)
    plain = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=12, temperature=0)
    assert s_text == plain.choices[0].text


def test_streaming_usage_comes_last_as_openai_sends_it(client):
    chunks = list(
        client.chat.completions.create(
            model="tiny",
            messages=[{"role": "user", "content": "hey"}],
            max_tokens=10,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 10
    assert chunks[-1].usage.total_tokens == chunks[-1].usage.prompt_tokens + 10
    assert chunks[-2].choices[0].finish_reason == "length" and chunks[-2].usage is None
    assert all(c.usage is None for c in chunks[:-1])
    comp = list(
        client.completions.create(
            model="tiny",
            prompt=PROMPT,
            max_tokens=6,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert comp[-1].choices == [] and comp[-1].usage.completion_tokens == 6


def test_speculative_extension_field_and_metrics(server, client):
    before = httpx.get(server[0] + "/metrics").text
    client.completions.create(
        model="tiny",
        prompt=PROMPT,
        max_tokens=30,
        temperature=0,
        extra_body={"speculative": {"drafter": "draft", "k": 3}},
    )
    after = httpx.get(server[0] + "/metrics").text

    def val(text, name):
        return float(next(line.split()[1] for line in text.splitlines() if line.startswith(name + " ")))

    for name in (
        "edgespec:spec_decode_num_draft_tokens_total",
        "edgespec:spec_decode_num_drafts_total",
        "edgespec:request_success_total",
    ):
        assert val(after, name) > val(before, name), name
    assert "edgespec:time_to_first_token_seconds_bucket" in after
    assert val(after, "edgespec:spec_decode_mean_acceptance_length") >= 1.0
    assert server[1].drafter.name == "ngram" and server[1].k == 4  # the default is back


def _chat(extra: dict | None = None, content="x") -> bytes:
    return json.dumps({"model": "tiny", "messages": [{"role": "user", "content": content}]} | (extra or {})).encode()


def _raw_chat(fragment: str) -> bytes:  # JSON text Python's json.dumps would not write (1e400, NaN)
    return b'{"messages": [{"role": "user", "content": "x"}], ' + fragment.encode() + b"}"


C, P = "/v1/chat/completions", "/v1/completions"
BAD = [  # (path, body, status, param, words in the message)
    (C, b"{not json", 400, None, "not valid JSON"),
    (C, b"\xff\xfe{}", 400, None, "not valid JSON"),
    (C, b"[" * 100_000, 400, None, "not valid JSON"),
    (C, b"[1, 2]", 400, None, "JSON object"),
    (C, json.dumps({"messages": "hi"}).encode(), 400, "messages", "non-empty list"),
    (C, json.dumps({"messages": []}).encode(), 400, "messages", "non-empty list"),
    (C, json.dumps({"messages": ["hi"]}).encode(), 400, "messages[0]", "object"),
    (C, _chat(content=None), 400, "messages[0].content", "null content"),
    (C, _chat(content=[]), 400, "messages[0].content", "non-empty list"),
    (
        C,
        _chat(content=[{"type": "image_url", "image_url": {"url": "http://x"}}]),
        400,
        "messages[0].content[0]",
        "text-only",
    ),
    (C, _chat(content=[{"type": "text", "text": 5}]), 400, "messages[0].content[0]", "text"),
    (C, json.dumps({"messages": [{"role": 5, "content": "x"}]}).encode(), 400, "messages[0].role", "choose one"),
    (C, json.dumps({"messages": [{"role": "wizard", "content": "x"}]}).encode(), 400, "messages[0].role", "wizard"),
    (C, _chat({"messages": [{"role": "tool", "content": "x"}]}), 400, "messages[0].tool_call_id", "no call"),
    (C, json.dumps({"messages": [{"content": "x"}]}).encode(), 400, "messages[0].role", "None"),
    (C, _chat({"model": 7}), 400, "model", "string"),
    (C, _raw_chat('"max_tokens": 1e400'), 400, "max_tokens", "finite"),
    (C, _chat({"max_tokens": 0}), 400, "max_tokens", "[1, inf]"),
    (C, _chat({"max_tokens": -5}), 400, "max_tokens", "got -5"),
    (C, _chat({"max_tokens": 2.5}), 400, "max_tokens", "integer"),
    (C, _chat({"max_tokens": "10"}), 400, "max_tokens", "integer"),
    (C, _chat({"max_tokens": True}), 400, "max_tokens", "integer"),
    (C, _chat({"max_completion_tokens": 0}), 400, "max_completion_tokens", "got 0"),
    (C, _raw_chat('"temperature": NaN'), 400, "temperature", "finite"),
    (C, _raw_chat('"temperature": Infinity'), 400, "temperature", "finite"),
    (C, _chat({"temperature": -1}), 400, "temperature", "[0.0, 2.0]"),
    (C, _chat({"temperature": "hot"}), 400, "temperature", "number"),
    (C, _raw_chat('"top_p": NaN'), 400, "top_p", "finite"),
    (C, _raw_chat('"top_p": -Infinity'), 400, "top_p", "finite"),
    (C, _chat({"top_p": 0}), 400, "top_p", "(0.0, 1.0]"),
    (C, _chat({"top_k": -1}), 400, "top_k", "got -1"),
    (C, _chat({"seed": -1}), 400, "seed", "got -1"),
    (C, _chat({"repetition_penalty": 0}), 400, "repetition_penalty", "got 0"),
    (C, _chat({"n": 0}), 400, "n", "[1, 16]"),
    (C, _chat({"n": 1e9}), 400, "n", "[1, 16]"),
    (C, _chat({"stop": [""]}), 400, "stop", "non-empty"),
    (C, _chat({"stream": "yes"}), 400, "stream", "true or false"),
    (C, _chat({"stream_options": {"include_usage": "yes"}}), 400, "stream_options", "include_usage"),
    (C, _chat({"tools": [{"type": "function"}]}), 400, "tools[0]", "function: {name"),
    (C, _chat({"logprobs": 1}), 400, "logprobs", "true or false"),
    (C, _chat({"logprobs": True, "top_logprobs": 9}), 400, "top_logprobs", "[0, 8]"),
    (C, _chat({"logprobs": True, "top_logprobs": -1}), 400, "top_logprobs", "[0, 8]"),
    (C, _chat({"response_format": {"type": "xml"}}), 400, "response_format", "json_schema"),
    (C, _chat({"response_format": "json"}), 400, "response_format", "json_object"),
    (
        C,
        _chat({"response_format": {"type": "json_schema", "json_schema": "x"}}),
        400,
        "response_format.json_schema",
        "{name, schema, strict}",
    ),
    (
        C,
        _chat({"response_format": {"type": "json_schema", "json_schema": {"schema": {}, "strict": "yes"}}}),
        400,
        "response_format.json_schema.strict",
        "true or false",
    ),
    (C, _chat({"response_format": {"type": "regex", "regex": 5}}), 400, "response_format.regex", "string"),
    (C, _chat({"speculative": {"k": 99}}), 400, "speculative.k", "outside 1..8"),
    (C, _chat({"speculative": {"k": 0}}), 400, "speculative.k", "outside 1..8"),
    (C, _chat({"speculative": {"k": 2.5}}), 400, "speculative.k", "integer"),
    (C, _chat({"speculative": {"drafter": "magic"}}), 400, "speculative.drafter", "choose one of"),
    (C, _chat({"speculative": {"drafter": "eagle"}}), 400, "speculative.drafter", "not available"),
    (C, _chat({"speculative": {"tree": "x:y"}}), 400, "speculative.tree", "NODES"),
    (C, _chat({"speculative": {"tree": "99"}}), 400, "speculative.tree", "2..9"),
    (C, _chat({"speculative": {"tree": 6}}), 400, "speculative.tree", "string"),
    (C, _chat({"speculative": {"drafter": "draft", "tree": "4:3:1:1"}}), 400, "speculative.tree", "cannot draft"),
    (C, _chat({"speculative": {"fast": True}}), 400, "speculative", "optional 'drafter'"),
    (C, _chat({"speculative": "eagle"}), 400, "speculative", "object"),
    (C, _chat(content="x " * 400), 400, "messages", "this server takes prompts up to 255 tokens"),
    (P, json.dumps({"prompt": ""}).encode(), 400, "prompt", "empty"),
    (P, json.dumps({"prompt": 5}).encode(), 400, "prompt", "string"),
    (P, json.dumps({}).encode(), 400, "prompt", "string"),
    (P, json.dumps({"prompt": "x", "max_tokens": 0}).encode(), 400, "max_tokens", "got 0"),
]


@pytest.mark.parametrize("path, body, status, param, words", BAD, ids=[f"{i}" for i in range(len(BAD))])
def test_bad_requests_get_openai_style_errors(server, path, body, status, param, words):
    r = httpx.post(server[0] + path, content=body, headers={"content-type": "application/json"})
    err = r.json()["error"]
    assert r.status_code == status, err
    assert set(err) == {"message", "type", "param", "code"} and err["type"] == "invalid_request_error"
    assert err["param"] == param and words in err["message"], err


def test_the_server_survives_the_table(server, client):
    """After every bad request above the worker is still there and the default drafter unchanged."""
    r = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=5, temperature=0)
    assert r.usage.completion_tokens == 5 and server[1].drafter.name == "ngram"
    assert httpx.get(server[0] + "/admin/speculation").json()["drafter"] == "ngram"


def test_openai_client_raises_bad_request_with_the_field(client):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x"}], max_tokens=0)
    assert e.value.body["param"] == "max_tokens"


def test_disconnect_mid_stream_stops_the_generation(server, client):
    url, gen, app = server
    before = _metric(url, "edgespec:request_cancelled_total")
    with httpx.stream(
        "POST", url + "/v1/completions", json={"prompt": PROMPT, "max_tokens": 200, "temperature": 0, "stream": True}
    ) as r:
        for _ in zip(range(3), r.iter_lines(), strict=False):
            pass
    time.sleep(1.0)
    assert _metric(url, "edgespec:request_cancelled_total") > before
    # the engine is free again at once: a new request completes normally
    r = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=5, temperature=0)
    assert r.usage.completion_tokens == 5


def test_disconnect_cancels_a_non_streaming_request(server, client, monkeypatch):
    url, gen, _ = server
    inner = gen.stream_text

    def slow(*args, **kwargs):  # 20 ms a piece: 200 tokens take 4 s
        pieces = inner(*args, **kwargs)
        try:
            for piece in pieces:
                time.sleep(0.02)
                yield piece
        finally:
            pieces.close()

    monkeypatch.setattr(gen, "stream_text", slow)
    before = _metric(url, "edgespec:request_cancelled_total")
    body = json.dumps({"prompt": PROMPT, "max_tokens": 200, "temperature": 0}).encode()
    port = int(url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.sendall(
            b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
        )
        time.sleep(0.5)  # generating now; then the client goes away
    t0 = time.perf_counter()
    r = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=5, temperature=0)
    waited = time.perf_counter() - t0
    assert r.usage.completion_tokens == 5
    assert waited < 2.0, f"the short request waited {waited:.1f} s behind an abandoned one"
    assert _metric(url, "edgespec:request_cancelled_total") == before + 1


def test_burst_of_concurrent_requests_all_complete_or_get_503(server):
    url = server[0]

    def one(i):
        c = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=120)
        try:
            r = c.completions.create(model="tiny", prompt=f"{i} {PROMPT}", max_tokens=24, temperature=0)
            return i, "ok", r.choices[0].text
        except openai.APIStatusError as e:
            assert e.status_code == 503 and e.response.headers.get("retry-after") == "1"
            assert e.body["code"] == "server_busy"
            return i, "busy", None

    with ThreadPoolExecutor(20) as ex:
        results = list(ex.map(one, range(20)))
    assert len(results) == 20
    ok = [r for r in results if r[1] == "ok"]
    assert len(ok) >= 5 and all(r[1] in ("ok", "busy") for r in results)
    # none mixed up: each answer is what that prompt gives alone
    c = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=60)
    for i, _, text in ok[:4]:
        alone = c.completions.create(model="tiny", prompt=f"{i} {PROMPT}", max_tokens=24, temperature=0)
        assert alone.choices[0].text == text


# ---- every drafter, the API key, size caps, the quality watch (full_server) ----------------------------------
def test_api_key_guards_v1_and_admin_but_not_health(full_server):
    url = full_server[0]
    assert httpx.get(url + "/health").status_code == 200
    assert httpx.get(url + "/metrics").status_code == 200
    for method, path in (
        ("GET", "/v1/models"),
        ("POST", "/v1/completions"),
        ("GET", "/admin/speculation"),
        ("POST", "/admin/speculation"),
    ):
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY}):
            r = httpx.request(method, url + path, headers=headers, json={"prompt": "x"})
            assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key", (path, headers)
            assert r.headers["www-authenticate"] == "Bearer"
    wrong = openai.OpenAI(base_url=url + "/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        wrong.models.list()
    right = openai.OpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0, timeout=60)
    assert [m.id for m in right.models.list().data] == ["tiny"]


@pytest.fixture()
def keyed(full_server):
    return openai.OpenAI(base_url=full_server[0] + "/v1", api_key=KEY, max_retries=0, timeout=120)


def _idle(url: str, app, timeout: float = 60) -> None:
    """Wait until no shadow check is waiting or running (the count stays put and none is queued)."""
    deadline, last = time.time() + timeout, None
    while time.time() < deadline:
        now = _metric(url, "edgespec:shadow_checks_total")
        if not app.state.worker.shadows and now == last:
            return
        last = now
        time.sleep(0.3)
    raise AssertionError(f"shadow checks still pending after {timeout} s")


def _used(client, **extra) -> tuple:
    """(drafter, k, tree) a short greedy request was decoded with."""
    r = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=2, temperature=0, **extra)
    st = r.model_extra["edgespec_stats"]
    return st["drafter"], st["k"], st["tree"]


SPECS = [
    {"drafter": "none"},
    {"drafter": "ngram", "k": 3},
    {"drafter": "suffix", "k": 3},
    {"drafter": "draft", "k": 2},
    {"drafter": "eagle", "k": 4},
    {"drafter": "hybrid", "k": 4},
    {"drafter": "medusa", "k": 3},
    {"drafter": "eagle", "tree": "6:5:1:1"},
    {"drafter": "medusa", "tree": "6:3:2:2"},
    {"drafter": "ngram", "tree": "5:4:2:1"},
    {"drafter": "hybrid", "k": 6, "tree": "7:4:2:2"},
]


def test_every_drafter_the_folder_ships_per_request(full_server, keyed):
    url, gen, app = full_server
    _idle(url, app)
    checks0 = _metric(url, "edgespec:shadow_checks_total")
    texts = {}
    for spec in SPECS:
        r = keyed.completions.create(
            model="tiny", prompt=PROMPT, max_tokens=24, temperature=0, extra_body={"speculative": spec}
        )
        st = r.model_extra["edgespec_stats"]
        assert st["drafter"] == spec["drafter"] and st["tree"] == spec.get("tree", ""), (spec, st)
        texts[json.dumps(spec)] = r.choices[0].text
    assert len(set(texts.values())) == 1, texts  # greedy output is the same whatever the drafter
    assert _used(keyed) == ("ngram", 4, "")  # the default is back
    # the quality watch re-ran every greedy speculative request plainly (all but drafter none's,
    # the last one included) and agreed
    _idle(url, app)
    assert _metric(url, "edgespec:shadow_checks_total") == checks0 + len(SPECS)
    assert _metric(url, "edgespec:shadow_mismatches_total") == 0


def test_admin_sets_the_default_drafter_without_a_restart(full_server, keyed):
    url, gen, _ = full_server
    h = {"Authorization": f"Bearer {KEY}"}
    assert httpx.get(url + "/admin/speculation", headers=h).json()["drafter"] == "ngram"
    r = httpx.post(url + "/admin/speculation", headers=h, json={"drafter": "eagle", "k": 3, "tree": "6:5:1:1"})
    assert r.status_code == 200 and r.json()["drafter"] == "eagle" and r.json()["tree"] == "6:5:1:1"
    try:
        st = keyed.completions.create(model="tiny", prompt=PROMPT, max_tokens=8, temperature=0).model_extra
        assert st["edgespec_stats"]["drafter"] == "eagle" and st["edgespec_stats"]["tree"] == "6:5:1:1"
        # a request's own choice still wins, and a tree-less drafter drops the default's tree
        st = keyed.completions.create(
            model="tiny", prompt=PROMPT, max_tokens=8, temperature=0, extra_body={"speculative": {"drafter": "draft"}}
        ).model_extra
        assert st["edgespec_stats"]["drafter"] == "draft" and st["edgespec_stats"]["k"] == 3
        bad = httpx.post(url + "/admin/speculation", headers=h, json={"drafter": "medusa", "k": 40})
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "speculation.k"
        off = httpx.post(url + "/admin/speculation", headers=h, json={"drafter": "none"}).json()
        assert off["drafter"] == "none" and off["tree"] is None
        st = keyed.completions.create(model="tiny", prompt=PROMPT, max_tokens=8, temperature=0).model_extra
        assert st["edgespec_stats"]["drafter"] == "none"
    finally:
        httpx.post(url + "/admin/speculation", headers=h, json={"drafter": "ngram", "k": 4, "tree": None})
    assert _used(keyed) == ("ngram", 4, "")  # the default is back


def test_shadow_mismatch_is_counted_and_logged(full_server, keyed, monkeypatch, caplog):
    url, _, app = full_server
    worker = app.state.worker
    real = worker.plain_ids

    def tampered(check):  # only this test's request (medusa, k=2): checks of earlier tests may still run
        ids = real(check)
        if ids is not None and check.speculation == Speculation("medusa", 2):
            ids = ids.copy()
            ids[3] += 1  # as if plain decoding had picked another token at output position 3
        return ids

    monkeypatch.setattr(worker, "plain_ids", tampered)
    before = _metric(url, "edgespec:shadow_mismatches_total")
    with caplog.at_level(logging.WARNING, logger="edgespec.serve"):
        r = keyed.completions.create(
            model="tiny",
            prompt=PROMPT,
            max_tokens=12,
            temperature=0,
            extra_body={"speculative": {"drafter": "medusa", "k": 2}},
        )
        deadline = time.time() + 30
        while _metric(url, "edgespec:shadow_mismatches_total") == before and time.time() < deadline:
            time.sleep(0.1)
    assert _metric(url, "edgespec:shadow_mismatches_total") == before + 1
    assert any(r.id in m and "output token 3" in m for m in caplog.messages), caplog.messages
    # sampled requests are never shadowed (their output is random)
    _idle(url, app)
    checks = _metric(url, "edgespec:shadow_checks_total")
    keyed.completions.create(model="tiny", prompt=PROMPT, max_tokens=6, temperature=0.8, seed=1)
    _idle(url, app)
    assert _metric(url, "edgespec:shadow_checks_total") == checks


def test_first_difference():
    a = np.array([1, 2, 3, 4])
    assert first_difference(a, a.copy()) is None
    assert first_difference(a, np.array([1, 2, 9, 4])) == 2
    assert first_difference(a, a[:3]) == 3


def test_big_bodies_are_refused_before_tokenizing_and_health_stays_up(full_server):
    url = full_server[0]
    h = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
    big = _chat(content="word " * 1_000_000)  # 5 MB: under this server's 8 MiB cap, far over its context
    result = {}

    def post():
        t0 = time.perf_counter()
        result["r"] = httpx.post(url + "/v1/chat/completions", content=big, headers=h, timeout=60)
        result["s"] = time.perf_counter() - t0

    th = threading.Thread(target=post)
    th.start()
    worst = 0.0
    while th.is_alive():
        t0 = time.perf_counter()
        assert httpx.get(url + "/health").status_code == 200
        worst = max(worst, time.perf_counter() - t0)
    th.join()
    r = result["r"]
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
    assert "5000000 bytes" in r.json()["error"]["message"]
    assert worst < 1.0, f"/health took {worst:.2f} s while a big prompt was refused"
    over = httpx.post(url + "/v1/chat/completions", content=b" " * (9 << 20), headers=h, timeout=60)
    assert over.status_code == 413 and over.json()["error"]["code"] == "request_too_large"
    chunked = httpx.post(url + "/v1/chat/completions", content=iter([b" " * (1 << 20)] * 9), headers=h, timeout=60)
    assert chunked.status_code == 413 and "over 8388608 bytes" in chunked.json()["error"]["message"]


def test_serve_flags_are_checked_before_loading(tiny_engine):
    res = subprocess.run(
        [sys.executable, "-m", "edgespec.cli", "serve", "--engine", str(tiny_engine), "--shadow-rate", "1.5"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 2 and "--shadow-rate 1.5" in res.stderr and "Traceback" not in res.stderr


def test_load_test_tool(server, tmp_path):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
    import load_test

    assert load_test.main(["--url", "http://example.com:8000"]) == 2  # loopback only
    assert load_test.main(["--url", server[0], "--clients", "999"]) == 2  # bounded
    assert load_test.percentile([3.0, 1.0, 2.0, 4.0], 0.5) == 2.0
    out = tmp_path / "load.json"
    for stream in ([], ["--stream"]):
        rc = load_test.main(
            ["--url", server[0], "--clients", "3", "--seconds", "1.5", "--max-tokens", "8", "--json", str(out)] + stream
        )
        s = json.loads(out.read_text())
        assert rc == 0 and s["ok_200"] >= 3 and s["incomplete_200"] == 0 and s["connection_errors"] == 0, s
        assert s["ok_200"] + s["busy_503"] == s["requests"] and s["latency_p99_s"] >= s["latency_p50_s"]
    assert s["ttft_p50_s"] is not None


# ---- response_format: structured output ---------------------------------------------------------
# no strings: the tiny model's tokenizer decodes with a space between tokens, so the text is checked
# with its spaces taken out
DIGIT = {"type": "integer", "minimum": 0, "maximum": 9}
SCHEMA = {
    "type": "object",
    "properties": {
        "n": {"type": "integer", "minimum": 0, "maximum": 999},
        "ok": {"type": "boolean"},
        "tag": {"enum": ["x", "yy"]},
        "list": {"type": "array", "items": DIGIT, "maxItems": 3},
    },
    "required": ["n", "ok", "tag", "list"],
    "additionalProperties": False,
}


def _schema_format(strict: bool = True, schema: dict = SCHEMA) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "record", "schema": schema, "strict": strict}}


def _check(text: str) -> dict:
    value = json.loads(text.replace(" ", ""))
    assert set(value) == {"n", "ok", "tag", "list"} and 0 <= value["n"] <= 999 and value["tag"] in ("x", "yy")
    assert isinstance(value["ok"], bool) and len(value["list"]) <= 3
    return value


def test_response_format_json_schema_with_the_openai_client(server, client):
    """The official client's response_format: the output parses and validates, equals the Python
    API's constrained plain decoding, and streams the same text."""
    pytest.importorskip("llguidance")
    msgs = [{"role": "user", "content": "give me a record"}]
    r = client.chat.completions.create(
        model="tiny", messages=msgs, max_tokens=150, temperature=0, response_format=_schema_format()
    )
    text = r.choices[0].message.content
    assert r.choices[0].finish_reason == "stop", text
    _check(text)
    ref = Generator.load(server[1].manifest.folder, RuntimeConfig(drafter="none"))
    assert text == ref.generate(msgs, max_new_tokens=150, json_schema=SCHEMA)
    assert ref.last_stats.n_forced > 0
    chunks = client.chat.completions.create(
        model="tiny",
        messages=msgs,
        max_tokens=150,
        temperature=0,
        response_format=_schema_format(strict=False),
        stream=True,
    )
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == text
    sampled = client.chat.completions.create(
        model="tiny", messages=msgs, max_tokens=150, temperature=1.0, seed=3, response_format=_schema_format()
    )
    if sampled.choices[0].finish_reason == "stop":
        _check(sampled.choices[0].message.content)


def test_response_format_json_object_and_grammar_extensions(server, client):
    pytest.importorskip("llguidance")
    r = client.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "an object"}],
        max_tokens=40,
        temperature=0,
        response_format={"type": "json_object"},
    )
    assert r.choices[0].message.content.startswith("{")
    body = {
        "prompt": PROMPT,
        "max_tokens": 20,
        "temperature": 0,
        "response_format": {"type": "regex", "regex": "[0-9]{2,5}"},
    }
    out = httpx.post(server[0] + "/v1/completions", json=body, timeout=60).json()
    assert out["choices"][0]["text"].replace(" ", "").isdigit() and out["edgespec_stats"]["grammar"] == "regex"


def test_a_bad_schema_is_a_400_with_the_library_reason(client):
    pytest.importorskip("llguidance")
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(
            model="tiny",
            messages=[{"role": "user", "content": "x"}],
            max_tokens=5,
            response_format=_schema_format(schema={"type": "object", "if": {}}),
        )
    assert e.value.body["param"] == "response_format" and "Unimplemented keys" in e.value.body["message"]
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(
            model="tiny",
            messages=[{"role": "user", "content": "x"}],
            max_tokens=5,
            response_format=_schema_format(schema={"type": "wat"}),
        )
    assert "Invalid type: wat" in e.value.body["message"]
    ok = client.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "x"}],
        max_tokens=5,
        response_format=_schema_format(False, {"type": "object", "if": {}}),
    )
    assert ok.choices[0].message.content.startswith("{")  # not strict: the keyword is ignored


def test_structured_requests_are_speculative_and_shadow_checked(full_server, keyed):
    """Every drafter of the folder under response_format: greedy output identical across them and
    to the plain re-run of the shadow check (which follows the grammar too)."""
    pytest.importorskip("llguidance")
    url, _, app = full_server
    _idle(url, app)
    checks0 = _metric(url, "edgespec:shadow_checks_total")
    mismatches0 = _metric(url, "edgespec:shadow_mismatches_total")  # an earlier test forces one
    msgs = [{"role": "user", "content": '{"n": 12, "ok": true, "tag": "x", "list": [1, 2]} again:'}]
    texts = set()
    drafters = ("draft", "eagle", "medusa", "hybrid", "suffix")
    for drafter in drafters:
        r = keyed.chat.completions.create(
            model="tiny",
            messages=msgs,
            max_tokens=150,
            temperature=0,
            response_format=_schema_format(),
            extra_body={"speculative": {"drafter": drafter, "k": 3}},
        )
        assert r.model_extra["edgespec_stats"]["forced_tokens"] > 0
        texts.add(r.choices[0].message.content)
    assert len(texts) == 1, texts
    _check(texts.pop())
    _idle(url, app)
    assert _metric(url, "edgespec:shadow_checks_total") == checks0 + len(drafters)
    assert _metric(url, "edgespec:shadow_mismatches_total") == mismatches0
