"""What paceline.redis's two limiters share: the scripts, the errors, the checks of keys
and arguments, the base of their decisions, and the watchdog of their bookings."""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import os
import secrets
import sys
import time
from typing import Any, Dict, Optional, Tuple, Union

try:
    import redis.exceptions as _rexc
except ImportError as e:  # pragma: no cover - the message is the point
    raise ImportError(
        "paceline.redis runs on redis-py: pip install 'paceline[redis]' (or redis>=5)"
    ) from e

from .. import KeyedLimiter, Limiter
from .._args import _count, _finite, _quota
from .._paceline import (
    REDIS_DECIDE_SCRIPT as DECIDE_SCRIPT,
    REDIS_MAX_WINDOW_NS as MAX_WINDOW_NS,
    REDIS_REFUND_SCRIPT as REFUND_SCRIPT,
    redis_quota,
)


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
    Anything that is not redis-py's is raised as it is (a bug is not Redis's answer), but
    for an asyncio client whose connections belong to an event loop that is gone (a
    client made at import and used by a framework's test client, which runs a loop per
    block): Redis cannot be reached from this loop, an outage."""
    if isinstance(e, _UNREACHABLE):
        return None
    if not isinstance(e, _rexc.RedisError):
        if isinstance(e, RuntimeError) and _LOOP_GONE in str(e):
            return None
        raise e
    message = str(e)
    if message.startswith("BUSY"):
        # Another client's script runs past the server's time limit: Redis serves no one
        # until it ends or is killed, an outage like a loading server.
        return None
    oom = getattr(_rexc, "OutOfMemoryError", ())
    if (oom and isinstance(e, oom)) or message.startswith("OOM"):
        return RedisOutOfMemory(f"Redis is out of memory: {message}")
    return RedisRejected(f"Redis refused the rate-limit call: {message}")


def _unanswered(e: BaseException) -> RedisLimitError:
    """The exception to raise for a call with no decision to fall back on: what Redis
    answered (see ``_answered``), else ``RedisUnavailable``."""
    answered = _answered(e)
    if answered is not None:
        return answered
    return RedisUnavailable(f"Redis unreachable or too slow: {_describe(e)}")


# What asyncio says of a connection used on another loop than its own, or after it.
_LOOP_GONE = "loop"


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
    return _finite(
        value, True, "timeout must be a number of seconds", "timeout must be a positive, finite number of seconds"
    )


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
        if timeout is None or timeout * 1e9 >= MAX_WINDOW_NS:
            return MAX_WINDOW_NS
        return int(timeout * 1e9)

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
