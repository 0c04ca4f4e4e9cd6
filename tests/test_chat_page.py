"""The chat page at `/` in a real headless Chromium (Selenium driving Debian's chromedriver), and
the streaming extension field it reads (`edgespec`: each piece's origins and running counts)."""

import re
import time

import pytest

openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")

from helpers.browser import Page, until  # noqa: E402
from helpers.serving import KEY, PROMPT, serving  # noqa: E402

from edgespec.runtime.config import RuntimeConfig  # noqa: E402
from edgespec.runtime.generator import Generator  # noqa: E402
from edgespec.runtime.text import TARGET, Origins  # noqa: E402


@pytest.fixture(scope="module")
def server(tiny_engine):
    gen = Generator.load(tiny_engine, RuntimeConfig(drafter="ngram", k=4))
    with serving(gen, api_key=KEY, queue_size=4) as (url, app):
        yield url, gen, app


@pytest.fixture(scope="module")
def keyed(server):
    return openai.OpenAI(base_url=server[0] + "/v1", api_key=KEY, max_retries=0, timeout=60)


def _plain(client, messages, max_tokens: int) -> str:
    """What plain greedy decoding answers (the page's greedy answer must be the same text)."""
    r = client.chat.completions.create(
        model="tiny",
        messages=messages,
        max_tokens=max_tokens,
        temperature=0,
        extra_body={"speculative": {"drafter": "none"}},
    )
    return r.choices[0].message.content


# ---- the extension field (no browser) -------------------------------------------------------------------
def test_origins_read_out_per_piece():
    o = Origins()
    o.add(3, "ngram")
    o.add(2, "ngram")  # merged with the run before
    o.add(0, TARGET)  # nothing
    o.add(1, TARGET)
    o.add(4, "draft")
    assert o.take(2) == [[2, "ngram"]]
    assert o.take(7) == [[3, "ngram"], [1, TARGET], [1, "draft"]]
    assert o.take(7) == []
    assert o.take(10) == [[3, "draft"]] and not o.runs


def test_stream_chunks_carry_origins_and_counts(keyed):
    msgs = [{"role": "user", "content": PROMPT}]
    chunks = list(
        keyed.chat.completions.create(
            model="tiny",
            messages=msgs,
            max_tokens=40,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    pieces = [c for c in chunks if c.choices and c.choices[0].delta.content]
    text = "".join(c.choices[0].delta.content for c in pieces)
    assert text == _plain(keyed, msgs, 40)  # greedy speculative text is plain decoding's
    labels, last = {}, None
    for c in pieces:
        ext = c.model_extra["edgespec"]
        assert sum(n for n, _ in ext["origin"]) == len(c.choices[0].delta.content), ext
        for n, label in ext["origin"]:
            labels[label] = labels.get(label, 0) + n
        if last is not None:  # running counts only grow
            assert all(ext[k] >= last[k] for k in ("tokens", "target_calls", "drafted", "accepted")), (last, ext)
        last = ext
    assert set(labels) == {"ngram", TARGET} and labels["ngram"] > 0, labels
    assert last["accepted"] <= last["drafted"] and last["tokens"] == 40
    final = next(c for c in chunks if c.choices and c.choices[0].finish_reason)
    st = final.model_extra["edgespec_stats"]
    assert st["tokens"] == chunks[-1].usage.completion_tokens == 40 and st["drafter"] == "ngram"
    assert st["accepted"] == last["accepted"] and st["target_calls"] == last["target_calls"]


def test_page_is_served_self_contained(server):
    r = httpx.get(server[0] + "/")  # no key needed for the page itself (its API calls send one)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    assert "default-src 'none'" in r.headers["content-security-policy"]
    html = r.text
    assert not re.search(r"""(src|href|action)\s*=\s*["']?(https?:)?//""", html), "loads something remote"
    assert "@import" not in html and "url(" not in html and "<script src" not in html


def test_chat_streams_coloured_tokens_and_live_stats(server, keyed, browser):
    url = server[0]
    offer = httpx.get(url + "/admin/speculation", headers={"Authorization": f"Bearer {KEY}"}).json()
    page = Page(browser, url)
    # the settings are what this folder offers, the server's default chosen
    assert page.options("drafter") == offer["drafters"]
    assert page.options("k") == [str(i) for i in range(1, offer["k_max"] + 1)]
    assert page.el("drafter").get_attribute("value") == "ngram" and page.el("k").get_attribute("value") == "4"
    page.fill("max-tokens", 40)
    answer = page.ask(PROMPT)
    shown = answer.find_element(page.By.CSS_SELECTOR, ".text").text
    assert shown == _plain(keyed, [{"role": "user", "content": PROMPT}], 40).strip()
    drafted = answer.find_elements(page.By.CSS_SELECTOR, ".tok.draft")
    own = answer.find_elements(page.By.CSS_SELECTOR, ".tok.target")
    assert drafted and own, "both drafted-and-kept and the target's own tokens are shown"
    assert {s.get_attribute("data-origin") for s in drafted} == {"ngram"}
    tint = drafted[0].value_of_css_property("background-color")
    assert tint not in ("rgba(0, 0, 0, 0)", "transparent") and tint != own[0].value_of_css_property("background-color")
    assert "drafted by ngram, kept by the target" in page.text("legend")
    stats = page.text("stats")
    for words in ("40 tokens", "tok/s", "ITL p50", "mean accepted length", "acceptance", "ngram k=4"):
        assert words in stats, stats
    mal = float(re.search(r"mean accepted length ([\d.]+)", stats).group(1))
    assert mal > 1.0, stats  # the drafts paid: more than one token per target call
    assert "ngram k=4" in answer.find_element(page.By.CSS_SELECTOR, ".meta").text
    # a second turn carries the first: the answer is plain decoding's for the whole conversation
    first = shown
    answer2 = page.ask("and again")
    msgs = [
        {"role": "user", "content": PROMPT},
        {"role": "assistant", "content": _plain(keyed, [{"role": "user", "content": PROMPT}], 40)},
        {"role": "user", "content": "and again"},
    ]
    assert answer2.find_element(page.By.CSS_SELECTOR, ".text").text == _plain(keyed, msgs, 40).strip()
    assert len(page.answers()) == 2 and page.answers()[0].find_element(page.By.CSS_SELECTOR, ".text").text == first
    page.el("new-chat").click()
    assert not page.answers()


def test_settings_choose_the_drafter_k_and_tree(server, browser):
    url = server[0]
    offer = httpx.get(url + "/admin/speculation", headers={"Authorization": f"Bearer {KEY}"}).json()
    page = Page(browser, url)
    page.fill("max-tokens", 24)
    page.choose("drafter", "none")
    assert not page.el("k").is_enabled() and not page.el("tree").is_enabled()
    answer = page.ask(PROMPT)
    assert not answer.find_elements(page.By.CSS_SELECTOR, ".tok.draft")
    assert "plain decoding" in page.text("stats") and "acceptance 0%" in page.text("stats")
    page.choose("drafter", "draft")
    page.choose("k", "2")
    answer = page.ask("x")
    assert "draft k=2" in answer.find_element(page.By.CSS_SELECTOR, ".meta").text
    assert {s.get_attribute("data-origin") for s in answer.find_elements(page.By.CSS_SELECTOR, ".tok.draft")} <= {
        "draft"
    }
    tree_drafter = offer["tree_drafters"][0]  # the tiny folder is exported with trees
    page.el("new-chat").click()
    page.choose("drafter", tree_drafter)
    trees = [t for t in page.options("tree") if t]
    assert trees and page.el("tree").is_enabled()
    page.choose("tree", trees[0])
    answer = page.ask(PROMPT)
    assert f"{tree_drafter} tree {trees[0]}" in answer.find_element(page.By.CSS_SELECTOR, ".meta").text


def test_stop_ends_the_stream_and_the_generation(server, browser, monkeypatch):
    url, gen, _ = server
    inner = gen.stream_text

    def slow(*args, **kwargs):  # 40 ms a piece, so the answer is still streaming when Stop is pressed
        pieces = inner(*args, **kwargs)
        try:
            for piece in pieces:
                time.sleep(0.04)
                yield piece
        finally:
            pieces.close()

    monkeypatch.setattr(gen, "stream_text", slow)
    cancelled = _metric(url, "edgespec:request_cancelled_total")
    page = Page(browser, url)
    page.fill("max-tokens", 200)
    page.send(PROMPT)
    text = lambda: page.answers()[-1].find_element(page.By.CSS_SELECTOR, ".text").text  # noqa: E731
    until(lambda: len(text()) >= 5 and page.busy(), "streamed text while the answer is still coming")
    assert "tok/s" in page.text("stats")  # the live line, before the end
    page.el("stop").click()
    until(lambda: not page.busy() and page.el("send").is_enabled(), "the page to stop")
    assert "stopped" in page.answers()[-1].find_element(page.By.CSS_SELECTOR, ".meta").text
    at_stop = text()
    until(lambda: _metric(url, "edgespec:request_cancelled_total") > cancelled, "the server to cancel")
    time.sleep(0.3)
    assert text() == at_stop and len(at_stop) < 200  # nothing more arrived
    monkeypatch.undo()
    page.fill("max-tokens", 8)
    assert page.ask("next").find_element(page.By.CSS_SELECTOR, ".text").text  # the engine is free again


def test_errors_show_the_servers_message(server, browser):
    url = server[0]
    page = Page(browser, url)
    page.fill("temperature", 5)
    page.send("hello")
    notice = until(lambda: page.el("notice").is_displayed() and page.text("notice"), "the error")
    assert "'temperature' must be in [0.0, 2.0], got 5" in notice
    assert not page.answers() and page.el("prompt").get_attribute("value") == "hello"  # back in the box
    page.fill("temperature", 0)
    page.set_key("wrong")
    until(lambda: "API key needed" in page.text("model"), "the key to be refused")
    assert "missing or wrong API key" in page.text("notice")
    page.el("send").click()
    until(lambda: not page.busy() and "missing or wrong API key" in page.text("notice"), "the 401 message")
    assert not page.answers()


def _metric(url: str, name: str) -> float:
    text = httpx.get(url + "/metrics").text
    return float(next(line.split()[1] for line in text.splitlines() if line.startswith(name + " ")))
