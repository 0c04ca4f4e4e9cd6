"""`edgespec serve`'s settings (ServeConfig: its fields are the command's flags, edgespec/cli_fields.py)
and the host and origin names it allows. Imports nothing of the server itself (no starlette): the CLI
builds its parser from here."""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass, field

# names this machine's own pages and clients reach the server by, whatever --host is
LOCAL_HOSTS = ("localhost", "127.0.0.1", "::1")
# bind addresses on every interface: the Host a client sends is then whatever name it used for the
# machine, so only Origin is checked (ServeConfig.allow_origin)
ANY_ADDRESS = ("0.0.0.0", "::", "")


def tcp_port(text: str) -> int:
    """argparse type: a TCP port, 0..65535 (0: any free port)."""
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number (0..65535)") from None
    if not 0 <= n <= 65535:
        raise argparse.ArgumentTypeError(f"{n} is outside 0..65535")
    return n


@dataclass(frozen=True)
class ServeConfig:
    host: str = field(  # loopback by default: a single-user local server
        default="127.0.0.1", metadata={"help": "bind address (default %(default)s: this machine only)"}
    )
    port: int = field(default=8000, metadata={"help": "TCP port, 0..65535 (default %(default)s)", "type": tcp_port})
    queue_size: int = field(  # requests waiting behind the running one
        default=8, metadata={"help": "waiting requests before 503 (default %(default)s)"}
    )
    model_name: str = field(  # reported by /v1/models
        default="", metadata={"help": "id reported to clients (default: the folder name)"}
    )
    strict_model: bool = field(  # False: any model name a client sends is this folder (editors send their own)
        default=False,
        metadata={
            "help": "refuse (404) a request whose 'model' is not the served name; by default any name is "
            "taken and answered by this folder, as llama.cpp's server does"
        },
    )
    max_tokens_default: int = 256  # when a request gives no max_tokens
    api_key: str | None = field(  # None: open
        default=None,
        metadata={
            "help": "require 'Authorization: Bearer KEY' on /v1/* and /admin/* (/health and /metrics stay "
            "open; default: $EDGESPEC_API_KEY, else no key)",
            "env": "EDGESPEC_API_KEY",
        },
    )
    max_body_bytes: int = field(  # refused before they are parsed
        default=1 << 20,
        metadata={"help": "larger request bodies get HTTP 413 before they are read (default %(default)s)"},
    )
    max_prompt_tokens: int = field(
        default=0,
        metadata={"help": "longest prompt taken, in tokens (default %(default)s: the engine's context less one)"},
    )
    shadow_rate: float = field(
        default=0.0,
        metadata={
            "help": "quality watch: re-run this fraction (0..1) of greedy speculative requests with plain "
            "decoding when the server is idle and compare the ids (/metrics edgespec:shadow_*; a mismatch "
            "is logged with the request id). Default 0 = off"
        },
    )
    shadow_seed: int | None = None  # seeds which requests get a shadow check (tests)
    # browser origins allowed to call the API besides this machine's own names; their hosts join the
    # allowed Host names, and they get CORS headers
    allow_origin: tuple[str, ...] = field(
        default=(),
        metadata={
            "help": "a browser origin (scheme://host[:port], repeatable) whose pages may call the API; by "
            "default only pages from this machine's names (localhost, 127.0.0.1, [::1], --host) may, a foreign "
            "Origin or Host gets 403 and a body that is not application/json 415, with or without --api-key",
            "action": "append",
            "metavar": "ORIGIN",
        },
    )

    def check(self) -> None:
        if not 0.0 <= self.shadow_rate <= 1.0 or not math.isfinite(self.shadow_rate):
            raise ValueError(f"--shadow-rate {self.shadow_rate}: give a fraction in [0, 1] (0 = off)")
        if self.max_body_bytes < 1024 or self.max_prompt_tokens < 0 or self.queue_size < 1:
            raise ValueError(
                f"--max-body-bytes {self.max_body_bytes} (>= 1024), --max-prompt-tokens "
                f"{self.max_prompt_tokens} (>= 0, 0 = the context), --queue-size {self.queue_size} "
                "(>= 1; Python's 0 would mean unbounded): one is out of range"
            )
        if self.api_key is not None and (not self.api_key or not self.api_key.isascii()):
            raise ValueError("--api-key must be a non-empty ASCII string")
        for origin in self.allow_origin:
            if origin_host(origin) is None or origin != origin.strip().lower().rstrip("/"):
                raise ValueError(
                    f"--allow-origin {origin!r}: give an origin as a browser sends it, scheme://host[:port] in "
                    "lower case with no path, e.g. http://myhost.lan:8000"
                )

    def origins(self) -> frozenset[str]:
        """The Origin headers allowed as given (--allow-origin), besides origin_hosts() on any port."""
        return frozenset(o.rstrip("/") for o in self.allow_origin)

    def origin_hosts(self) -> frozenset[str]:
        """Hosts whose pages, on any port, may call the API: this machine's names and the bound one
        (not a wildcard address: a page reached by a LAN name is then allowed by --allow-origin only)."""
        bound = self.host.strip().lower().strip("[]")
        return frozenset(LOCAL_HOSTS) | ({bound} if bound not in ANY_ADDRESS else set())

    def hosts(self) -> frozenset[str] | None:
        """The Host names this server answers to (None: any, when bound to every interface)."""
        if self.host.strip().lower().strip("[]") in ANY_ADDRESS:
            return None
        return self.origin_hosts() | {origin_host(o) for o in self.allow_origin}


def host_name(netloc: str) -> str | None:
    """The host of `host[:port]` or `[v6]:port`, lower case without brackets; None when malformed."""
    netloc = netloc.strip().lower()
    if netloc.startswith("["):
        host, _, port = netloc[1:].partition("]")
        if port and not (port[0] == ":" and port[1:].isdigit()):
            return None
        return host or None
    host, _, port = netloc.partition(":")
    return host if host and (not port or port.isdigit()) else None


def origin_host(origin: str) -> str | None:
    """The host of an Origin header (`scheme://host[:port]`, http or https); None otherwise (`null`)."""
    scheme, sep, rest = origin.strip().lower().partition("://")
    if scheme not in ("http", "https") or not sep or "/" in rest.rstrip("/") or "@" in rest:
        return None
    return host_name(rest.rstrip("/"))
