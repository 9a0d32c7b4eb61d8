"""Eight worker processes share one quota of 100 calls per second, as gunicorn or uvicorn
workers would: each prints its share, and the parent the rate they achieved together.

    python python/examples/workers.py

With an in-process paceline.Limiter (or any per-process limiter) the same program lets
800 calls per second through; with Limiter.shared it is 100, whatever the worker count.
"""

import asyncio
import multiprocessing
import os
import tempfile
import time

import paceline

WORKERS, SECONDS, RATE = 8, 3.0, 100


async def fake_api_call():
    await asyncio.sleep(0.02)  # however long a call takes, the pace is the same


def worker(limiter, until):
    """One worker process: 20 tasks calling the API for as long as the run lasts."""
    calls, first, last = 0, None, None

    async def task():
        nonlocal calls, first, last
        while time.monotonic() < until:
            try:
                # A booked turn, first come first served across every process.
                await limiter.acquire(timeout=max(until - time.monotonic(), 0.0))
            except TimeoutError:
                return  # the next turn comes after the end of the run
            calls += 1
            last = time.monotonic()
            first = first or last
            await fake_api_call()

    async def main():
        await asyncio.gather(*(task() for _ in range(20)))

    asyncio.run(main())
    return os.getpid(), calls, first, last


def main():
    # /dev/shm keeps the file in memory on Linux; any local file system works.
    directory = "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()
    path = os.path.join(directory, f"paceline-workers-{os.getpid()}")
    limiter = paceline.Limiter.shared(path, RATE, per=1.0, burst=1)
    print(f"{WORKERS} processes, one quota of {RATE}/s, {SECONDS:.0f} s, file {path}")
    started = time.monotonic()
    until = started + SECONDS
    # The limiter pickles as its path and quota: each worker attaches the same file.
    with multiprocessing.get_context("spawn").Pool(WORKERS) as pool:
        results = pool.starmap(worker, [(limiter, until)] * WORKERS)
    total = sum(r[1] for r in results)
    for i, (pid, calls, _, _) in enumerate(results):
        print(f"worker {i} (pid {pid}): {calls:4d} calls ({100 * calls / max(total, 1):4.1f} % of the total)")
    # From the first call in any process to the last (workers start at different times).
    first = min(r[2] for r in results if r[2])
    last = max(r[3] for r in results if r[3])
    print(f"together: {total} calls from {first - started:.2f} s to {last - started:.2f} s")
    print(f"achieved rate: {(total - 1) / (last - first):.1f}/s   (configured: {RATE}/s for all {WORKERS} processes)")
    os.remove(path)


if __name__ == "__main__":
    main()
