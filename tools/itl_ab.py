"""ITL A/B for the chat API's extras (issue 54): the same greedy chat requests plain, with logprobs
(top 5), with tools offered (tool_choice auto), and plain on the context the tools add (the folder's
template fallback describes them in the system message), interleaved in rotating order in one process.

    python tools/itl_ab.py ENGINE_FOLDER

Prints each mode's median decode ms per token (per request: (total - TTFT) / (tokens - 1)) over 3
measured rounds of 10 chat-eval prompts (a warm-up round first), and the ratios."""

import json
import statistics
import sys
from pathlib import Path

from edgespec.runtime.config import RuntimeConfig
from edgespec.runtime.generator import Generator
from edgespec.runtime.tools import plan, template_messages, tool_format

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "weather for a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
TOOLS = [WEATHER]
PROMPTS = Path(__file__).parent / "prompts" / "chat_eval.jsonl"


def main(engine: str, rounds: int = 4, n_prompts: int = 10, new_tokens: int = 96) -> None:
    g = Generator.load(engine, RuntimeConfig())
    fmt = tool_format(g.codec.template_text, g.codec.takes_tools)
    prompts = [json.loads(line)["messages"] for line in PROMPTS.read_text().splitlines()[:n_prompts]]
    modes = {
        "plain": {},
        "logprobs": {"logprobs": 5},
        "tools": {"tools": TOOLS, "tool_choice": "auto"},
        "tools_ctx": {},
    }
    names = list(modes)
    ms = {m: [] for m in modes}
    for rnd in range(rounds):
        for i, msgs in enumerate(prompts):
            turn = (i + rnd) % len(names)
            for mode in names[turn:] + names[:turn]:
                ctx = template_messages(msgs, plan(TOOLS, "auto"), fmt)[0] if mode == "tools_ctx" else msgs
                "".join(g.stream(ctx, new_tokens, **modes[mode]))
                st = g.last_stats
                if rnd:  # round 0 warms up
                    ms[mode].append((st.total_s - st.ttft_s) / max(1, st.n_output - 1) * 1e3)
    med = {m: statistics.median(v) for m, v in ms.items()}
    for m, v in med.items():
        print(f"{m}: decode {v:.3f} ms per token (median of {len(ms[m])})")
    print(
        f"logprobs / plain {med['logprobs'] / med['plain']:.3f}; tools / plain {med['tools'] / med['plain']:.3f}; "
        f"tools / the same context without tools {med['tools'] / med['tools_ctx']:.3f}"
    )


if __name__ == "__main__":
    main(sys.argv[1])
