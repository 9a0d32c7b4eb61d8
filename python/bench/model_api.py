"""A model API's limits from the client side: paceline.Budget beside its peers, same run.

The fake API of python/examples/fake_model_api.py (its own process, on loopback)
allows 60 requests/s and 6 000 tokens/s, each a bucket of half a second's worth, and 8
calls at once; a call's latency is 5-25 ms. Each call books its prompt (counted by the
client, off by up to 10 % either way) plus ``max_tokens`` = 200; it uses 30-100 % of
that completion. So tokens bind (about 26 calls/s), and a call's real cost is known only
from its response. Each contender sends CALLS calls from 1, 10, 100 and 500 tasks; a
refused call (429) waits its ``retry-after`` and is sent again, in every contender.

* paceline.Budget: requests, tokens and in flight in one turn, settled from the usage
  (a refused call is released, keeping its charge);
* the same budget configured at twice the API's limits, following the limits and
  counts the API's fields announce (``Budget.follow``, what the httpx transports do);
* the same budget in a file shared by 4 processes (``Budget.shared``), each sending a
  quarter of the calls from a quarter of the tasks;
* the same budget in Redis shared by 4 processes (``paceline.redis.RedisBudget``, a
  ``redis-server`` of its own on loopback; skipped where none is installed);
* aiolimiter on requests only (deaf to tokens and concurrency);
* a token pre-counting limiter that never settles: aiolimiter for requests, aiolimiter
  for tokens charged the estimate, and a semaphore for the calls in flight;
* a semaphore and a per-second limiter on requests (aiometer's model:
  ``max_at_once`` + ``max_per_second``), written out so it runs with the same tasks.

For each, the binding dimension's (tokens') achieved share of what the API allowed over
the run (a full bucket plus the rate for the run's length) and the share of calls
refused. ``python python/bench/model_api.py [calls] [contender...]``: with names, only the
contenders whose names contain one of them (``paceline``: paceline's rows alone).
"""

import asyncio
import os
import random
import sys
import time
import multiprocessing
import shutil
import socket
import subprocess
import tempfile
from typing import Awaitable, Callable, Dict, List, Optional

import httpx
from aiolimiter import AsyncLimiter

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))

import paceline  # noqa: E402
from fake_model_api import Limits, start  # noqa: E402

LIMITS = Limits(requests=30, tokens=3_000, window=0.5, concurrency=8, latency=(0.005, 0.025))
MAX_TOKENS = 200
TASKS = (1, 10, 100, 500)

# A contender: given the call (which posts and returns the response), runs one job.
Send = Callable[[int], Awaitable[httpx.Response]]


async def backoff(response: httpx.Response) -> None:
    await asyncio.sleep(float(response.headers.get("retry-after", "1")))


Job = Callable[[Send, int, Dict[str, int]], Awaitable[None]]


def until_admitted(attempt: Callable[[Send, int], Awaitable[httpx.Response]]) -> Job:
    """A contender's job: ``attempt(send, prompt)`` (its wait, then the call) again until
    the API answers other than 429, each refusal counted and backed off as it says."""

    async def job(send: Send, prompt: int, count: Dict[str, int]) -> None:
        while True:
            response = await attempt(send, prompt)
            if response.status_code != 429:
                return
            count["refused"] += 1
            await backoff(response)

    return job


def budget_job(
    scale: int = 1, follow: bool = False, path: Optional[str] = None
) -> Job:
    """A paceline.Budget at ``scale`` times the API's limits; with ``follow``, steered by
    the limits and counts the API's fields announce (``Budget.follow``, as the httpx
    transports do); with ``path``, the budget of that file (``Budget.shared``), or, for a
    ``redis://`` URL, the budget of that Redis (``paceline.redis.RedisBudget``)."""
    rates = dict(
        requests=paceline.Rate(scale * LIMITS.requests, per=LIMITS.window),
        tokens=paceline.Rate(scale * LIMITS.tokens, per=LIMITS.window),
        in_flight=LIMITS.concurrency,
    )
    if path is None:
        budget = paceline.Budget(**rates)
    elif path.startswith("redis://"):
        from redis.asyncio import Redis
        from paceline.redis import RedisBudget

        url, name = path.rsplit("#", 1)
        budget = RedisBudget(Redis.from_url(url), name, **rates)
    else:
        budget = paceline.Budget.shared(path, on_mismatch="adopt", **rates)

    async def attempt(send: Send, prompt: int) -> httpx.Response:
        async with budget.acquire(tokens=prompt + MAX_TOKENS) as turn:
            response = await send(prompt)
            if follow:
                budget.follow(response.status_code, response.headers.raw)
            if response.status_code != 429:
                turn.settle(tokens=response.json()["usage"]["total_tokens"])
            else:
                turn.release()
        return response

    job = until_admitted(attempt)

    async def warm() -> None:
        if hasattr(budget, "in_flight") and asyncio.iscoroutinefunction(budget.in_flight):
            await budget.in_flight()

    job.warm = warm  # type: ignore[attr-defined]
    return job


def aiolimiter_requests() -> Job:
    requests = AsyncLimiter(LIMITS.requests, LIMITS.window)

    async def attempt(send: Send, prompt: int) -> httpx.Response:
        async with requests:
            return await send(prompt)

    return until_admitted(attempt)


def precounting() -> Job:
    requests = AsyncLimiter(LIMITS.requests, LIMITS.window)
    tokens = AsyncLimiter(LIMITS.tokens, LIMITS.window)
    in_flight = asyncio.Semaphore(LIMITS.concurrency)

    async def attempt(send: Send, prompt: int) -> httpx.Response:
        async with in_flight:
            await requests.acquire()
            await tokens.acquire(prompt + MAX_TOKENS)
            return await send(prompt)

    return until_admitted(attempt)


def semaphore_per_second() -> Job:
    """aiometer's model: at most ``max_at_once`` running, starts spaced by
    ``1 / max_per_second`` (no burst)."""
    in_flight = asyncio.Semaphore(LIMITS.concurrency)
    interval = LIMITS.window / LIMITS.requests
    next_start = [0.0]

    async def attempt(send: Send, prompt: int) -> httpx.Response:
        async with in_flight:
            now = time.monotonic()
            start_at = max(now, next_start[0])
            next_start[0] = start_at + interval
            await asyncio.sleep(start_at - now)
            return await send(prompt)

    return until_admitted(attempt)


CONTENDERS = [
    ("paceline.Budget", budget_job),
    ("paceline.Budget at 2x, following", lambda: budget_job(scale=2, follow=True)),
    ("paceline.Budget.shared, 4 processes", "processes"),
    ("paceline.redis.RedisBudget, 4 processes", "redis"),
    ("aiolimiter (requests only)", aiolimiter_requests),
    ("pre-counting, never settled", precounting),
    ("semaphore + per-second", semaphore_per_second),
]


PROCESSES = 4


def process_share(
    url: str, path: str, tasks: int, prompts: List[int], ready, go, done, i: int
) -> None:
    """One of ``PROCESSES`` processes sharing the budget of ``path``: its tasks and its
    share of the calls, from when ``go`` is set (the interpreter started and the budget
    opened before, off the clock), to when its calls are done (``done[i]``, on the host's
    monotonic clock: the interpreter's exit is off the clock too)."""
    async def share() -> None:
        job = budget_job(path=path)
        # Off the clock, as opening the file is: a Redis budget's first call connects.
        await job.warm()
        ready.release()
        go.wait()
        await calls(url, job, tasks, prompts, reset=False)
        done[i] = time.monotonic()

    asyncio.run(share())


async def run(url: str, make, tasks: int, prompts: List[int]) -> Dict[str, float]:
    async with httpx.AsyncClient(timeout=60.0) as client:
        await client.post(f"{url}/reset")
        t0 = time.monotonic()
        if make in ("processes", "redis"):
            # Each process gets a quarter of the tasks (at least one) and of the calls.
            if make == "processes":
                path = os.path.join(tempfile.mkdtemp(), "budget")
            else:
                path = f"{REDIS['url']}#model-api-{tasks}-{time.monotonic_ns()}"
            # Spawned: a fork inside the running event loop would inherit it.
            ctx = multiprocessing.get_context("spawn")
            ready, go = ctx.Semaphore(0), ctx.Event()
            done = ctx.Array("d", PROCESSES)
            procs = [
                ctx.Process(
                    target=process_share,
                    args=(
                        url,
                        path,
                        max(1, tasks // PROCESSES),
                        prompts[i::PROCESSES],
                        ready,
                        go,
                        done,
                        i,
                    ),
                )
                for i in range(PROCESSES)
            ]
            for p in procs:
                p.start()
            for _ in procs:
                ready.acquire()
            t0 = time.monotonic()
            go.set()
            for p in procs:
                p.join()
            elapsed = max(done) - t0
        else:
            await calls(url, make(), tasks, prompts, reset=False)
            elapsed = time.monotonic() - t0
        stats = (await client.get(f"{url}/stats")).json()
    refused = stats["refused_requests"] + stats["refused_tokens"] + stats["refused_concurrency"]
    allowed_tokens = LIMITS.tokens + LIMITS.tokens / LIMITS.window * elapsed
    allowed_requests = LIMITS.requests + LIMITS.requests / LIMITS.window * elapsed
    return dict(
        seconds=elapsed,
        tokens_share=stats["tokens"] / allowed_tokens,
        requests_share=stats["accepted"] / allowed_requests,
        refused=refused / (stats["accepted"] + refused),
        most_in_flight=stats["most_in_flight"],
    )


async def calls(url: str, job, tasks: int, prompts: List[int], reset: bool) -> None:
    """Sends ``prompts`` through ``job`` from ``tasks`` tasks."""
    count = {"refused": 0}
    queue = list(reversed(prompts))
    limits = httpx.Limits(max_connections=tasks + 10, max_keepalive_connections=tasks + 10)
    async with httpx.AsyncClient(limits=limits, timeout=60.0) as client:
        if reset:
            await client.post(f"{url}/reset")

        async def send(prompt: int) -> httpx.Response:
            return await client.post(
                f"{url}/v1/chat/completions",
                json={"prompt_tokens": prompt, "max_tokens": MAX_TOKENS},
            )

        async def worker() -> None:
            while queue:
                await job(send, queue.pop(), count)

        await asyncio.gather(*(worker() for _ in range(tasks)))


# The Redis of the RedisBudget row: a server of its own, started by ``main``.
REDIS: Dict[str, str] = {}


def start_redis() -> Optional[subprocess.Popen]:
    if shutil.which("redis-server") is None:
        CONTENDERS[:] = [c for c in CONTENDERS if c[1] != "redis"]
        return None
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
        stdout=subprocess.DEVNULL,
    )
    for _ in range(200):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.1).close()
            break
        except OSError:
            time.sleep(0.01)
    REDIS["url"] = f"redis://127.0.0.1:{port}/0"
    return proc


async def main(calls: int) -> None:
    url, server = start(LIMITS)
    redis_server = start_redis()
    rng = random.Random(3)
    prompts = [rng.randint(50, 150) for _ in range(calls)]
    print(
        f"fake model API: {LIMITS.requests / LIMITS.window:.0f} requests/s, "
        f"{LIMITS.tokens / LIMITS.window:.0f} tokens/s (buckets of {LIMITS.window} s), "
        f"{LIMITS.concurrency} at once; {calls} calls per run"
    )
    print()
    print("| tasks | contender | tokens: share of allowed | requests: share | refused | most in flight | time |")
    print("|---:|---|---:|---:|---:|---:|---:|")
    try:
        for tasks in TASKS:
            for name, make in CONTENDERS:
                r = await run(url, make, tasks, prompts)
                print(
                    f"| {tasks} | {name} | {100 * r['tokens_share']:.1f} % | "
                    f"{100 * r['requests_share']:.1f} % | {100 * r['refused']:.1f} % | "
                    f"{r['most_in_flight']:.0f} | {r['seconds']:.2f} s |",
                    flush=True,
                )
    finally:
        server.terminate()
        if redis_server is not None:
            redis_server.terminate()


if __name__ == "__main__":
    if len(sys.argv) > 2:
        CONTENDERS[:] = [c for c in CONTENDERS if any(w in c[0] for w in sys.argv[2:])]
    asyncio.run(main(int(sys.argv[1]) if len(sys.argv) > 1 else 150))
