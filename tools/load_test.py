"""A bounded load test of a running `edgespec serve`, on this machine only.

    edgespec serve --engine engines/smollm2-135m-instruct --port 8000 &
    python tools/load_test.py --clients 4 --seconds 20 [--stream] [--json out.json]

N client threads send chat requests back to back for M seconds (after a 503, each waits as
Retry-After says; requests in flight at the end finish), then it reports the count of 200 / 503 /
other answers and of connection errors, the latency p50 / p99 of the 200s (and time to first
token when streaming), and whether every 200 was complete: a finish_reason, usage with total =
prompt + completion, completion <= max_tokens, and = max_tokens when the finish reason is
"length"; streaming also needs the usage chunk and [DONE].
Only loopback addresses are accepted: this is not a tool for loading other people's servers.
Standard library only.
"""

from __future__ import annotations

import argparse
import http.client
import json
import math
import sys
import threading
import time
from urllib.parse import urlsplit

LOOPBACK = ("127.0.0.1", "localhost", "::1")
MAX_CLIENTS, MAX_SECONDS, MAX_TOKENS = 64, 600, 2048  # the bounds this tool stays within
PROMPTS = [
    "Write a Python function that checks whether a string is a palindrome.",
    "Explain in three sentences what a KV cache is.",
    "List five fruits and their colours.",
    "What is the capital of France? Answer in one word.",
    "Write a haiku about autumn.",
    "def fibonacci(n):",
]


def percentile(xs: list[float], q: float) -> float:
    """The q-quantile (0..1) by nearest rank; nan when empty."""
    if not xs:
        return float("nan")
    s = sorted(xs)
    return s[max(0, math.ceil(q * len(s)) - 1)]


def check_usage(usage, finish: str | None, max_tokens: int) -> str | None:
    """Why a 200's finish_reason / usage is incomplete or inconsistent, else None."""
    if finish not in ("stop", "length"):
        return f"finish_reason {finish!r}"
    if not isinstance(usage, dict):
        return "no usage"
    p, c, t = usage.get("prompt_tokens"), usage.get("completion_tokens"), usage.get("total_tokens")
    if not all(isinstance(x, int) for x in (p, c, t)) or p < 1 or not 1 <= c <= max_tokens or t != p + c:
        return f"usage {usage}"
    if finish == "length" and c != max_tokens:
        return f"finish_reason length after {c} of {max_tokens} tokens"
    return None


class Client(threading.Thread):
    def __init__(self, i: int, a, host: str, port: int, path: str, deadline: float, results: list, lock) -> None:
        super().__init__(daemon=True)
        self.i, self.a, self.host, self.port, self.path = i, a, host, port, path
        self.deadline, self.results, self.lock = deadline, results, lock

    def run(self) -> None:
        n = 0
        while time.monotonic() < self.deadline:
            prompt = PROMPTS[(self.i + n) % len(PROMPTS)]
            n += 1
            self.record(self.one(prompt))

    def record(self, row: dict) -> None:
        with self.lock:
            self.results.append(row)

    def one(self, prompt: str) -> dict:
        a = self.a
        body = {
            "messages": [{"role": "user", "content": prompt}],
            "max_tokens": a.max_tokens,
            "temperature": a.temperature,
            "stream": a.stream,
        }
        if a.stream:
            body["stream_options"] = {"include_usage": True}
        headers = {"Content-Type": "application/json"}
        if a.api_key:
            headers["Authorization"] = f"Bearer {a.api_key}"
        conn = http.client.HTTPConnection(self.host, self.port, timeout=a.timeout)
        t0 = time.perf_counter()
        try:
            conn.request("POST", self.path, json.dumps(body), headers)
            r = conn.getresponse()
            if r.status != 200:
                r.read()
                if r.status == 503:  # as a polite client does: wait as told (at most 5 s) before the next one
                    time.sleep(min(5.0, float(r.getheader("Retry-After") or 1)))
                return {"status": r.status, "s": time.perf_counter() - t0}
            if not a.stream:
                data = json.loads(r.read())
                choice = (data.get("choices") or [{}])[0]
                why = check_usage(data.get("usage"), choice.get("finish_reason"), a.max_tokens)
                return {
                    "status": 200,
                    "s": time.perf_counter() - t0,
                    "incomplete": why,
                    "tokens": (data.get("usage") or {}).get("completion_tokens", 0),
                }
            return self.read_stream(r, t0)
        except (OSError, http.client.HTTPException, ValueError) as e:
            return {"status": "error", "s": time.perf_counter() - t0, "error": f"{type(e).__name__}: {e}"}
        finally:
            conn.close()

    def read_stream(self, r, t0: float) -> dict:
        ttft, finish, usage, done = None, None, None, False
        for raw in r:
            line = raw.decode().strip()
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                done = True
                break
            chunk = json.loads(line[6:])
            if "error" in chunk:
                return {"status": 200, "s": time.perf_counter() - t0, "incomplete": f"error {chunk['error']}"}
            for c in chunk.get("choices", []):
                if ttft is None and c.get("delta", {}).get("content"):
                    ttft = time.perf_counter() - t0
                finish = c.get("finish_reason") or finish
            usage = chunk.get("usage") or usage
        why = check_usage(usage, finish, self.a.max_tokens) or (None if done else "no [DONE]")
        return {
            "status": 200,
            "s": time.perf_counter() - t0,
            "ttft": ttft,
            "incomplete": why,
            "tokens": (usage or {}).get("completion_tokens", 0),
        }


def summarize(rows: list[dict], seconds: float) -> dict:
    ok = [r for r in rows if r["status"] == 200]
    lat = [r["s"] for r in ok]
    ttft = [r["ttft"] for r in ok if r.get("ttft") is not None]
    bad = [r["incomplete"] for r in ok if r.get("incomplete")]
    return {
        "requests": len(rows),
        "ok_200": len(ok),
        "busy_503": sum(r["status"] == 503 for r in rows),
        "other_status": sum(r["status"] not in (200, 503, "error") for r in rows),
        "connection_errors": sum(r["status"] == "error" for r in rows),
        "incomplete_200": len(bad),
        "incomplete_examples": bad[:3],
        "latency_p50_s": percentile(lat, 0.5),
        "latency_p99_s": percentile(lat, 0.99),
        "ttft_p50_s": percentile(ttft, 0.5) if ttft else None,
        "ttft_p99_s": percentile(ttft, 0.99) if ttft else None,
        "wall_s": seconds,
        "completion_tokens_per_s": sum(r.get("tokens", 0) for r in ok) / seconds,
        "errors": sorted({r["error"] for r in rows if r["status"] == "error"})[:3],
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--url", default="http://127.0.0.1:8000", help="the server (loopback only)")
    p.add_argument("--clients", type=int, default=4, help=f"concurrent clients, 1..{MAX_CLIENTS} (default 4)")
    p.add_argument("--seconds", type=float, default=20, help=f"how long new requests are sent, <= {MAX_SECONDS}")
    p.add_argument("--max-tokens", type=int, default=64, help=f"max_tokens per request, 1..{MAX_TOKENS}")
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--stream", action="store_true", help="streaming requests (SSE, stream_options.include_usage)")
    p.add_argument("--api-key", help="Bearer key, when the server has one")
    p.add_argument("--timeout", type=float, default=120, help="seconds one request may take (default 120)")
    p.add_argument("--json", help="also write the summary here")
    a = p.parse_args(argv)
    u = urlsplit(a.url)
    if u.scheme != "http" or u.hostname not in LOOPBACK:
        print(
            f"load_test: {a.url}: only http on {', '.join(LOOPBACK)} is allowed (this machine's own server)",
            file=sys.stderr,
        )
        return 2
    if not (1 <= a.clients <= MAX_CLIENTS and 0 < a.seconds <= MAX_SECONDS and 1 <= a.max_tokens <= MAX_TOKENS):
        print(
            f"load_test: need 1 <= --clients <= {MAX_CLIENTS}, 0 < --seconds <= {MAX_SECONDS}, "
            f"1 <= --max-tokens <= {MAX_TOKENS}",
            file=sys.stderr,
        )
        return 2
    path = (u.path.rstrip("/") or "") + "/v1/chat/completions"
    results: list[dict] = []
    lock = threading.Lock()
    t0 = time.monotonic()
    clients = [Client(i, a, u.hostname, u.port or 80, path, t0 + a.seconds, results, lock) for i in range(a.clients)]
    for c in clients:
        c.start()
    for c in clients:
        c.join()
    s = summarize(results, time.monotonic() - t0)
    s["config"] = {
        "url": a.url,
        "clients": a.clients,
        "seconds": a.seconds,
        "max_tokens": a.max_tokens,
        "temperature": a.temperature,
        "stream": a.stream,
    }
    print(
        f"{s['requests']} requests in {s['wall_s']:.1f} s from {a.clients} clients: {s['ok_200']} x 200, "
        f"{s['busy_503']} x 503, {s['other_status']} other, {s['connection_errors']} connection errors; "
        f"{s['incomplete_200']} incomplete 200s"
    )
    print(
        f"latency of 200s: p50 {s['latency_p50_s']:.2f} s, p99 {s['latency_p99_s']:.2f} s"
        + (f"; TTFT p50 {s['ttft_p50_s']:.3f} s, p99 {s['ttft_p99_s']:.3f} s" if s["ttft_p50_s"] else "")
        + f"; {s['completion_tokens_per_s']:.1f} completion tok/s"
    )
    for ex in s["incomplete_examples"] + s["errors"]:
        print(f"  e.g. {ex}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(s, f, indent=1)
    return 1 if s["incomplete_200"] or s["other_status"] or s["connection_errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
