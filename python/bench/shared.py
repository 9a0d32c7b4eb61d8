"""A limiter shared by the processes of one host, from Python, side by side in one run:
paceline's Limiter.shared against pyrate-limiter's MultiprocessBucket (a list served by a
multiprocessing manager, under a process-shared lock), limits' MemoryStorage (one process
only: shown as what a per-process limiter costs) and a Redis round trip (what any limiter
with its state in Redis pays at least, here on loopback).

    pip install pyrate-limiter limits redis; python3 python/bench/shared.py

1. The cost of one try_acquire that is admitted, in one process (median of 7 rounds).
2. Admissions per second from 4 processes at once on one shared limiter.
Needs `redis-server` on PATH for the Redis rows (skipped otherwise).
"""

import multiprocessing
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

import paceline
from timing import ROUNDS, per_call

HUGE = 10**9


def redis_server():
    """A redis-server on a free loopback port, or None."""
    if not shutil.which("redis-server"):
        return None, None
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", ""],
        stdout=subprocess.DEVNULL,
    )
    import redis

    client = redis.Redis(port=port)
    for _ in range(100):
        try:
            client.ping()
            return proc, port
        except redis.ConnectionError:
            time.sleep(0.05)
    proc.kill()
    return None, None


def costs(path, port):
    import limits
    import pyrate_limiter

    out = {}
    shared = paceline.Limiter.shared(path + "-cost", HUGE, burst=10**6)
    out["paceline Limiter.shared try_acquire"] = per_call(
        lambda n: [shared.try_acquire() for _ in range(n)], 100_000
    )
    local = paceline.Limiter(HUGE, burst=10**6)
    out["paceline Limiter (one process) try_acquire"] = per_call(
        lambda n: [local.try_acquire() for _ in range(n)], 100_000
    )
    bucket = pyrate_limiter.MultiprocessBucket.init(
        [pyrate_limiter.Rate(HUGE, pyrate_limiter.Duration.SECOND)]
    )
    pr = pyrate_limiter.Limiter(bucket)
    out["pyrate-limiter MultiprocessBucket try_acquire"] = per_call(
        lambda n: [pr.try_acquire("k", blocking=False) for _ in range(n)], 1_000
    )
    window = limits.strategies.MovingWindowRateLimiter(limits.storage.MemoryStorage())
    item = limits.parse(f"{HUGE}/second")
    out["limits MemoryStorage (one process) hit"] = per_call(
        lambda n: [window.hit(item, "k") for _ in range(n)], 10_000
    )
    if port:
        import redis

        client = redis.Redis(port=port)
        out["a Redis round trip (INCR, loopback)"] = per_call(
            lambda n: [client.incr("k") for _ in range(n)], 5_000
        )
        redis_window = limits.strategies.MovingWindowRateLimiter(
            limits.storage.RedisStorage(f"redis://127.0.0.1:{port}")
        )
        out["limits RedisStorage hit"] = per_call(
            lambda n: [redis_window.hit(item, "k") for _ in range(n)], 2_000
        )
    return out


def paceline_worker(path, seconds):
    limiter = paceline.Limiter.shared(path, HUGE, burst=10**6, on_mismatch="adopt")
    n, until = 0, time.monotonic() + seconds
    while time.monotonic() < until:
        for _ in range(100):
            n += limiter.try_acquire()
    return n


# pyrate-limiter's bucket holds a multiprocessing lock, shared only by inheritance: the
# pool's workers are forked after this is set.
PYRATE = None


def pyrate_worker(seconds):
    n, until = 0, time.monotonic() + seconds
    while time.monotonic() < until:
        n += PYRATE.try_acquire("k", blocking=False)
    return n


def throughput(path, processes=4, seconds=1.0):
    import pyrate_limiter

    ctx = multiprocessing.get_context("fork")
    with ctx.Pool(processes) as pool:
        ours = sum(pool.starmap(paceline_worker, [(path + "-many", seconds)] * processes))
    global PYRATE
    bucket = pyrate_limiter.MultiprocessBucket.init(
        [pyrate_limiter.Rate(HUGE, pyrate_limiter.Duration.SECOND)]
    )
    PYRATE = pyrate_limiter.Limiter(bucket)
    with ctx.Pool(processes) as pool:
        theirs = sum(pool.map(pyrate_worker, [seconds] * processes))
    return ours / seconds, theirs / seconds


def main():
    directory = "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()
    path = os.path.join(directory, f"paceline-pybench-{os.getpid()}")
    proc, port = redis_server()
    try:
        print(f"Python {sys.version.split()[0]}, {os.cpu_count()} CPUs")
        results = costs(path, port)
        base = results["paceline Limiter.shared try_acquire"]
        print(f"\n1. one admitted try_acquire, one process (median of {ROUNDS} rounds)")
        for name, ns in results.items():
            print(f"   {name:46s} {ns:9.0f} ns   {ns / base:7.1f}x paceline Limiter.shared's")
        ours, theirs = throughput(path)
        print("\n2. 4 processes on one shared limiter, 1 s")
        print(f"   paceline Limiter.shared                {ours / 1e6:8.3f} M admissions/s")
        print(f"   pyrate-limiter MultiprocessBucket      {theirs / 1e6:8.3f} M admissions/s"
              f"   (paceline: {ours / max(theirs, 1):.0f}x)")
    finally:
        if proc:
            proc.kill()
        for suffix in ("-cost", "-many"):
            try:
                os.remove(path + suffix)
            except FileNotFoundError:
                pass


if __name__ == "__main__":
    main()
