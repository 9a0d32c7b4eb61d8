"""Calling a model API with paceline.Budget: requests per window, tokens per window and
calls in flight, in one first-come-first-served turn, each call's tokens settled from
its response.

Starts a fake model API on loopback (python/examples/fake_model_api.py: 60 requests/s,
6 000 tokens/s, 8 calls at once, each a bucket of half a second's worth; usage and the
OpenAI ``x-ratelimit-*`` headers in every answer) and sends it 250 calls from 40 tasks.
A call books its prompt plus ``max_tokens`` and settles what the response says it used.
Prints progress each second, then the achieved rates against each limit and the share
refused. Runs in about 10 s::

    python python/examples/model_api.py
"""

import asyncio
import random
import time

import httpx

import paceline
from fake_model_api import Limits, start

LIMITS = Limits(requests=30, tokens=3_000, window=0.5, concurrency=8)
CALLS = 250
TASKS = 40
MAX_TOKENS = 200


async def main() -> None:
    url, server = start(LIMITS)
    budget = paceline.Budget(
        requests=paceline.Rate(LIMITS.requests, per=LIMITS.window),
        tokens=paceline.Rate(LIMITS.tokens, per=LIMITS.window),
        in_flight=LIMITS.concurrency,
    )
    rng = random.Random(1)
    jobs = [rng.randint(50, 150) for _ in range(CALLS)]  # prompt tokens, as we count them
    done = {"calls": 0, "tokens": 0, "refused": 0}

    async def worker(client: httpx.AsyncClient) -> None:
        while jobs:
            prompt = jobs.pop()
            while True:
                async with budget.acquire(tokens=prompt + MAX_TOKENS) as turn:
                    response = await client.post(
                        f"{url}/v1/chat/completions",
                        json={"prompt_tokens": prompt, "max_tokens": MAX_TOKENS},
                    )
                    if response.status_code == 429:
                        # Refused: we were ahead of the API's clock. Keep the charge
                        # (release, not settle), which puts the budget behind it again.
                        turn.release()
                        done["refused"] += 1
                        continue
                    used = response.json()["usage"]["total_tokens"]
                    turn.settle(tokens=used)
                done["calls"] += 1
                done["tokens"] += used
                break

    print(
        f"fake model API at {url}: {LIMITS.requests} requests and {LIMITS.tokens} tokens "
        f"per {LIMITS.window} s, {LIMITS.concurrency} calls at once"
    )
    print(f"{CALLS} calls from {TASKS} tasks, each booking its prompt + {MAX_TOKENS} tokens")

    async def progress(t0: float) -> None:
        while True:
            await asyncio.sleep(1.0)
            print(
                f"  {time.monotonic() - t0:4.1f} s: {done['calls']:3d} calls, "
                f"{done['tokens']:6d} tokens, {done['refused']} refused"
            )

    limits = httpx.Limits(max_connections=TASKS, max_keepalive_connections=TASKS)
    async with httpx.AsyncClient(limits=limits) as client:
        t0 = time.monotonic()
        ticker = asyncio.ensure_future(progress(t0))
        await asyncio.gather(*(worker(client) for _ in range(TASKS)))
        elapsed = time.monotonic() - t0
        ticker.cancel()
        stats = (await client.get(f"{url}/stats")).json()
    server.terminate()

    rate_r = LIMITS.requests / LIMITS.window
    rate_t = LIMITS.tokens / LIMITS.window
    # What the API allowed over the run: a full bucket, plus the rate for its length.
    allowed_r = LIMITS.requests + rate_r * elapsed
    allowed_t = LIMITS.tokens + rate_t * elapsed
    sent = done["calls"] + done["refused"]
    print(f"{done['calls']} calls finished in {elapsed:.2f} s")
    print(
        f"requests: {done['calls'] / elapsed:6.1f}/s   (limit {rate_r:.0f}/s; "
        f"{100 * done['calls'] / allowed_r:5.1f} % of what the API allowed)"
    )
    print(
        f"tokens:   {done['tokens'] / elapsed:6.0f}/s   (limit {rate_t:.0f}/s; "
        f"{100 * done['tokens'] / allowed_t:5.1f} % of what the API allowed)"
    )
    print(
        f"in flight at most: {stats['most_in_flight']:.0f}   (limit {LIMITS.concurrency})"
    )
    print(f"refused: {done['refused']} of {sent} calls ({100 * done['refused'] / sent:.1f} %)")


if __name__ == "__main__":
    asyncio.run(main())
