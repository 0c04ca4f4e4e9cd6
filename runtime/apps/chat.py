"""`edgespec chat`: a multi-turn terminal chat. The KV of earlier turns is kept (prefix reuse),
so each turn prefills only its new text."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field

from edgespec.runtime.backends import runnable_drafters
from edgespec.runtime.generator import Generator
from edgespec.runtime.sampling import SamplingConfig, check_max_new_tokens

HELP = """commands:
  /drafter NAME     {drafters}
  /k N              num_speculative_tokens
  /temperature T    0 = greedy
  /stats            full stats of the last answer
  /reset            forget the conversation
  /quit             leave (Ctrl-D too)"""


@dataclass
class ChatSettings:
    """What /commands may change during a chat; a field with a "help" is a flag of `edgespec chat`."""

    temperature: float = field(default=0.0, metadata={"help": "0 = greedy (default)"})  # sampling temperature
    max_new_tokens: int = field(default=512, metadata={"help": "tokens per answer at most (default %(default)s)"})

    def check(self) -> None:
        SamplingConfig(temperature=self.temperature).check()
        check_max_new_tokens(self.max_new_tokens)


def footer(st) -> str:
    return (
        f"[{st.tokens_per_s:.1f} tok/s | mean accepted length {st.mean_accepted_length:.2f} | "
        f"TTFT {st.ttft_s * 1e3:.0f} ms | prompt {st.n_prompt} tok, {st.n_prompt_cached} reused | "
        f"{st.drafter} k={st.k}]"
    )


def _number(kind, arg: str, cmd: str, what: str):
    """arg read as kind (int, float), refused in one line naming the command and what it takes."""
    try:
        return kind(arg)
    except ValueError:
        raise ValueError(f"{cmd} {arg!r}: give {what}") from None


def handle_command(line: str, g: Generator, settings: ChatSettings, messages: list) -> str | None:
    """Apply a slash command; return a message to print, or None to quit."""
    cmd, _, arg = line[1:].partition(" ")
    arg = arg.strip()
    try:
        if cmd in ("quit", "exit", "q"):
            return None
        if cmd == "drafter":
            g.set_drafter(arg, g.k or None)
            return f"drafter = {g.drafter.name}, k = {g.k}"
        if cmd == "k":
            g.set_drafter(g.drafter.name, _number(int, arg, "/k", "a whole number"))
            return f"k = {g.k}"
        if cmd == "temperature":
            t = _number(float, arg, "/temperature", "a number >= 0 (0 = greedy)")
            SamplingConfig(temperature=t).check()  # refused here, not on the next turn
            settings.temperature = t
            return f"temperature = {settings.temperature}"
        if cmd == "stats":
            return g.last_stats.line()
        if cmd == "reset":
            messages.clear()
            return "conversation cleared"
        # only the drafters this folder and backend run (a section it lacks or whose files broke: not offered)
        return HELP.format(drafters=" | ".join(runnable_drafters(g.engines, g.cfg)))
    except ValueError as e:
        return f"error: {e}"


def chat_loop(g: Generator, settings: ChatSettings, inp=input, out=sys.stdout) -> None:
    messages: list[dict] = []
    print(f"edgespec chat ({g.manifest.name}, drafter {g.drafter.name}, k={g.k}); /help for commands", file=out)
    while True:
        try:
            line = inp("> ").strip()
        except (EOFError, KeyboardInterrupt):
            print(file=out)
            return
        if not line:
            continue
        if line.startswith("/"):
            msg = handle_command(line, g, settings, messages)
            if msg is None:
                return
            print(msg, file=out)
            continue
        messages.append({"role": "user", "content": line})
        answer = ""
        try:
            for piece in g.stream(messages, max_new_tokens=settings.max_new_tokens, temperature=settings.temperature):
                answer += piece
                out.write(piece)
                out.flush()
        except KeyboardInterrupt:
            out.write(" [interrupted]")
        except ValueError as e:  # e.g. the conversation outgrew the context
            print(f"\nerror: {e}. /reset to start over", file=out)
            messages.pop()
            continue
        print(f"\n{footer(g.last_stats)}", file=out)
        messages.append({"role": "assistant", "content": answer})
