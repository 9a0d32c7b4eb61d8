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
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import os
import secrets
import sys
import threading
import time
import weakref
from typing import Any, Dict, Optional, Tuple, Union

try:
    import redis.exceptions as _rexc
except ImportError as e:  # pragma: no cover - the message is the point
    raise ImportError(
        "paceline.redis runs on redis-py: pip install 'paceline[redis]' (or redis>=5)"
    ) from e

from . import KeyedLimiter, Limiter
from ._args import _count, _quota, _timeout
from ._paceline import (
    REDIS_DECIDE_SCRIPT as DECIDE_SCRIPT,
    REDIS_MAX_WINDOW_NS as MAX_WINDOW_NS,
    REDIS_REFUND_SCRIPT as REFUND_SCRIPT,
    redis_quota,
)

__all__ = [
    "RedisLimiter",
    "SyncRedisLimiter",
    "RedisLimitError",
    "RedisUnavailable",
    "RedisRejected",
    "RedisOutOfMemory",
    "DECIDE_SCRIPT",
    "REFUND_SCRIPT",
    "MAX_KEY_LEN",
]

#: The longest key accepted, in bytes of UTF-8 (the Rust fleet limiter's bound).
MAX_KEY_LEN = 1024

_DECIDE_SHA = hashlib.sha1(DECIDE_SCRIPT.encode()).hexdigest()
_REFUND_SHA = hashlib.sha1(REFUND_SCRIPT.encode()).hexdigest()
_DECIDE_SHA_B = _DECIDE_SHA.encode()

# A refund is sent up to this many times, this far apart, each within this long, before
# the cell is left spent (the strict side), as the Rust limiter does.
_REFUND_TRIES = 5
_REFUND_RETRY = 0.2
_REFUND_TIMEOUT = 2.0

# Keys Redis refused, remembered locally at most (the map is cleared when it fills).
_MAX_REMEMBERED = 100_000

# Python 3.11+ tells a cancellation of ours from another's (Task.uncancel).
_UNCANCEL = sys.version_info >= (3, 11)


class RedisLimitError(Exception):
    """What the fleet limiter raises besides ``TimeoutError`` and bad-input errors."""


class RedisUnavailable(RedisLimitError):
    """Redis could not answer (unreachable, or slower than the limiter's ``timeout``) and
    the failure policy is ``"closed"``; also from ``remaining`` and ``wait_time``, which
    have no decision to fall back on. The redis-py error is its ``__cause__``."""


class RedisRejected(RedisLimitError):
    """Redis answered with an error: a value of another type at the limiter's key, or one
    that is not the limiter's (something else writes there), or a script error. Not an
    outage: nothing is admitted, whatever the failure policy."""


class RedisOutOfMemory(RedisRejected):
    """Redis is out of memory (``maxmemory`` reached with a policy that evicts nothing)
    and refused to write. Not an outage: nothing is admitted, whatever the failure
    policy."""


class _TooFar(TimeoutError):
    """The turn is further away than the caller's timeout: nothing was booked."""

    def __init__(self, wait_ns: int) -> None:
        super().__init__(
            f"the turn is {wait_ns / 1e9:.6f} s away, longer than the timeout; nothing was booked"
        )
        self.wait_ns = wait_ns


# Errors that mean "no answer": the failure policy decides. Redirections the client could
# not follow and a cluster without coverage count, as do a loading server, a replica that
# was a master (READONLY) and a master that is down; and a timeout of ours.
_UNREACHABLE: Tuple[type, ...] = (
    _rexc.ConnectionError,
    _rexc.TimeoutError,
    _rexc.BusyLoadingError,
    _rexc.ReadOnlyError,
    _rexc.ClusterError,
    _rexc.TryAgainError,
    _rexc.InvalidResponse,
    OSError,
    asyncio.TimeoutError,
    TimeoutError,
)
for _name in ("ClusterDownError", "MasterDownError", "RedisClusterException", "AskError"):
    if hasattr(_rexc, _name):
        _UNREACHABLE += (getattr(_rexc, _name),)


def _answered(e: BaseException) -> Optional[RedisLimitError]:
    """The exception to raise for an error Redis answered, or ``None`` for an outage.
    Anything that is not redis-py's is raised as it is: a bug is not Redis's answer."""
    if isinstance(e, _UNREACHABLE):
        return None
    if not isinstance(e, _rexc.RedisError):
        raise e
    message = str(e)
    oom = getattr(_rexc, "OutOfMemoryError", ())
    if (oom and isinstance(e, oom)) or message.startswith("OOM"):
        return RedisOutOfMemory(f"Redis is out of memory: {message}")
    return RedisRejected(f"Redis refused the rate-limit call: {message}")


def _describe(e: BaseException) -> str:
    """An error in a message: its class and what it says."""
    said = e.args[0] if e.args else ""
    return f"{type(e).__name__}: {said}" if said else type(e).__name__


# Booking ids: a random part per process, drawn again in a forked child (so a parent and
# its children never share ids on a key), and a counter. Neither spaces nor colons: the
# scripts list bookings as " id:cost".
_ids = {"nonce": secrets.token_hex(8), "count": itertools.count()}


def _new_ids() -> None:
    _ids["nonce"] = secrets.token_hex(8)
    _ids["count"] = itertools.count()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_new_ids)


def _booking_id() -> str:
    return f"{_ids['nonce']}.{next(_ids['count']):x}"


def _key(key: object) -> str:
    if not isinstance(key, str):
        raise TypeError(f"key must be a str, got {type(key).__name__}")
    try:
        size = len(key.encode("utf-8"))
    except UnicodeEncodeError:
        raise ValueError("key must be valid text (it holds a lone surrogate)") from None
    if not 1 <= size <= MAX_KEY_LEN:
        raise ValueError(f"key must be 1 to {MAX_KEY_LEN} bytes of UTF-8, got {size}")
    return key


def _prefix(prefix: object) -> str:
    if not isinstance(prefix, str) or not prefix:
        raise ValueError(f"prefix must be a non-empty str, got {prefix!r}")
    if "{" in prefix or "}" in prefix:
        # The key is the hash tag: braces in the prefix would put every key on one slot.
        raise ValueError(f"prefix must not hold braces (the key is the hash tag), got {prefix!r}")
    return prefix


def _call_timeout(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"timeout must be a number of seconds, got {type(value).__name__}")
    value = float(value)
    if not 0.0 < value < float("inf"):
        raise ValueError(f"timeout must be a positive, finite number of seconds, got {value}")
    return value


def _policy(on_failure: object) -> Union[str, Limiter, KeyedLimiter]:
    if on_failure in ("closed", "open") or isinstance(on_failure, (Limiter, KeyedLimiter)):
        return on_failure  # type: ignore[return-value]
    raise ValueError(
        'on_failure must be "closed", "open", a paceline.KeyedLimiter (a share per key) '
        f"or a paceline.Limiter (one share for every key), got {on_failure!r}"
    )


class _Base:
    """What the async limiter and its synchronous twin share: the quota as the scripts
    take it, the keys, the policy, the local cache of refusals."""

    def __init__(
        self,
        client: Any,
        rate: int,
        per: float,
        burst: int,
        prefix: str,
        timeout: float,
        on_failure: object,
    ) -> None:
        rate, per, burst = _quota(rate, per, burst)
        self._interval, self._tau = redis_quota(rate, per, burst)
        self._rate, self._per, self._burst = rate, per, burst
        self._interval_b, self._tau_b = b"%d" % self._interval, b"%d" % self._tau
        self._client = client
        self._prefix = _prefix(prefix)
        self._timeout = _call_timeout(timeout)
        self._policy = _policy(on_failure)
        # Keys Redis refused, and the monotonic instant one cell fits again (the local fast
        # path: a flood of refusals for one key costs no round trips).
        self._refused: Dict[str, float] = {}
        # Test mode: decisions at this Redis time in µs instead of the server's TIME.
        self._time = ""

    @property
    def burst(self) -> int:
        """The most cells ever admitted at once, per key."""
        return self._burst

    @property
    def prefix(self) -> str:
        """The first part of every Redis key: ``<prefix>:{<key>}``."""
        return self._prefix

    def __repr__(self) -> str:
        policy = self._policy if isinstance(self._policy, str) else type(self._policy).__name__
        return (
            f"{type(self).__name__}(rate={self._rate}, per={self._per}, burst={self._burst}, "
            f"prefix={self._prefix!r}, on_failure={policy!r})"
        )

    def _redis_key(self, key: str) -> str:
        return f"{self._prefix}:{{{key}}}"

    def _n(self, n: object) -> int:
        n = _count("n", n, 0)
        if n > self._burst:
            raise ValueError(
                f"n = {n} is more than the burst ({self._burst}): it can never be admitted"
            )
        return n

    def _set_fixed_time(self, micros: Optional[int]) -> None:
        """Test mode, as the Rust limiter's ``set_fixed_time``: later decisions are made at
        this Redis time (µs, above 0) instead of the server's clock; ``None`` ends it."""
        self._time = "" if micros is None else str(max(int(micros), 1))
        self._refused.clear()

    def _locally_refused(self, key: str, n: int) -> int:
        """Nanoseconds that ``n`` cells of ``key`` are still refused locally (0: ask)."""
        one_fits = self._refused.get(key)
        if one_fits is None:
            return 0
        left = one_fits + (n - 1) * self._interval / 1e9 - time.monotonic()
        return max(int(left * 1e9), 1) if left > 0 else 0

    def _remember_refusal(self, key: str, n: int, wait_ns: int) -> None:
        if self._time:
            return  # test mode: local time means nothing there
        one = wait_ns - (n - 1) * self._interval
        if one <= 0:
            return
        if len(self._refused) >= _MAX_REMEMBERED:
            self._refused.clear()
        self._refused[key] = time.monotonic() + one / 1e9

    def _decide_args(self, key: str, cost: int, extra: int, booking: str) -> tuple:
        # The constant arguments as bytes already: redis-py passes bytes as they are.
        return (
            "EVALSHA",  # a str: redis-py's cluster routing looks the name up as text
            _DECIDE_SHA_B,
            1,
            self._redis_key(key),
            self._interval_b,
            self._tau_b,
            cost,
            self._time,
            extra,
            booking,
        )

    def _extra(self, timeout: Optional[float]) -> int:
        if timeout is None:
            return MAX_WINDOW_NS
        return min(int(timeout * 1e9), MAX_WINDOW_NS)

    def _too_far(self, wait_ns: int) -> TimeoutError:
        return _TooFar(wait_ns)

    def _try_on_failure(self, key: str, n: int, e: BaseException) -> bool:
        policy = self._policy
        if policy == "open":
            return True
        if isinstance(policy, KeyedLimiter):
            return bool(policy.try_acquire(key, n))
        if isinstance(policy, Limiter):
            return policy.try_acquire(n)
        raise RedisUnavailable(f"Redis unreachable or too slow, failing closed: {_describe(e)}") from e

    def _local_wait(self, key: str, n: int) -> float:
        policy = self._policy
        if isinstance(policy, KeyedLimiter):
            return policy.wait_time(key, n)
        if isinstance(policy, Limiter):
            return policy.wait_time(n)
        return 0.0

    def _wait_from(self, reply: Any, n: int) -> float:
        ahead = int(reply[2])
        return max(0, ahead - (self._tau - n * self._interval)) / 1e9


def _is_async_client(client: Any) -> bool:
    execute = getattr(client, "execute_command", None)
    return execute is not None and asyncio.iscoroutinefunction(execute)


class RedisLimiter(_Base):
    """``rate`` cells per ``per`` seconds per key, at most ``burst`` at once, for every
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
        self,
        client: Any,
        rate: int,
        per: float = 1.0,
        burst: int = 1,
        *,
        prefix: str = "paceline",
        timeout: float = 0.25,
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
        # The timer that bounds calls, per event loop (a client serves one loop; a loop
        # that ends takes its entry with it).
        self._watchdogs: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Watchdog]" = (
            weakref.WeakKeyDictionary()
        )

    async def _send(self, args: tuple) -> Any:
        """The script's answer; a server without it in its cache (``NOSCRIPT``) gets the
        script itself, which loads it again."""
        execute = self._client.execute_command
        try:
            return await execute(*args)
        except _rexc.NoScriptError:
            script = DECIDE_SCRIPT if args[1] == _DECIDE_SHA_B else REFUND_SCRIPT
            return await execute("EVAL", script, *args[2:])

    async def _run(self, args: tuple, seconds: float) -> Any:
        """``_send`` within ``seconds``: past them, ``asyncio.TimeoutError``. The bound
        is kept by one timer per event loop for every call in flight (``_Watchdog``), not
        by a timer per call: ``asyncio.timeout`` costs more than a tenth of a loopback
        round trip, and this is every check's path."""
        loop = asyncio.get_running_loop()
        watchdog = self._watchdogs.get(loop)
        if watchdog is None:
            # A quarter of the shortest bound it keeps (a call's, or a refund's).
            watchdog = self._watchdogs[loop] = _Watchdog(min(self._timeout, _REFUND_TIMEOUT) / 4)
        task = asyncio.current_task()
        watchdog.watch(loop, task, loop.time() + seconds)
        try:
            return await self._send(args)
        except asyncio.CancelledError:
            if task not in watchdog.expired:
                raise  # someone else's cancellation
            watchdog.expired.discard(task)
            # Before 3.11 a cancellation by someone else at the same moment cannot be told
            # apart, and is taken for the timeout.
            if _UNCANCEL and task.uncancel() > 0:  # type: ignore[union-attr]
                raise  # cancelled by someone else as well
            raise asyncio.TimeoutError(f"no answer from Redis within {seconds} s") from None
        finally:
            del watchdog.calls[task]
            if watchdog.expired:
                watchdog.expired.discard(task)

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
        if n == 0:
            return 0
        booking = _booking_id()
        args = self._decide_args(key, self._interval * n, self._extra(timeout), booking)
        try:
            reply = await self._run(args, self._timeout)
        except asyncio.CancelledError:
            await self._give_back(args[3], booking)
            raise
        except Exception as e:
            # No answer (or an error answer): the call may have booked. Give it back.
            await self._give_back(args[3], booking)
            answered = _answered(e)
            if answered is not None:
                raise answered from e
            await self._acquire_on_failure(key, n, timeout, e)
            return 0
        if reply[0] != 1:
            raise self._too_far(int(reply[1]))
        wait = int(reply[2])
        if wait > 0:
            try:
                await asyncio.sleep(wait / 1e9)
            except BaseException:
                await self._give_back(args[3], booking)
                raise
        return int(reply[1]) - wait

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
        task = asyncio.ensure_future(self._refund(redis_key, booking))
        self._refunds.add(task)
        task.add_done_callback(self._refunds.discard)
        await asyncio.wait((task,), timeout=self._timeout)

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


class _Watchdog:
    """Bounds the calls in flight on one event loop with one timer: every ``period``
    while calls are in flight, it cancels those past their deadline (so a call is cut
    between its deadline and a period after it). Touched only from its loop's thread."""

    __slots__ = ("period", "calls", "expired", "armed")

    def __init__(self, period: float) -> None:
        self.period = period
        self.calls: Dict[Any, float] = {}  # task -> deadline (loop time)
        self.expired: "set[Any]" = set()  # tasks cancelled for their deadline
        self.armed = False

    def watch(self, loop: asyncio.AbstractEventLoop, task: Any, deadline: float) -> None:
        self.calls[task] = deadline
        if not self.armed:
            self.armed = True
            loop.call_later(self.period, self.tick, loop)

    def tick(self, loop: asyncio.AbstractEventLoop) -> None:
        now = loop.time()
        for task, deadline in list(self.calls.items()):
            if deadline <= now and task not in self.expired:
                self.expired.add(task)
                task.cancel()
        if self.calls:
            loop.call_later(self.period, self.tick, loop)
        else:
            self.armed = False


class _Turn:
    __slots__ = ("_limiter", "_key", "_n", "_timeout")

    def __init__(self, limiter: Any, key: str, n: int, timeout: Optional[float]) -> None:
        self._limiter, self._key, self._n, self._timeout = limiter, key, n, timeout

    async def __aenter__(self) -> None:
        await self._limiter.acquire(self._key, self._n, self._timeout)

    async def __aexit__(self, *exc: object) -> None:
        return None

    def __enter__(self) -> None:
        self._limiter.acquire_blocking(self._key, self._n, self._timeout)

    def __exit__(self, *exc: object) -> None:
        return None


def _socket_timeout(client: Any) -> Optional[float]:
    """The socket timeout a redis-py client's connections use (``None``: none), or
    ``False`` when it cannot be told."""
    pool = getattr(client, "connection_pool", None)
    kwargs = getattr(pool, "connection_kwargs", None)
    if kwargs is None:
        manager = getattr(client, "nodes_manager", None)
        kwargs = getattr(manager, "connection_kwargs", None)
    if kwargs is None:
        return False  # type: ignore[return-value]
    return kwargs.get("socket_timeout")


class SyncRedisLimiter(_Base):
    """The same limiter for threads, on a synchronous redis-py client (``redis.Redis``, or
    ``redis.cluster.RedisCluster``): ``try_acquire``, ``remaining`` and ``wait_time``
    without ``await``, and ``acquire_blocking`` (``with limiter(key):``) for the booked
    turn, named as ``paceline.Limiter``'s blocking wait, since it blocks the calling
    thread. Its decisions, keys and policies are ``RedisLimiter``'s.

    A synchronous call cannot be cut short from outside, so each call is bounded by the
    client's own ``socket_timeout`` (and ``socket_connect_timeout``, times its retry
    policy: redis-py retries a failed connection, with backoff, unless told otherwise):
    the client must have a ``socket_timeout``, and it plays ``RedisLimiter``'s
    ``timeout``. A thread interrupted while it
    waits its turn (Ctrl-C) gives the booking back, as a cancelled task does.
    """

    def __init__(
        self,
        client: Any,
        rate: int,
        per: float = 1.0,
        burst: int = 1,
        *,
        prefix: str = "paceline",
        on_failure: Union[str, Limiter, KeyedLimiter] = "closed",
    ) -> None:
        if _is_async_client(client) or not hasattr(client, "execute_command"):
            raise TypeError(
                "SyncRedisLimiter takes a synchronous redis-py client (redis.Redis or "
                f"redis.cluster.RedisCluster), got {type(client).__name__}; for "
                "redis.asyncio use paceline.redis.RedisLimiter"
            )
        bound = _socket_timeout(client)
        if bound is None:
            raise ValueError(
                "the client has no socket_timeout, so a Redis that stops answering would "
                "block every caller for ever and the failure policy would never apply: "
                "make it with one, e.g. redis.Redis(..., socket_timeout=0.25, "
                "socket_connect_timeout=0.25)"
            )
        super().__init__(client, rate, per, burst, prefix, bound or 1.0, on_failure)
        self._refund_lock = threading.Lock()

    def _send(self, args: tuple) -> Any:
        execute = self._client.execute_command
        try:
            return execute(*args)
        except _rexc.NoScriptError:
            script = DECIDE_SCRIPT if args[1] == _DECIDE_SHA_B else REFUND_SCRIPT
            return execute("EVAL", script, *args[2:])

    def try_acquire(self, key: str, n: int = 1) -> bool:
        """As ``RedisLimiter.try_acquire``."""
        key = _key(key)
        n = self._n(n)
        if n == 0:
            return True
        if key in self._refused and self._locally_refused(key, n):
            return False
        try:
            reply = self._send(self._decide_args(key, self._interval * n, 0, ""))
        except Exception as e:
            answered = _answered(e)
            if answered is not None:
                raise answered from e
            return self._try_on_failure(key, n, e)
        if reply[0] == 1:
            return True
        self._remember_refusal(key, n, int(reply[1]))
        return False

    def acquire_blocking(self, key: str, n: int = 1, timeout: Optional[float] = None) -> None:
        """Blocks this thread for its booked turn for ``n`` cells of ``key``, with the
        same ``timeout`` rule as ``RedisLimiter.acquire``. Interrupted (Ctrl-C's
        ``KeyboardInterrupt``, any exception from a signal handler) before its instant, it
        gives the booking back."""
        key = _key(key)
        n = self._n(n)
        if timeout is not None:
            timeout = _timeout(timeout)
        if n == 0:
            return
        booking = _booking_id()
        args = self._decide_args(key, self._interval * n, self._extra(timeout), booking)
        try:
            reply = self._send(args)
        except Exception as e:
            self._give_back(args[3], booking)
            answered = _answered(e)
            if answered is not None:
                raise answered from e
            self._acquire_on_failure(key, n, timeout, e)
            return
        except BaseException:
            self._give_back(args[3], booking)
            raise
        if reply[0] != 1:
            raise self._too_far(int(reply[1]))
        wait = int(reply[2])
        if wait > 0:
            try:
                time.sleep(wait / 1e9)
            except BaseException:
                self._give_back(args[3], booking)
                raise

    def _acquire_on_failure(
        self, key: str, n: int, timeout: Optional[float], e: BaseException
    ) -> None:
        policy = self._policy
        if policy == "open":
            return
        if isinstance(policy, KeyedLimiter):
            policy.acquire_blocking(key, n, timeout)
            return
        if isinstance(policy, Limiter):
            policy.acquire_blocking(n, timeout)
            return
        raise RedisUnavailable(f"Redis unreachable or too slow, failing closed: {_describe(e)}") from e

    def _give_back(self, redis_key: str, booking: str) -> None:
        """Sends the refund once now; if Redis cannot take it, a daemon thread tries
        again (as the async limiter's background refunds)."""
        if self._refund_once(redis_key, booking):
            return
        thread = threading.Thread(
            target=self._refund_retrying, args=(redis_key, booking), daemon=True
        )
        thread.start()

    def _refund_once(self, redis_key: str, booking: str) -> bool:
        try:
            self._send(("EVALSHA", _REFUND_SHA, 1, redis_key, booking, self._time))
            return True
        except Exception as e:
            return _answered(e) is not None

    def _refund_retrying(self, redis_key: str, booking: str) -> None:
        for _ in range(_REFUND_TRIES - 1):
            time.sleep(_REFUND_RETRY)
            if self._refund_once(redis_key, booking):
                return

    def remaining(self, key: str) -> int:
        """As ``RedisLimiter.remaining``."""
        return int(self._read(_key(key))[1])

    def wait_time(self, key: str, n: int = 1) -> float:
        """As ``RedisLimiter.wait_time``."""
        key = _key(key)
        n = self._n(n)
        return self._wait_from(self._read(key), n)

    def _read(self, key: str) -> Any:
        try:
            return self._send(self._decide_args(key, -1, 0, ""))
        except Exception as e:
            answered = _answered(e)
            if answered is not None:
                raise answered from e
            raise RedisUnavailable(f"Redis unreachable or too slow: {_describe(e)}") from e

    def __call__(self, key: str, n: int = 1, timeout: Optional[float] = None) -> _Turn:
        """``with limiter(key):`` waits the booked turn, as ``acquire_blocking``."""
        return _Turn(self, key, n, timeout)

