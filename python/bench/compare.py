"""paceline side by side with aiolimiter, pyrate-limiter and limits, in one run.

    python3 python/bench/compare.py          # every section
    python3 python/bench/compare.py 0        # only the sections named (0, 1, 2)

0. paceline's acquires that do not wait against the interpreter's floor, measured in
   the same rounds: a builtin C call (`len("a")`) for `try_acquire`, an `await` of a
   coroutine that does nothing for `await acquire()`; the ratio and its goal printed.
1. The cost of one acquire that does not wait (a quota far above the request rate),
   median of several rounds, per library.
2. The job at volume: 20 000 tasks through 10 000/s (burst 1), on one event loop: wall
   time against the ideal (2.0 s) and the process's CPU time, per library that waits.
Both are printed as ratios to paceline's, with the raw numbers beside them.
"""

import asyncio
import os
import statistics
import sys
import tempfile
import time

import paceline
from timing import ROUNDS, per_call

N = 50_000


def calls(fn, arg, n):
    if arg is None:
        for _ in range(n):
            fn()
    else:
        for _ in range(n):
            fn(arg)


async def awaits(fn, arg, n):
    if arg is None:
        for _ in range(n):
            await fn()
    else:
        for _ in range(n):
            await fn(arg)


async def nothing():
    pass


# (name, goal: at most this many times its floor); the floor is the first row of its kind.
FLOOR_GOALS = {
    "try_acquire()": 3.0,
    "await acquire()": 1.6,
    'try_acquire("client-1")': 4.0,
    'await acquire("client-1")': 1.8,
}


# More rounds than section 1's: the ratios to the floors are what this section is for,
# and a shared machine's slower stretches land on one candidate's round at a time.
FLOOR_ROUNDS = 15


def floor_costs(n=2 * N):
    """[(what, name, ns, floor ns, goal)]: each paceline call beside its floor, every
    candidate run once per round (so a slower stretch of the machine hits all alike),
    medians of FLOOR_ROUNDS rounds of `n` calls."""
    folder = tempfile.mkdtemp(dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
    big = dict(per=1.0, burst=10**6)
    limiters = {
        "Limiter": paceline.Limiter(10**9, **big),
        "Limiter.shared": paceline.Limiter.shared(os.path.join(folder, "one"), 10**9, **big),
        "KeyedLimiter": paceline.KeyedLimiter(10**9, **big),
        "KeyedLimiter.shared": paceline.KeyedLimiter.shared(
            os.path.join(folder, "keyed"), 10**9, **big, capacity=1024
        ),
    }
    sync_floor = ("floor: len(\"a\")", lambda k: calls(len, "a", k))
    async_floor = ("floor: await nothing()", lambda k: asyncio.run(awaits(nothing, None, k)))
    runs = [sync_floor, async_floor]
    for kind, limiter in limiters.items():
        key = "client-1" if kind.startswith("Keyed") else None
        arg = "" if key is None else '"client-1"'
        try_name, await_name = f"try_acquire({arg})", f"await acquire({arg})"
        runs.append((f"{kind} {try_name}", lambda k, l=limiter, a=key: calls(l.try_acquire, a, k)))
        runs.append(
            (
                f"{kind} {await_name}",
                lambda k, l=limiter, a=key: asyncio.run(awaits(l.acquire, a, k)),
            )
        )
    samples = {name: [] for name, _ in runs}
    for _ in range(FLOOR_ROUNDS):
        for name, fn in runs:
            t0 = time.perf_counter_ns()
            fn(n)
            samples[name].append((time.perf_counter_ns() - t0) / n)
    ns = {name: statistics.median(s) for name, s in samples.items()}
    for path in os.listdir(folder):
        os.unlink(os.path.join(folder, path))
    os.rmdir(folder)
    rows = []
    for name, _ in runs[2:]:
        call = name.split(" ", 1)[1]
        floor = sync_floor[0] if call.startswith("try") else async_floor[0]
        rows.append((name, ns[name], floor, ns[floor], FLOOR_GOALS[call]))
    return rows


def no_wait_costs():
    """name -> ns per acquire that does not wait."""
    import aiolimiter
    import limits
    import pyrate_limiter

    costs = {}

    pl = paceline.Limiter(10**9, per=1.0, burst=10**6)
    costs["paceline try_acquire"] = per_call(lambda n: [pl.try_acquire() for _ in range(n)], N)

    async def pl_async(n):
        for _ in range(n):
            await pl.acquire()

    costs["paceline await acquire()"] = per_call(lambda n: asyncio.run(pl_async(n)), N)

    al = None

    async def al_async(n):
        nonlocal al
        al = al or aiolimiter.AsyncLimiter(10**9, 1)
        for _ in range(n):
            await al.acquire()

    costs["aiolimiter await acquire()"] = per_call(lambda n: asyncio.run(al_async(n)), N)

    async def al_has(n):
        limiter = aiolimiter.AsyncLimiter(10**9, 1)
        for _ in range(n):
            limiter.has_capacity()

    costs["aiolimiter has_capacity()"] = per_call(lambda n: asyncio.run(al_has(n)), N)

    pr = pyrate_limiter.Limiter(pyrate_limiter.Rate(10**9, pyrate_limiter.Duration.SECOND))
    costs["pyrate-limiter try_acquire"] = per_call(
        lambda n: [pr.try_acquire("k", blocking=False) for _ in range(n)], n=N // 10
    )

    storage = limits.storage.MemoryStorage()
    window = limits.strategies.MovingWindowRateLimiter(storage)
    item = limits.parse("1000000000/second")
    costs["limits moving window hit"] = per_call(
        lambda n: [window.hit(item, "k") for _ in range(n)], n=N // 10
    )
    return costs


async def job(acquire, tasks=20_000):
    """`tasks` coroutines, each waiting its turn once: the span from the first admission
    to the last, the whole wall time (creating 20 000 tasks included) and CPU seconds."""
    wall0, cpu0 = time.perf_counter(), time.process_time()
    admitted = []

    async def one():
        await acquire()
        admitted.append(time.perf_counter())

    await asyncio.gather(*(one() for _ in range(tasks)))
    span = max(admitted) - min(admitted)
    return span, time.perf_counter() - wall0, time.process_time() - cpu0


def volume():
    """name -> (wall s, cpu s) for 20 000 tasks at 10 000/s, burst 1."""
    import aiolimiter

    results = {}
    pl = paceline.Limiter(10_000, per=1.0, burst=1)
    results["paceline"] = asyncio.run(job(pl.acquire))
    unbounded = paceline.Limiter(10_000, per=1.0, burst=1, execution_bound=False)
    results["paceline, no execution bound"] = asyncio.run(job(unbounded.acquire))
    al = aiolimiter.AsyncLimiter(1, 1 / 10_000)  # 10 000/s, bucket of 1
    results["aiolimiter"] = asyncio.run(job(al.acquire))
    return results


def main():
    sections = set(sys.argv[1:]) or {"0", "1", "2"}
    if not sections <= {"0", "1", "2"}:
        sys.exit(f"usage: {sys.argv[0]} [0] [1] [2] (the sections to run; default: all)")
    print(f"Python {sys.version.split()[0]}; paceline, aiolimiter, pyrate-limiter, limits")
    if "0" in sections:
        print("\n0. paceline against the interpreter's floor (medians of %d rounds)" % FLOOR_ROUNDS)
        for name, ns, floor, floor_ns, goal in floor_costs():
            ratio = ns / floor_ns
            met = "met" if ratio <= goal else "NOT met"
            print(
                f"   {name:40s} {ns:6.0f} ns   {floor:22s} {floor_ns:5.0f} ns"
                f"   {ratio:5.2f}x (goal <= {goal}x: {met})"
            )
    if "1" in sections:
        no_wait_section()
    if "2" in sections:
        volume_section()


def no_wait_section():
    costs = no_wait_costs()
    base = costs["aiolimiter await acquire()"]
    print("\n1. one acquire that does not wait (median of %d rounds)" % ROUNDS)
    for name, ns in costs.items():
        print(f"   {name:32s} {ns:8.0f} ns   aiolimiter's await acquire() / this: {base / ns:5.2f}x")


def volume_section():
    print("\n2. 20 000 tasks at 10 000/s, burst 1 (ideal span from the first admission to")
    print("   the last: 1.9999 s; wall includes creating the tasks)")
    results = volume()
    al_cpu = results["aiolimiter"][2]
    for name, (span, wall, cpu) in results.items():
        print(
            f"   {name:30s} span {span:6.3f} s ({(span / 1.9999 - 1) * 100:+6.2f} %)"
            f"   wall {wall:6.3f} s   CPU {cpu:6.3f} s ({cpu / al_cpu:4.2f}x aiolimiter's)"
        )


if __name__ == "__main__":
    main()
