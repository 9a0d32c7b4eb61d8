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
    """The key kept in Redis: the client's own, or a digest of it when it is long, or
    empty (an empty header value is a key like any other, and Redis keys need a byte)."""
    if not key or (
        len(key) > _MAX_TEXT_KEY // 4 and len(key.encode("utf-8", "surrogatepass")) > _MAX_TEXT_KEY
    ):
        return "\x01" + hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()
    return key


def _policy(interval: int, burst: int) -> Tuple[int, int]:
    """``RateLimit-Policy``'s ``q`` and ``w`` as the Rust layer writes them: ``w`` the
    burst window in whole seconds (at least 1) or, when the rate is not a whole number of
    cells in it, the first longer whole number of seconds (at most a minute longer) in
    which it is within 1 % of one; ``q`` the cells the rate admits in ``w``, rounded down.
    So a client spacing its requests ``w / q`` apart is never refused."""
    first = max(-(-interval * burst // 1_000_000_000), 1)

    def cells(w: int) -> int:
        return w * 1_000_000_000 // interval

    best = (cells(first), first)
    for w in range(first, first + 60):
        q = cells(w)
        if q * interval * 100 >= w * 99_000_000_000:
            return q, w
        if q * best[1] > best[0] * w:
            best = (q, w)
    return best


_LEGACY = (b"x-ratelimit-limit", b"x-ratelimit-remaining", b"x-ratelimit-reset")


def _legacy(limit: int, remaining: int, reset: int) -> List[Tuple[bytes, bytes]]:
    return [(name, b"%d" % value) for name, value in zip(_LEGACY, (limit, remaining, reset))]


def tightest_legacy(fields: List[Tuple[bytes, bytes]]) -> List[Tuple[bytes, bytes]]:
    """``fields`` with one set of ``X-RateLimit-*`` fields, the tightest limit's (the
    fewest cells left, then the longest until full), where the layer's and the limits in
    Redis each wrote theirs."""
    sets = [
        [int(fields[i + k][1]) for k in range(3)]
        for i, (name, _) in enumerate(fields)
        if name == _LEGACY[0] and fields[i + 1 : i + 3] and fields[i + 1][0] == _LEGACY[1]
    ]
    if len(sets) < 2:
        return fields
    limit, remaining, reset = min(sets, key=lambda s: (s[1], -s[2]))
    return [f for f in fields if f[0] not in _LEGACY] + _legacy(limit, remaining, reset)


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
        self.interval = self.limiter._interval
        self.tau = self.limiter._tau
        self.q, w = _policy(self.interval, self.limiter.burst)
        self.policy = (b"ratelimit-policy", f"{field};q={self.q};w={w}".encode())
        self.field = field
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
        remaining, t = self.counts(ahead_ns)
        return (b"ratelimit", f"{self.field};r={remaining};t={t}".encode())

    def counts(self, ahead_ns: int) -> Tuple[int, int]:
        """``(cells left, whole seconds until full)`` for a TAT ``ahead_ns`` past now."""
        return max(self.tau - ahead_ns, 0) // self.interval, math.ceil(max(ahead_ns, 0) / 1e9)

    def legacy(self, ahead_ns: int) -> List[Tuple[bytes, bytes]]:
        """The ``X-RateLimit-*`` fields for a TAT ``ahead_ns`` past now."""
        return _legacy(self.q, *self.counts(ahead_ns))

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


def _too_many(limit: FleetLimit, wait_ns: int, cost: int, legacy: bool) -> Answer:
    retry_after = max(math.ceil(wait_ns / 1e9), 1)
    ahead = wait_ns + limit.tau - limit.interval * cost  # the refused wait, back to the TAT
    headers = [
        (b"content-type", b"text/plain; charset=utf-8"),
        (b"retry-after", str(retry_after).encode()),
        limit.policy,
        limit.state(ahead),
    ]
    if legacy:
        headers += limit.legacy(ahead)
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
        legacy_headers: bool,
        wait_up_to: Optional[float],
        buffer: int,
    ) -> None:
        self.limits = [FleetLimit(limit) for limit in limits]
        self.missing = missing
        self.headers_on_success = headers_on_success
        self.legacy_headers = legacy_headers
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
                return _too_many(limit, wait, cost, self.legacy_headers), fields, kept, False
            if self.headers_on_success:
                fields.append(limit.policy)
                fields.append(limit.state(ahead))
                if self.legacy_headers:
                    fields += limit.legacy(ahead)
        return None, fields, kept, False

    async def also_refusing(self, scope: Any, refused: Any) -> Any:
        """A refusal of the layer's (``refused``), told the longest wait among every
        limit that applies, those in Redis included: each of those is read (nothing is
        spent), and one that would refuse for longer sets ``Retry-After``; their fields
        join the refusal's. A limit whose Redis cannot answer is left out."""
        from ..redis import RedisLimitError

        headers = list(refused.headers)
        longest, name = refused.wait, refused.limit
        for limit in self.limits:
            if not await limit.applies(scope):
                continue
            key = await limit.key(scope)
            if key is None:
                if self.missing != "shared" and self.missing is not None:
                    continue
                key = _KEYLESS
            cost = limit.cost
            if callable(cost):
                continue  # a cost function is asked once, when the request is decided
            try:
                reply = await limit.limiter._read(key)
            except RedisLimitError:
                continue
            ahead = int(reply[2])
            wait = limit.limiter._wait_from(reply, cost)
            headers += [limit.policy, limit.state(ahead)]
            if self.legacy_headers:
                headers += limit.legacy(ahead)
            if wait > longest:
                longest, name = wait, limit.name
        if name == refused.limit:
            return Answer(refused.status, tightest_legacy(headers), refused.body, name, longest)
        retry_after = max(math.ceil(longest), 1)
        headers = [h for h in headers if h[0] != b"retry-after"]
        headers.insert(1, (b"retry-after", str(retry_after).encode()))
        body = f'Too Many Requests: limit "{name}", retry in {retry_after} s\n'.encode()
        return Answer(refused.status, tightest_legacy(headers), body, name, longest)
