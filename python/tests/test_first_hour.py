"""What a newcomer meets in the first hour: one burst rule for every constructor given only
a count, and a warning when a blocking wait would stall an event loop."""

import asyncio
import warnings

import pytest

import paceline


def test_every_constructor_given_only_a_count_lets_that_many_through_at_once(tmp_path):
    redis = pytest.importorskip("redis")
    import redis.asyncio  # noqa: F401

    import paceline.redis
    from paceline.asgi import Limit

    nowhere = "redis://127.0.0.1:9"  # never connected: the constructors make no call
    made = {
        "Limiter": paceline.Limiter(10),
        "Limiter.per_second": paceline.Limiter.per_second(10),
        "Limiter.shared": paceline.Limiter.shared(str(tmp_path / "one"), 10),
        "KeyedLimiter": paceline.KeyedLimiter(10),
        "KeyedLimiter.shared": paceline.KeyedLimiter.shared(str(tmp_path / "keys"), 10),
        "Rate": paceline.Rate(10),
        "RedisLimiter": paceline.redis.RedisLimiter(redis.asyncio.Redis.from_url(nowhere), 10),
        "SyncRedisLimiter": paceline.redis.SyncRedisLimiter(
            redis.Redis.from_url(nowhere, socket_timeout=1.0), 10
        ),
    }
    assert {name: made[name].burst for name in made} == {name: 10 for name in made}
    assert [burst for _, _, burst, _ in Limit("x", 10)._rates] == [10]
    assert [burst for _, _, burst, _ in Limit("x", "10/second")._rates] == [10]
    # A fresh one admits the whole count at once, then refills one cell per interval.
    limiter = paceline.Limiter(10, per=3600.0)
    assert [limiter.try_acquire() for _ in range(11)] == [True] * 10 + [False]
    keyed = paceline.KeyedLimiter(3, per=3600.0)
    assert [keyed.try_acquire("k") for _ in range(4)] == [True] * 3 + [False]
    # set_quota follows the same rule.
    limiter.set_quota(20, per=3600.0)
    assert limiter.burst == 20


def test_a_blocking_wait_on_an_event_loops_thread_warns_once():
    import paceline._blocking as blocking

    blocking._warned = False
    limiter = paceline.Limiter(50, per=1.0, burst=1)
    keyed = paceline.KeyedLimiter(50, per=1.0, burst=1)

    async def inside_a_loop():
        with limiter:  # the turn is now: nothing waits, nothing to say
            pass
        assert keyed.try_acquire("k")
        with pytest.warns(RuntimeWarning, match="async with") as caught:
            with limiter:  # 20 ms away: the loop would stall
                pass
        assert caught[0].filename == __file__  # the line that blocks, not paceline's
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            keyed.acquire_blocking("k")  # once per process: no second warning

    asyncio.run(inside_a_loop())
    blocking._warned = False
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for _ in range(3):
            limiter.acquire_blocking()  # a plain thread: blocking is what it asked for
    blocking._warned = False

    async def keyed_inside_a_loop():
        keyed.try_acquire("j")
        with pytest.warns(RuntimeWarning, match="acquire"):
            keyed.acquire_blocking("j")

    asyncio.run(keyed_inside_a_loop())


def test_a_blocking_call_that_would_not_wait_or_fails_at_once_does_not_warn():
    import paceline._blocking as blocking

    blocking._warned = False
    limiter = paceline.Limiter(1, per=5.0, burst=1)

    async def inside_a_loop():
        assert limiter.try_acquire()
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            with pytest.raises(TimeoutError):
                limiter.acquire_blocking(timeout=0.01)  # raises at once: no stall

    asyncio.run(inside_a_loop())
    assert blocking._warned is False


def test_a_blocking_budget_turn_on_an_event_loops_thread_warns():
    import paceline._blocking as blocking

    blocking._warned = False
    budget = paceline.Budget(in_flight=1)

    async def inside_a_loop():
        held = budget.try_acquire()
        with pytest.warns(RuntimeWarning, match="budget.acquire") as caught:
            with pytest.raises(TimeoutError):
                budget.acquire_blocking(timeout=0.05)
        assert caught[0].filename == __file__
        held.release()

    asyncio.run(inside_a_loop())
    blocking._warned = False
