"""TTFT of a 5-turn chat with and without cross-turn KV reuse (same engine, one process).

python tools/chat_ttft.py --engine engines/smollm2-135m-instruct
"""

from __future__ import annotations

import argparse
import json

from edgespec.runtime.config import RuntimeConfig
from edgespec.runtime.generator import Generator

TURNS = [
    "Hi! I want to learn how hash tables work. Can you explain the basic idea?",
    "What happens when two keys land in the same bucket?",
    "Show me a tiny Python class that implements chaining.",
    "How would I make it grow when it gets too full?",
    "Summarise everything we discussed in three bullet points.",
]


def run(g: Generator, reuse: bool, max_new_tokens: int) -> list[dict]:
    g.reconfigure(reuse_kv=reuse)
    g.forget()  # start each conversation cold
    messages, rows = [], []
    for text in TURNS:
        messages.append({"role": "user", "content": text})
        answer = "".join(g.stream(messages, max_new_tokens=max_new_tokens))
        st = g.last_stats
        rows.append({"prompt_tokens": st.n_prompt, "reused": st.n_prompt_cached, "ttft_ms": st.ttft_s * 1e3})
        messages.append({"role": "assistant", "content": answer})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--engine", default="engines/smollm2-135m-instruct")
    ap.add_argument("--drafter", default="ngram")
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--json")
    a = ap.parse_args()
    g = Generator.load(a.engine, RuntimeConfig(drafter=a.drafter))
    run(g, True, 8)  # warm-up
    with_reuse, without = run(g, True, a.max_new_tokens), run(g, False, a.max_new_tokens)
    print("| turn | prompt tokens | reused | TTFT with reuse (ms) | TTFT without (ms) |")
    print("|---|---|---|---|---|")
    for i, (r, n) in enumerate(zip(with_reuse, without, strict=True), 1):
        print(f"| {i} | {r['prompt_tokens']} | {r['reused']} | {r['ttft_ms']:.0f} | {n['ttft_ms']:.0f} |")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"with_reuse": with_reuse, "without_reuse": without}, f, indent=1)


if __name__ == "__main__":
    main()
