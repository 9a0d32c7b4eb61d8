"""``Limit.reset()`` / ``await Limit.areset()``: every key starts afresh, in every tier (in
process, a shared file that other processes hold open, Redis), so a test suite passes
twice and an operator can start a limit over."""

import asyncio
import os
import subprocess
import sys
import time

import pytest

from paceline.asgi import KeySource, Limit, RateLimitMiddleware, RouteLimit

from asgi_calls import ok as ok_app, sent_by
from redis_servers import Server, have, server_binary

HOUR = 3600.0
KEY = KeySource.header("x-api-key")


async def statuses(app, n, key=b"k"):
    out = []
    for _ in range(n):
        sent = await sent_by(app, client=("192.0.2.1", 1), raw=[(b"x-api-key", key)])
        out.append(sent[0]["status"])
    return out


def test_a_reset_starts_every_key_afresh_in_process_for_every_middleware_and_route():
    limit = Limit("in-process", 2, per=HOUR, key=KEY)
    middleware = RateLimitMiddleware(ok_app, [limit])
    route = RouteLimit(limit)

    async def go():
        assert await statuses(middleware, 3) == [200, 200, 429]
        assert await statuses(middleware, 2, b"other") == [200, 200]
        limit.reset()
        # At once, for the middleware and the route alike, every key.
        assert await statuses(middleware, 1) == [200]
        assert await statuses(middleware, 3, b"other") == [200, 200, 429]
        scope = {"type": "http", "method": "GET", "path": "/", "client": ("192.0.2.1", 1),
                 "headers": [(b"x-api-key", b"k")]}
        assert route.decide(scope)[0] and not route.decide(scope)[0]

    asyncio.run(go())


def test_a_shared_file_is_reset_for_this_process_at_once_and_the_others_within_a_second(tmp_path):
    path = str(tmp_path / "limit")
    limit = Limit("shared", 2, per=HOUR, key=KEY, shared=path)
    middleware = RateLimitMiddleware(ok_app, [limit])
    asyncio.run(statuses(middleware, 2))
    # Another process of the host: it finds the key spent, is told of the reset within a
    # second, and then has the key's burst again.
    other = subprocess.Popen(
        [sys.executable, "-c", OTHER_WORKER, path, os.path.dirname(os.path.abspath(__file__))],
        stdout=subprocess.PIPE, stdin=subprocess.PIPE, text=True,
    )
    try:
        assert other.stdout.readline().strip() == "[429]"
        limit.reset()
        assert asyncio.run(statuses(middleware, 1)) == [200]
        time.sleep(1.3)
        other.stdin.write("go\n")
        other.stdin.flush()
        # The other worker joined the new file (the old one had the key spent): one
        # count for both again, the key's second cell its, and none left for this one.
        assert other.stdout.readline().strip() == "[200]"
        assert other.wait(timeout=10) == 0
        assert asyncio.run(statuses(middleware, 1)) == [429]
    finally:
        other.kill()
    # The next run of a suite (a new Limit on the same file) starts afresh after a reset.
    again = Limit("shared", 2, per=HOUR, key=KEY, shared=path)
    again.reset()
    assert asyncio.run(statuses(RateLimitMiddleware(ok_app, [again]), 3)) == [200, 200, 429]


OTHER_WORKER = """
import asyncio, sys
sys.path.insert(0, sys.argv[2])
from test_asgi_reset import KEY, HOUR, ok_app, statuses
from paceline.asgi import Limit, RateLimitMiddleware
middleware = RateLimitMiddleware(ok_app, [Limit("shared", 2, per=HOUR, key=KEY, shared=sys.argv[1])])
print(asyncio.run(statuses(middleware, 1)), flush=True)
sys.stdin.readline()
print(asyncio.run(statuses(middleware, 1)), flush=True)
"""


@pytest.mark.skipif(not have(server_binary()), reason=f"{server_binary()} is not installed")
def test_a_limit_in_redis_resets_for_the_fleet_with_areset():
    redis = pytest.importorskip("redis")
    import redis.asyncio  # noqa: F401

    server = Server()
    try:
        async def go():
            r = redis.asyncio.Redis.from_url(server.url)
            limit = Limit("fleet*[x]", 2, per=HOUR, key=KEY, redis=r, redis_timeout=5.0)
            untouched = Limit("fleet", 1, per=HOUR, key=KEY, redis=r, redis_timeout=5.0)
            middleware = RateLimitMiddleware(ok_app, [limit])
            other = RateLimitMiddleware(ok_app, [untouched])
            assert await statuses(middleware, 3) == [200, 200, 429]
            assert await statuses(middleware, 3, b"b") == [200, 200, 429]
            assert await statuses(other, 2) == [200, 429]
            with pytest.raises(TypeError, match="areset"):
                limit.reset()
            await limit.areset()
            # Every key afresh (the local memory of the refusal gone too); another limit
            # whose name the pattern could have matched keeps its counts.
            assert await statuses(middleware, 3) == [200, 200, 429]
            assert await statuses(middleware, 3, b"b") == [200, 200, 429]
            assert await statuses(other, 1) == [429]
            await r.aclose()

        asyncio.run(go())
    finally:
        server.stop()


def test_the_readme_fixture_resets_route_limits_and_middlewares_too():
    limit = Limit("route", 1, per=HOUR, key=KEY)
    route = RouteLimit(limit)
    middleware = RateLimitMiddleware(ok_app, [Limit("mw", 1, per=HOUR, key=KEY)])
    scope = {"type": "http", "method": "GET", "path": "/", "client": ("192.0.2.1", 1),
             "headers": [(b"x-api-key", b"k")]}
    for _ in range(2):  # a suite run twice
        route.reset()
        middleware.reset()
        assert route.decide(scope)[0] and not route.decide(scope)[0]
        assert asyncio.run(statuses(middleware, 2)) == [200, 429]


def test_a_tier_given_as_rate_and_period_is_a_tier():
    tiered = Limit("tiers", 1, per=HOUR, key=lambda scope: "k", quota_for=lambda key: (3, HOUR))
    assert asyncio.run(statuses(RateLimitMiddleware(ok_app, [tiered]), 4)) == [200, 200, 200, 429]
