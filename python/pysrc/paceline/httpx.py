"""httpx transports that pace every request by a paceline limiter and follow what the
upstream says (429, ``Retry-After``, the IETF ``RateLimit`` fields, ``X-RateLimit-*``).

    import httpx, paceline, paceline.httpx

    limiter = paceline.Limiter(100, burst=1)  # 100 calls per second to the API
    client = httpx.AsyncClient(transport=paceline.httpx.AsyncTransport(limiter))

Each request waits its booked turn on ``limiter``, then on its upstream's follower,
which carries what the upstream says, for every task at once: a ``Retry-After`` (or a
field saying nothing is left until a reset) holds every turn until then, booked turns
included, and the pace resumes spaced; a ``RateLimit-Policy`` sets the pace (95 % of its
rate, never above the limiter's quota unless ``above_configured``); an upstream that only
refuses has its rate learned from the refusals. Nothing it says makes a request wait
longer than ``max_hold`` seconds. With a ``KeyedLimiter`` each host has its own turns and
follower: a host is its name, and its port unless it is the scheme's default
(``api.example.com``, ``127.0.0.1:8001``), which is also what a ``key=`` function gets. A request refused with a 429 is sent again in a new turn, up to ``retries``
times, for idempotent methods unless ``retry_methods`` says otherwise.

The wait for a turn counts against the client's ``timeout`` (its ``pool`` part, the one
for waiting to send): a turn further away than that raises ``httpx.PoolTimeout`` at once,
having booked nothing.

**A budget of several rates.** With ``budget=`` (a ``paceline.Budget``, with or without
a limiter), each request books ``cost(request)`` (a mapping of dimension names to counts;
default: 1 in every dimension) in one turn before it is sent, and every response steers
the budget by its per-dimension fields (``Budget.follow``: ``x-ratelimit-*-tokens``,
``anthropic-ratelimit-*``, named ``RateLimit`` policies, ``Retry-After``; never a wait
past ``max_hold``). The turn ends when the response's body is closed (read to its end,
as ``client.post`` does, or closed early from a stream): a success (2xx) is settled
with ``settle_from(response)``, which gets a response holding the status, the headers
and the body as it was read; any other status, a ``settle_from`` of ``None``, one that
raises or returns junk, or a body over 8 MiB ends the turn keeping its estimate::

    budget = paceline.Budget(requests=paceline.Rate(500, per=60.0),
                             tokens=paceline.Rate(200_000, per=60.0), in_flight=8)
    transport = paceline.httpx.AsyncTransport(
        budget=budget,
        cost=lambda request: {"tokens": estimate(request.content)},
        settle_from=lambda response: {"tokens": response.json()["usage"]["total_tokens"]},
    )
"""

from __future__ import annotations

import time
import itertools
from typing import Callable, Collection, Generic, Optional, Tuple, TypeVar, Union

import httpx

from . import KeyedLimiter, Limiter
from ._booking import Booking
from ._budget import Budget, Turn
from ._upstream import IDEMPOTENT, Hosts, host_key

# The most body a settle reads; a longer one keeps its turn's estimate.
_SETTLE_BODY = 8 << 20

__all__ = ["AsyncTransport", "Transport", "IDEMPOTENT", "AsyncFleetTransport", "FleetTransport"]


def _headers(response: httpx.Response):
    return [(name.decode("latin-1"), value) for name, value in response.headers.raw]


def _pool_timeout(request: httpx.Request) -> Optional[float]:
    """The request's timeout for waiting to send (httpx's ``pool`` timeout), if any."""
    timeout = request.extensions.get("timeout") or {}
    pool = timeout.get("pool")
    return None if pool is None else float(pool)


# Where AsyncTransport / Transport leave the deadline of a request's wait for a transport
# under them that waits too (a fleet transport), so that the two waits share one timeout.
_DEADLINE = "paceline.deadline"


def _fleet_wait(request: httpx.Request, max_wait: Optional[float]) -> Tuple[Optional[float], bool]:
    """How long a fleet transport may wait for ``request``'s turn, and whether that bound
    is the client's timeout (``PoolTimeout``) rather than ``max_wait`` (``TimeoutError``)."""
    deadline = request.extensions.get(_DEADLINE)
    if deadline is None:
        timeout = _pool_timeout(request)
        deadline = None if timeout is None else time.monotonic() + timeout
    if deadline is None:
        return max_wait, False
    left = max(deadline - time.monotonic(), 0.0)
    if max_wait is not None and max_wait <= left:
        return max_wait, False
    return left, True


def _late(request: httpx.Request) -> httpx.PoolTimeout:
    return httpx.PoolTimeout(
        "paceline: the turn to send this request is further away than the client's "
        "timeout allows (nothing was sent)",
        request=request,
    )



def _host(url: httpx.URL) -> str:
    """The host a request goes to, with its port unless the scheme's default."""
    return host_key(url.host, url.port, url.scheme)

class _Options:
    def __init__(
        self,
        limiter: Union[Limiter, KeyedLimiter, None],
        key: Optional[Callable[[str], str]],
        retries: int,
        retry_methods: Collection[str],
        max_hold: float,
        above_configured: bool,
        revert_after: Optional[float],
        budget: Optional[Budget] = None,
        cost: Optional[Callable[[httpx.Request], object]] = None,
        settle_from: Optional[Callable[[httpx.Response], object]] = None,
    ) -> None:
        if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
            raise ValueError(f"retries must be an int >= 0, got {retries!r}")
        if limiter is None and budget is None:
            raise TypeError("give a limiter, a budget, or both")
        if budget is None and (cost is not None or settle_from is not None):
            raise TypeError("cost and settle_from price a budget's turns: give budget=")
        self.hosts = (
            None
            if limiter is None
            else Hosts(limiter, key, max_hold, above_configured, revert_after)
        )
        self.booking = (
            None if budget is None else Booking(budget, cost, settle_from, max_hold)
        )
        self.retries = retries
        self.retry_methods = frozenset(m.upper() for m in retry_methods)

    def start(self, request: httpx.Request) -> Tuple[Optional[Hosts], Optional[Booking], str, Optional[float]]:
        """What a request waits on (the hosts' limiter, the budget's booking), its
        upstream key (``""`` without a limiter) and the deadline of its waits (the
        client's ``pool`` timeout; ``None``: none), left in the request for a fleet
        transport under this one."""
        hosts = self.hosts
        key = "" if hosts is None else hosts.key(_host(request.url))
        timeout = _pool_timeout(request)
        if timeout is None:
            return hosts, self.booking, key, None
        deadline = request.extensions[_DEADLINE] = time.monotonic() + timeout
        return hosts, self.booking, key, deadline

    def answered(self, request, response, key: str, sent, turn: Optional[Turn], attempt: int, wrap) -> bool:
        """Follows ``response`` (the upstream's follower, the budget) and hands its turn
        on (``_after``): whether the request is sent again (a 429 of an idempotent
        request with retries left)."""
        hosts = self.hosts
        if hosts is not None:
            hosts.observe(key, response.status_code, _headers(response), sent)
        retry = (
            response.status_code == 429
            and attempt < self.retries
            and request.method.upper() in self.retry_methods
            # A body that was streamed cannot be sent again.
            and isinstance(request.stream, httpx.ByteStream)
        )
        _after(self, request, response, turn, retry, wrap)
        return retry


def _left(deadline: Optional[float]) -> Optional[float]:
    return None if deadline is None else max(0.0, deadline - time.monotonic())


def _give_back(turn: Optional[Turn]) -> None:
    """The turn of a request that was not sent (or whose sending failed) ends."""
    if turn is not None:
        turn.release()


class _Body:
    """A response body passing through: what was read, up to ``_SETTLE_BODY``, and the
    settle of its turn when it is closed (once)."""

    def __init__(self, booking: Booking, turn: Turn, request, response) -> None:
        self.booking = booking
        self.turn: Optional[Turn] = turn
        self.request = request
        self.response = response
        self.chunks = []
        self.size = 0

    def keep(self, chunk: bytes) -> None:
        if self.size <= _SETTLE_BODY:
            self.size += len(chunk)
            self.chunks.append(chunk)

    def close(self) -> None:
        turn, self.turn = self.turn, None
        if turn is None:
            return
        if self.size > _SETTLE_BODY:
            turn.release()
            return
        body, self.chunks = b"".join(self.chunks), []
        try:
            read = httpx.Response(
                self.response.status_code,
                headers=self.response.headers,
                content=body,
                request=self.request,
            )
        except Exception:
            # Never seen; but closing a body must not raise for the settle's sake.
            turn.release()
            return
        self.booking.settle(turn, read)


class _AsyncSettling(httpx.AsyncByteStream):
    def __init__(self, stream, body: _Body) -> None:
        self._stream = stream
        self._body = body

    async def __aiter__(self):
        async for chunk in self._stream:
            self._body.keep(chunk)
            yield chunk

    async def aclose(self) -> None:
        try:
            await self._stream.aclose()
        finally:
            self._body.close()


class _Settling(httpx.SyncByteStream):
    def __init__(self, stream, body: _Body) -> None:
        self._stream = stream
        self._body = body

    def __iter__(self):
        for chunk in self._stream:
            self._body.keep(chunk)
            yield chunk

    def close(self) -> None:
        try:
            self._stream.close()
        finally:
            self._body.close()


def _after(options: "_Options", request, response, turn: Optional[Turn], retry: bool, wrap):
    """Follows ``response`` and hands its turn on: settled when its body closes (a
    success with a ``settle_from``), else ended now keeping its estimate."""
    booking = options.booking
    if booking is None or turn is None:
        return
    booking.follow(response.status_code, _headers(response))
    if retry or not booking.settles(response.status_code):
        turn.release()
        return
    if response.is_closed:
        # Read already (a transport that answers from memory: httpx.MockTransport, a
        # cache, a test double): no body will be closed through us, so settle now.
        booking.settle(turn, response)
        return
    response.stream = wrap(response.stream, _Body(booking, turn, request, response))


def _hosts(options: "_Options") -> Hosts:
    if options.hosts is None:
        raise ValueError("this transport has no limiter (it paces by its budget alone)")
    return options.hosts


_Under = TypeVar("_Under", httpx.AsyncBaseTransport, httpx.BaseTransport)


class _Paced(Generic[_Under]):
    """What ``AsyncTransport`` and ``Transport`` share: their arguments, the options
    they make, the transport under them (``_default()`` unless given)."""

    _default: Callable[[], _Under]

    def __init__(
        self,
        limiter: Union[Limiter, KeyedLimiter, None] = None,
        transport: Optional[_Under] = None,
        *,
        key: Optional[Callable[[str], str]] = None,
        retries: int = 2,
        retry_methods: Collection[str] = IDEMPOTENT,
        max_hold: float = 300.0,
        above_configured: bool = False,
        revert_after: Optional[float] = None,
        budget: Optional[Budget] = None,
        cost: Optional[Callable[[httpx.Request], object]] = None,
        settle_from: Optional[Callable[[httpx.Response], object]] = None,
    ) -> None:
        self._options = _Options(
            limiter, key, retries, retry_methods, max_hold, above_configured, revert_after,
            budget, cost, settle_from,
        )
        self._transport: _Under = transport if transport is not None else self._default()

    def pace(self, host: str):
        """The pace ``host``'s follower keeps now (``name``, or ``name:port`` unless the
        scheme's default): ``(1, seconds between requests, burst)``; ``ValueError`` for a
        transport with no limiter."""
        hosts = _hosts(self._options)
        return hosts.followers.quota(hosts.key(host))


class AsyncTransport(_Paced[httpx.AsyncBaseTransport], httpx.AsyncBaseTransport):
    """An ``httpx.AsyncClient`` transport: every request waits its turn on ``limiter``
    and its upstream's follower, and on ``budget`` (see the module docs), then goes
    through ``transport`` (httpx's default one unless given)."""

    _default = httpx.AsyncHTTPTransport

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        options = self._options
        hosts, booking, key, deadline = options.start(request)
        for attempt in itertools.count():
            try:
                if hosts is not None:
                    await hosts.acquire(key, _left(deadline))
                turn = None if booking is None else await booking.acquire(request, _left(deadline))
            except TimeoutError:
                raise _late(request) from None
            try:
                sent = None if hosts is None else hosts.sent(key)
                response = await self._transport.handle_async_request(request)
            except BaseException:
                _give_back(turn)
                raise
            if not options.answered(request, response, key, sent, turn, attempt, _AsyncSettling):
                return response
            await response.aclose()

    async def aclose(self) -> None:
        await self._transport.aclose()


class Transport(_Paced[httpx.BaseTransport], httpx.BaseTransport):
    """An ``httpx.Client`` transport: the same as ``AsyncTransport``, for threads (the
    wait releases the GIL and answers Ctrl-C)."""

    _default = httpx.HTTPTransport

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        options = self._options
        hosts, booking, key, deadline = options.start(request)
        for attempt in itertools.count():
            try:
                if hosts is not None:
                    hosts.acquire_blocking(key, _left(deadline))
                turn = (
                    None if booking is None else booking.acquire_blocking(request, _left(deadline))
                )
            except TimeoutError:
                raise _late(request) from None
            try:
                sent = None if hosts is None else hosts.sent(key)
                response = self._transport.handle_request(request)
            except BaseException:
                _give_back(turn)
                raise
            if not options.answered(request, response, key, sent, turn, attempt, _Settling):
                return response
            response.close()

    def close(self) -> None:
        self._transport.close()


class _FleetPaced(Generic[_Under]):
    """What ``AsyncFleetTransport`` and ``FleetTransport`` share: their arguments, the
    check of the limiter (a ``paceline.redis`` class, ``_wants``; ``_refusal`` says what
    to use instead), the transport under them (``_default()`` unless given)."""

    _default: Callable[[], _Under]
    _wants: str
    _refusal: str

    def __init__(
        self,
        limiter: object,
        transport: Optional[_Under] = None,
        *,
        key: Union[str, Callable[[str], str], None] = None,
        max_wait: Optional[float] = None,
    ) -> None:
        from . import redis

        if not isinstance(limiter, getattr(redis, self._wants)):
            raise TypeError(
                f"limiter must be a paceline.redis.{self._wants} ({self._refusal}), got "
                f"{type(limiter).__name__}"
            )
        self._limiter = limiter
        self._key = _fleet_key(key)
        self._max_wait = max_wait
        self._transport: _Under = transport if transport is not None else self._default()


class AsyncFleetTransport(_FleetPaced[httpx.AsyncBaseTransport], httpx.AsyncBaseTransport):
    """An ``httpx.AsyncClient`` transport that paces requests by a fleet-wide limiter
    (``paceline.redis.RedisLimiter``): every request waits its booked turn in Redis, in
    one first-come-first-served line with every process and host that uses the same
    limiter, then goes through ``transport`` (httpx's default one unless given).

    Named for what it paces: the whole fleet, where ``AsyncTransport`` paces one
    process's limiter. ``key`` is the limiter key a request waits on: a ``str`` for one
    quota, or a function of the request's host (its name, and its port unless the
    scheme's default; default: the host, a quota per upstream). To also follow what the upstream says (429, ``Retry-After``, the
    ``RateLimit`` fields) in this process, put it under an ``AsyncTransport``::

        fleet = paceline.httpx.AsyncFleetTransport(redis_limiter, key="partner-api")
        transport = paceline.httpx.AsyncTransport(paceline.Limiter(100), transport=fleet)

    (a refused request sent again then waits a new fleet turn too). ``max_wait``
    (seconds) bounds the wait: a turn further away raises ``TimeoutError`` without
    booking it.
    """

    _default = httpx.AsyncHTTPTransport
    _wants = "RedisLimiter"
    _refusal = "for httpx.Client and a SyncRedisLimiter, use FleetTransport"

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        wait, pool = _fleet_wait(request, self._max_wait)
        try:
            await self._limiter.acquire(self._key(_host(request.url)), 1, wait)
        except TimeoutError:
            if pool:
                raise _late(request) from None
            raise
        return await self._transport.handle_async_request(request)

    async def aclose(self) -> None:
        await self._transport.aclose()


class FleetTransport(_FleetPaced[httpx.BaseTransport], httpx.BaseTransport):
    """An ``httpx.Client`` transport: the same as ``AsyncFleetTransport``, for threads,
    on a ``paceline.redis.SyncRedisLimiter`` (the wait blocks the calling thread)."""

    _default = httpx.HTTPTransport
    _wants = "SyncRedisLimiter"
    _refusal = "for httpx.AsyncClient and a RedisLimiter, use AsyncFleetTransport"

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        wait, pool = _fleet_wait(request, self._max_wait)
        try:
            self._limiter.acquire_blocking(self._key(_host(request.url)), 1, wait)
        except TimeoutError:
            if pool:
                raise _late(request) from None
            raise
        return self._transport.handle_request(request)

    def close(self) -> None:
        self._transport.close()


def _fleet_key(key: Union[str, Callable[[str], str], None]) -> Callable[[str], str]:
    if key is None:
        return lambda host: host
    if isinstance(key, str):
        return lambda host: key
    if callable(key):
        return key
    raise TypeError(f"key must be a str, a function of the host, or None, got {key!r}")
