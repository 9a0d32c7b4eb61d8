"""The job this project started from: 300 calls to a (fake) third-party API at 100 per
second, however long each call takes. Prints progress and the achieved rate.

    python3 python/examples/api_calls.py
"""

import asyncio
import random
import time

import paceline

CALLS, RATE = 300, 100


async def fake_api(i: int) -> None:
    await asyncio.sleep(random.uniform(0.005, 0.300))  # each call takes 5-300 ms


async def main() -> None:
    limiter = paceline.Limiter(RATE, per=1.0, burst=1)  # one every 10 ms: 100/s, one at a time
    t0 = time.monotonic()
    starts = []

    async def call(i: int) -> None:
        async with limiter:  # this call's booked turn
            starts.append(time.monotonic() - t0)
            if len(starts) % 50 == 0:
                print(f"{len(starts):4d}/{CALLS} started at {starts[-1]:6.3f} s", flush=True)
            await fake_api(i)

    await asyncio.gather(*(call(i) for i in range(CALLS)))
    rate = (len(starts) - 1) / (starts[-1] - starts[0])
    print(f"{CALLS} calls; achieved rate {rate:.1f}/s (configured: {RATE}/s)")


if __name__ == "__main__":
    asyncio.run(main())
