"""paceline.redis.SyncRedisBudget against a real redis-server: threads sharing the cap and
the queue with an asyncio client of the same budget; Ctrl-C; the server going away."""

import asyncio
import threading
import time

import pytest
import redis

import paceline
import paceline.redis as pr
from redis_fixtures import BINARIES, client, run

REDIS_BINARIES = BINARIES  # conftest's server: one per binary


def sync_client(server, **kw):
    kw.setdefault("socket_timeout", 5.0)
    return redis.Redis.from_url(server.url, **kw)


def test_threads_share_the_cap_with_an_asyncio_client_of_the_same_budget(fresh):
    b = pr.SyncRedisBudget(sync_client(fresh), "mixed", in_flight=2)
    spans = []
    lock = threading.Lock()

    def worker():
        for _ in range(4):
            with b.acquire_blocking():
                start = time.monotonic()
                time.sleep(0.02)
                with lock:
                    spans.append((start, time.monotonic()))

    async def tasks():
        a = pr.RedisBudget(client(fresh), "mixed", in_flight=2, timeout=5.0)

        async def one():
            for _ in range(4):
                async with a.acquire():
                    start = time.monotonic()
                    await asyncio.sleep(0.02)
                    with lock:
                        spans.append((start, time.monotonic()))

        await asyncio.gather(*(one() for _ in range(3)))

    threads = [threading.Thread(target=worker) for _ in range(3)]
    for t in threads:
        t.start()
    run(tasks())
    for t in threads:
        t.join(30)
    assert len(spans) == 24
    events = sorted([(s, 1) for s, _ in spans] + [(e, -1) for _, e in spans])
    running = most = 0
    for _, step in events:
        running += step
        most = max(most, running)
    assert most == 2
    assert b.in_flight() == 0 and b.waiting() == 0


def test_settle_try_acquire_and_a_deadline(fresh):
    b = pr.SyncRedisBudget(sync_client(fresh), "sync", tokens=paceline.Rate(100))
    turn = b.acquire_blocking(tokens=100)
    assert b.try_acquire(tokens=50) is None
    with pytest.raises(TimeoutError):
        b.acquire_blocking(tokens=50, timeout=0.1)
    turn.settle(tokens=20)  # 80 come back
    with b.try_acquire(tokens=50) as t:
        assert t.cost("tokens") == 50
    assert b.remaining("tokens") >= 29
    with pytest.raises(RuntimeError):
        turn.settle(tokens=1)


def test_an_interrupted_thread_gives_its_place_up(fresh):
    import ctypes

    b = pr.SyncRedisBudget(sync_client(fresh), "ctrl-c", in_flight=1)
    turn = b.acquire_blocking()
    interrupted = []

    def waiter():
        try:
            b.acquire_blocking()
        except KeyboardInterrupt:
            interrupted.append(True)

    t = threading.Thread(target=waiter)
    t.start()
    time.sleep(0.3)
    assert b.waiting() == 1
    # What Ctrl-C does to the waiting thread: a KeyboardInterrupt raised in it.
    ctypes.pythonapi.PyThreadState_SetAsyncExc(
        ctypes.c_ulong(t.ident), ctypes.py_object(KeyboardInterrupt)
    )
    t.join(10)
    assert interrupted == [True]
    for _ in range(50):
        if b.waiting() == 0:
            break
        time.sleep(0.05)
    assert b.waiting() == 0, "its place was given up"
    turn.release()
    assert b.in_flight() == 0


def test_the_server_going_away_raises_within_the_socket_timeout(fresh):
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    c = redis.Redis.from_url(
        fresh.url, socket_timeout=0.3, socket_connect_timeout=0.3, retry=Retry(NoBackoff(), 0)
    )
    b = pr.SyncRedisBudget(c, "away", in_flight=1)
    turn = b.acquire_blocking()
    fresh.stop()
    started = time.monotonic()
    with pytest.raises(pr.RedisUnavailable):
        b.try_acquire()
    assert time.monotonic() - started < 3
    with pytest.raises(pr.RedisUnavailable):
        turn.release()
    fresh.start()
    for _ in range(50):
        try:
            again = b.try_acquire()
            break
        except pr.RedisUnavailable:
            time.sleep(0.1)
    assert again is not None
    again.release()


def test_a_client_without_a_socket_timeout_or_an_asyncio_client_is_refused(fresh):
    with pytest.raises(ValueError, match="socket_timeout"):
        pr.SyncRedisBudget(redis.Redis.from_url(fresh.url), "b", in_flight=1)
    with pytest.raises(TypeError, match="synchronous"):
        pr.SyncRedisBudget(client(fresh), "b", in_flight=1)
