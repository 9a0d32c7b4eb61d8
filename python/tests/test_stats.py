"""stats(): the counts a limiter object's calls came to, against known sequences of
admissions, waits and refusals, under real event loops and threads."""

import asyncio
import threading

import pytest

import paceline


def test_try_acquire_counts_admissions_and_refusals():
    limiter = paceline.Limiter(1, per=60.0, burst=3)
    results = [limiter.try_acquire() for _ in range(5)]
    assert results == [True, True, True, False, False]
    stats = limiter.stats()
    assert stats["admitted"] == 3
    assert stats["refused"] == 2
    assert stats["waited"] == 0
    assert stats["wait_seconds_total"] == 0.0


def test_acquire_counts_once_whether_it_waited_or_not():
    # 20 per second, one at a time: the first task is admitted at once, the others wait
    # 50, 100, 150 and 200 ms.
    limiter = paceline.Limiter(20, per=1.0, burst=1)

    async def main():
        await asyncio.gather(*(limiter.acquire() for _ in range(5)))

    asyncio.run(main())
    stats = limiter.stats()
    assert stats["admitted"] + stats["waited"] == 5
    assert stats["refused"] == 0
    assert stats["waited"] >= 3
    # Booked 50 ms apart, so the waits sum to about 0.5 s and the longest is about 0.2 s.
    assert 0.3 <= stats["wait_seconds_total"] <= 0.55
    assert 0.1 <= stats["wait_seconds_max"] <= 0.21


def test_a_turn_beyond_the_timeout_is_counted_as_refused():
    limiter = paceline.Limiter(1, per=60.0)
    assert limiter.try_acquire()

    async def main():
        with pytest.raises(TimeoutError):
            await limiter.acquire(timeout=0.1)

    asyncio.run(main())
    with pytest.raises(TimeoutError):
        limiter.acquire_blocking(timeout=0.1)
    stats = limiter.stats()
    assert (stats["admitted"], stats["waited"], stats["refused"]) == (1, 0, 2)


def test_threads_blocking_are_counted_as_waited():
    limiter = paceline.Limiter(50, per=1.0, burst=1)
    threads = [threading.Thread(target=limiter.acquire_blocking) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=10)
    stats = limiter.stats()
    assert stats["admitted"] + stats["waited"] == 6
    assert stats["waited"] >= 1
    assert stats["wait_seconds_max"] <= 0.11  # five turns 20 ms apart at most


def test_keyed_stats_count_every_key_and_the_keys_stored():
    limiter = paceline.KeyedLimiter(1, per=60.0)
    for key in ["a", "a", "b", "c", "c", "c"]:
        limiter.try_acquire(key)
    stats = limiter.stats()
    assert (stats["admitted"], stats["refused"], stats["keys"]) == (3, 3, 3)


def test_a_shared_limiter_counts_this_processes_calls(tmp_path):
    path = tmp_path / "quota"
    one = paceline.Limiter.shared(path, 2, per=60.0, burst=2)
    two = paceline.Limiter.shared(path, 2, per=60.0, burst=2)
    assert one.try_acquire()
    assert two.try_acquire()
    assert not one.try_acquire()
    assert (one.stats()["admitted"], one.stats()["refused"]) == (1, 1)
    assert (two.stats()["admitted"], two.stats()["refused"]) == (1, 0)
