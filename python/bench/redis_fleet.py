"""A quota kept in Redis, from Python, side by side in one run: paceline.redis against a bare
INCR round trip on the same redis-py client, limits' Redis moving window and
fastapi-limiter's Redis limiter (pyrate-limiter's RedisBucket, which fastapi-limiter runs).

    pip install ./python redis limits fastapi-limiter
    python3 python/bench/redis_fleet.py

Starts its own redis-server on a free loopback port (`redis-server` on PATH), and stops it.

1. Latency of one admitted check, one event loop, one caller at a time, the candidates'
   calls interleaved one by one and each timed on its own: the median per call, and its
   ratio to INCR's median on the same client.
2. Exactness across 4 processes: each process runs 4 tasks calling the limiter's
   non-waiting check as fast as they can for a few seconds on one key, quota 100 per
   second, trying again 1 ms after a refusal; each admission's call is timed from sending
   to answer. Reported: admissions per second over the run against the quota, and the
   most admissions provably within one second (their whole call inside it) against the
   limiter's own promise for one second.
"""

import argparse
import asyncio
import multiprocessing
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))

import redis.asyncio  # noqa: E402

import paceline.redis  # noqa: E402
from redis_servers import Server  # noqa: E402

RATE = 100  # per second, for the exactness runs


def most_within(spans, window):
    """The most admissions provably within one window of `window` seconds: each
    admission happened somewhere between its call's sending and its answer (`spans`, one
    host's clock), so only those whose whole span lies inside the window count. A count
    above the limiter's promise is then an over-admission, not a late reading."""
    spans = sorted(spans)
    best = 0
    for i, (start, _) in enumerate(spans):
        end = start + window
        count = 0
        for sent, answered in spans[i:]:
            if sent >= end:
                break
            if answered < end:
                count += 1
        best = max(best, count)
    return best


# Candidates: an async factory returning (check, close), check() -> awaitable of a truthy
# admission. `rate` and `per` is the quota; `huge` asks for one that admits everything.


async def incr(url, client, key, huge):
    async def check():
        return await client.incr(f"bench:incr:{key}")

    return check, None


# The least a limiter whose decision is atomic in Redis pays: one EVALSHA with the same
# key and arguments as paceline's, of a script that reads the key, writes it and answers
# three numbers (no arithmetic).
SCRIPT_FLOOR = """
local v = redis.call('GET', KEYS[1])
redis.call('SET', KEYS[1], ARGV[1], 'PX', 1000)
return {1, 0, 0}
"""


async def script_floor(url, client, key, huge):
    sha = await client.script_load(SCRIPT_FLOOR)
    args = (b"1000", b"1000000", b"1000", b"", b"0", b"")
    full = f"bench:floor:{{{key}}}"

    async def check():
        return await client.evalsha(sha, 1, full, *args)

    return check, None


async def paceline_try(url, client, key, huge):
    limiter = paceline.redis.RedisLimiter(
        client, 1_000_000 if huge else RATE, 1.0, 1_000_000 if huge else 1, timeout=5.0
    )

    async def check():
        return await limiter.try_acquire(key)

    return check, None


async def paceline_acquire(url, client, key, huge):
    limiter = paceline.redis.RedisLimiter(
        client, 1_000_000 if huge else RATE, 1.0, 1_000_000 if huge else 1, timeout=5.0
    )

    async def check():
        await limiter.acquire(key)
        return True

    return check, None


async def limits_moving_window(url, client, key, huge):
    from limits import RateLimitItemPerSecond
    from limits.aio.storage import RedisStorage
    from limits.aio.strategies import MovingWindowRateLimiter

    storage = RedisStorage(f"async+{url}", implementation="redispy")
    limiter = MovingWindowRateLimiter(storage)
    item = RateLimitItemPerSecond(1_000_000 if huge else RATE)

    async def check():
        return await limiter.hit(item, key)

    return check, None


async def fastapi_limiter(url, client, key, huge):
    from pyrate_limiter import Duration, Limiter, Rate
    from pyrate_limiter.buckets.redis_bucket import RedisBucket

    bucket = await RedisBucket.init(
        [Rate(1_000_000 if huge else RATE, Duration.SECOND)], client, f"bench:fl:{key}"
    )
    limiter = Limiter(bucket)

    async def check():
        return await limiter.try_acquire_async(key, blocking=False)

    return check, limiter.close if hasattr(limiter, "close") else None


CANDIDATES = {
    "INCR (a bare round trip, the floor)": incr,
    "EVALSHA of a GET+SET script, same arguments (a script's floor)": script_floor,
    "paceline.redis try_acquire": paceline_try,
    "limits moving window hit": limits_moving_window,
    "fastapi-limiter (pyrate-limiter RedisBucket)": fastapi_limiter,
}


async def latency(url, rounds, calls):
    client = redis.asyncio.Redis.from_url(url)
    checks = {}
    for name, make in CANDIDATES.items():
        check, _ = await make(url, client, "lat", True)
        for _ in range(200):  # warm: connections, scripts loaded
            await check()
        checks[name] = check
    # Calls interleaved one by one (A B C D A B C D ...), each timed on its own: the
    # median per call shrugs off the bursts of a shared machine, and every candidate
    # meets the same moments.
    samples = {name: [] for name in checks}
    names = list(checks)
    perf = time.perf_counter
    for r in range(rounds):
        order = names[r % len(names):] + names[: r % len(names)]
        for _ in range(calls):
            for name in order:
                check = checks[name]
                t0 = perf()
                await check()
                samples[name].append(perf() - t0)
    # The server's own time per call, from its command statistics.
    server_us = {}
    for name in names[:3]:
        await client.config_resetstat()
        for _ in range(calls):
            await checks[name]()
        stats = await client.info("commandstats")
        command = "cmdstat_incrby" if name == names[0] else "cmdstat_evalsha"
        server_us[name] = stats[command]["usec_per_call"]
    await client.aclose()
    floor = statistics.median(samples[names[0]])
    rows = []
    for name in names:
        ordered = sorted(samples[name])
        med = statistics.median(ordered)
        p10, p90 = ordered[len(ordered) // 10], ordered[len(ordered) * 9 // 10]
        script = statistics.median(samples[names[1]])
        rows.append((name, med * 1e6, p10 * 1e6, p90 * 1e6, med / floor, med / script))
    return rows, server_us


def hammer(url, kind, seconds, out):
    async def go():
        client = redis.asyncio.Redis.from_url(url)
        check, _ = await EXACT[kind](url, client, "exact", False)
        spans = []
        until = time.time() + seconds

        async def task():
            while True:
                sent = time.time()
                admitted = await check()
                now = time.time()
                if now >= until:
                    return
                if admitted:
                    spans.append((sent, now))
                else:
                    await asyncio.sleep(0.001)  # a refused caller tries again 1 ms later

        await asyncio.gather(*(task() for _ in range(4)))
        await client.aclose()
        return spans

    out.put(asyncio.run(go()))


EXACT = {
    "paceline.redis try_acquire (100/s, burst 1)": paceline_try,
    "paceline.redis acquire, booked turns (100/s, burst 1)": paceline_acquire,
    "limits moving window (100 per 1 s)": limits_moving_window,
    "fastapi-limiter (pyrate-limiter, 100 per 1 s)": fastapi_limiter,
}


def exactness(server, seconds):
    ctx = multiprocessing.get_context("fork")
    rows = []
    for kind in EXACT:
        server.cli("FLUSHALL")
        out = ctx.Queue()
        procs = [ctx.Process(target=hammer, args=(server.url, kind, seconds, out)) for _ in range(4)]
        for p in procs:
            p.start()
        spans = sorted(s for _ in procs for s in out.get(timeout=120))
        for p in procs:
            p.join()
        starts = sorted(answered for _, answered in spans)
        span = starts[-1] - starts[0] if len(starts) > 1 else 0.0
        # What each promises for any one-second window: GCRA with burst 1, 1 + 100; a
        # 100-per-second window, 100.
        promise = RATE + 1 if kind.startswith("paceline") else RATE
        rows.append((kind, len(starts), span, most_within(spans, 1.0), promise))
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--seconds", type=float, default=3.0)
    args = parser.parse_args()
    server = Server(binary="redis-server")
    try:
        print(f"Python {sys.version.split()[0]}, redis-py {redis.__version__}, "
              f"{os.cpu_count()} CPUs, redis-server on loopback\n")
        print(f"1. One admitted check, {args.rounds} rounds of {args.calls} calls each, interleaved")
        print("| | µs per call, median (p10–p90) | over INCR's | over the script floor's |")
        print("|---|---|---|---|")
        rows, server_us = asyncio.run(latency(server.url, args.rounds, args.calls))
        for name, med, p10, p90, ratio, over_script in rows:
            print(f"| {name} | {med:.1f} ({p10:.1f}–{p90:.1f}) | {ratio:.2f}× | {over_script:.2f}× |")
        print("\nThe server's own time per call (INFO commandstats): "
              + ", ".join(f"{name.split(' (')[0]} {us:.1f} µs" for name, us in server_us.items()))
        print(f"\n2. 4 processes x 4 tasks on one key for {args.seconds:.0f} s, quota {RATE}/s")
        print("| | admitted | per second over the run | most provably in 1 s | its promise for 1 s |")
        print("|---|---|---|---|---|")
        for kind, count, span, most, promise in exactness(server, args.seconds):
            rate = count / span if span else float("nan")
            verdict = "held" if most <= promise else f"**{most - promise} over**"
            print(f"| {kind} | {count} | {rate:.1f} | {most} ({verdict}) | {promise} |")
    finally:
        server.stop()


if __name__ == "__main__":
    main()
