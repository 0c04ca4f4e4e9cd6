"""A PNG of the chat page (`edgespec serve` at /) as headless Chromium shows it after a short
conversation: the README's docs/data/chat_page.png.

    python tools/chat_screenshot.py --engine engines/smollm2-135m-instruct --out docs/data/chat_page.png
    python tools/chat_screenshot.py --out docs/data/chat_page.png     # no folder: a tiny memorizing model

With --engine it serves that folder with its default drafter and asks TURNS. Without, it trains a
tiny random char-level Llama (tests/tiny.py) until it has memorized DEMO, a two-turn
conversation, exports it (fp32, a self:1 draft) and serves that: the text is then readable, and
the colours are what the ngram drafter really got accepted on it. Needs the export and dev extras
and Debian's chromium + chromedriver; nothing is downloaded.
"""

from __future__ import annotations

import argparse
import json
import socket
import sys
import tempfile
import threading
import time
from pathlib import Path

from edgespec.runtime.apps.chat_page import HEADLESS_CHROMIUM

ROOT = Path(__file__).resolve().parents[1]
TURNS = (
    "What does speculative decoding do? Answer in two sentences.",
    "Write a Python function that reverses a string, with a docstring.",
)
DEMO = (  # (question, the answer the tiny model memorizes); no newlines: its tokenizer has none
    (
        TURNS[0],
        "A small drafter guesses the next few tokens, and the big model checks all of the guesses in one "
        "call. It keeps every guess it would have written itself, so the text is the same as without "
        "the drafter, only faster.",
    ),
    (TURNS[1], "A small model drafts tokens and the big model checks them all in one call."),
)
CHROMIUM_FLAGS = (*HEADLESS_CHROMIUM, "--hide-scrollbars")
MAX_STEPS = 3000  # training steps at most before giving up on memorizing DEMO
WAIT_S = 120  # the longest one answer is waited for


def demo_engine(root: Path) -> Path:
    """Train a tiny Llama on DEMO until greedy decoding reproduces both answers; export it."""
    import jinja2
    import torch
    from tokenizers import Tokenizer
    from transformers import AutoModelForCausalLM

    sys.path.insert(0, str(ROOT / "tests"))
    from tiny import CHAT_TEMPLATE, TINY_EXPORT, make_tiny

    from edgespec.export.target.exporter import ExportConfig, export

    torch.set_num_threads(1)  # a tiny model: more threads only wait on each other on a busy machine
    hf = make_tiny(
        "llama", root / "hf", hidden_size=128, intermediate_size=384, num_hidden_layers=2, max_position_embeddings=1024
    )
    spec = json.loads((hf / "tokenizer.json").read_text())
    spec["decoder"] = {"type": "Fuse"}  # one character a token: joined as they are (not with spaces)
    (hf / "tokenizer.json").write_text(json.dumps(spec))
    model = AutoModelForCausalLM.from_pretrained(hf).train()
    template = jinja2.Environment(trim_blocks=True, lstrip_blocks=True).from_string(CHAT_TEMPLATE)
    tok = Tokenizer.from_file(str(hf / "tokenizer.json"))  # the ids the server will see (TextCodec.encode)
    history, cases = [], []  # (prompt ids, answer ids + EOS)
    for question, answer in DEMO:
        history.append({"role": "user", "content": question})
        prompt = template.render(messages=history, add_generation_prompt=True)
        cases.append(
            (tok.encode(prompt, add_special_tokens=False).ids, tok.encode(answer, add_special_tokens=False).ids + [1])
        )
        history.append({"role": "assistant", "content": answer})
    n = max(len(p) + len(a) for p, a in cases)
    ids = torch.zeros(len(cases), n, dtype=torch.long)
    labels = torch.full((len(cases), n), -100)
    for i, (p, a) in enumerate(cases):
        ids[i, : len(p) + len(a)] = torch.tensor(p + a)
        labels[i, : len(p) + len(a)] = ids[i, : len(p) + len(a)]
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.0)
    for step in range(MAX_STEPS):
        loss = model(input_ids=ids, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 100 == 99:
            print(f"step {step + 1}: loss {loss.item():.4f}", file=sys.stderr)
            if loss.item() < 0.01 and all(_greedy(model, p, len(a)) == a for p, a in cases):
                break
    else:
        raise SystemExit(f"the tiny model did not memorize the demo in {MAX_STEPS} steps")
    model.eval().save_pretrained(hf)
    # the tests' tiny export (fp32, k 8, trees), with room for the two turns
    settings = TINY_EXPORT | {"max_len": 1024}
    return export(ExportConfig(target=str(hf), draft="self:1", out=str(root / "tiny-memorized"), **settings))


def _greedy(model, prompt: list[int], n: int) -> list[int]:
    import torch

    ids = torch.tensor([prompt])
    with torch.no_grad():  # an explicit mask: id 0 (the tokenizer's unknown, e.g. a newline) is no padding here
        out = model.generate(
            ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, do_sample=False, eos_token_id=1, pad_token_id=0
        )
    return out[0, len(prompt) :].tolist()


def start_chromium(width: int, height: int):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = "/usr/bin/chromium"
    for flag in CHROMIUM_FLAGS + (f"--window-size={width},{height}", f"--user-data-dir={tempfile.mkdtemp()}"):
        opts.add_argument(flag)
    return webdriver.Chrome(options=opts, service=Service("/usr/bin/chromedriver"))


def shoot(url: str, turns, out: Path, width: int, height: int, max_tokens: int) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    d = start_chromium(width, height)
    try:
        d.get(url + "/")
        deadline = time.time() + 30
        while not d.find_elements(By.CSS_SELECTOR, "#drafter option") and time.time() < deadline:
            time.sleep(0.1)
        box = d.find_element(By.ID, "max-tokens")
        box.clear()
        box.send_keys(str(max_tokens))
        for turn in turns:
            d.find_element(By.ID, "prompt").send_keys(turn, Keys.ENTER)
            time.sleep(0.3)
            deadline = time.time() + WAIT_S
            while d.find_element(By.ID, "stop").is_enabled() and time.time() < deadline:
                time.sleep(0.1)
        time.sleep(0.3)
        d.execute_script("document.activeElement.blur()")  # no focus ring in the picture
        d.save_screenshot(str(out))
    finally:
        d.quit()
    try:  # a palette PNG: a fraction of the size, the same to the eye
        from PIL import Image

        Image.open(out).convert("RGB").quantize(colors=128).save(out, optimize=True)
    except ImportError:
        pass


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--engine", help="engine folder to serve (default: train and export a tiny memorizing model)")
    p.add_argument("--out", default=str(ROOT / "docs" / "chat_page.png"))
    p.add_argument("--width", type=int, default=1100)
    p.add_argument("--height", type=int, default=700)
    p.add_argument("--max-tokens", type=int, default=160)
    a = p.parse_args(argv)

    import uvicorn

    from edgespec.runtime.apps.server import ServeConfig, create_app
    from edgespec.runtime.config import RuntimeConfig
    from edgespec.runtime.generator import Generator

    with tempfile.TemporaryDirectory(prefix="edgespec-shot-") as tmp:
        engine = Path(a.engine) if a.engine else demo_engine(Path(tmp))
        gen = Generator.load(engine, RuntimeConfig(drafter=None if a.engine else "ngram"))
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        app = create_app(gen, ServeConfig(port=port))
        srv = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
        threading.Thread(target=srv.run, daemon=True).start()
        while not srv.started:
            time.sleep(0.05)
        try:
            shoot(f"http://127.0.0.1:{port}", TURNS, Path(a.out), a.width, a.height, a.max_tokens)
        finally:
            srv.should_exit = True
            app.state.jobs.put(None)
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
