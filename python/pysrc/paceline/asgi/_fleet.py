"""The limits of ``paceline.asgi`` kept in Redis (``Limit(..., redis=client)``): one bound
per client for a whole fleet of ASGI servers.

The client's key is read by the Rust layer's own key sources (``KeyReader``); the
decision is ``paceline.redis``'s (the Rust fleet limiter's script); the refusal carries
``Retry-After`` and the ``RateLimit-Policy`` / ``RateLimit`` fields as the Rust layer
writes them. Limits kept in the process or in a shared file are decided first, by the
Rust layer; the limits in Redis then, in their order. A request refused by one of them
may have spent a cell of a limit in Redis checked before it (the strict side: the fleet
never passes more than its quota).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import math
import time
from typing import Any, List, Optional, Tuple

from ._listen import watching

_log = logging.getLogger("paceline.asgi")

# Text keys longer than this many bytes are kept as a digest of themselves, so a client
# that sends a 100 KB header costs Redis no more than one that sends a short one (the
# Rust layer's bound for its own table). SHA-256, unseeded: every server of the fleet
# computes the same key.
_MAX_TEXT_KEY = 64
# The key that requests without one share (on_missing_key="shared"): it starts with a
# NUL, which no header value, address or digest does.
_KEYLESS = "\x00keyless"
# How long to answer 503s before logging Redis's trouble again, per limit.
_LOG_EVERY = 60.0


def _bounded(key: str) -> str:
    if len(key) > _MAX_TEXT_KEY // 4 and len(key.encode("utf-8", "surrogatepass")) > _MAX_TEXT_KEY:
        return "\x01" + hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()
    return key


def _policy(rate: int, per: float, burst: int) -> Tuple[int, int]:
    """``RateLimit-Policy``'s ``q`` and ``w`` as the Rust layer writes them: ``w`` the
    burst window in whole seconds (at least 1), ``q`` the cells the rate admits in ``w``,
    rounded down."""
    interval = max(int(per * 1e9) // rate, 1)
    w = max(math.ceil(interval * burst / 1e9), 1)
    return w * 1_000_000_000 // interval, w


def _field_name(name: str) -> str:
    return '"' + name.replace("\\", "\\\\").replace('"', '\\"') + '"'


class FleetLimit:
    """One ``Limit`` kept in Redis: its limiter, its key reader, its fields."""

    def __init__(self, limit: Any) -> None:
        from .._paceline import new_key_reader

        self.name = limit.name
        self.limiter = limit.redis  # its paceline.redis.RedisLimiter
        self.key_fn = limit.key._fn
        self.reader = None if self.key_fn is not None else new_key_reader(limit.key._spec)
        self.cost = limit.cost
        self.methods = limit.methods
        self.exempt_when = limit.exempt_when
        field = _field_name(limit.name)
        count, per, burst, _ = limit._rates[0]
        q, w = _policy(count, per, burst)
        self.policy = (b"ratelimit-policy", f"{field};q={q};w={w}".encode())
        self.field = field
        self.interval = self.limiter._interval
        self.tau = self.limiter._tau
        self.logged_at = -_LOG_EVERY

    async def applies(self, scope: Any) -> bool:
        if self.methods is not None and scope["method"] not in self.methods:
            return False
        if self.exempt_when is None:
            return True
        skip = self.exempt_when(scope)
        if hasattr(skip, "__await__"):
            skip = await skip
        return not skip

    async def key(self, scope: Any) -> Optional[str]:
        if self.key_fn is not None:
            key = self.key_fn(scope)
            if hasattr(key, "__await__"):
                key = await key
            if key is not None and not isinstance(key, str):
                raise TypeError(f"a key function must return a str or None, got {key!r}")
        else:
            key = self.reader.key(scope["headers"], scope.get("client"))  # type: ignore[union-attr]
        return None if key is None else _bounded(key)

    def state(self, ahead_ns: int) -> Tuple[bytes, bytes]:
        """The ``RateLimit`` item for a key whose TAT is ``ahead_ns`` past now."""
        remaining = max(self.tau - ahead_ns, 0) // self.interval
        t = math.ceil(max(ahead_ns, 0) / 1e9)
        return (b"ratelimit", f"{self.field};r={remaining};t={t}".encode())

    def trouble(self, e: BaseException) -> None:
        now = time.monotonic()
        if now - self.logged_at >= _LOG_EVERY:
            self.logged_at = now
            _log.error(
                "paceline: the rate limit %r keeps its state in Redis, which failed "
                "(answering 503 until it recovers; logged once a minute): %s",
                self.name,
                e,
            )


class Answer:
    """A refusal decided here (a ``Refused``'s shape)."""

    __slots__ = ("status", "headers", "body", "limit", "wait", "table_full")

    def __init__(
        self,
        status: int,
        headers: List[Tuple[bytes, bytes]],
        body: bytes,
        limit: Optional[str] = None,
        wait: float = 0.0,
    ) -> None:
        self.status = status
        self.headers = headers
        self.body = body
        self.limit = limit
        self.wait = wait
        self.table_full = False


def _unavailable(limit: FleetLimit) -> Answer:
    """503 with ``Retry-After: 1`` and no ``RateLimit`` field: the client spent nothing."""
    body = b"Service Unavailable: the rate limit store cannot be reached, retry in 1 s\n"
    headers = [
        (b"content-type", b"text/plain; charset=utf-8"),
        (b"retry-after", b"1"),
    ]
    return Answer(503, headers, body)


def _too_many(limit: FleetLimit, wait_ns: int, cost: int) -> Answer:
    retry_after = max(math.ceil(wait_ns / 1e9), 1)
    ahead = wait_ns + limit.tau - limit.interval * cost  # the refused wait, back to the TAT
    headers = [
        (b"content-type", b"text/plain; charset=utf-8"),
        (b"retry-after", str(retry_after).encode()),
        limit.policy,
        limit.state(ahead),
    ]
    body = f'Too Many Requests: limit "{limit.name}", retry in {retry_after} s\n'.encode()
    return Answer(429, headers, body, limit.name, wait_ns / 1e9)


def _never(limit: FleetLimit, cost: int) -> Answer:
    body = (
        f'Too Many Requests: limit "{limit.name}": this request costs {cost}, more than the '
        "limit's burst: it can never be admitted\n"
    ).encode()
    headers = [(b"content-type", b"text/plain; charset=utf-8"), limit.policy]
    return Answer(429, headers, body, limit.name, 0.0)


class FleetLimits:
    """The limits of one middleware that live in Redis."""

    def __init__(
        self,
        limits: List[Any],
        *,
        missing: Optional[str],
        headers_on_success: bool,
        wait_up_to: Optional[float],
        buffer: int,
    ) -> None:
        self.limits = [FleetLimit(limit) for limit in limits]
        self.missing = missing
        self.headers_on_success = headers_on_success
        self.wait_up_to = wait_up_to
        self.buffer = buffer

    async def check(
        self, scope: Any, receive: Any
    ) -> Tuple[Optional[Answer], List[Tuple[bytes, bytes]], List[Any], bool]:
        """``(refusal, fields, kept, gone)``: the refusal to answer with (``None``: pass),
        the fields to add to an admitted response, the messages read while waiting, and
        whether the client went away meanwhile."""
        fields: List[Tuple[bytes, bytes]] = []
        kept: List[Any] = []
        for limit in self.limits:
            if not await limit.applies(scope):
                continue
            key = await limit.key(scope)
            if key is None:
                if self.missing == "skip":
                    continue
                if self.missing not in (None, "shared"):
                    status = int(self.missing)  # type: ignore[arg-type]
                    body = b"a rate-limit key is missing from the request\n"
                    headers = [(b"content-type", b"text/plain; charset=utf-8")]
                    return Answer(status, headers, body), fields, kept, False
                key = _KEYLESS
            cost = limit.cost
            if callable(cost):
                cost = cost(scope)
                if hasattr(cost, "__await__"):
                    cost = await cost
                if isinstance(cost, bool) or not isinstance(cost, int) or not 0 <= cost <= 0xFFFF_FFFF:
                    raise TypeError(
                        f"a cost function must return an int from 0 to 4294967295, got {cost!r}"
                    )
            if cost == 0:
                continue
            if cost * limit.interval > limit.tau:
                return _never(limit, cost), fields, kept, False
            try:
                if self.wait_up_to is None:
                    wait, ahead = await limit.limiter._try(key, cost)
                else:
                    turn = limit.limiter._wait(key, self.wait_up_to, cost)
                    waited, more = await watching(turn, receive, self.buffer)
                    kept.extend(more)
                    if waited is None:
                        return None, fields, kept, True  # the client went away
                    wait, ahead = waited
            except Exception as e:  # noqa: BLE001 - Redis's trouble, answered with a 503
                from ..redis import RedisLimitError

                if not isinstance(e, RedisLimitError):
                    raise
                limit.trouble(e)
                return _unavailable(limit), fields, kept, False
            if wait > 0:
                return _too_many(limit, wait, cost), fields, kept, False
            if self.headers_on_success:
                fields.append(limit.policy)
                fields.append(limit.state(ahead))
        return None, fields, kept, False
