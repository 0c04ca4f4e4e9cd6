"""What llguidance compiles: a JSON Schema, Lark grammar or regex checked into a `Grammar` (one
line of the library's reason when it cannot be), and the tokenizer view its matchers read. The
token-level constraint that runs a grammar inside the loop is constrain.py.

llguidance is the `structured` extra; every call into it runs on one thread with a large stack
(`_deep`), and its failures, Rust panics included, come back as GrammarError.
"""

from __future__ import annotations

import json
import os
import re
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

INSTALL_HINT = "pip install 'edgespec[structured]'"
# JSON as one line, spaced like Python's json.dumps: the separators are then forced tokens, and a
# small model cannot wander off into whitespace. A schema's own "x-guidance" options override it.
JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
KINDS = ("json_schema", "json_object", "lark", "regex")

_SOURCE_LINE = re.compile(r"^\s*(\d+ \|.*|\^+)\s*$")  # a grammar error's quoted source line or caret
# where llguidance's matcher errors append its parser state ("<state>...", or "<non-verbose/>" with
# verbose_errors off): internal detail, never shown to a client
_STATE_DUMP = re.compile(r"^\s*<(state|non-verbose)\b")
# llguidance's resource limits, for validation and every matcher (LLParserLimits; defaults otherwise).
# initial_lexer_fuel bounds how far one step walks a forced run: at the default (1e6) a regex like
# (((a{100}){100}){100}) holds the GIL for over a second on its first token before it fails anyway
# (200k: ~0.1 s; JSON schemas and the tests' grammars use a few thousand). verbose_errors off: no
# parser state in error messages.
LEXER_FUEL = 200_000
# llguidance compiles a Lark grammar recursing once per nested rule (~3 KB of stack each): a chain of
# ~2,700 rules (r0: r1, r1: r2, ...) overflows an 8 MiB stack, ~650 a 2 MiB thread stack, and the
# process dies (SIGSEGV: no exception to catch). So grammars are compiled on one thread with a large
# stack (`_deep`), and a Lark grammar may define at most MAX_LARK_RULES rules and terminals (a chain
# cannot be deeper than that): 4x under what DEEP_STACK holds, far above hand-written grammars.
DEEP_STACK = 64 << 20
MAX_LARK_RULES = 5_000
_DEFINITION = re.compile(r"^[ \t]*[?!]?[A-Za-z_][A-Za-z0-9_]*(\.-?\d+)?[ \t]*:", re.M)  # a Lark rule or terminal
_deep_pool: ThreadPoolExecutor | None = None
_deep_lock = threading.Lock()


def _forget_deep_pool() -> None:  # a forked child has no grammar thread: it makes its own
    global _deep_pool, _deep_lock
    _deep_pool, _deep_lock = None, threading.Lock()


os.register_at_fork(after_in_child=_forget_deep_pool)
HINT = "shorten long repetitions, split rules with thousands of alternatives, give each recursive rule a base case"


class GrammarError(ValueError):
    """A JSON Schema, grammar or regex that cannot constrain the output (the library's reason)."""


def llguidance_module():
    try:
        import llguidance
    except ImportError:
        raise GrammarError(f"structured output needs llguidance, which is not installed: {INSTALL_HINT}") from None
    return llguidance


def call_library(kind: str, fn, *args, **kwargs):
    """fn(*args, **kwargs) of llguidance on the grammar thread (`_deep`), its failures as
    GrammarError: its errors, and a panic of its Rust code (which pyo3 raises as PanicException, a
    BaseException)."""
    try:
        return _deep(fn, *args, **kwargs)
    except (ValueError, TypeError, RecursionError) as e:
        raise GrammarError(f"{kind}: {one_line(str(e))}") from None
    except BaseException as e:
        if type(e).__name__ != "PanicException":
            raise
        raise GrammarError(f"{kind}: llguidance failed on it ({one_line(str(e))[:200]})") from None


def _deep(fn, *args, **kwargs):
    """fn(*args, **kwargs) on the grammar thread (DEEP_STACK of stack; made at the first call).
    llguidance drops the GIL while it compiles, so the thread hop costs ~0.1 ms and no parallelism."""
    global _deep_pool
    with _deep_lock:
        if _deep_pool is None:
            old = threading.stack_size(DEEP_STACK)  # process-wide, for threads started meanwhile too
            try:
                pool = ThreadPoolExecutor(1, thread_name_prefix="edgespec-grammar")
                pool.submit(int).result()  # its one thread starts now, with the large stack
            finally:
                threading.stack_size(old)
            _deep_pool = pool
    return _deep_pool.submit(fn, *args, **kwargs).result()


def one_line(msg: str) -> str:
    """llguidance's message as one line: no quoted source lines or carets, nothing from its state dump on."""
    lines = []
    for s in msg.splitlines():
        if _STATE_DUMP.match(s):
            break
        if s.strip() and not _SOURCE_LINE.match(s):
            lines.append(s.strip())
    return " ".join(lines)[:300]


def parser_limits():
    return llguidance_module().LLParserLimits(initial_lexer_fuel=LEXER_FUEL, verbose_errors=False)


def label(kind: str) -> str:
    """How an error names the constraint: the request's own word for it."""
    return "grammar" if kind == "lark" else kind


@dataclass(frozen=True)
class Grammar:
    """A checked output constraint: llguidance's grammar text and what it was made from."""

    text: str  # the grammar as llguidance's LLMatcher takes it
    kind: str  # json_schema | json_object | lark | regex


def grammar_from(
    json_schema=None, grammar: str | None = None, regex: str | None = None, strict: bool = True
) -> Grammar | None:
    """The Grammar of at most one of: a JSON Schema (dict, or its JSON text), a Lark grammar
    (llguidance's dialect), a regex. None when none is given. strict=False ignores JSON Schema
    keywords the library does not implement instead of refusing them (OpenAI's strict: false).
    Raises GrammarError (one line, the library's reason)."""
    given = [
        name for name, v in (("json_schema", json_schema), ("grammar", grammar), ("regex", regex)) if v is not None
    ]
    if not given:
        return None
    if len(given) > 1:
        raise GrammarError(f"give one output constraint, not {' and '.join(given)}")
    llg = llguidance_module()
    if json_schema is not None:
        kind = "json_schema"
        options = JSON_OPTIONS | {"lenient": not strict}
        text = call_library(kind, llg.LLMatcher.grammar_from_json_schema, _schema_text(json_schema), defaults=options)
    elif grammar is not None:
        if not isinstance(grammar, str) or not grammar.strip():
            raise GrammarError("grammar must be a non-empty Lark grammar string")
        n_rules = len(_DEFINITION.findall(grammar))
        if n_rules > MAX_LARK_RULES:
            raise GrammarError(
                f"grammar: {n_rules} rules and terminals, over the {MAX_LARK_RULES} llguidance can compile "
                "safely (its compiler recurses once per nested rule): merge rules, or use a regex terminal"
            )
        kind, text = "lark", llg.LLMatcher.grammar_from_lark(grammar)
    else:
        if not isinstance(regex, str):
            raise GrammarError(f"regex must be a string, got {type(regex).__name__}")
        kind, text = "regex", llg.LLMatcher.grammar_from_regex(regex)
    is_error, msgs = call_library(
        kind, llg.LLMatcher.validate_grammar_with_warnings, text, None, limits=parser_limits()
    )
    if is_error:
        raise GrammarError(f"{label(kind)}: {one_line(msgs[0])}")
    return Grammar(text, kind)


def _schema_text(json_schema) -> str:
    """A JSON Schema (a dict, or its JSON text) as the JSON text llguidance reads. As text:
    llguidance's parser of JSON text stops at 128 levels, its reader of a dict recurses without a
    limit (a dict 20,000 levels deep kills the process)."""
    failed = "is not JSON"  # what went wrong if the next conversion fails
    try:
        if isinstance(json_schema, str):
            json_schema = json.loads(json_schema)
        failed = "cannot be written as JSON"
        if isinstance(json_schema, dict):
            return json.dumps(json_schema)
    except (ValueError, TypeError, RecursionError) as e:
        raise GrammarError(f"json_schema {failed}: {e}") from None
    raise GrammarError(f"json_schema must be a JSON object (a schema), got {type(json_schema).__name__}")


def json_object() -> Grammar:
    """Any JSON object (OpenAI's response_format json_object)."""
    return Grammar(grammar_from(json_schema={"type": "object"}).text, "json_object")


class TokenTable:
    """What llguidance's TokenizerWrapper reads, for a tokenizer it cannot load by itself (no
    byte-level or byte-fallback decoder): each token's bytes, its special ids, an encoder."""

    def __init__(self, tokens: list[bytes], eos: int, special: list[int], encode) -> None:
        self.tokens, self.eos_token_id, self.bos_token_id = tokens, eos, None
        self.special_token_ids, self._encode = special, encode

    def __call__(self, text) -> list[int]:
        return self._encode(text.decode("utf-8", "replace") if isinstance(text, bytes) else text)


def grammar_tokenizer(tokenizer, vocab_size: int, eos_ids):
    """llguidance's view of a `tokenizers` Tokenizer (no transformers): its own reader of the
    tokenizer.json, else a token-by-token table made by decoding each id alone."""
    llg = llguidance_module()
    eos = [int(i) for i in eos_ids]
    try:
        return llg.LLTokenizer(tokenizer.to_str(), n_vocab=vocab_size, eos_token=eos)
    except ValueError:
        n = tokenizer.get_vocab_size(with_added_tokens=True)
        special = sorted({i for i, t in tokenizer.get_added_tokens_decoder().items() if t.special} | set(eos))
        table = TokenTable(
            [tokenizer.decode([i], skip_special_tokens=False).encode() for i in range(n)],
            eos[0],
            special,
            lambda s: tokenizer.encode(s, add_special_tokens=False).ids,
        )
        return llg.LLTokenizer(llg.TokenizerWrapper(table), n_vocab=vocab_size, eos_token=eos)
