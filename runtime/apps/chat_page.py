"""The chat page `edgespec serve` answers at `/`: one self-contained HTML file (chat.html:
inline CSS and vanilla JS, no CDN, no remote font: the machines it runs on are offline). It talks
to the server's own API: /admin/speculation for the drafters, k and trees the folder offers,
/v1/chat/completions (stream=true) for the answer, whose chunks carry each piece's origins (the
`edgespec` extension field, server_worker.progress) so drafted tokens the target kept are coloured.
"""

from __future__ import annotations

from functools import cache
from importlib.resources import files

# nothing may load from elsewhere: inline script and style, fetches to this server only; and no other
# site may frame the page (clickjacking: a hidden frame whose Send button a visitor is lured to click)
PAGE_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
    "connect-src 'self'; img-src data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
    "X-Frame-Options": "DENY",  # frame-ancestors for browsers that predate it
    "X-Content-Type-Options": "nosniff",
    "Cache-Control": "no-cache",
}

# how a program opens the page in a headless Chromium (the page's tests, tools/chat_screenshot.py): as root
# in a container, so no sandbox; nothing that reaches out (updates, sync, QUIC probes)
HEADLESS_CHROMIUM = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
)


@cache
def chat_page() -> str:
    """The page's HTML (package data of edgespec.runtime.apps)."""
    return files("edgespec.runtime.apps").joinpath("chat.html").read_text(encoding="utf-8")
