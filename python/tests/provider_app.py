"""A fake model API for the tests that follow a provider's per-dimension fields
(test_budget_follow.py), served by uvicorn in-process on loopback.

It keeps two GCRA buckets, requests and tokens, each `rate` per second with a burst of
`burst`, and admits a request when both conform. A request's JSON body says
`{"tokens": n}`, its estimate; the provider charges `used = n * 3 // 4` tokens (what it
reports as `usage.total_tokens`). A refusal is a 429 with a `Retry-After`. Every response
carries the buckets' state in the style it is told (`"openai"`: `x-ratelimit-*` with Go
durations; `"anthropic"`: `anthropic-ratelimit-*` with RFC 3339 instants; `"ietf"`: named
`RateLimit` policies). The first `hostile_count` requests are refused (429) with the
`hostile` pairs added.
"""

from __future__ import annotations

import asyncio
import datetime
import json
import socket
import threading
import time

import uvicorn

from asgi_calls import body_of


class Bucket:
    def __init__(self, rate: float, burst: int) -> None:
        self.interval = 1.0 / rate
        self.tau = burst * self.interval
        self.rate = rate
        self.burst = burst
        self.tat = 0.0

    def conforms(self, n: int, now: float) -> bool:
        return max(self.tat, now) + n * self.interval - self.tau <= now + 1e-9

    def charge(self, n: int, now: float) -> None:
        self.tat = max(self.tat, now) + n * self.interval

    def remaining(self, now: float) -> int:
        backlog = max(self.tat, now) - now
        return max(0, int((self.tau - backlog) / self.interval + 1e-9))

    def reset(self, now: float) -> float:
        """Seconds until the bucket is whole."""
        return max(0.0, self.tat - now)


def go_duration(seconds: float) -> str:
    ms = int(seconds * 1000)
    if ms < 1000:
        return f"{ms}ms"
    minutes, rest = divmod(ms, 60_000)
    text = f"{rest / 1000:g}s"
    return f"{minutes}m{text}" if minutes else text


def rfc3339(seconds_from_now: float) -> str:
    at = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(seconds=seconds_from_now)
    return at.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class Provider:
    """The fake API, its log, and the uvicorn server running it in a thread."""

    def __init__(self, style: str, rate: float, tokens: float, burst: int, token_burst: int):
        self.style = style
        self.requests = Bucket(rate, burst)
        self.tokens = Bucket(tokens, token_burst)
        self.lock = threading.Lock()
        self.log = []  # (arrival, status)
        self.hostile = []
        self.hostile_count = 0
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        self.port = sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}/v1/chat"
        config = uvicorn.Config(
            self.app, log_level="warning", access_log=False, lifespan="off", interface="asgi3"
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [sock]}, daemon=True
        )
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            assert time.monotonic() < deadline, "the provider did not start"
            time.sleep(0.01)

    def close(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)

    def refusals(self) -> int:
        return sum(1 for _, status in self.log if status == 429)

    def fields(self, now: float):
        r, t = self.requests, self.tokens
        pairs = []
        if self.style in ("openai", "anthropic"):
            # The field of each dimension's limit, remaining and reset, in each style.
            field, reset = {
                "openai": ("x-ratelimit-{what}-{name}", go_duration),
                "anthropic": ("anthropic-ratelimit-{name}-{what}", rfc3339),
            }[self.style]
            for name, b in (("requests", r), ("tokens", t)):
                pairs += [
                    (field.format(what="limit", name=name), str(int(b.rate * 60))),
                    (field.format(what="remaining", name=name), str(b.remaining(now))),
                    (field.format(what="reset", name=name), reset(b.reset(now))),
                ]
        else:
            state = ", ".join(
                f'"{name}";r={b.remaining(now)};t={int(b.reset(now) + 0.999)}'
                for name, b in (("requests", r), ("tokens", t))
            )
            # The rate per whole second (the draft's windows are whole seconds).
            policy = ", ".join(
                f'"{name}";q={int(b.rate)};w=1' for name, b in (("requests", r), ("tokens", t))
            )
            pairs += [("ratelimit", state), ("ratelimit-policy", policy)]
        return pairs

    async def app(self, scope, receive, send) -> None:
        body = await body_of(receive)
        try:
            estimate = int(json.loads(body or b"{}").get("tokens", 1))
        except (ValueError, AttributeError):
            estimate = 1
        used = estimate * 3 // 4
        now = time.monotonic()
        with self.lock:
            hostile = self.hostile_count > 0
            admitted = (
                not hostile
                and self.requests.conforms(1, now)
                and self.tokens.conforms(used, now)
            )
            if admitted:
                self.requests.charge(1, now)
                self.tokens.charge(used, now)
            pairs = self.fields(now)
            if not admitted:
                wait = max(
                    self.requests.tat + self.requests.interval - self.requests.tau,
                    self.tokens.tat + used * self.tokens.interval - self.tokens.tau,
                ) - now
                pairs.append(("retry-after", str(max(1, int(wait + 0.999)))))
            if hostile:
                self.hostile_count -= 1
                pairs = [p for p in pairs if p[0] != "retry-after"] + self.hostile
            status = 200 if admitted else 429
            self.log.append((now, status))
        payload = {"usage": {"total_tokens": used}} if admitted else {"error": "rate limited"}
        raw = json.dumps(payload).encode()
        headers = [(b"content-type", b"application/json")]
        headers += [(n.encode(), v.encode()) for n, v in pairs]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        # A little time to think, as a model does.
        await asyncio.sleep(0.005)
        await send({"type": "http.response.body", "body": raw})
