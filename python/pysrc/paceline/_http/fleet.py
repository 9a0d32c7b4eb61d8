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
from typing import Any, Dict, Generator, List, Optional, Tuple, Union

from .limit import client_of, storable

_log = logging.getLogger("paceline.asgi")

# Text keys longer than this many bytes are kept as a digest of themselves, so a client
# that sends a 100 KB header costs Redis no more than one that sends a short one (the
# Rust layer's bound for its own table). SHA-256, unseeded: every server of the fleet
# computes the same key.
_MAX_TEXT_KEY = 64
# The key that requests without one share (on_missing_key="shared"): it starts with a
# NUL, which no header value, address or digest does.
_KEYLESS = "\x00keyless"
# How long to answer 503s before logging Redis's trouble again, per limit (and, for a
# value Redis answered as corrupt, per key: one bad key does not hide another).
_LOG_EVERY = 60.0
# The most keys whose trouble is remembered for that, per limit (then forgotten at once).
_MAX_LOGGED = 1024


def _bounded(key: str) -> str:
    """The key kept in Redis: the client's own, or a digest of it when it is long, or
    empty (an empty header value is a key like any other, and Redis keys need a byte), or
    not UTF-8 (a key function's lone surrogate: ``storable``)."""
    key = storable(key)
    if not key or (len(key) > _MAX_TEXT_KEY // 4 and len(key.encode("utf-8")) > _MAX_TEXT_KEY):
        return "\x01" + hashlib.sha256(key.encode("utf-8")).hexdigest()
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
        # When Redis's trouble was last logged: under None for the whole store, under the
        # key for a value Redis answered about one key.
        self.logged: Dict[Optional[str], float] = {}

    def ask(self, scope: Any, subject: Any) -> Generator[Any, Any, Optional[Ask]]:
        """This limit's part in a request (``None``: it does not apply), as steps: each
        value a function of the request gave is yielded, and what is sent back is used
        (awaited first by an async server's runner; a sync server's runner refuses an
        awaitable). So one source serves ``prepare`` and ``prepare_sync``."""
        if self.methods is not None and scope["method"] not in self.methods:
            return None
        if self.exempt_when is not None and (yield self.exempt_when(subject)):
            return None
        if self.key_fn is not None:
            key = yield self.key_fn(subject)
            if key is not None and not isinstance(key, str):
                raise TypeError(f"a key function must return a str or None, got {key!r}")
        else:
            key = self.reader.key(scope["headers"], client_of(scope))  # type: ignore[union-attr]
        cost = self.cost
        if callable(cost):
            cost = yield cost(subject)
            if isinstance(cost, bool) or not isinstance(cost, int) or not 0 <= cost <= 0xFFFF_FFFF:
                raise TypeError(
                    f"a cost function must return an int from 0 to 4294967295, got {cost!r}"
                )
        return self, None if key is None else _bounded(key), cost

    def never(self, cost: int) -> bool:
        """Whether ``cost`` cells are more than the burst: never admitted."""
        return cost * self.interval > self.tau

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

    def fields(self, ahead_ns: int, legacy: bool) -> List[Tuple[bytes, bytes]]:
        """The fields of an admitted request whose key's TAT is ``ahead_ns`` past now."""
        fields = [self.policy, self.state(ahead_ns)]
        return fields + self.legacy(ahead_ns) if legacy else fields

    def trouble(self, e: BaseException, key: str) -> None:
        """Logs Redis's trouble, once a minute: per limit while Redis cannot answer, per
        key for a value Redis answered about (a corrupt value under one key)."""
        from .._redis.core import RedisRejected

        about = key if isinstance(e, RedisRejected) else None
        now = time.monotonic()
        if now - self.logged.get(about, -math.inf) < _LOG_EVERY:
            return
        if len(self.logged) >= _MAX_LOGGED:
            self.logged.clear()
        self.logged[about] = now
        if about is None:
            _log.error(
                "paceline: the rate limit %r keeps its state in Redis, which failed "
                "(answering 503 until it recovers; logged once a minute): %s",
                self.name,
                e,
            )
        else:
            _log.error(
                "paceline: the rate limit %r keeps its state in Redis, which answered "
                "with an error for the key %r (answering 503 to its requests; logged once "
                "a minute per key): %s",
                self.name,
                about,
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


def _unavailable(e: BaseException) -> Answer:
    """503 with ``Retry-After: 1`` and no ``RateLimit`` field: the client spent nothing.
    The body says which trouble: Redis out of reach (or too slow), or Redis answering
    with an error (a value it holds that is not a limit's, say: logged)."""
    from .._redis.core import RedisRejected

    if isinstance(e, RedisRejected):
        body = (
            b"Service Unavailable: the rate limit store answered with an error for this "
            b"client (logged), retry in 1 s\n"
        )
    else:
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


#: One limit's part in a request: the limit, the request's key for it (``None``: the
#: request has none, and ``on_missing_key`` is a status or ``"skip"``) and its cost.
Ask = Tuple[FleetLimit, Optional[str], int]
#: A turn booked in Redis, to give back while it has not come: ``(limiter, (redis key,
#: booking id))``.
Booked = Tuple[Any, Tuple[str, str]]


class FleetLimits:
    """The limits of one middleware that live in Redis.

    A request's limits in Redis are asked after the ones the Rust layer decides. Without
    wait mode each takes its cells at once, in order (``check``): one refusing may leave
    the earlier ones spent, the strict side. In wait mode a request has one deadline,
    ``wait_up_to`` from its arrival, across every limit: each limit's turn is read first,
    spending nothing (``too_far``), and a request whose turn in any limit comes after
    the deadline is refused at once, with the longest wait; otherwise every limit books
    its turn within what is left of the deadline (``book``), and the request waits for
    the latest, giving back every booking when one cannot be had or the client leaves.
    """

    def __init__(
        self,
        limits: List[Any],
        *,
        missing: Optional[str],
        headers_on_success: bool,
        legacy_headers: bool,
    ) -> None:
        self.limits = [FleetLimit(limit) for limit in limits]
        self.missing = missing
        self.headers_on_success = headers_on_success
        self.legacy_headers = legacy_headers

    def _asks(self, scope: Any, subject: Any) -> Generator[Any, Any, List[Ask]]:
        asks: List[Ask] = []
        for limit in self.limits:
            ask = yield from limit.ask(scope, subject)
            if ask is None:
                continue
            limit, key, cost = ask
            if key is None and self.missing in (None, "shared"):
                key = _KEYLESS
            asks.append((limit, key, cost))
        return asks

    async def prepare(self, scope: Any, subject: Any = None) -> List[Ask]:
        """Each limit that applies to the request, with its key and cost (the key and
        cost functions are called here, once per request, with ``subject``, default
        ``scope``; ``async`` ones awaited)."""
        steps = self._asks(scope, scope if subject is None else subject)
        value = None
        while True:
            try:
                value = steps.send(value)
            except StopIteration as done:
                return done.value
            if hasattr(value, "__await__"):
                value = await value

    def prepare_sync(self, scope: Any, subject: Any) -> List[Ask]:
        """``prepare`` for a sync server: a function returning an awaitable is an error."""
        steps = self._asks(scope, subject)
        value = None
        try:
            # Each value goes back as it is, until one is awaitable.
            while not hasattr(value := steps.send(value), "__await__"):
                pass
        except StopIteration as done:
            return done.value
        if hasattr(value, "close"):
            value.close()  # never awaited: no warning about it
        steps.close()
        raise TypeError(
            "a limit's key, cost or exemption function is async, and this server is not: "
            "make it a plain function"
        )

    def _plan(self, asks: List[Ask]) -> Union[Answer, List[Tuple[FleetLimit, str, int]]]:
        """The limits to ask, or the answer a request gets without asking Redis (a
        missing key refused by status, a cost past the burst)."""
        plan = []
        for limit, key, cost in asks:
            if key is None:
                if self.missing == "skip":
                    continue
                status = int(self.missing)  # type: ignore[arg-type]
                body = b"a rate-limit key is missing from the request\n"
                return Answer(status, [(b"content-type", b"text/plain; charset=utf-8")], body)
            if cost == 0:
                continue
            if limit.never(cost):
                return _never(limit, cost)
            plan.append((limit, key, cost))
        return plan

    def _admitted(self, limit: FleetLimit, ahead: int, fields: List[Tuple[bytes, bytes]]) -> None:
        if self.headers_on_success:
            fields += limit.fields(ahead, self.legacy_headers)

    async def check(self, asks: List[Ask]) -> Tuple[Optional[Answer], List[Tuple[bytes, bytes]]]:
        """Without wait mode: ``(refusal, fields)``, the refusal to answer with
        (``None``: pass) and the fields to add to an admitted response."""
        from .._redis.core import RedisLimitError

        fields: List[Tuple[bytes, bytes]] = []
        plan = self._plan(asks)
        if isinstance(plan, Answer):
            return plan, fields
        for limit, key, cost in plan:
            try:
                wait, ahead = await limit.limiter._try(key, cost)
            except RedisLimitError as e:
                limit.trouble(e, key)
                return _unavailable(e), fields
            if wait > 0:
                return _too_many(limit, wait, cost, self.legacy_headers), fields
            self._admitted(limit, ahead, fields)
        return None, fields

    async def too_far(
        self, asks: List[Ask], deadline: float
    ) -> Tuple[Optional[Answer], Dict[int, BaseException]]:
        """Wait mode, before anything is booked: reads every limit's turn (spending
        nothing) and answers the refusal with the longest wait when some limit's turn
        comes after ``deadline`` (``time.monotonic()``). Also gives, by position, the
        limits whose Redis could not answer, whose failure policy then decides without a
        second call (so an outage is answered within one call timeout)."""
        from .._redis.core import RedisLimitError, RedisUnavailable

        plan = self._plan(asks)
        if isinstance(plan, Answer):
            return plan, {}
        replies = await asyncio.gather(
            *(limit.limiter._read(key) for limit, key, _ in plan), return_exceptions=True
        )
        unreachable: Dict[int, BaseException] = {}
        longest: Optional[Tuple[int, FleetLimit, int]] = None
        left = deadline - time.monotonic()
        for i, ((limit, key, cost), reply) in enumerate(zip(plan, replies)):
            if isinstance(reply, RedisUnavailable):
                # Its failure policy decides when it books: "closed" refuses now, before
                # anything is booked; a local share's turn counts against the deadline.
                policy = limit.limiter._policy
                if policy == "closed":
                    limit.trouble(reply, key)
                    return _unavailable(reply), {}
                unreachable[i] = reply
                if policy == "open":
                    continue
                wait = int(limit.limiter._local_wait(key, cost) * 1e9)
                if longest is None or wait > longest[0]:
                    longest = (wait, limit, cost)
                continue
            if isinstance(reply, RedisLimitError):
                limit.trouble(reply, key)
                return _unavailable(reply), {}
            if isinstance(reply, BaseException):
                raise reply
            wait = int(limit.limiter._wait_from(reply, cost) * 1e9)
            if longest is None or wait > longest[0]:
                longest = (wait, limit, cost)
        if longest is not None and longest[0] > max(left, 0.0) * 1e9:
            wait, limit, cost = longest
            return _too_many(limit, wait, cost, self.legacy_headers), unreachable
        return None, unreachable

    async def book(
        self, asks: List[Ask], deadline: float, unreachable: Dict[int, BaseException]
    ) -> Tuple[Optional[Answer], List[Tuple[bytes, bytes]], List[Booked], float]:
        """Wait mode: books every limit's turn within what is left of ``deadline``:
        ``(refusal, fields, booked, instant)``, ``instant`` the latest turn
        (``time.monotonic()``). A refusal has given back what was booked."""
        from .._redis.core import RedisLimitError, _TooFar

        fields: List[Tuple[bytes, bytes]] = []
        booked: List[Booked] = []
        instant = 0.0
        plan = self._plan(asks)
        if isinstance(plan, Answer):
            return plan, fields, booked, instant
        try:
            for i, (limit, key, cost) in enumerate(plan):
                left = max(deadline - time.monotonic(), 0.0)
                limiter = limit.limiter
                try:
                    failed = unreachable.get(i)
                    if failed is not None:
                        await limiter._acquire_on_failure(key, cost, left, failed)
                        wait, ahead, booking = 0, 0, None
                    else:
                        wait, ahead, booking = await limiter._book(key, cost, left)
                except _TooFar as e:
                    await self.give_back(booked)
                    return _too_many(limit, e.wait_ns, cost, self.legacy_headers), fields, [], 0.0
                except RedisLimitError as e:
                    await self.give_back(booked)
                    limit.trouble(e, key)
                    return _unavailable(e), fields, [], 0.0
                if booking is not None:
                    booked.append((limiter, booking))
                instant = max(instant, time.monotonic() + wait / 1e9)
                self._admitted(limit, ahead, fields)
        except BaseException:
            await self.give_back(booked)
            raise
        return None, fields, booked, instant

    @staticmethod
    async def give_back(booked: List[Booked]) -> None:
        """Gives back turns booked in Redis (those whose instant came stay spent)."""
        if booked:
            await asyncio.gather(*(limiter._give_back(*booking) for limiter, booking in booked))

    async def also_refusing(self, refused: Any, asks: List[Ask]) -> Any:
        """A refusal of the layer's (``refused``), told the longest wait among every
        limit that applies, those in Redis included: each of those is read (nothing is
        spent; its cost as the request's cost function gives it; all at once, so an
        outage costs one call timeout), and one that would refuse for longer sets
        ``Retry-After``; their fields join the refusal's. A limit whose Redis cannot
        answer is left out. A refusal that has no wait (a cost past a burst, a missing
        key) is answered as it is, and so is a limit in Redis that can never admit the
        request (its cost past that limit's burst)."""
        from .._redis.core import RedisLimitError

        if refused.limit is None or not any(name == b"retry-after" for name, _ in refused.headers):
            return refused  # not a wait: nothing to make longer
        plan = []
        for limit, key, cost in asks:
            if key is None or cost == 0:
                continue
            if limit.never(cost):
                return _never(limit, cost)
            plan.append((limit, key, cost))
        replies = await asyncio.gather(
            *(limit.limiter._read(key) for limit, key, _ in plan), return_exceptions=True
        )
        headers = list(refused.headers)
        longest, name = refused.wait, refused.limit
        for (limit, key, cost), reply in zip(plan, replies):
            if isinstance(reply, RedisLimitError):
                continue
            if isinstance(reply, BaseException):
                raise reply
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
