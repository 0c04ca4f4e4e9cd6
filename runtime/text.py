"""Tokenizer, chat template and incremental detokenization (tokenizers + jinja2, no transformers)."""

from __future__ import annotations

import json
import re
import warnings
from collections import deque
from datetime import datetime

import jinja2
import jinja2.meta
import numpy as np
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer

from edgespec.engines.manifest import Manifest


class TemplateError(ValueError):
    """Chat messages that the model's chat template cannot render."""


def _raise(msg: str):
    raise TemplateError(msg)


class TokenizerError(ValueError):
    """A tokenizer file that cannot be read (truncated, not JSON, not the tokenizers format)."""


class TextCodec:
    def __init__(self, manifest: Manifest) -> None:
        path = manifest.path(manifest.tokenizer_file)
        try:
            self.tokenizer = Tokenizer.from_file(str(path))
        except Exception as e:  # tokenizers raises a bare Exception for every parse failure
            raise TokenizerError(
                f"tokenizer {path} cannot be read ({e}). Hint: re-export the folder "
                f"(edgespec export --out {manifest.folder} --force)"
            ) from None
        self.eos_token_ids = manifest.eos_token_ids
        self.bos_token_id = manifest.bos_token_id
        self._template = None
        self.template_text: str | None = None  # the chat template's source (tools.tool_format reads its markers)
        self.takes_tools = False  # the template reads a `tools` variable (tools.py: else the generic description)
        self._template_error = None  # why the folder's template cannot be used (raised when messages come)
        if manifest.chat_template_file:
            self._template_error = self._compile(manifest)
            if self._template_error:
                warnings.warn(self._template_error, RuntimeWarning, stacklevel=2)

    def _compile(self, manifest: Manifest) -> str | None:
        """Compile the chat template; a broken one only fails chat calls (raw prompts never use it),
        so its error is kept and raised by render_chat."""
        path = manifest.path(manifest.chat_template_file)
        env = ImmutableSandboxedEnvironment(
            trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
        )
        env.globals["raise_exception"] = _raise
        env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        env.filters["tojson"] = _tojson  # as transformers renders templates: plain JSON, not HTML-escaped
        try:
            self.template_text = path.read_text()
            self._template = env.from_string(self.template_text)
            self.takes_tools = "tools" in jinja2.meta.find_undeclared_variables(env.parse(self.template_text))
        except (OSError, UnicodeDecodeError, jinja2.TemplateSyntaxError) as e:
            where = f" line {e.lineno}" if isinstance(e, jinja2.TemplateSyntaxError) else ""
            return (
                f"chat template {path}{where} cannot be used ({type(e).__name__}: {e}). Hint: fix the file or "
                f"re-export the folder; raw-text prompts still work"
            )
        return None

    def encode(self, prompt, tools: list[dict] | None = None) -> np.ndarray:
        """Raw text (no template, the tokenizer's own special tokens) or chat messages (template; tools
        for a template that takes them).
        Through the tokenizer's batch call, which releases the GIL (the single call holds it
        throughout), so a long prompt tokenized in one thread does not stall the others."""
        if isinstance(prompt, str):
            return np.array(self.tokenizer.encode_batch([prompt])[0].ids, np.int64)
        text = self.render_chat(prompt, tools)
        return np.array(self.tokenizer.encode_batch([text], add_special_tokens=False)[0].ids, np.int64)

    def render_chat(self, messages: list[dict], tools: list[dict] | None = None) -> str:
        """The chat template over messages (and tools, OpenAI-shaped, for a template that takes them)."""
        if self._template_error is not None:
            raise TemplateError(self._template_error)
        if self._template is None:
            raise TemplateError("this engine folder has no chat template; pass raw text instead of messages")
        if not isinstance(messages, list) or not all(
            isinstance(m, dict) and "role" in m and "content" in m for m in messages
        ):
            raise TemplateError("messages must be a list of {'role': ..., 'content': ...} dicts")
        try:
            extra = {"tools": tools} if tools is not None else {}
            return self._template.render(
                **extra,
                messages=messages,
                add_generation_prompt=True,
                bos_token=self._token(self.bos_token_id),
                eos_token=self._token(self.eos_token_ids[0] if self.eos_token_ids else None),
            )
        except jinja2.TemplateError as e:
            raise TemplateError(f"chat template failed: {e}") from e
        except (TypeError, ValueError, KeyError, AttributeError) as e:  # e.g. content of a type it cannot join
            raise TemplateError(f"chat template failed on these messages ({type(e).__name__}: {e})") from e

    def token_bytes(self, i: int) -> bytes:
        """The bytes token i stands for: a byte-level (GPT-2) or byte-fallback (<0xAB>) token may be part
        of a character, which decoding it alone would turn into U+FFFD. Cached per id."""
        cache = self.__dict__.setdefault("_token_bytes", {})
        b = cache.get(i)
        if b is None:
            piece = self.tokenizer.id_to_token(int(i)) or ""
            if type(self.tokenizer.decoder).__name__ == "ByteLevel" and all(c in _BYTE_OF for c in piece):
                b = bytes(_BYTE_OF[c] for c in piece)
            elif _BYTE_TOKEN.fullmatch(piece):
                b = bytes([int(piece[3:5], 16)])
            else:
                b = self.tokenizer.decode([int(i)], skip_special_tokens=False).encode()
            cache[i] = b
        return b

    def is_special(self, text: str) -> bool:
        """Is text one special token of the tokenizer (decoding leaves it out)?"""
        return any(t.special and t.content == text for t in self.tokenizer.get_added_tokens_decoder().values())

    def _token(self, i):
        return self.tokenizer.id_to_token(i) if i is not None else ""

    def decode(self, ids) -> str:
        return self.tokenizer.decode(list(map(int, ids)), skip_special_tokens=True)


def _byte_chars() -> dict[str, int]:
    """GPT-2's byte-level alphabet: the character that stands for each byte in a token's string."""
    keep = [*range(33, 127), *range(161, 173), *range(174, 256)]
    chars, n = {}, 0
    for b in range(256):
        if b in keep:
            chars[chr(b)] = b
        else:
            chars[chr(256 + n)] = b
            n += 1
    return chars


_BYTE_OF = _byte_chars()
_BYTE_TOKEN = re.compile(r"<0x[0-9A-Fa-f]{2}>")


def _tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    """transformers' tojson filter for chat templates (jinja2's own escapes <, > and & for HTML)."""
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


class StreamDecoder:
    """Incremental detokenization: emits only complete characters (vLLM-style prefix offsets)."""

    def __init__(self, codec: TextCodec) -> None:
        self.codec = codec
        self.ids: list[int] = []
        self.prefix = 0  # start of the window decoded for context
        self.read = 0  # ids already turned into emitted text

    def push(self, new_ids) -> str:
        self.ids.extend(int(i) for i in new_ids)
        prefix_text = self.codec.decode(self.ids[self.prefix : self.read])
        full = self.codec.decode(self.ids[self.prefix :])
        if len(full) > len(prefix_text) and not full.endswith("\ufffd"):
            self.prefix, self.read = self.read, len(self.ids)
            return full[len(prefix_text) :]
        return ""


TARGET = "target"  # origin label of a token the target chose itself (no draft, a correction or the bonus)


class Origins:
    """Who produced each character of a streamed text: runs [end offset, label] (a drafter's name
    for drafted tokens the target kept, TARGET for its own), read out once per emitted piece."""

    def __init__(self) -> None:
        self.runs: deque[list] = deque()  # [end, label], ends increasing; runs read out are dropped
        self.end = 0  # characters attributed so far
        self.start = 0  # where the next read starts

    def add(self, n_chars: int, label: str) -> None:
        """The next n_chars characters came from `label`."""
        if not n_chars:
            return
        self.end += n_chars
        if self.runs and self.runs[-1][1] == label:
            self.runs[-1][0] = self.end
        else:
            self.runs.append([self.end, label])

    def take(self, stop: int) -> list[list]:
        """[[n_chars, label], ...] of the characters from the last read up to `stop`."""
        out, pos = [], self.start
        for end, label in self.runs:
            if pos >= stop:
                break
            if end > pos:
                out.append([min(end, stop) - pos, label])
                pos = min(end, stop)
        while self.runs and self.runs[0][0] <= stop:
            self.runs.popleft()
        self.start = stop
        return out


# ANSI colours by provenance: accepted draft tokens by position (greens; recycled from the target's own
# earlier predictions: magentas), correction, bonus
_POS = ["\033[38;5;46m", "\033[38;5;40m", "\033[38;5;34m", "\033[38;5;28m", "\033[38;5;22m"]
_RECYCLED = ["\033[38;5;207m", "\033[38;5;170m", "\033[38;5;133m", "\033[38;5;96m", "\033[38;5;89m"]
CORRECTION, BONUS, RESET = "\033[38;5;196m", "\033[38;5;33m", "\033[0m"


def provenance(m: int, n_acc: int, n_tokens: int) -> list[str]:
    """How each token of one step came: 'draft{i}', 'correction', 'bonus' or 'plain'."""
    kinds = [f"draft{i}" for i in range(min(n_acc, n_tokens))]
    if n_tokens > n_acc:
        kinds.append("plain" if m == 0 else ("bonus" if n_acc == m else "correction"))
    return kinds


def show_acceptance(g, prompt, max_new_tokens: int, temperature: float, seed, out, grammar=None) -> None:
    from edgespec.runtime.sampling import SamplingConfig

    ids = g.codec.encode(prompt)
    decoder = StreamDecoder(g.codec)
    eos = set(g.manifest.eos_token_ids)
    recycled = False
    for new in g.generate_ids(ids, max_new_tokens, SamplingConfig(temperature, seed=seed), grammar):
        m, n_acc = g.last_step
        n_kept = min(n_acc, len(new))
        runs = g.drafter.kept_sources(n_kept) if n_kept else ()
        sources = [src or g.drafter.name for n, src in runs for _ in range(n)]  # per kept draft
        for tok, kind in zip(new, provenance(m, n_acc, len(new)), strict=True):
            piece = decoder.push([] if int(tok) in eos else [tok])
            if kind.startswith("draft"):
                i = int(kind[5:])
                shades = _RECYCLED if i < len(sources) and sources[i] == "recycle" else _POS  # (forced: no source)
                recycled |= shades is _RECYCLED
                colour = shades[min(i, len(shades) - 1)]
            else:
                colour = {"correction": CORRECTION, "bonus": BONUS}.get(kind, "")
            out.write(f"{colour}{piece}{RESET if colour else ''}")
        out.flush()
    out.write(
        f"\n{_POS[0]}accepted draft{RESET} (darker = later position)  "
        + (f"{_RECYCLED[0]}recycled draft{RESET} (the target's own earlier prediction)  " if recycled else "")
        + f"{CORRECTION}target correction{RESET}  {BONUS}bonus{RESET}  plain = no draft\n"
    )
