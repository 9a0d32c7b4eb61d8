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
        from . import _paceline

        self.name = limit.name
        self.limiter = limit.redis  # its paceline.redis.RedisLimiter
        self.key_fn = limit.key._fn
        self.reader = None if self.key_fn is not None else _paceline.new_key_reader(limit.key._spec)
        field = _field_name(limit.name)
        q, w = _policy(limit.rate, limit.per, limit.burst)
        self.policy = (b"ratelimit-policy", f"{field};q={q};w={w}".encode())
        self.field = field
        self.interval = self.limiter._interval
        self.tau = self.limiter._tau
        self.logged_at = -_LOG_EVERY

    def key(self, scope: Any) -> Optional[str]:
        if self.key_fn is not None:
            key = self.key_fn(scope)
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


def _unavailable(limit: FleetLimit) -> tuple:
    """503 with ``Retry-After: 1`` and no ``RateLimit`` field: the client spent nothing."""
    body = b"Service Unavailable: the rate limit store cannot be reached, retry in 1 s\n"
    headers = [
        (b"content-type", b"text/plain; charset=utf-8"),
        (b"retry-after", b"1"),
    ]
    return (False, 503, headers, body, None)


def _too_many(limit: FleetLimit, wait_ns: int, python_refusals: bool) -> tuple:
    retry_after = max(math.ceil(wait_ns / 1e9), 1)
    ahead = wait_ns + limit.tau - limit.interval  # the refused cell's wait, back to the TAT
    headers = [
        (b"content-type", b"text/plain; charset=utf-8"),
        (b"retry-after", str(retry_after).encode()),
        limit.policy,
        limit.state(ahead),
    ]
    body = f'Too Many Requests: limit "{limit.name}", retry in {retry_after} s\n'.encode()
    refusal = (limit.name, wait_ns / 1e9) if python_refusals else None
    return (False, 429, headers, body, refusal)


class FleetLimits:
    """The limits of one middleware that live in Redis."""

    def __init__(
        self,
        limits: List[Any],
        *,
        missing: Optional[str],
        headers_on_success: bool,
        wait_up_to: Optional[float],
        python_refusals: bool,
    ) -> None:
        self.limits = [FleetLimit(limit) for limit in limits]
        self.missing = missing
        self.headers_on_success = headers_on_success
        self.wait_up_to = wait_up_to
        self.python_refusals = python_refusals

    async def check(self, scope: Any, receive: Any) -> Tuple[Optional[tuple], List[Tuple[bytes, bytes]], List[Any]]:
        """``(refusal, fields, kept)``: the refusal to answer with (``None``: pass), the
        fields to add to an admitted response, and the messages read while waiting (the
        client went away: the refusal is then ``()``)."""
        fields: List[Tuple[bytes, bytes]] = []
        kept: List[Any] = []
        for limit in self.limits:
            key = limit.key(scope)
            if key is None:
                if self.missing == "skip":
                    continue
                if self.missing not in (None, "shared"):
                    status = int(self.missing)  # type: ignore[arg-type]
                    body = b"a rate-limit key is missing from the request\n"
                    headers = [(b"content-type", b"text/plain; charset=utf-8")]
                    return (False, status, headers, body, None), fields, kept
                key = _KEYLESS
            try:
                if self.wait_up_to is None:
                    wait, ahead = await limit.limiter._try(key, 1)
                else:
                    waited, more = await _watching(limit.limiter._wait(key, self.wait_up_to), receive)
                    kept.extend(more)
                    if waited is None:
                        return (), fields, kept  # the client went away
                    wait, ahead = waited
            except Exception as e:  # noqa: BLE001 - Redis's trouble, answered with a 503
                from .redis import RedisLimitError

                if not isinstance(e, RedisLimitError):
                    raise
                limit.trouble(e)
                return _unavailable(limit), fields, kept
            if wait > 0:
                return _too_many(limit, wait, self.python_refusals), fields, kept
            if self.headers_on_success:
                fields.append(limit.policy)
                fields.append(limit.state(ahead))
        return None, fields, kept


async def _watching(awaitable: Any, receive: Any) -> Tuple[Any, List[Any]]:
    """Awaits ``awaitable`` while listening for the client going away: the messages read
    meanwhile are kept for the app. A disconnect cancels the wait (a fleet booking is
    then given back by its id) and returns ``None``."""
    kept: List[Any] = []

    async def listen() -> None:
        while True:
            message = await receive()
            kept.append(message)
            if message["type"] == "http.disconnect":
                return

    turn = asyncio.ensure_future(awaitable)
    listener = asyncio.ensure_future(listen())
    try:
        await asyncio.wait((turn, listener), return_when=asyncio.FIRST_COMPLETED)
    except BaseException:
        turn.cancel()
        listener.cancel()
        raise
    if not turn.done():
        turn.cancel()
        try:
            await turn
        except asyncio.CancelledError:
            pass
        return None, kept
    listener.cancel()
    try:
        await listener
    except asyncio.CancelledError:
        pass
    return turn.result(), kept
