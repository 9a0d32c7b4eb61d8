"""paceline.redis.SyncRedisLimiter: the fleet limiter for threads, on redis.Redis."""

from __future__ import annotations

import threading
import time
from typing import Any, Callable, Optional, Tuple, Union

from .. import KeyedLimiter, Limiter
from .._args import _timeout
from .._blocking import warn_if_on_a_loop
from .core import (
    DECIDE_SCRIPT,
    REFUND_SCRIPT,
    RedisUnavailable,
    _Base,
    _DECIDE_SHA_B,
    _REFUND_RETRY,
    _REFUND_SHA,
    _REFUND_TRIES,
    _Turn,
    _answered,
    _booking_id,
    _describe,
    _is_async_client,
    _key,
    _rexc,
)


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


def _sync_bound(client: Any, not_sync: str, unbounded: str) -> float:
    """What bounds each call on a synchronous client: its ``socket_timeout`` (1 s where
    it cannot be told). ``TypeError(not_sync)`` for a client that is not a synchronous
    redis-py one, ``ValueError(unbounded)`` for one without a socket timeout."""
    if _is_async_client(client) or not hasattr(client, "execute_command"):
        raise TypeError(not_sync)
    bound = _socket_timeout(client)
    if bound is None:
        raise ValueError(unbounded)
    return bound or 1.0


class NoAnswer(Exception):
    """Redis did not answer a booking (unreachable, or slower than the client's
    timeout): ``cause`` is what the client raised."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__(str(cause))
        self.cause = cause


class SyncRedisLimiter(_Base):
    """The same limiter for threads, on a synchronous redis-py client (``redis.Redis``, or
    ``redis.cluster.RedisCluster``): ``try_acquire``, ``remaining`` and ``wait_time``
    without ``await``, and ``acquire_blocking`` (``with limiter(key):``) for the booked
    turn, named as ``paceline.Limiter``'s blocking wait, since it blocks the calling
    thread. Its decisions, keys and policies are ``RedisLimiter``'s.

    A synchronous call cannot be cut short from outside, so each call is bounded by the
    client's own ``socket_timeout`` (and ``socket_connect_timeout``) *per attempt*, times
    the attempts of the client's retry policy, with its backoff between them: redis-py 6
    and later retry 3 times by default, so a hung server at ``socket_timeout=0.25`` holds a
    call about 7 s. For the failure policy to apply within ``socket_timeout``, make the
    client with ``retry=redis.retry.Retry(redis.backoff.NoBackoff(), 0)``. The client must
    have a ``socket_timeout``, and it plays ``RedisLimiter``'s ``timeout``. A booking
    whose answer did not come is given back from a daemon thread, not by the caller. A
    thread interrupted while it
    waits its turn (Ctrl-C) gives the booking back, as a cancelled task does.
    """

    def __init__(
        self, client: Any, rate: int, per: float = 1.0, burst: Optional[int] = None, *,
        prefix: str = "paceline", on_failure: Union[str, Limiter, KeyedLimiter] = "closed",
    ) -> None:
        bound = _sync_bound(
            client,
            "SyncRedisLimiter takes a synchronous redis-py client (redis.Redis or "
            f"redis.cluster.RedisCluster), got {type(client).__name__}; for "
            "redis.asyncio use paceline.redis.RedisLimiter",
            "the client has no socket_timeout, so a Redis that stops answering would "
            "block every caller for ever and the failure policy would never apply: "
            "make it with one, e.g. redis.Redis(..., socket_timeout=0.25, "
            "socket_connect_timeout=0.25, retry=Retry(NoBackoff(), 0)) (Retry from "
            "redis.retry, NoBackoff from redis.backoff: without it redis-py retries 3 "
            "times, with backoff, before the policy applies)",
        )
        super().__init__(client, rate, per, burst, prefix, bound, on_failure)
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
        try:
            wait, give_back = self._book(key, n, timeout)
        except NoAnswer as e:
            self._acquire_on_failure(key, n, timeout, e.cause)
            return
        if wait > 0:
            try:
                warn_if_on_a_loop(lambda: True, "paceline.redis.RedisLimiter's `await limiter.acquire(key)`")
                time.sleep(wait / 1e9)
            except BaseException:
                give_back()
                raise

    def _book(self, key: str, n: int, timeout: Optional[float]) -> Tuple[int, Callable[[], None]]:
        """Books ``n`` cells of ``key`` (both checked) within ``timeout``: the
        nanoseconds until the turn, and what gives the booking back. ``NoAnswer`` when
        Redis did not answer (the booking, if it was made, is given back from a daemon
        thread), ``RedisRejected`` when it refused, ``TimeoutError`` past ``timeout``."""
        booking = _booking_id()
        args = self._decide_args(key, self._interval * n, self._extra(timeout), booking)
        try:
            reply = self._send(args)
        except Exception as e:
            # Booked or not, the caller is not kept waiting for the refund: Redis just
            # failed to answer in time, so a daemon thread sends it.
            self._give_back_later(args[3], booking)
            answered = _answered(e)
            if answered is not None:
                raise answered from e
            raise NoAnswer(e) from e
        except BaseException:
            self._give_back(args[3], booking)
            raise
        if reply[0] != 1:
            raise self._too_far(int(reply[1]))
        return int(reply[2]), lambda: self._give_back(args[3], booking)

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
        if not self._refund_once(redis_key, booking):
            self._give_back_later(redis_key, booking)

    def _give_back_later(self, redis_key: str, booking: str) -> None:
        threading.Thread(target=self._refund_retrying, args=(redis_key, booking), daemon=True).start()

    def _refund_once(self, redis_key: str, booking: str) -> bool:
        try:
            self._send(("EVALSHA", _REFUND_SHA, 1, redis_key, booking, self._time))
            return True
        except Exception as e:
            return _answered(e) is not None

    def _refund_retrying(self, redis_key: str, booking: str) -> None:
        for _ in range(_REFUND_TRIES):
            if self._refund_once(redis_key, booking):
                return
            time.sleep(_REFUND_RETRY)

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
