"""Calling an API that limits you: 300 calls from 30 tasks to an upstream that allows 50
per second (bursts of 10) and answers 429 with Retry-After and the IETF RateLimit fields,
by a client configured for 100 per second. First with paceline.httpx, which follows what
the upstream says for every task at once; then with aiolimiter, which does not listen, so
each task retries on its own after the Retry-After it got.

    pip install ./python httpx uvicorn aiolimiter; python python/examples/upstream.py
"""

import asyncio
import math
import socket
import threading
import time

import aiolimiter
import httpx
import uvicorn

import paceline
import paceline.httpx

CALLS, TASKS = 300, 30


def upstream_app():
    """An API that allows 50 per second, bursts of 10, and says so."""
    limiter = paceline.Limiter(50, per=1.0, burst=10)

    async def app(scope, receive, send):
        if scope["type"] != "http":
            return
        headers = [(b"ratelimit-policy", b'"default";q=50;w=1')]
        if limiter.try_acquire():
            status = 200
        else:
            status = 429
            headers.append((b"retry-after", str(max(1, math.ceil(limiter.wait_time()))).encode()))
        reset = max(1, math.ceil(limiter.wait_time(10)))
        headers.append((b"ratelimit", f'"default";r={limiter.remaining()};t={reset}'.encode()))
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": b"ok"})

    return app


async def job(client, before_call, after_refusal):
    """CALLS calls from TASKS tasks; each retries a refused call. Returns 429s seen and
    the rate of successful calls."""
    refused = 0
    successes = []

    async def task():
        nonlocal refused
        for _ in range(CALLS // TASKS):
            while True:
                await before_call()
                response = await client.get(URL)
                if response.status_code != 429:
                    successes.append(time.monotonic())
                    break
                refused += 1
                await after_refusal(response)

    await asyncio.gather(*(task() for _ in range(TASKS)))
    span = max(successes) - min(successes)
    return refused, (len(successes) - 1) / span


async def with_paceline():
    limiter = paceline.Limiter(100, per=1.0, burst=1)
    # The transport waits each call's turn and follows every response; it also retries a
    # 429 itself, which the job would count if any came back to it.
    transport = paceline.httpx.AsyncTransport(limiter, retries=0)
    async with httpx.AsyncClient(transport=transport) as client:

        async def nothing(*_):
            return None

        return await job(client, nothing, nothing)


async def with_aiolimiter():
    limiter = aiolimiter.AsyncLimiter(100, 1)
    async with httpx.AsyncClient() as client:

        async def after_refusal(response):
            await asyncio.sleep(float(response.headers.get("retry-after", "1")))

        return await job(client, limiter.acquire, after_refusal)


def main():
    global URL
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    URL = f"http://127.0.0.1:{port}/"
    server = uvicorn.Server(uvicorn.Config(upstream_app(), port=port, log_level="warning"))
    threading.Thread(target=server.run, daemon=True).start()
    while not server.started:
        time.sleep(0.05)
    print(f"{CALLS} calls from {TASKS} tasks, client configured for 100/s, upstream allows 50/s")
    for name, run in (("paceline.httpx", with_paceline), ("aiolimiter", with_aiolimiter)):
        time.sleep(1.0)  # the upstream's burst back between the two
        t0 = time.monotonic()
        refused, rate = asyncio.run(run())
        print(
            f"{name:15s} 429s seen: {refused:4d} ({100 * refused / CALLS:5.1f} % of calls)"
            f"   achieved rate: {rate:5.1f}/s   total {time.monotonic() - t0:5.1f} s"
        )
    server.should_exit = True


if __name__ == "__main__":
    main()
