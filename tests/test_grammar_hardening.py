"""Grammars that pass validation but fail once generation starts, or admit no output (issue 41,
defects 2 and 3): the start check (constrain.Constraint._start) refuses them before anything is
generated, as a 400 from the server (streamed or not) and a one-line CLI error (exit 2), with
llguidance's reason in one line and none of its internal state; a failure that still happens
mid-stream ends the stream with a clean error event."""

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

llg = pytest.importorskip("llguidance")
httpx = pytest.importorskip("httpx")
pytest.importorskip("uvicorn")

from helpers.cli import one_line_error, run_cli  # noqa: E402
from helpers.grammars import LARK, SCHEMA  # noqa: E402
from helpers.serving import serving  # noqa: E402

from edgespec.runtime.config import RuntimeConfig  # noqa: E402
from edgespec.runtime.constrain import Constraint  # noqa: E402
from edgespec.runtime.generator import Generator  # noqa: E402
from edgespec.runtime.grammar import GrammarError, grammar_from, grammar_tokenizer  # noqa: E402

# each passes grammar_from's validation; before the start check each failed at its first tokens
# (a 500, or a 200 and then an error chunk holding llguidance's parser state)
FAILING = {
    "regex a{1000000}": ("regex", "a{1000000}"),
    "regex nested repeats": ("regex", "(((a{100}){100}){100})"),
    "lark 30,000 alternatives": ("grammar", "start: " + " | ".join(f'"w{i}"' for i in range(30_000))),
    "lark x{1000000}": ("grammar", 'start: x{1000000}\nx: "x"'),
    "lark doubling 60 deep": (
        "grammar",
        "start: r0\n" + "\n".join(f"r{i}: r{i + 1} r{i + 1}" for i in range(60)) + '\nr60: "x"',
    ),
    "lark recursion without a base": ("grammar", 'start: a\na: "x" a'),
}
# each admits nothing to generate; before, a 200 with "" and finish_reason "stop"
EMPTY = {
    "regex matching nothing": ("regex", r"[^\s\S]", "admits no output"),
    "lark start: start": ("grammar", "start: start", "admits no output"),
    "regex of the empty string": ("regex", "", "admits only the empty string"),
}
# a choice, then two more, then a forced run over llguidance's limits: past the start check's steps
MID_STREAM = ("regex", "[ab][ab][ab]a{1000000}")


@pytest.fixture(autouse=True)
def _own_thread_pools(monkeypatch):
    """main() would make this test process share one ORT pool, changing how later tests' sessions run."""
    import edgespec.engines.ort as eo

    monkeypatch.setattr(eo, "share_thread_pool", lambda threads=None: 0)


@pytest.fixture(scope="module")
def served(tiny_engine):
    gen = Generator.load(tiny_engine, RuntimeConfig(drafter="ngram", k=4))
    with serving(gen, queue_size=4) as (url, app):
        yield url


def _clean(msg: str) -> str:
    """msg is one line with none of llguidance's parser state in it."""
    for dump in ("\n", "<state>", "<non-verbose", "Tokens:", '"rows"', "Parser: {", "Traceback"):
        assert dump not in msg, msg
    return msg


def _body(kind: str, text: str, stream: bool) -> dict:
    return {
        "prompt": "hello world",
        "max_tokens": 12,
        "temperature": 0,
        "stream": stream,
        "response_format": {"type": kind, kind: text},
    }


def _refused(url: str, kind: str, text: str, stream: bool) -> dict:
    """The 400 body, read before any event could be sent."""
    with httpx.stream("POST", url + "/v1/completions", json=_body(kind, text, stream), timeout=60) as r:
        r.read()
        assert r.status_code == 400, (r.status_code, r.text[:300])
        err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and err["param"] == "response_format", err
    _clean(err["message"])
    return err


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
@pytest.mark.parametrize("name", list(FAILING))
def test_the_server_refuses_a_grammar_that_fails_once_started(served, name, stream):
    kind, text = FAILING[name]
    t0 = time.perf_counter()
    err = _refused(served, kind, text, stream)
    assert "llguidance cannot run it" in err["message"] and "hint:" in err["message"], err
    assert time.perf_counter() - t0 < 10


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
@pytest.mark.parametrize("name", list(EMPTY))
def test_the_server_refuses_a_grammar_that_admits_no_output(served, name, stream):
    kind, text, what = EMPTY[name]
    assert what in _refused(served, kind, text, stream)["message"]


def test_a_grammar_failing_mid_stream_ends_the_stream_with_a_clean_error_event(served):
    kind, text = MID_STREAM
    events = []
    with httpx.stream("POST", served + "/v1/completions", json=_body(kind, text, True), timeout=60) as r:
        assert r.status_code == 200  # the start check passed: the first tokens stream
        for line in r.iter_lines():
            if line.startswith("data: "):
                events.append(line[len("data: ") :])
    assert events[-1] == "[DONE]", events
    err = json.loads(events[-2])["error"]
    assert err["type"] == "invalid_request_error" and err["param"] == "response_format", err
    assert "failed during generation" in _clean(err["message"])
    assert any(json.loads(e).get("choices") for e in events[:-2])  # text came before the error
    r = httpx.post(served + "/v1/completions", json=_body(kind, text, False), timeout=60)
    assert r.status_code == 400 and "failed during generation" in _clean(r.json()["error"]["message"])
    r = httpx.post(served + "/v1/completions", json=_body("regex", "[0-9]{2,4}", False), timeout=60)
    assert r.status_code == 200 and r.json()["choices"][0]["text"].replace(" ", "").isdigit()  # still serving


@pytest.mark.parametrize("name", list(FAILING) + list(EMPTY))
def test_cli_generate_refuses_them_in_one_line(tiny_engine, tmp_path, capsys, name):
    kind, text, *what = (FAILING | EMPTY)[name]
    if kind == "grammar":
        (tmp_path / "g.lark").write_text(text)
        flag = ["--grammar", tmp_path / "g.lark"]
    else:
        flag = ["--regex", text]
    rc, err = run_cli(capsys, "generate", "--engine", tiny_engine, "--prompt", "hi", "--max-new-tokens", 8, *flag)
    line = _clean(one_line_error(err, "generate"))
    assert rc == 2 and (what[0] if what else "llguidance cannot run it") in line, err


def test_the_start_check_is_fast_and_the_python_api_refuses_at_the_call(tiny_engine):
    g = Generator.load(tiny_engine, RuntimeConfig(drafter="none"))
    tok = grammar_tokenizer(g.codec.tokenizer, g.engines.target.vocab_size, g.eos)
    vocab = g.engines.target.vocab_size
    for grammar in (grammar_from(json_schema=SCHEMA), grammar_from(grammar=LARK), grammar_from(regex="[0-9]{3}")):
        con = Constraint(tok, vocab, g.eos, 8)  # a fresh one: no matcher to reuse
        t0 = time.perf_counter()
        con.begin(grammar)
        assert time.perf_counter() - t0 < 0.05, grammar.kind  # ~1 ms here
    for kind, text in (FAILING["regex nested repeats"], FAILING["regex a{1000000}"]):
        # one step over the limits held the GIL (so the server's event loop) for over a second
        t0 = time.perf_counter()
        with pytest.raises(GrammarError, match="llguidance cannot run it"):
            Constraint(tok, vocab, g.eos, 8).begin(grammar_from(**{kind: text}))
        assert time.perf_counter() - t0 < 1.0
    with pytest.raises(GrammarError, match="admits no output"):
        g.stream("hi", regex=r"[^\s\S]")  # at the call, not at the first next()


# run in a child: before the fix each killed the process (SIGSEGV in llguidance's compiler, which
# recurses once per nested Lark rule or JSON level); the worker's thread stack is 2 MiB here, as
# under `ulimit -s unlimited`, where ~650 nested rules were enough
_CHILD = r"""
import sys, threading
sys.path.insert(0, "tests")
from helpers.grammars import fake_tokenizer
from edgespec.runtime.constrain import Constraint
from edgespec.runtime.grammar import GrammarError, grammar_from, grammar_tokenizer

def chain(n):
    return "start: r0\n" + "\n".join(f'r{i}: "a" r{i + 1}' for i in range(n)) + f'\nr{n}: "b"'

def work():
    con = Constraint(grammar_tokenizer(fake_tokenizer(), 8, [7]), 8, [7], 4)
    con.begin(grammar_from(grammar=chain(4_000)))  # deep but under the cap: compiles and starts
    print("deep chain ok", con._forced_token())
    deep = {"type": "string"}
    for _ in range(20_000):
        deep = {"type": "object", "properties": {"a": deep}}
    for kw in ({"grammar": chain(6_000)}, {"json_schema": deep}, {"json_schema": '{"a":' * 5_000 + "1" + "}" * 5_000}):
        try:
            grammar_from(**kw)
        except GrammarError as e:
            print("refused:", e)

threading.stack_size(2 << 20)
t = threading.Thread(target=work)
t.start()
t.join()
"""


def test_deeply_nested_grammars_are_refused_or_compiled_never_a_crash():
    root = Path(__file__).resolve().parents[1]
    r = subprocess.run([sys.executable, "-c", _CHILD], capture_output=True, text=True, cwd=root, timeout=120)
    assert r.returncode == 0, (r.returncode, r.stderr[-2000:])
    lines = r.stdout.splitlines()
    assert lines[0] == "deep chain ok 0", r.stdout  # "a" (token 0) forced first
    refused = [ln for ln in lines if ln.startswith("refused: ")]
    assert len(refused) == 3, r.stdout
    assert "6002 rules and terminals, over the 5000" in refused[0]
    assert "json_schema cannot be written as JSON" in refused[1] and "json_schema is not JSON" in refused[2]
