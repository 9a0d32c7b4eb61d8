"""A fake model API on loopback, for python/examples/model_api.py and
python/bench/model_api.py: it enforces requests per window, tokens per window and a cap
on concurrent calls, as providers do, and answers with the call's usage and the OpenAI
headers (``x-ratelimit-{limit,remaining,reset}-{requests,tokens}``).

Each limit is a bucket of one window's worth that refills continuously over the window
(the providers' description). A call's tokens are its prompt (the client's count off by
up to 10 %, either way: the client counts without the provider's tokenizer) plus a
completion of 30 % to 100 % of its ``max_tokens``, drawn when the call arrives and
charged then; a call the buckets or the cap cannot take gets ``429`` with
``retry-after`` and charges nothing. The server runs in a process of its own, so the
client's event loop cannot slow its clock.

``start(limits)`` starts it and returns its URL and a handle; ``GET /stats`` reports
what it accepted and refused; ``POST /reset`` starts the buckets and counts afresh.
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import random
import time
from dataclasses import asdict, dataclass
from typing import Dict, Tuple


@dataclass
class Limits:
    """What the fake API allows: ``requests`` and ``tokens`` per ``window`` seconds (each
    a bucket that size, refilling over the window), ``concurrency`` calls at once, and
    each call's latency drawn between ``latency`` bounds (seconds)."""

    requests: int = 30
    tokens: int = 3_000
    window: float = 0.5
    concurrency: int = 8
    latency: Tuple[float, float] = (0.005, 0.025)


class _Bucket:
    """GCRA: ``size`` per ``window``, a full bucket at once."""

    def __init__(self, size: int, window: float) -> None:
        self.interval = window / size
        self.tau = window
        self.tat = 0.0

    def wait(self, cost: int, now: float) -> float:
        """Seconds until ``cost`` fits (0: now)."""
        return max(0.0, max(self.tat, now) + cost * self.interval - self.tau - now)

    def take(self, cost: int, now: float) -> None:
        self.tat = max(self.tat, now) + cost * self.interval

    def remaining(self, now: float) -> int:
        return int(max(0.0, self.tau - (max(self.tat, now) - now)) / self.interval + 1e-9)

    def reset_in(self, now: float) -> float:
        return max(0.0, self.tat - now)


def _go_duration(seconds: float) -> str:
    """Seconds as OpenAI writes them: ``6m0s``, ``1.5s``, ``12ms``."""
    if seconds < 1.0:
        return f"{int(seconds * 1000)}ms"
    minutes, rest = divmod(seconds, 60.0)
    return f"{int(minutes)}m{rest:.0f}s" if minutes else f"{rest:.3g}s"


class _Api:
    def __init__(self, limits: Limits, seed: int) -> None:
        self.limits = limits
        self.rng = random.Random(seed)
        self.reset()

    def reset(self) -> None:
        lim = self.limits
        self.requests = _Bucket(lim.requests, lim.window)
        self.tokens = _Bucket(lim.tokens, lim.window)
        self.in_flight = 0
        self.stats: Dict[str, float] = dict(
            accepted=0, tokens=0, refused_requests=0, refused_tokens=0,
            refused_concurrency=0, most_in_flight=0, first=0.0, last=0.0,
        )

    def headers(self, now: float) -> Dict[str, str]:
        lim = self.limits
        # Limits per minute, as the provider states them.
        per_minute = 60.0 / lim.window
        return {
            "x-ratelimit-limit-requests": str(round(lim.requests * per_minute)),
            "x-ratelimit-remaining-requests": str(self.requests.remaining(now)),
            "x-ratelimit-reset-requests": _go_duration(self.requests.reset_in(now)),
            "x-ratelimit-limit-tokens": str(round(lim.tokens * per_minute)),
            "x-ratelimit-remaining-tokens": str(self.tokens.remaining(now)),
            "x-ratelimit-reset-tokens": _go_duration(self.tokens.reset_in(now)),
        }

    async def call(self, body: bytes) -> Tuple[int, Dict[str, str], dict]:
        request = json.loads(body)
        now = time.monotonic()
        prompt = max(1, round(request["prompt_tokens"] * self.rng.uniform(0.9, 1.1)))
        completion = round(request["max_tokens"] * self.rng.uniform(0.3, 1.0))
        total = prompt + completion
        stats = self.stats
        if self.in_flight >= self.limits.concurrency:
            stats["refused_concurrency"] += 1
            return 429, {"retry-after": "1", **self.headers(now)}, {"error": "concurrency"}
        wait_r, wait_t = self.requests.wait(1, now), self.tokens.wait(total, now)
        if wait_r > 0.0 or wait_t > 0.0:
            stats["refused_requests" if wait_r >= wait_t else "refused_tokens"] += 1
            retry = max(wait_r, wait_t)
            return 429, {"retry-after": f"{retry:.3f}", **self.headers(now)}, {"error": "rate"}
        self.requests.take(1, now)
        self.tokens.take(total, now)
        stats["accepted"] += 1
        stats["tokens"] += total
        stats["first"] = stats["first"] or now
        stats["last"] = now
        self.in_flight += 1
        stats["most_in_flight"] = max(stats["most_in_flight"], self.in_flight)
        try:
            await asyncio.sleep(self.rng.uniform(*self.limits.latency))
        finally:
            self.in_flight -= 1
        usage = dict(prompt_tokens=prompt, completion_tokens=completion, total_tokens=total)
        return 200, self.headers(time.monotonic()), {"usage": usage}

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                method, path, _ = lines[0].split(" ", 2)
                length = 0
                for line in lines[1:]:
                    name, _, value = line.partition(":")
                    if name.strip().lower() == "content-length":
                        length = int(value)
                body = await reader.readexactly(length) if length else b""
                if path == "/stats":
                    status, headers, payload = 200, {}, dict(self.stats, now=time.monotonic())
                elif path == "/reset" and method == "POST":
                    self.reset()
                    status, headers, payload = 200, {}, {}
                else:
                    status, headers, payload = await self.call(body)
                data = json.dumps(payload).encode()
                reason = "OK" if status == 200 else "Too Many Requests"
                out = [f"HTTP/1.1 {status} {reason}", "content-type: application/json",
                       f"content-length: {len(data)}"]
                out += [f"{k}: {v}" for k, v in headers.items()]
                writer.write(("\r\n".join(out) + "\r\n\r\n").encode() + data)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


def _run(limits: dict, seed: int, ready: "multiprocessing.Queue[int]") -> None:
    limits["latency"] = tuple(limits["latency"])
    api = _Api(Limits(**limits), seed)

    async def main() -> None:
        server = await asyncio.start_server(api.serve, "127.0.0.1", 0, backlog=2048)
        ready.put(server.sockets[0].getsockname()[1])
        async with server:
            await server.serve_forever()

    asyncio.run(main())


def start(limits: Limits, seed: int = 7) -> Tuple[str, multiprocessing.Process]:
    """Starts the fake API in a process of its own; returns its URL and the process
    (``terminate()`` it when done)."""
    ready: "multiprocessing.Queue[int]" = multiprocessing.Queue()
    process = multiprocessing.Process(target=_run, args=(asdict(limits), seed, ready), daemon=True)
    process.start()
    port = ready.get(timeout=30)
    return f"http://127.0.0.1:{port}", process
