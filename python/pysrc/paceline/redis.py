"""One quota across the hosts of a fleet: GCRA with its state in Redis, on redis-py.

::

    import redis.asyncio, paceline.redis

    r = redis.asyncio.Redis.from_url("redis://127.0.0.1:6379/0")
    partner = paceline.redis.RedisLimiter(r, rate=50, per=1.0, burst=1, on_failure="closed")
    await partner.acquire("partner-api")          # a booked turn, FIFO across every process and host
    if await partner.try_acquire("user:42"):      # one round trip, never waits
        ...

Every decision is one ``EVALSHA`` of the Lua script that paceline's Rust fleet limiter
runs: the very text, shipped from the package's Rust extension (``DECIDE_SCRIPT``,
``REFUND_SCRIPT``), so the decisions are the Rust limiter's, and a Python and a Rust
limiter with the same prefix and quota share their keys. In short:

- **Exact GCRA at the Redis server's clock** (``TIME``, in microseconds; decisions in
  whole nanoseconds): one clock for the whole fleet, so hosts whose clocks drift cannot
  over-admit. Across every process, loop and thread, never more than ``burst`` plus one
  cell per interval.
- **One Redis key per limited key**, ``<prefix>:{<key>}``: the key is its own hash tag, so
  a Redis Cluster spreads keys over its slots; each key expires once it has refilled.
- **Booked turns**: ``acquire`` books its place in the key's state at once (plain checks
  cannot take it), then sleeps locally until its instant. A task cancelled or timed out
  gives its booking back by its id, chosen before the call is sent, so the booking is
  refunded even when its answer never arrived.
- **``NOSCRIPT``** (a restart, ``SCRIPT FLUSH``, a failover to a node that never saw the
  script) is answered by sending the script itself (``EVAL``), which loads it again.
- **When Redis cannot answer** (unreachable, slower than ``timeout``), the failure policy
  decides: ``"closed"`` (default) raises ``RedisUnavailable``, so nothing passes;
  ``"open"`` admits; a local ``paceline.KeyedLimiter`` (a share per key) or
  ``paceline.Limiter`` (one share for every key) decides in this process instead. An error
  Redis *answered* is not an outage and no policy applies: a value of another type at the
  key, or an unreadable one, raises ``RedisRejected``; a full server (``maxmemory``)
  raises ``RedisOutOfMemory``. Nothing is admitted either way.
- A Redis restart loses the state: every key starts again with a full burst.

``RedisBudget`` (asyncio) and ``SyncRedisBudget`` (threads) are ``paceline.Budget`` for the
whole fleet: rates by name and a cap on calls in flight in one first-come-first-served
queue kept in Redis, the cost settled after the call (docs/FLEET.md, "A budget for the
fleet").
"""


from __future__ import annotations

import asyncio
from typing import Any, Optional, Tuple, Union

from . import KeyedLimiter, Limiter
from ._args import _timeout
from ._redis.core import (
    _REFUND_RETRY,
    _REFUND_SHA,
    _REFUND_TIMEOUT,
    _REFUND_TRIES,
    DECIDE_SCRIPT,
    MAX_KEY_LEN,
    MAX_WINDOW_NS,
    REFUND_SCRIPT,
    RedisLimitError,
    RedisOutOfMemory,
    RedisRejected,
    RedisUnavailable,
    _answered,
    _Base,
    _booking_id,
    _describe,
    _is_async_client,
    _key,
    _TooFar,
    _Turn,
)
from ._redis.budget_async import FleetTurn, RedisBudget
from ._redis.budget_sync import SyncFleetTurn, SyncRedisBudget
from ._redis.limiter_sync import SyncRedisLimiter
from ._redis.wire import _AsyncWire

__all__ = [
    "RedisLimiter",
    "RedisBudget",
    "FleetTurn",
    "SyncRedisBudget",
    "SyncFleetTurn",
    "SyncRedisLimiter",
    "RedisLimitError",
    "RedisUnavailable",
    "RedisRejected",
    "RedisOutOfMemory",
    "DECIDE_SCRIPT",
    "REFUND_SCRIPT",
    "MAX_KEY_LEN",
    "MAX_WINDOW_NS",
]


class RedisLimiter(_Base, _AsyncWire):
    """``rate`` cells per ``per`` seconds per key, at most ``burst`` at once (default:
    ``rate``), for every
    process and host that uses the same Redis, ``prefix`` and quota, on a redis-py
    asyncio client (``redis.asyncio.Redis``, or ``redis.asyncio.cluster.RedisCluster``).

    The name is the Rust crate's ``paceline::redis::RedisLimiter``, whose scripts and
    decisions it shares; its methods are ``paceline.KeyedLimiter``'s (``try_acquire``,
    ``acquire``, ``remaining``, ``wait_time``, ``async with limiter(key)``), so code moves
    from one host to a fleet by changing the constructor. Each method is one round trip.

    - ``timeout`` (seconds, default 0.25) bounds each call; past it, or when Redis cannot
      be reached, ``on_failure`` decides (see the module docs).
    - ``prefix`` (default ``"paceline"``): limiters with different prefixes are
      independent; a Rust ``RedisLimiter`` with the same prefix and quota shares the keys.
    """

    def __init__(
        self, client: Any, rate: int, per: float = 1.0, burst: Optional[int] = None, *,
        prefix: str = "paceline", timeout: float = 0.25,
        on_failure: Union[str, Limiter, KeyedLimiter] = "closed",
    ) -> None:
        if not _is_async_client(client):
            raise TypeError(
                "RedisLimiter takes a redis-py asyncio client (redis.asyncio.Redis or "
                f"redis.asyncio.cluster.RedisCluster), got {type(client).__name__}; for "
                "redis.Redis use paceline.redis.SyncRedisLimiter"
            )
        super().__init__(client, rate, per, burst, prefix, timeout, on_failure)
        # Refunds in flight, kept alive until they end.
        self._refunds: "set[asyncio.Task]" = set()
        self._wire()

    async def try_acquire(self, key: str, n: int = 1) -> bool:
        """Takes ``n`` cells of ``key`` now if they fit fleet-wide and no booked turn is
        ahead: True, or False. Never waits. A key Redis just refused is refused locally
        until the instant Redis gave (no round trip); admissions always ask Redis."""
        return (await self._try(key, n))[0] == 0

    async def _try(self, key: str, n: int) -> Tuple[int, int]:
        """``try_acquire``'s decision as ``(wait, ahead)`` in nanoseconds: ``wait`` 0 when
        admitted, else until ``n`` cells fit; ``ahead`` how far the key's TAT is past now
        after the decision (0 when the failure policy decided)."""
        key = _key(key)
        if n.__class__ is not int or not 0 < n <= self._burst:
            n = self._n(n)
            if n == 0:
                return 0, 0  # nothing asked for: granted, as in process
        if key in self._refused:
            wait = self._locally_refused(key, n)
            if wait:
                return wait, wait + self._tau - self._interval * n
        try:
            reply = await self._run(self._decide_args(key, self._interval * n, 0, ""), self._timeout)
        except Exception as e:
            answered = _answered(e)
            if answered is not None:
                raise answered from e
            if self._try_on_failure(key, n, e):
                return 0, 0
            return max(int(self._local_wait(key, n) * 1e9), 1), 0
        if reply[0] == 1:
            return 0, int(reply[1])
        wait = int(reply[1])
        self._remember_refusal(key, n, wait)
        return wait, wait + self._tau - self._interval * n

    async def acquire(self, key: str, n: int = 1, timeout: Optional[float] = None) -> None:
        """Waits this task's booked turn for ``n`` cells of ``key``, fleet-wide: the
        booking takes its place in Redis at once (turns are served in booking order across
        every process and host, and plain checks cannot take them), then this task sleeps
        until its instant.

        With ``timeout`` (seconds), books nothing and raises ``TimeoutError`` at once if
        the turn is further away than that. Cancelled (or timed out by
        ``asyncio.wait_for``) before its instant, the booking is given back by its id,
        even when Redis's answer never arrived: unless a plain check was admitted on that
        key after it, or a later booking is still waiting (then the cells stay spent: the
        limit only errs on the strict side)."""
        await self._acquire(key, n, timeout)

    async def _acquire(self, key: str, n: int, timeout: Optional[float]) -> int:
        """``acquire``, returning how far the key's TAT is past its instant, in
        nanoseconds (0 when the failure policy decided)."""
        key = _key(key)
        n = self._n(n)
        if timeout is not None:
            timeout = _timeout(timeout)
        wait, ahead, booking = await self._book(key, n, timeout)
        if wait > 0:
            try:
                await asyncio.sleep(wait / 1e9)
            except BaseException:
                await self._give_back(*booking)  # type: ignore[misc]
                raise
        return ahead

    async def _book(
        self, key: str, n: int, timeout: Optional[float]
    ) -> Tuple[int, int, Optional[Tuple[str, str]]]:
        """Books ``n`` cells of ``key`` (checked already) whose turn comes within
        ``timeout``, without waiting for it: ``(wait, ahead, booking)``, the wait and how
        far the key's TAT is past the turn in nanoseconds, and what ``_give_back`` takes to
        give the turn back before it comes (``None`` when nothing was booked in Redis: ``n``
        is 0, or the failure policy decided, having waited any local turn already). Raises
        ``_TooFar`` (nothing booked) or a ``RedisLimitError``. Redis failing to answer is
        answered within the one call timeout: the refund of what the call may have booked
        is sent in the background."""
        if n == 0:
            return 0, 0, None
        booking = _booking_id()
        args = self._decide_args(key, self._interval * n, self._extra(timeout), booking)
        try:
            reply = await self._run(args, self._timeout)
        except asyncio.CancelledError:
            await self._give_back(args[3], booking)
            raise
        except Exception as e:
            # No answer (or an error answer): the call may have booked. Give it back.
            self._give_back_later(args[3], booking)
            answered = _answered(e)
            if answered is not None:
                raise answered from e
            await self._acquire_on_failure(key, n, timeout, e)
            return 0, 0, None
        if reply[0] != 1:
            raise self._too_far(int(reply[1]))
        wait = int(reply[2])
        return wait, int(reply[1]) - wait, (args[3], booking)

    async def _wait(self, key: str, timeout: float, n: int = 1) -> Tuple[int, int]:
        """``n`` cells' booked turn within ``timeout``, as ``(wait, ahead)`` (see
        ``_try``): waited (0), or refused for a turn ``wait`` away, booking nothing."""
        try:
            return 0, await self._acquire(key, n, timeout)
        except _TooFar as e:
            return e.wait_ns, e.wait_ns + self._tau - self._interval * n

    async def _acquire_on_failure(
        self, key: str, n: int, timeout: Optional[float], e: BaseException
    ) -> None:
        policy = self._policy
        if policy == "open":
            return
        try:
            if isinstance(policy, KeyedLimiter):
                await policy.acquire(key, n, timeout)
                return
            if isinstance(policy, Limiter):
                await policy.acquire(n, timeout)
                return
        except TimeoutError:
            # The local turn is beyond the timeout: refused, with its wait, as Redis's.
            raise self._too_far(max(int(self._local_wait(key, n) * 1e9), 1)) from None
        raise RedisUnavailable(f"Redis unreachable or too slow, failing closed: {_describe(e)}") from e

    async def _give_back(self, redis_key: str, booking: str) -> None:
        """Sends the refund of ``booking`` (retried in the background while Redis cannot
        answer) and waits for it up to the call timeout, so that a cancelled task has
        given its turn back when it ends, as a rule; a second cancellation leaves the
        refund running on its own."""
        await asyncio.wait((self._give_back_later(redis_key, booking),), timeout=self._timeout)

    def _give_back_later(self, redis_key: str, booking: str) -> "asyncio.Task[None]":
        """Sends the refund of ``booking`` in the background (retried while Redis cannot
        answer), kept alive until it ends."""
        task = asyncio.ensure_future(self._refund(redis_key, booking))
        self._refunds.add(task)
        task.add_done_callback(self._refunds.discard)
        return task

    async def _refund(self, redis_key: str, booking: str) -> None:
        args = ("EVALSHA", _REFUND_SHA, 1, redis_key, booking, self._time)
        for attempt in range(_REFUND_TRIES):
            try:
                await self._run(args, _REFUND_TIMEOUT)
                return  # given back, or nothing to give back: done either way
            except Exception as e:
                if _answered(e) is not None:
                    return  # Redis answered: it will not take the refund
                if attempt + 1 < _REFUND_TRIES:
                    await asyncio.sleep(_REFUND_RETRY)

    async def remaining(self, key: str) -> int:
        """Cells of ``key`` a ``try_acquire`` would get right now, fleet-wide; spends
        nothing. Raises ``RedisUnavailable`` when Redis cannot answer, whatever the
        policy (there is no decision to fall back on)."""
        reply = await self._read(_key(key))
        return int(reply[1])

    async def wait_time(self, key: str, n: int = 1) -> float:
        """Seconds until ``n`` cells of ``key`` would be admitted (0.0: now), at Redis's
        clock; spends nothing. Raises ``RedisUnavailable`` as ``remaining`` does."""
        key = _key(key)
        n = self._n(n)
        return self._wait_from(await self._read(key), n)

    async def _read(self, key: str) -> Any:
        try:
            return await self._run(self._decide_args(key, -1, 0, ""), self._timeout)
        except Exception as e:
            answered = _answered(e)
            if answered is not None:
                raise answered from e
            raise RedisUnavailable(f"Redis unreachable or too slow: {_describe(e)}") from e

    def __call__(self, key: str, n: int = 1, timeout: Optional[float] = None) -> "_Turn":
        """``async with limiter(key):`` waits the booked turn, as ``acquire``."""
        return _Turn(self, key, n, timeout)
