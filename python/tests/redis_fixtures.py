"""What the tests of paceline.redis share: the servers they start (redis-server, and
valkey-server where installed: a module sets ``REDIS_BINARIES = BINARIES`` for
conftest's ``server`` and ``fresh``), and limiters whose calls may take 5 s."""

import asyncio

import redis.asyncio

import paceline.redis as pr
from redis_servers import have

# Fixed Redis times (µs) for the test mode.
T0 = 1_700_000_000_000_000

BINARIES = ["redis-server"] + (["valkey-server"] if have("valkey-server") else [])


def run(coro):
    return asyncio.run(coro)


def limiter_of(r, *args, **kw):
    """A RedisLimiter whose calls may take 5 s unless the test says otherwise: tests of
    decisions must not turn into tests of a loaded machine's round trips."""
    kw.setdefault("timeout", 5.0)
    return pr.RedisLimiter(r, *args, **kw)


def client(server, **kw):
    return redis.asyncio.Redis.from_url(server.url, **kw)
