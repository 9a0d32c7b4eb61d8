"""paceline.redis when things go wrong, against real redis-server and valkey-server
processes and a real Redis Cluster: the server killed or slow (the failure policy), NOSCRIPT
after a flush and a restart, the errors Redis answers, bad input, and the synchronous twin
interrupted by signals, killed servers and fork."""


import asyncio
import os
import signal
import threading
import time

import pytest

redis = pytest.importorskip("redis")
import redis.asyncio  # noqa: E402
import redis.asyncio.cluster  # noqa: E402

import paceline  # noqa: E402
import paceline.redis as pr  # noqa: E402

from redis_servers import Server, have, server_binary  # noqa: E402
from redis_fixtures import BINARIES, client, limiter_of, run  # noqa: E402

REDIS_BINARIES = BINARIES  # conftest's server: one per binary

if not have(server_binary()):
    pytest.skip(f"{server_binary()} is not installed (bash .ci/run installs it)", allow_module_level=True)

# Outages and the failure policy --------------------------------------------------------


def test_the_server_killed_mid_run_applies_the_policy_and_recovers(fresh):
    async def go():
        r = client(fresh)
        closed = limiter_of(r, 10, 1.0, 2, timeout=0.2)
        opened = limiter_of(r, 10, 1.0, 2, timeout=0.2, on_failure="open")
        local = limiter_of(r, 10, 1.0, 2, timeout=0.2, on_failure=paceline.KeyedLimiter(1, 1.0, 2))
        one = limiter_of(r, 10, 1.0, 2, timeout=0.2, on_failure=paceline.Limiter(1, 1.0, 1))
        assert await closed.try_acquire("a")
        fresh.stop()  # killed mid-run
        t0 = time.monotonic()
        with pytest.raises(pr.RedisUnavailable):
            await closed.try_acquire("a")
        with pytest.raises(pr.RedisUnavailable):
            await closed.acquire("a")
        assert time.monotonic() - t0 < 2.0  # within the timeouts, not hung
        assert await opened.try_acquire("a") and await opened.try_acquire("a")
        await opened.acquire("a")
        # The local share per key: its burst of 2 for each key, then refusals.
        assert [await local.try_acquire("a") for _ in range(3)] == [True, True, False]
        assert await local.try_acquire("b")
        # One local share for every key.
        assert [await one.try_acquire(k) for k in "xyz"] == [True, False, False]
        with pytest.raises(pr.RedisUnavailable):
            await opened.remaining("a")  # nothing to fall back on
        with pytest.raises(pr.RedisUnavailable):
            await opened.wait_time("a")
        fresh.start()  # back, empty, with no scripts in its cache
        deadline = time.monotonic() + 10
        while True:
            try:
                assert await closed.try_acquire("a")
                break
            except pr.RedisUnavailable:
                assert time.monotonic() < deadline
                await asyncio.sleep(0.05)
        assert await closed.remaining("a") == 1
        await r.aclose()

    run(go())


def test_a_slow_redis_is_an_outage_after_the_timeout(fresh):
    async def go():
        r = client(fresh)
        limiter = limiter_of(r, 10, 1.0, 2, timeout=0.1, on_failure="open")
        closed = limiter_of(r, 10, 1.0, 2, timeout=0.1)
        await r.ping()
        # DEBUG SLEEP would need the debug command; CLIENT PAUSE holds every write.
        await r.execute_command("CLIENT", "PAUSE", "600", "ALL")
        t0 = time.monotonic()
        assert await limiter.try_acquire("s")
        with pytest.raises(pr.RedisUnavailable):
            await closed.try_acquire("s")
        assert time.monotonic() - t0 < 1.0
        # The caller's own cancellation stays a cancellation, not an outage.
        task = asyncio.ensure_future(closed.try_acquire("s2"))
        await asyncio.sleep(0.02)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await r.aclose()

    run(go())
    time.sleep(0.6)


def test_a_failure_that_is_not_redis_is_raised_as_it_is():
    class Broken:
        async def execute_command(self, *args):
            raise RuntimeError("a bug, not an answer")

    limiter = limiter_of(Broken(), 10, 1.0, 1, on_failure="open")
    with pytest.raises(RuntimeError, match="a bug"):
        run(limiter.try_acquire("k"))


def test_noscript_after_a_flush_and_after_a_restart_is_answered_transparently(fresh):
    async def go():
        r = client(fresh)
        limiter = limiter_of(r, 1000, 1.0, 1000, timeout=2.0)
        stop = time.monotonic() + 0.6
        errors = []

        async def traffic(i):
            while time.monotonic() < stop:
                try:
                    await limiter.try_acquire(f"k{i}")
                    await limiter.remaining(f"k{i}")
                except Exception as e:  # noqa: BLE001
                    errors.append(e)

        async def flusher():
            for _ in range(10):
                await asyncio.sleep(0.05)
                await r.script_flush()

        await asyncio.gather(flusher(), *(traffic(i) for i in range(4)))
        assert errors == []
        await r.aclose()

    run(go())

    async def after_restart():
        r = client(fresh)
        limiter = limiter_of(r, 10, 1.0, 3, timeout=2.0)
        assert await limiter.try_acquire("k")
        fresh.restart()  # its script cache is empty
        for _ in range(100):
            try:
                await r.ping()
                break
            except redis.exceptions.ConnectionError:
                await asyncio.sleep(0.05)
        assert await limiter.try_acquire("k")  # a fresh state, via EVAL
        await limiter.acquire("k")
        assert await limiter.remaining("k") == 1
        await r.aclose()

    run(after_restart())


def test_errors_redis_answers_are_their_own_and_admit_nothing(fresh):
    async def go():
        r = client(fresh)
        # Open: an outage would admit. An answered error must not.
        limiter = limiter_of(r, 10, 1.0, 2, on_failure="open")
        await r.lpush("paceline:{list}", "x")
        await r.set("paceline:{junk}", "not a state")
        secs, micros = await r.time()
        await r.set("paceline:{far}", f"{secs * 1_000_000 + micros} {2**60}")  # 36 years ahead
        # Numbers another application keeps there, and values of the limiter's shape that
        # no limiter wrote: one from 1970 (a limiter's value expires with its TAT) or with
        # a tail that is not a list of bookings.
        foreign = {"int": "42", "neg": "-5", "pair": "1 2", "tail": "1 2 not-ours",
                   "half": f"{secs * 1_000_000 + micros} 5 a:1 b"}
        for key, value in foreign.items():
            await r.set(f"paceline:{{{key}}}", value)
        for key in ("list", "junk", "far", *foreign):
            with pytest.raises(pr.RedisRejected) as caught:
                await limiter.try_acquire(key)
            assert not isinstance(caught.value, pr.RedisOutOfMemory)
            with pytest.raises(pr.RedisRejected):
                await limiter.acquire(key)
            with pytest.raises(pr.RedisRejected):
                await limiter.remaining(key)
        # What sits there is left as it was.
        assert await r.lrange("paceline:{list}", 0, -1) == [b"x"]
        assert await r.get("paceline:{junk}") == b"not a state"
        for key, value in foreign.items():
            assert await r.get(f"paceline:{{{key}}}") == value.encode()
        await r.aclose()

    run(go())


def test_a_full_server_is_out_of_memory_and_admits_nothing():
    s = Server(args=["--maxmemory-policy", "noeviction"])
    try:

        async def go():
            r = redis.asyncio.Redis.from_url(s.url)
            limiter = limiter_of(r, 10, 1.0, 2, on_failure="open")
            # 3 MB of data, then a 2 MB limit: every write is refused from then on.
            for i in range(30):
                await r.set(f"fill:{i}", b"x" * 100_000)
            await r.config_set("maxmemory", "2mb")
            with pytest.raises(pr.RedisOutOfMemory):
                await limiter.try_acquire("new")
            with pytest.raises(pr.RedisOutOfMemory):
                await limiter.acquire("new")
            await r.aclose()

        run(go())
    finally:
        s.stop()


# Bad input ------------------------------------------------------------------------------


def test_bad_input_is_refused_in_words_and_changes_nothing(fresh):
    async def go():
        r = client(fresh)
        limiter = pr.RedisLimiter(r, 10, 1.0, 3, timeout=5.0)
        for bad in (b"k", 1, None):
            with pytest.raises(TypeError, match="key must be a str"):
                await limiter.try_acquire(bad)
        for bad in ("", "x" * 1025, "é" * 513, "\udc80"):
            with pytest.raises(ValueError, match="key must be"):
                await limiter.try_acquire(bad)
            with pytest.raises(ValueError):
                await limiter.acquire(bad)
        assert await limiter.try_acquire("x" * 1024)
        for bad in (4, 2**32, 2**64, -1):
            with pytest.raises(ValueError, match="n"):
                await limiter.try_acquire("k", bad)
            with pytest.raises(ValueError):
                await limiter.acquire("k", bad)
        for bad in (True, 1.0, "1"):
            with pytest.raises(TypeError):
                await limiter.try_acquire("k", bad)
        for bad in (-1, float("nan")):
            with pytest.raises(ValueError):
                await limiter.acquire("k", 1, timeout=bad)
        with pytest.raises(ValueError, match="more than the burst"):
            await limiter.wait_time("k", 4)
        assert await r.keys("paceline:{k}") == []
        await r.aclose()

    run(go())
    r = client(fresh)
    with pytest.raises(ValueError, match="1 µs"):
        pr.RedisLimiter(r, 2_000_000, 1.0)
    with pytest.raises(ValueError, match="52 days"):
        pr.RedisLimiter(r, 1, 86_400.0, 60)
    with pytest.raises(ValueError, match="rate"):
        pr.RedisLimiter(r, 0)
    with pytest.raises(ValueError, match="per"):
        pr.RedisLimiter(r, 1, -1.0)
    with pytest.raises(ValueError, match="burst"):
        pr.RedisLimiter(r, 1, 1.0, 0)
    with pytest.raises(ValueError, match="on_failure"):
        pr.RedisLimiter(r, 1, on_failure="fail-open")
    with pytest.raises(ValueError, match="braces"):
        pr.RedisLimiter(r, 1, prefix="a{b}")
    with pytest.raises(ValueError, match="timeout"):
        pr.RedisLimiter(r, 1, timeout=0)
    with pytest.raises(TypeError, match="SyncRedisLimiter"):
        pr.RedisLimiter(redis.Redis.from_url(fresh.url), 1)
    with pytest.raises(TypeError, match="RedisLimiter"):
        pr.SyncRedisLimiter(r, 1)
    with pytest.raises(ValueError, match="socket_timeout"):
        pr.SyncRedisLimiter(redis.Redis.from_url(fresh.url), 1)
    # The largest burst a microsecond interval allows, and its largest n.
    big = pr.RedisLimiter(r, 1_000_000, 1.0, 2**32 - 1, timeout=5.0)
    assert run(big.try_acquire("big", 2**32 - 1))


# The synchronous twin ---------------------------------------------------------------


def sync_client(server):
    return redis.Redis.from_url(server.url, socket_timeout=5.0, socket_connect_timeout=5.0)


def test_the_sync_twin_decides_alike_and_blocks_its_turn(fresh):
    r = sync_client(fresh)
    limiter = pr.SyncRedisLimiter(r, 4, 1.0, 2)  # T = 250 ms
    assert [limiter.try_acquire("s") for _ in range(3)] == [True, True, False]
    assert limiter.remaining("s") == 0
    assert 0.0 < limiter.wait_time("s") <= 0.25
    t0 = time.monotonic()
    limiter.acquire_blocking("s")
    with limiter("s"):
        pass
    assert time.monotonic() - t0 >= 0.45
    with pytest.raises(TimeoutError):
        limiter.acquire_blocking("s", timeout=0.01)
    # Threads share the key's turns.
    limiter = pr.SyncRedisLimiter(r, 20, 1.0, 2)  # T = 50 ms
    starts = []

    def thread():
        limiter.acquire_blocking("t")
        starts.append(time.monotonic())

    threads = [threading.Thread(target=thread) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    starts.sort()
    assert starts[-1] - starts[0] >= 3 * 0.05 - 0.01
    r.close()


def test_the_sync_twin_interrupted_by_a_signal_gives_its_turn_back(fresh):
    r = sync_client(fresh)
    limiter = pr.SyncRedisLimiter(r, 2, 1.0, 1)  # T = 500 ms
    assert limiter.try_acquire("sig")
    before = limiter.wait_time("sig")

    def raise_interrupt(*_):
        raise KeyboardInterrupt

    old = signal.signal(signal.SIGALRM, raise_interrupt)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.1)
        with pytest.raises(KeyboardInterrupt):
            limiter.acquire_blocking("sig")
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    assert limiter.wait_time("sig") <= before
    r.close()


def test_the_sync_twin_applies_the_policy_when_the_server_is_killed(fresh):
    r = sync_client(fresh)
    closed = pr.SyncRedisLimiter(r, 10, 1.0, 2)
    opened = pr.SyncRedisLimiter(r, 10, 1.0, 2, on_failure="open")
    assert closed.try_acquire("k")
    fresh.stop()
    with pytest.raises(pr.RedisUnavailable):
        closed.try_acquire("k")
    with pytest.raises(pr.RedisUnavailable):
        closed.acquire_blocking("k")
    assert opened.try_acquire("k")
    opened.acquire_blocking("k")
    fresh.start()
    r.close()


def test_a_forked_child_books_with_ids_of_its_own(fresh):
    r = sync_client(fresh)
    limiter = pr.SyncRedisLimiter(r, 1, 10.0, 1)
    parent_id = pr._booking_id()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            ok = limiter.try_acquire("forked")
            os.write(write, f"{pr._booking_id()} {ok}".encode())
        finally:
            os._exit(0)
    os.waitpid(pid, 0)
    child_id, ok = os.read(read, 100).decode().split()
    assert ok == "True"
    assert child_id.split(".")[0] != parent_id.split(".")[0]
    assert not limiter.try_acquire("forked")  # the child's admission counts here
    r.close()


def test_a_huge_or_infinite_timeout_is_no_timeout(fresh):
    async def go():
        r = client(fresh)
        limiter = limiter_of(r, 1, 3600.0, 1)
        for timeout in (1e300, float("inf"), 1e9):
            await limiter.acquire(f"k{timeout}", 1, timeout=timeout)
        await r.aclose()

    run(go())
    sync = pr.SyncRedisLimiter(redis.Redis.from_url(fresh.url, socket_timeout=5.0), 1, 3600.0, 1)
    for timeout in (1e300, float("inf")):
        sync.acquire_blocking(f"s{timeout}", 1, timeout=timeout)


def test_a_server_busy_with_another_clients_script_is_an_outage(fresh):
    # Another tenant's endless script: past the time limit Redis answers BUSY to everyone.
    fresh.cli("CONFIG", "SET", "lua-time-limit", "20")
    import subprocess

    blocker = subprocess.Popen(
        [fresh.cli_binary, "-p", str(fresh.port), "EVAL", "while true do end", "0"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        time.sleep(0.5)

        async def go():
            r = client(fresh)
            opened = limiter_of(r, 10, 1.0, 2, on_failure="open")
            assert await opened.try_acquire("k") is True
            await opened.acquire("k")
            share = limiter_of(r, 10, 1.0, 2, on_failure=paceline.KeyedLimiter(1, 3600.0, 1))
            assert [await share.try_acquire("k") for _ in range(2)] == [True, False]
            closed = limiter_of(r, 10, 1.0, 2)
            with pytest.raises(pr.RedisUnavailable, match="BUSY"):
                await closed.try_acquire("k")
            await r.aclose()

        run(go())
        sync = pr.SyncRedisLimiter(
            redis.Redis.from_url(fresh.url, socket_timeout=5.0), 10, on_failure="open"
        )
        assert sync.try_acquire("k") is True
    finally:
        subprocess.run([fresh.cli_binary, "-p", str(fresh.port), "SCRIPT", "KILL"],
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        blocker.wait(10)
        fresh.cli("CONFIG", "SET", "lua-time-limit", "5000")


def test_the_sync_twin_on_a_client_without_retries_is_bounded_by_its_socket_timeout():
    # A server that takes connections and never answers (hung).
    import socket

    from redis.backoff import NoBackoff
    from redis.retry import Retry

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    held = []

    def accept():
        while True:
            try:
                held.append(listener.accept()[0])
            except OSError:
                return

    threading.Thread(target=accept, daemon=True).start()
    try:
        r = redis.Redis(
            port=listener.getsockname()[1],
            socket_timeout=0.25,
            socket_connect_timeout=0.25,
            retry=Retry(NoBackoff(), 0),
        )
        limiter = pr.SyncRedisLimiter(r, 10, on_failure="open")
        for call in (lambda: limiter.try_acquire("k"), lambda: limiter.acquire_blocking("k")):
            started = time.monotonic()
            call()
            # One attempt of 0.25 s; generous for a loaded machine, far below the ~7 s
            # of redis-py's default retries.
            assert time.monotonic() - started < 2.0
    finally:
        listener.close()
        for c in held:
            c.close()
