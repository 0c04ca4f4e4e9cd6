"""The OpenAI-compatible server, driven by the official `openai` client against a real uvicorn."""

import json
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

openai = pytest.importorskip("openai")
uvicorn = pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")

from edgespec.runtime.config import RuntimeConfig  # noqa: E402
from edgespec.runtime.generator import Generator  # noqa: E402
from edgespec.runtime.server import ServeConfig, create_app  # noqa: E402

PROMPT = "hello hello world, hello world again and again; hello"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(tiny_engine):
    gen = Generator.load(tiny_engine, RuntimeConfig(drafter="ngram", k=4))
    port = _free_port()
    app = create_app(gen, ServeConfig(port=port, queue_size=4, model_name="tiny"))
    srv = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    th = threading.Thread(target=srv.run, daemon=True)
    th.start()
    for _ in range(100):
        if srv.started:
            break
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}", gen, app
    srv.should_exit = True
    th.join(timeout=10)


@pytest.fixture()
def client(server):
    return openai.OpenAI(base_url=server[0] + "/v1", api_key="unused", max_retries=0, timeout=60)


def test_models_and_health(server, client):
    assert [m.id for m in client.models.list().data] == ["tiny"]
    assert httpx.get(server[0] + "/health").json()["status"] == "ok"


def test_chat_completion_matches_the_python_api(server, client):
    _, gen, _ = server
    msgs = [{"role": "user", "content": "hi there"}]
    r = client.chat.completions.create(model="tiny", messages=msgs, max_tokens=20, temperature=0)
    gen.set_drafter("none")
    ref = "".join(gen.stream(msgs, max_new_tokens=20))
    gen.set_drafter("ngram", 4)
    assert r.choices[0].message.content == ref
    assert r.usage.completion_tokens == 20 and r.choices[0].finish_reason == "length"


def test_streaming_chat_and_completion(client):
    chunks = list(client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hey"}],
                                                 max_tokens=16, temperature=0, stream=True))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    full = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hey"}],
                                          max_tokens=16, temperature=0)
    assert text == full.choices[0].message.content
    assert chunks[-1].choices[0].finish_reason == "length"
    stream = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=12, temperature=0, stream=True)
    s_text = "".join(c.choices[0].text for c in stream)
    plain = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=12, temperature=0)
    assert s_text == plain.choices[0].text


def test_speculative_extension_field_and_metrics(server, client):
    before = httpx.get(server[0] + "/metrics").text
    client.completions.create(model="tiny", prompt=PROMPT, max_tokens=30, temperature=0,
                              extra_body={"speculative": {"drafter": "draft", "k": 3}})
    after = httpx.get(server[0] + "/metrics").text

    def val(text, name):
        return float(next(line.split()[1] for line in text.splitlines() if line.startswith(name + " ")))

    for name in ("edgespec:spec_decode_num_draft_tokens_total", "edgespec:spec_decode_num_drafts_total",
                 "edgespec:request_success_total"):
        assert val(after, name) > val(before, name), name
    assert "edgespec:time_to_first_token_seconds_bucket" in after
    assert val(after, "edgespec:spec_decode_mean_acceptance_length") >= 1.0


@pytest.mark.parametrize("body, status, words", [
    (b"{not json", 400, "not valid JSON"),
    (json.dumps({"model": "tiny", "messages": "hi"}).encode(), 400, "messages"),
    (json.dumps({"model": "other", "messages": [{"role": "user", "content": "x"}]}).encode(), 404, "not found"),
    (json.dumps({"model": "tiny", "messages": [{"role": "user", "content": "x" * 400}]}).encode(), 400,
     "context limit is 256"),
    (json.dumps({"messages": [{"role": "user", "content": "x"}], "temperature": "hot"}).encode(), 400,
     "temperature"),
    (json.dumps({"messages": [{"role": "user", "content": "x"}], "n": 2}).encode(), 400, "n=1"),
])
def test_bad_requests_get_clear_errors(server, body, status, words):
    r = httpx.post(server[0] + "/v1/chat/completions", content=body, headers={"content-type": "application/json"})
    assert r.status_code == status and words in r.json()["error"]["message"]


def test_disconnect_mid_stream_stops_the_generation(server, client):
    url, gen, app = server
    with httpx.stream("POST", url + "/v1/completions", json={"prompt": PROMPT, "max_tokens": 200,
                                                             "temperature": 0, "stream": True}) as r:
        for _ in zip(range(3), r.iter_lines(), strict=False):
            pass
    time.sleep(1.0)
    metrics = httpx.get(url + "/metrics").text
    assert "edgespec:request_cancelled_total 1" in metrics or "edgespec:request_cancelled_total 2" in metrics
    # the engine is free again at once: a new request completes normally
    r = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=5, temperature=0)
    assert r.usage.completion_tokens == 5


def test_burst_of_concurrent_requests_all_complete_or_get_503(server):
    url = server[0]

    def one(i):
        c = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=120)
        try:
            r = c.completions.create(model="tiny", prompt=f"{i} {PROMPT}", max_tokens=24, temperature=0)
            return i, "ok", r.choices[0].text
        except openai.APIStatusError as e:
            assert e.status_code == 503 and e.response.headers.get("retry-after") == "1"
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
