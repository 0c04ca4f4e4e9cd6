"""The server's input hardening (issue 41, part A), each test playing a probe that once got a wrong
answer: a web page driving the local server (text/plain POSTs, a foreign Origin, DNS rebinding),
the chat page framed by another site, huge integers, lone UTF-16 surrogates, a bad admin k that
stuck, the drafter alias the CLI takes, and request fields that were silently ignored."""

import contextlib
import http.server
import json
import re
import subprocess
import sys
import threading
from pathlib import Path

import pytest

openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")

from helpers.serving import KEY, PROMPT, serving  # noqa: E402

from edgespec.runtime.apps.server_config import ServeConfig, host_name, origin_host  # noqa: E402
from edgespec.runtime.apps.server_schema import Abilities, BadRequest, Speculation, parse_speculation  # noqa: E402
from edgespec.runtime.config import RuntimeConfig  # noqa: E402
from edgespec.runtime.generator import Generator  # noqa: E402

EVIL = "http://evil.example"
JSON = {"Content-Type": "application/json"}
HUGE = "1" + "0" * 400  # a JSON integer past every float: float() of it overflows


def _gen(engine):
    return Generator.load(engine, RuntimeConfig(drafter="ngram", k=4))


@pytest.fixture(scope="module")
def server(tiny_engine):
    """The default: no api key, bound to loopback."""
    with serving(_gen(tiny_engine), queue_size=4) as (url, app):
        yield url, app


@pytest.fixture(scope="module")
def keyed(tiny_engine):
    """Behind an api key, and one origin allowed (a page of the user's own on another name)."""
    with serving(_gen(tiny_engine), api_key=KEY, allow_origin=("http://app.example:3000",)) as (url, app):
        yield url, app


def _port(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


def _drafter(url: str, **headers) -> dict:
    return httpx.get(url + "/admin/speculation", headers=headers).json()


def _err(r, status: int, code: str | None = None, param: str | None = None) -> dict:
    err = r.json()["error"]
    assert r.status_code == status, (r.status_code, err)
    assert set(err) == {"message", "type", "param", "code"} and err["type"] == "invalid_request_error", err
    if code is not None:
        assert err["code"] == code, err
    assert err["param"] == param, err
    return err


# ---- cross-site -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("which", ["server", "keyed"])
def test_a_foreign_page_cannot_change_the_default_drafter(which, request):
    """The probe: a page's text/plain POST (no CORS preflight) set the server-wide drafter."""
    url, _ = request.getfixturevalue(which)
    auth = {"Authorization": f"Bearer {KEY}"} if which == "keyed" else {}
    before = _drafter(url, **auth)
    body = json.dumps({"drafter": "none"})
    attacks = [
        ({"Content-Type": "text/plain", "Origin": EVIL}, 403, "forbidden_origin"),
        ({"Content-Type": "text/plain;charset=UTF-8"}, 415, "unsupported_media_type"),
        ({"Content-Type": "application/x-www-form-urlencoded"}, 415, "unsupported_media_type"),
        ({"Content-Type": "multipart/form-data; boundary=x"}, 415, "unsupported_media_type"),
        ({}, 415, "unsupported_media_type"),  # no Content-Type at all
        (JSON | {"Origin": EVIL}, 403, "forbidden_origin"),  # JSON from a page: refused by its Origin
        (JSON | {"Origin": "null"}, 403, "forbidden_origin"),  # a sandboxed frame or a file:// page
        (JSON | {"Origin": "http://127.0.0.1.evil.example"}, 403, "forbidden_origin"),
        (JSON | {"Host": "attacker.example"}, 403, "forbidden_host"),  # DNS rebinding
    ]
    for headers, status, code in attacks:
        h = dict(headers) | auth  # the api key does not make a page's request acceptable
        r = httpx.post(url + "/admin/speculation", content=body, headers=h)
        _err(r, status, code)
        r = httpx.post(url + "/v1/completions", content=json.dumps({"prompt": "x", "max_tokens": 1}), headers=h)
        _err(r, status, code)
    assert _drafter(url, **auth) == before and before["drafter"] == "ngram"


def test_a_rebinding_host_is_refused_on_every_route(server):
    url, _ = server
    for path in ("/", "/health", "/metrics", "/v1/models", "/admin/speculation", "/nowhere"):
        for host in ("attacker.example", f"attacker.example:{_port(url)}", "127.0.0.1.nip.io", "[::2]:80", ":80"):
            _err(httpx.get(url + path, headers={"Host": host}), 403, "forbidden_host")
    for host in ("localhost", f"LOCALHOST:{_port(url)}", "127.0.0.1", f"[::1]:{_port(url)}", "[::1]"):
        assert httpx.get(url + "/health", headers={"Host": host}).status_code == 200, host


def test_same_origin_pages_and_clients_without_origin_work(server):
    url, _ = server
    body = {"prompt": PROMPT, "max_tokens": 2, "temperature": 0}
    for origin in (url, f"http://localhost:{_port(url)}", f"http://[::1]:{_port(url)}", "https://localhost"):
        r = httpx.post(url + "/v1/completions", json=body, headers={"Origin": origin})
        assert r.status_code == 200, (origin, r.text)
    r = httpx.post(url + "/v1/completions", json=body, headers={"Content-Type": "application/json; charset=utf-8"})
    assert r.status_code == 200, r.text
    page = httpx.get(url + "/", headers={"Origin": url})  # the page itself, fetched same-origin
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    c = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=60)
    assert c.completions.create(model="tiny", prompt=PROMPT, max_tokens=2, temperature=0).usage.completion_tokens == 2


def test_allow_origin_lets_that_page_in_with_cors(keyed):
    url, _ = keyed
    app = "http://app.example:3000"
    h = JSON | {"Authorization": f"Bearer {KEY}", "Origin": app}
    r = httpx.post(url + "/v1/completions", json={"prompt": PROMPT, "max_tokens": 2}, headers=h)
    assert r.status_code == 200 and r.headers["access-control-allow-origin"] == app, r.text
    # the browser's preflight for a JSON POST with a key
    pre = httpx.options(
        url + "/v1/chat/completions",
        headers={
            "Origin": app,
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization, content-type",
        },
    )
    assert pre.status_code == 200 and pre.headers["access-control-allow-origin"] == app
    assert httpx.get(url + "/health", headers={"Host": "app.example:8000"}).status_code == 200  # its host too
    other = h | {"Origin": "http://app.example:4000"}  # an allowed origin is exact: another port is another site
    _err(httpx.post(url + "/v1/completions", json={"prompt": "x"}, headers=other), 403, "forbidden_origin")
    _err(httpx.options(url + "/v1/chat/completions", headers={"Origin": EVIL}), 403, "forbidden_origin")
    _err(httpx.get(url + "/health", headers={"Host": "evil.example"}), 403, "forbidden_host")


def test_bound_to_every_interface_any_host_but_still_no_foreign_origin(tiny_engine):
    with serving(_gen(tiny_engine), host="0.0.0.0") as (url, _):
        assert httpx.get(url + "/health", headers={"Host": "mybox.lan:8000"}).status_code == 200
        body = {"prompt": PROMPT, "max_tokens": 1}
        _err(httpx.post(url + "/v1/completions", json=body, headers={"Origin": EVIL}), 403, "forbidden_origin")
        r = httpx.post(url + "/v1/completions", json=body, headers={"Origin": "http://mybox.lan:8000"})
        err = _err(r, 403, "forbidden_origin")
        assert "--allow-origin http://mybox.lan:8000" in err["message"]  # the hint says how to allow it
        assert httpx.post(url + "/v1/completions", json=body).status_code == 200


def test_allow_origin_is_checked_before_loading():
    for bad in ("evil.example", "ftp://x", "http://x/path", "HTTP://X", "null", "http://"):
        with pytest.raises(ValueError, match="--allow-origin"):
            ServeConfig(allow_origin=(bad,)).check()
    ServeConfig(allow_origin=("http://app.example:3000", "https://[::1]")).check()


def test_header_parsing():
    assert host_name("LocalHost:8000") == "localhost" and host_name("[::1]:80") == "::1" and host_name("[::1]") == "::1"
    assert host_name("a:b") is None and host_name("[::1]x") is None and host_name(":80") is None
    assert origin_host("http://127.0.0.1:8000") == "127.0.0.1" and origin_host("https://[::1]") == "::1"
    assert origin_host("null") is None and origin_host("file://") is None and origin_host("http://a/b") is None
    assert origin_host("http://user@a") is None


def test_the_chat_page_cannot_be_framed_and_still_posts_json(server):
    url, _ = server
    r = httpx.get(url + "/")
    csp = r.headers["content-security-policy"]
    assert "frame-ancestors 'none'" in csp and r.headers["x-frame-options"] == "DENY"
    for directive in ("default-src 'none'", "connect-src 'self'", "base-uri 'none'", "form-action 'none'"):
        assert directive in csp
    html = (Path(__file__).resolve().parents[1] / "runtime" / "apps" / "chat.html").read_text()
    posts = re.findall(r"fetch\([^)]*method:\s*\"POST\"[^)]*\)", html, re.S)
    assert posts and all("headers: headers()" in p for p in posts), posts
    assert re.search(r'function headers\(\) \{\s*const h = \{ "Content-Type": "application/json" \}', html)


# ---- numbers, surrogates, admin k, aliases ----------------------------------------------------------------
def _raw(fragment: str, chat: bool = True) -> bytes:
    head = '{"messages": [{"role": "user", "content": "x"}]' if chat else '{"prompt": "x"'
    return (head + ", " + fragment + "}").encode()


NUMBERS = [  # (body fragment, param): each was an OverflowError and a 500
    (f'"seed": {HUGE}', "seed"),
    (f'"seed": -{HUGE}', "seed"),
    (f'"max_tokens": {HUGE}', "max_tokens"),
    (f'"max_completion_tokens": {HUGE}', "max_completion_tokens"),
    (f'"top_k": {HUGE}', "top_k"),
    (f'"temperature": {HUGE}', "temperature"),
    (f'"temperature": -{HUGE}', "temperature"),
    (f'"top_p": {HUGE}', "top_p"),
    (f'"repetition_penalty": {HUGE}', "repetition_penalty"),
    (f'"n": {HUGE}', "n"),
    (f'"n": -{HUGE}', "n"),
    (f'"speculative": {{"k": {HUGE}}}', "speculative.k"),
    (f'"speculative": {{"drafter": "none", "k": -{HUGE}}}', "speculative.k"),
    ('"seed": 18446744073709551616', "seed"),  # 2**64: past a 64-bit seed
    ('"max_tokens": 1e300', "max_tokens"),  # an integer valued float past int64
    (f'"speculative": {{"tree": "{HUGE}:4"}}', "speculative.tree"),
]


@pytest.mark.parametrize("fragment, param", NUMBERS, ids=[p for _, p in NUMBERS])
def test_huge_numbers_are_a_400_naming_the_field(server, fragment, param):
    err = _err(httpx.post(server[0] + "/v1/chat/completions", content=_raw(fragment), headers=JSON), 400, None, param)
    assert len(err["message"]) < 400, err["message"]  # the number by its size, not its 401 digits


@pytest.mark.parametrize(
    "tree, words",
    [
        (f"{HUGE}:4", "at most 64"),
        ("6:5:1:0", "must be >= 1"),
        ("6:5:1:1:nan", "min_score=nan"),
        ("6:5:1:1:1e400", "min_score=inf"),
        ("6:5:1:1:-1", "min_score=-1"),
    ],
)
def test_tree_fields_are_bounded(tree, words):
    ab = Abilities(("none", "ngram", "eagle"), ("eagle",), k_max=8, context=256)
    default = Speculation("ngram", 4)
    with pytest.raises(BadRequest) as e:
        parse_speculation({"drafter": "eagle", "tree": tree}, default, ab)
    assert e.value.param == "speculative.tree" and words in str(e.value) and len(str(e.value)) < 300, str(e.value)
    ok = parse_speculation({"drafter": "eagle", "tree": "6:5:5:5:0.5"}, default, ab)
    assert ok.tree.label == "6:5:5:5:0.5"
    # a branch past the vocabulary failed mid-answer (the head's top-b); past nodes-1 it is the same tree
    assert parse_speculation({"drafter": "eagle", "tree": "6:99:99999:99"}, default, ab).tree.label == "6:99:5:99"
    assert parse_speculation({"drafter": "eagle", "tree": "3"}, default, ab).tree.label == "3:4:2:2"


def test_huge_admin_k_is_a_400(server):
    url, _ = server
    for k in (HUGE, f"-{HUGE}", "1e300"):
        r = httpx.post(url + "/admin/speculation", content=f'{{"k": {k}}}', headers=JSON)
        _err(r, 400, None, "speculation.k")
    assert _drafter(url)["k"] == 4


SURROGATES = [  # (body, param): valid JSON holding "\ud800", each was a 500
    (b'{"prompt": "hi \\ud800"}', "prompt"),
    (b'{"prompt": ["hi \\uDFFF"]}', "prompt[0]"),
    (_raw('"stop": ["ok", "a\\udc00"]'), "stop[1]"),
    (_raw('"stop": "a\\udc00"'), "stop"),
    (b'{"messages": [{"role": "user", "content": "hi \\ud800"}]}', "messages[0].content"),
    (
        b'{"messages": [{"role": "user", "content": [{"type": "text", "text": "\\ud83d"}]}]}',
        "messages[0].content[0].text",
    ),
    (_raw('"response_format": {"type": "regex", "regex": "a\\ud800"}'), "response_format.regex"),
    (_raw('"response_format": {"type": "grammar", "grammar": "start: \\"\\ud800\\""}'), "response_format.grammar"),
    (
        _raw('"response_format": {"type": "json_schema", "json_schema": {"schema": {"pattern": "\\ud800"}}}'),
        "response_format.json_schema.schema.pattern",
    ),
    (_raw('"user": {"\\ud800": 1}'), "user"),
]


@pytest.mark.parametrize("body, param", SURROGATES, ids=[p for _, p in SURROGATES])
def test_a_lone_surrogate_is_a_400_naming_where(server, body, param):
    path = "/v1/chat/completions" if b'"messages"' in body else "/v1/completions"
    err = _err(httpx.post(server[0] + path, content=body, headers=JSON), 400, None, param)
    assert "surrogate" in err["message"]


def test_surrogate_pairs_and_escaped_backslashes_are_text(server):
    url, _ = server
    for prompt in (b'"smile \\ud83d\\ude00"', b'"a \\\\ud800 written out"'):
        body = b'{"prompt": ' + prompt + b', "max_tokens": 1, "temperature": 0}'
        r = httpx.post(url + "/v1/completions", content=body, headers=JSON)
        assert r.status_code == 200, r.text
    r = httpx.post(url + "/admin/speculation", content=b'{"drafter": "\\ud800"}', headers=JSON)
    _err(r, 400, None, "drafter")
    utf16 = '{"prompt": "x \\ud800"}'.encode("utf-16-le")  # json.loads takes UTF-16 too; the escape is spread out
    _err(httpx.post(url + "/v1/completions", content=utf16, headers=JSON), 400, None, "prompt")


def test_admin_k_is_checked_with_drafter_none_and_never_sticks(server):
    url, app = server
    for k in (-5, 0, 9, 2.5, "3"):
        r = httpx.post(url + "/admin/speculation", json={"drafter": "none", "k": k})
        _err(r, 400, None, "speculation.k")
    assert _drafter(url)["drafter"] == "ngram" and _drafter(url)["k"] == 4
    # every later change that leaves k out still works (the probe: each was refused until a valid k came)
    try:
        assert httpx.post(url + "/admin/speculation", json={"drafter": "none"}).json()["drafter"] == "none"
        assert httpx.post(url + "/admin/speculation", json={"drafter": "ngram"}).json()["k"] == 4
        assert httpx.post(url + "/admin/speculation", json={"drafter": "none", "k": 3}).json()["k"] == 3
    finally:
        httpx.post(url + "/admin/speculation", json={"drafter": "ngram", "k": 4})
    assert _drafter(url)["drafter"] == "ngram" and _drafter(url)["k"] == 4


def test_the_cli_alias_prompt_lookup_is_taken(server):
    url, app = server
    body = {"prompt": PROMPT, "max_tokens": 4, "temperature": 0, "speculative": {"drafter": "prompt_lookup", "k": 2}}
    r = httpx.post(url + "/v1/completions", json=body)
    assert r.status_code == 200 and r.json()["edgespec_stats"]["drafter"] == "ngram", r.text
    try:
        r = httpx.post(url + "/admin/speculation", json={"drafter": "none"})
        r = httpx.post(url + "/admin/speculation", json={"drafter": "prompt_lookup"})
        assert r.status_code == 200 and r.json()["drafter"] == "ngram", r.text
    finally:
        httpx.post(url + "/admin/speculation", json={"drafter": "ngram", "k": 4})
    err = _err(httpx.post(url + "/admin/speculation", json={"drafter": "lookup"}), 400, None, "speculation.drafter")
    assert "choose one of" in err["message"]


# ---- fields this server does not implement ------------------------------------------------------------------
REFUSED = [  # (field, a value that asks for something)
    ("logit_bias", {"50256": -100}),
    ("presence_penalty", 0.5),
    ("frequency_penalty", -1),
    ("functions", [{"name": "f"}]),
    ("function_call", "auto"),
    ("echo", True),
    ("best_of", 3),
    ("suffix", "\n}"),
    ("min_p", 0.1),
    ("ignore_eos", True),
    ("guided_json", {"type": "object"}),
]


@pytest.mark.parametrize("field, value", REFUSED, ids=[f for f, _ in REFUSED])
def test_unimplemented_fields_are_refused_not_ignored(server, field, value):
    chat = {"messages": [{"role": "user", "content": "x"}]}
    for path, body in (("/v1/completions", {"prompt": "x"}), ("/v1/chat/completions", chat)):
        r = httpx.post(server[0] + path, json=body | {field: value}, headers=JSON)
        err = _err(r, 400, None, field)
        assert "not supported" in err["message"], err


def test_their_no_op_values_are_taken(server):
    """What an SDK may send on its own: zeros, empty maps, false, best_of 1, null."""
    c = openai.OpenAI(base_url=server[0] + "/v1", api_key="unused", max_retries=0, timeout=60)
    r = c.completions.create(
        model="tiny",
        prompt=PROMPT,
        max_tokens=2,
        temperature=0,
        echo=False,
        best_of=1,
        presence_penalty=0,
        frequency_penalty=0,
        logit_bias={},
        logprobs=None,
        extra_body={"suffix": None, "min_p": 0, "ignore_eos": False, "user": "me", "metadata": None},
    )
    assert r.usage.completion_tokens == 2
    r = c.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=2,
        temperature=0,
        presence_penalty=0.0,
        frequency_penalty=0.0,
        logit_bias={},
        logprobs=False,
        tool_choice="none",
        tools=[],
        parallel_tool_calls=False,
        user="me",
    )
    assert r.usage.completion_tokens == 2


def test_a_bad_allow_origin_flag_is_one_line_before_loading(tiny_engine):
    cmd = [sys.executable, "-m", "edgespec.cli", "serve", "--engine", str(tiny_engine), "--allow-origin", "x.example"]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert res.returncode == 2 and "--allow-origin 'x.example'" in res.stderr and "Traceback" not in res.stderr


# ---- in a real browser: a foreign page (evil.example, resolved to this machine) attacks -------------------
ATTACK_PAGE = """<!doctype html><title>win a prize</title><script>
const target = "http://127.0.0.1:%(port)d";
const simple = {method: "POST", mode: "no-cors", headers: {"Content-Type": "text/plain"}};
Promise.allSettled([
  fetch(target + "/admin/speculation", {...simple, body: '{"drafter": "none"}'}),
  fetch(target + "/v1/completions", {...simple, body: '{"prompt": "x", "max_tokens": 1}'}),
  fetch(target + "/admin/speculation", {method: "POST", headers: {"Content-Type": "application/json"},
                                        body: '{"drafter": "none"}'}),
]).then(rs => { document.title = "done " + rs.map(r => r.status).join(","); });
</script>"""


@pytest.fixture(scope="module")
def evil_browser():
    """Headless Chromium in which evil.example resolves to 127.0.0.1 (as DNS rebinding makes it)."""
    from helpers.browser import chromium

    with chromium("--host-resolver-rules=MAP evil.example 127.0.0.1", page_load_s=30) as driver:
        yield driver


@contextlib.contextmanager
def _attack_site(port: int):
    """http://evil.example:PORT/ serving ATTACK_PAGE against the server on `port`."""
    page = (ATTACK_PAGE % {"port": port}).encode()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(page)))
            self.end_headers()
            self.wfile.write(page)

        def log_message(self, *args):
            pass

    site = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    th = threading.Thread(target=site.serve_forever, daemon=True)
    th.start()
    try:
        yield f"http://evil.example:{site.server_address[1]}/"
    finally:
        site.shutdown()
        th.join(timeout=10)


def test_a_foreign_page_in_a_browser_changes_nothing(server, evil_browser):
    from helpers.browser import until

    url, _ = server
    with _attack_site(_port(url)) as evil:
        evil_browser.get(evil)
        title = until(lambda: evil_browser.title.startswith("done") and evil_browser.title, "the attack to run")
    # the JSON POST needs a preflight, which the server refuses (403): the fetch fails in the page
    assert title.split()[1].split(",")[2] == "rejected", title
    assert _drafter(url)["drafter"] == "ngram"
    # DNS rebinding: the attacker's name now points at the server itself
    evil_browser.get(f"http://evil.example:{_port(url)}/")
    assert "forbidden_host" in evil_browser.page_source
    # while the server's own page, opened by its own name, still loads its settings
    evil_browser.get(url + "/")
    until(lambda: evil_browser.find_element("id", "model").text == "tiny", "the page to connect")
