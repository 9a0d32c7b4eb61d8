"""Rate limiting for ASGI servers (Starlette, FastAPI, Litestar, Django's ASGI), per client.

::

    from fastapi import FastAPI
    from paceline.asgi import KeySource, Limit, RateLimitMiddleware

    app = FastAPI()
    app.add_middleware(
        RateLimitMiddleware,
        limits=[Limit("per-ip", rate=10, per=1.0, burst=20, key=KeySource.peer_ip())],
    )

Each request needs a cell from every limit that applies to it; a refused one gets ``429``
with ``Retry-After`` (whole seconds, rounded up, the longest wait among the limits) and the
IETF ``RateLimit-Policy`` / ``RateLimit`` fields. The decisions, the client keys (the peer
address with IPv6 grouped by prefix, forwarding headers read only from trusted proxies)
and the header values are paceline's Rust HTTP layer's own: each request's head goes
through that layer, not a second implementation of it.

A limit is kept in this process, or, with ``shared="/dev/shm/my-api"``, in a file that
every worker of the host opens (``uvicorn --workers 4``, gunicorn with uvicorn workers),
so the bound per client is one bound for the whole host, exactly, without Redis.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import os
from typing import (
    Any,
    Awaitable,
    Callable,
    Dict,
    Iterable,
    List,
    MutableMapping,
    Optional,
    Sequence,
    Tuple,
    Union,
)

from . import _capacity, _count, _gid, _path, _quota, _trusted, _uid
from ._paceline import new_asgi_core

__all__ = ["KeySource", "Limit", "RateLimitMiddleware", "RouteLimit", "RefusalInfo"]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

_log = logging.getLogger("paceline.asgi")


class KeySource:
    """Which client a request counts against, for one limit."""

    __slots__ = ("_spec", "_fn", "_by_address")

    def __init__(self, spec: tuple, fn: Optional[Callable[[Scope], Optional[str]]] = None):
        self._spec = spec
        self._fn = fn
        self._by_address = spec[0] in ("peer", "proxies")

    def __repr__(self) -> str:
        return f"KeySource{self._spec!r}"

    @staticmethod
    def peer_ip(ipv6_prefix: int = 64) -> "KeySource":
        """The address the connection comes from (``scope["client"]``), IPv6 grouped by
        ``ipv6_prefix`` bits (128: each address on its own). Behind a proxy every client
        is the proxy: use ``behind_proxies``."""
        return KeySource(("peer", _prefix(ipv6_prefix)))

    @staticmethod
    def behind_proxies(
        proxies: Iterable[str], *, forwarded_header: bool = False, ipv6_prefix: int = 64
    ) -> "KeySource":
        """The client behind trusted proxies: when the connection comes from one of
        ``proxies`` (networks such as ``"10.0.0.0/8"`` or addresses), the right-most
        address of ``X-Forwarded-For`` that is not itself a trusted proxy. What a client
        writes left of it is ignored, so a spoofed entry changes nothing; a request from
        anywhere else is keyed by its own address. With ``forwarded_header=True`` the RFC
        7239 ``Forwarded`` header is read instead: name the one your proxies write."""
        if isinstance(proxies, (str, bytes)):
            raise TypeError("proxies must be a list of networks, not one string")
        networks = []
        for network in proxies:
            if not isinstance(network, str):
                raise TypeError(f"a trusted proxy network must be a str, got {network!r}")
            try:
                ipaddress.ip_network(network, strict=False)
            except ValueError as e:
                raise ValueError(f"a trusted proxy network {network!r}: {e}") from None
            networks.append(network)
        return KeySource(("proxies", networks, bool(forwarded_header), _prefix(ipv6_prefix)))

    @staticmethod
    def header(name: str) -> "KeySource":
        """A header's value (an API key, a tenant); a request without it has no key (see
        ``on_missing_key``)."""
        if not isinstance(name, str) or not name or not all(
            c.isascii() and (c.isalnum() or c in "!#$%&'*+-.^_`|~") for c in name
        ):
            raise ValueError(f"{name!r} is not a header name")
        return KeySource(("header", name.lower()))

    @staticmethod
    def global_() -> "KeySource":
        """One key for every request: a limit on the whole service."""
        return KeySource(("global",))

    @staticmethod
    def callable(fn: Callable[[Scope], Optional[str]]) -> "KeySource":
        """Any function of the ASGI scope returning the key as a ``str``; ``None`` means no
        key. Keys longer than 64 bytes are stored as a digest, so any length costs the
        same memory."""
        if not callable(fn):
            raise TypeError(f"KeySource.callable needs a function of the scope, got {fn!r}")
        return KeySource(("callable",), fn)


def _prefix(prefix: object) -> int:
    if isinstance(prefix, bool) or not isinstance(prefix, int) or not 0 <= prefix <= 128:
        raise ValueError(f"ipv6_prefix must be an int from 0 to 128, got {prefix!r}")
    return prefix


class Limit:
    """One named quota per client: ``rate`` requests per ``per`` seconds, up to ``burst``
    at once (default: ``rate``, as "10 per second" lets 10 through at once), keyed by
    ``key`` (default: the peer address). ``max_keys`` bounds the clients kept in this
    process (default 1 000 000, as in the Rust layer); ``shared`` is a file that every
    worker of the host opens instead (in ``/dev/shm`` to stay in memory), with room for at
    least ``capacity`` clients still limited (64 bytes each); the file holds this one
    limit, by name, and is opened under ``Limiter.shared``'s rules (``trust_user``,
    ``trust_group``). A new client the table has no room for gets ``503`` with
    ``Retry-After``, never a ``429``: it spent nothing. A shared file made for another
    quota is refused at start-up unless ``on_mismatch`` is ``"adopt"`` (use the file's) or
    ``"replace"`` (set this quota for every process: for a deploy that changes it).
    ``name`` is the limit's name in the ``RateLimit`` fields (1 to 64 printable ASCII
    characters).

    ``redis`` (a ``redis.asyncio.Redis`` or ``RedisCluster``) keeps the limit in Redis
    instead: one bound per client for every server of a fleet that uses the same Redis
    and limit name (``paceline.redis``'s decisions, at Redis's clock; Redis keys
    ``paceline-asgi:<name>:{<client key>}``). ``redis_timeout`` bounds each call (seconds);
    past it, or when Redis cannot be reached, ``on_redis_failure`` decides: ``"closed"``
    (default: ``503`` with ``Retry-After: 1`` and no ``RateLimit`` field), ``"open"``, or a
    local ``paceline.KeyedLimiter`` share. An error Redis answers is a ``503`` too, logged.
    """

    __slots__ = (
        "name",
        "rate",
        "per",
        "burst",
        "key",
        "max_keys",
        "shared",
        "capacity",
        "on_mismatch",
        "trust_user",
        "trust_group",
        "redis",
    )

    def __init__(
        self,
        name: str,
        rate: int,
        per: float = 1.0,
        burst: Optional[int] = None,
        *,
        key: Union[KeySource, Callable[[Scope], Optional[str]], None] = None,
        max_keys: Optional[int] = None,
        shared: "os.PathLike[str] | str | None" = None,
        capacity: int = 65_536,
        on_mismatch: str = "refuse",
        trust_user: "int | str | None" = None,
        trust_group: "int | str | None" = None,
        redis: Any = None,
        redis_timeout: float = 0.25,
        on_redis_failure: Any = "closed",
    ) -> None:
        if not isinstance(name, str) or not name:
            raise ValueError(f"a limit's name must be a non-empty str, got {name!r}")
        self.rate, self.per, self.burst = _quota(rate, per, rate if burst is None else burst)
        self.name = name
        if key is None:
            key = KeySource.peer_ip()
        elif not isinstance(key, KeySource):
            key = KeySource.callable(key)
        self.key = key
        self.max_keys = None if max_keys is None else _count("max_keys", max_keys, 1)
        self.shared = None if shared is None else _path(shared)
        if self.shared is not None and max_keys is not None:
            raise ValueError("a shared limit's keys are bounded by capacity, not max_keys")
        self.capacity = _capacity(capacity)
        self.trust_user = _trusted("trust_user", trust_user, _uid)
        self.trust_group = _trusted("trust_group", trust_group, _gid)
        if on_mismatch not in ("refuse", "adopt", "replace"):
            raise ValueError(
                f'on_mismatch must be "refuse", "adopt" or "replace", got {on_mismatch!r}'
            )
        self.on_mismatch = on_mismatch
        self.redis = None
        if redis is not None:
            self.redis = _fleet_limiter(self, redis, redis_timeout, on_redis_failure, max_keys)

    def __repr__(self) -> str:
        return (
            f"Limit({self.name!r}, rate={self.rate}, per={self.per}, burst={self.burst}, "
            f"key={self.key!r}{'' if self.shared is None else f', shared={self.shared!r}'})"
        )

    def _spec(self) -> tuple:
        return (
            self.name,
            self.rate,
            self.per,
            self.burst,
            self.key._spec,
            self.max_keys,
            None
            if self.shared is None
            else (
                self.shared,
                self.capacity,
                self.on_mismatch,
                self.trust_user,
                self.trust_group,
            ),
        )


def _fleet_limiter(limit: Limit, client: Any, timeout: float, on_failure: Any, max_keys: Any) -> Any:
    """The ``paceline.redis.RedisLimiter`` of a limit kept in Redis."""
    if limit.shared is not None:
        raise ValueError("a limit is kept in a shared file or in Redis, not both")
    if max_keys is not None:
        raise ValueError("a limit kept in Redis has no max_keys: Redis keeps its keys")
    if "{" in limit.name or "}" in limit.name:
        raise ValueError(
            f"a limit kept in Redis names its Redis keys, which take no braces: {limit.name!r}"
        )
    from .redis import RedisLimiter

    return RedisLimiter(
        client,
        limit.rate,
        limit.per,
        limit.burst,
        prefix=f"paceline-asgi:{limit.name}",
        timeout=timeout,
        on_failure=on_failure,
    )


class RefusalInfo:
    """Why a request was refused, for a custom refusal response: the ``limit`` that admits
    it last, the ``wait`` in seconds until it would, ``retry_after`` (whole seconds,
    rounded up, at least 1), the ``status`` (429) and the ``headers`` the refusal carries
    (``Retry-After`` and the ``RateLimit`` fields, as ASGI ``(bytes, bytes)`` pairs)."""

    __slots__ = ("limit", "wait", "retry_after", "status", "headers")

    def __init__(
        self, limit: str, wait: float, status: int, headers: List[Tuple[bytes, bytes]]
    ) -> None:
        self.limit = limit
        self.wait = wait
        self.status = status
        self.headers = headers
        self.retry_after = 1
        for name, value in headers:
            if name == b"retry-after":
                self.retry_after = int(value)

    def __repr__(self) -> str:
        return f"RefusalInfo(limit={self.limit!r}, wait={self.wait:.3f}, retry_after={self.retry_after})"


_MISSING = ("shared", "skip")


def _missing(value: object) -> Optional[str]:
    if value is None:
        return None
    if value in _MISSING:
        return str(value)
    if isinstance(value, int) and not isinstance(value, bool) and 400 <= value <= 599:
        return str(value)
    raise ValueError(
        f'on_missing_key must be None, "shared", "skip" or an HTTP error status, got {value!r}'
    )


class _Checker:
    """The Rust layer for a set of limits, and what Python adds around it: keys from
    callables, the exempt rule, the 500 of a server that gives no client address."""

    def __init__(
        self,
        limits: Sequence[Limit],
        *,
        headers_on_success: bool,
        legacy_headers: bool,
        wait_up_to: Optional[float],
        on_missing_key: object,
        on_refusal: Optional[Callable[[Scope, RefusalInfo], Any]],
        exempt: Optional[Callable[[Scope], bool]],
    ) -> None:
        if isinstance(limits, Limit):
            limits = [limits]
        limits = list(limits)
        if not limits or not all(isinstance(limit, Limit) for limit in limits):
            raise TypeError("limits must be a non-empty list of paceline.asgi.Limit")
        names = [limit.name for limit in limits]
        if len(set(names)) != len(names):
            raise ValueError(f"two limits share a name: {names}")
        if wait_up_to is not None:
            if isinstance(wait_up_to, bool) or not isinstance(wait_up_to, (int, float)):
                raise TypeError("wait_up_to must be None or a number of seconds")
            if not 0.0 <= float(wait_up_to) < float("inf"):
                raise ValueError(f"wait_up_to must be a finite number of seconds >= 0, got {wait_up_to}")
        if exempt is not None and not callable(exempt):
            raise TypeError("exempt must be a function of the scope returning a bool")
        if on_refusal is not None and not callable(on_refusal):
            raise TypeError("on_refusal must be a function (scope, RefusalInfo) -> ASGI app")
        missing = _missing(on_missing_key)
        # Limits kept in Redis are decided in Python after the layer's (_asgi_fleet).
        self.fleet = None
        if any(limit.redis is not None for limit in limits):
            from ._asgi_fleet import FleetLimits

            self.fleet = FleetLimits(
                [limit for limit in limits if limit.redis is not None],
                missing=missing,
                headers_on_success=bool(headers_on_success),
                wait_up_to=None if wait_up_to is None else float(wait_up_to),
                python_refusals=on_refusal is not None,
            )
            every = limits
            limits = [limit for limit in limits if limit.redis is None]
        self.core = None if not limits else new_asgi_core(
            [limit._spec() for limit in limits],
            bool(headers_on_success),
            bool(legacy_headers),
            None if wait_up_to is None else float(wait_up_to),
            missing,
            on_refusal is not None,
            exempt is None,
        )
        self.exempt = exempt
        self.on_refusal = on_refusal
        self.key_fns = [limit.key._fn for limit in limits]
        if not any(self.key_fns):
            self.key_fns = None
        # The first limit keyed by the client's address, when a server that gives none is
        # a misconfiguration to answer with a 500.
        self.needs_address = None
        if missing is None:
            self.needs_address = next(
                (limit.name for limit in (every if self.fleet else limits) if limit.key._by_address),
                None,
            )

    def keys(self, scope: Scope) -> Optional[List[Optional[str]]]:
        fns = self.key_fns
        if fns is None:
            return None
        keys = []
        for fn in fns:
            key = None if fn is None else fn(scope)
            if key is not None and not isinstance(key, str):
                raise TypeError(f"a key function must return a str or None, got {key!r}")
            keys.append(key)
        return keys

    def check(self, scope: Scope) -> Any:
        """The layer's answer for this request: ``None`` when exempt, an outcome tuple, or
        a ``Waiting``."""
        if self.exempt is not None and self.exempt(scope):
            return None
        client = scope.get("client")
        if self.needs_address is not None and (not client or not client[0]):
            return _no_address(self.needs_address)
        if self.core is None:
            return (True, [])  # only limits kept in Redis: the middleware asks them next
        return self.core.check(
            scope["method"], scope["path"], scope["headers"], client, self.keys(scope)
        )


def _no_address(limit: str) -> tuple:
    message = (
        f"paceline: the rate limit {limit!r} keys clients by their address, but this ASGI "
        "server gives none (scope['client'] is None, as over a unix socket). Serve over "
        "TCP; behind a proxy on a unix socket, let the server take the client from the "
        "proxy's header (uvicorn --proxy-headers --forwarded-allow-ips=...) or key by a "
        "header the proxy sets (KeySource.header); or share one bucket on purpose with "
        "on_missing_key=\"shared\".\n"
    )
    if not _no_address.warned:  # type: ignore[attr-defined]
        _no_address.warned = True  # type: ignore[attr-defined]
        _log.error("%s", message.strip())
    return (False, 500, [(b"content-type", b"text/plain; charset=utf-8")], message.encode(), None)


_no_address.warned = False  # type: ignore[attr-defined]


async def _wait(waiting: Any) -> tuple:
    """Awaits a ``Waiting`` from the Rust layer: polls it, and when its waker fires (on
    the timer's thread) polls again on this loop. Cancelled, it gives every booking back."""
    loop = asyncio.get_running_loop()
    try:
        while True:
            woken = loop.create_future()

            def wake(woken: asyncio.Future = woken) -> None:
                loop.call_soon_threadsafe(_settle, woken)

            outcome = waiting.poll(wake)
            if outcome is not None:
                return outcome
            await woken
    except BaseException:
        waiting.cancel()
        raise


def _settle(future: asyncio.Future) -> None:
    if not future.done():
        future.set_result(None)


async def _wait_watching(waiting: Any, receive: Receive) -> Tuple[Optional[tuple], List[Message]]:
    """Waits the turn while listening for the client going away: the messages read
    meanwhile (the request's body) are kept for the app. A disconnect cancels the wait,
    giving its booking back, and returns ``None``."""
    kept: List[Message] = []

    async def listen() -> None:
        while True:
            message = await receive()
            kept.append(message)
            if message["type"] == "http.disconnect":
                return

    turn = asyncio.ensure_future(_wait(waiting))
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


def _replaying(kept: List[Message], receive: Receive) -> Receive:
    if not kept:
        return receive

    async def replay() -> Message:
        if kept:
            return kept.pop(0)
        return await receive()

    return replay


def _adding(send: Send, fields: List[Tuple[bytes, bytes]]) -> Send:
    async def with_fields(message: Message) -> None:
        if message["type"] == "http.response.start":
            message = dict(message)
            message["headers"] = list(message.get("headers", ())) + fields
        await send(message)

    return with_fields


async def _refuse(checker: _Checker, scope: Scope, receive: Receive, send: Send, outcome: tuple) -> None:
    _, status, headers, body, refusal = outcome
    if refusal is not None and checker.on_refusal is not None:
        kept = [
            (name, value)
            for name, value in headers
            if name not in (b"content-type", b"content-length")
        ]
        info = RefusalInfo(refusal[0], refusal[1], status, kept)
        response = checker.on_refusal(scope, info)
        if asyncio.iscoroutine(response):
            response = await response
        await response(scope, receive, _adding(send, _missing_fields(kept, response)))
        return
    headers.append((b"content-length", str(len(body)).encode()))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def _missing_fields(fields: List[Tuple[bytes, bytes]], response: Any) -> List[Tuple[bytes, bytes]]:
    """The refusal's fields that a custom response does not set itself."""
    own = getattr(response, "raw_headers", None)
    if not own:
        return fields
    names = {name.lower() for name, _ in own}
    return [(name, value) for name, value in fields if name not in names]


class RateLimitMiddleware:
    """An ASGI middleware that limits HTTP requests by ``limits`` (a list of ``Limit``).

    - ``headers_on_success``: add the ``RateLimit-Policy`` / ``RateLimit`` fields to
      admitted responses too (default: only to refusals).
    - ``legacy_headers``: also the ``X-RateLimit-Limit/Remaining/Reset`` fields of the
      tightest limit.
    - ``wait_up_to``: seconds a request may wait for its turn instead of being refused
      (booked in line, first come first served; a client that goes away gives its turn
      back). Default: refuse at once.
    - ``on_missing_key``: a request without a key for a limit (no such header, a key
      function returning ``None``): ``"shared"`` (default; keyless requests share one
      bucket), ``"skip"`` (the limit does not apply) or an HTTP status to refuse with.
      Left unset, a limit keyed by the client's address behind a server that gives none
      answers 500 naming the fix.
    - ``on_refusal``: ``(scope, RefusalInfo) -> ASGI app`` (a Starlette ``Response``, say),
      sent instead of the default ``429`` text; the refusal's ``Retry-After`` and
      ``RateLimit`` fields are added where the response does not set them.
    - ``exempt``: ``scope -> bool``, requests not limited at all (default: ``OPTIONS``, so
      CORS preflights never eat a client's budget).

    Non-HTTP scopes (websocket, lifespan) pass through.
    """

    def __init__(
        self,
        app: ASGIApp,
        limits: Sequence[Limit],
        *,
        headers_on_success: bool = False,
        legacy_headers: bool = False,
        wait_up_to: Optional[float] = None,
        on_missing_key: Union[str, int, None] = None,
        on_refusal: Optional[Callable[[Scope, RefusalInfo], Any]] = None,
        exempt: Optional[Callable[[Scope], bool]] = None,
    ) -> None:
        self.app = app
        self._checker = _Checker(
            limits,
            headers_on_success=headers_on_success,
            legacy_headers=legacy_headers,
            wait_up_to=wait_up_to,
            on_missing_key=on_missing_key,
            on_refusal=on_refusal,
            exempt=exempt,
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        checker = self._checker
        outcome = checker.check(scope)
        if outcome is None:
            await self.app(scope, receive, send)
            return
        if type(outcome) is not tuple:
            outcome, kept = await _wait_watching(outcome, receive)
            if outcome is None:
                return  # the client went away while it waited
            receive = _replaying(kept, receive)
        if outcome[0] and checker.fleet is not None:
            # The limits kept in Redis, once the others admitted the request.
            refusal, more, kept = await checker.fleet.check(scope, receive)
            receive = _replaying(kept, receive)
            if refusal == ():
                return  # the client went away while it waited
            outcome = refusal if refusal is not None else (True, outcome[1] + more)
        if outcome[0]:
            fields = outcome[1]
            await self.app(scope, receive, _adding(send, fields) if fields else send)
            return
        await _refuse(checker, scope, receive, send, outcome)


class RouteLimit:
    """Limits for some routes only, the same ``Limit``s and options as
    ``RateLimitMiddleware`` (its ``on_missing_key``, ``headers_on_success``, ``exempt``).

    In FastAPI, as a dependency (it raises ``HTTPException(429)`` with ``Retry-After`` and
    the ``RateLimit`` fields)::

        login_limit = RouteLimit(Limit("login", rate=5, per=60.0, key=KeySource.peer_ip()))

        @app.post("/login", dependencies=[Depends(login_limit)])
        async def login(): ...

    On a Starlette endpoint (or any endpoint that takes the ``Request``), as a decorator
    that answers the ``429`` itself::

        @login_limit.limit
        async def login(request): ...

    A route limit refuses at once (``wait_up_to`` is the middleware's).
    """

    def __init__(
        self,
        limits: Union[Limit, Sequence[Limit]],
        *,
        headers_on_success: bool = False,
        legacy_headers: bool = False,
        on_missing_key: Union[str, int, None] = None,
        exempt: Optional[Callable[[Scope], bool]] = None,
    ) -> None:
        self._checker = _Checker(
            limits,
            headers_on_success=headers_on_success,
            legacy_headers=legacy_headers,
            wait_up_to=None,
            on_missing_key=on_missing_key,
            on_refusal=None,
            exempt=exempt,
        )
        if self._checker.fleet is not None:
            raise ValueError(
                "a Limit kept in Redis needs RateLimitMiddleware (RouteLimit decides "
                "without awaiting)"
            )

    def decide(self, scope: Scope) -> Tuple[bool, int, Dict[str, str], bytes]:
        """The decision for a request's scope: ``(admitted, status, fields, body)``, with
        the fields to add (admitted) or to answer with (refused) as a ``str`` dict."""
        outcome = self._checker.check(scope)
        if outcome is None:
            return True, 200, {}, b""
        if outcome[0]:
            return True, 200, _as_dict(outcome[1]), b""
        _, status, headers, body, _ = outcome
        fields = {
            name: value
            for name, value in _as_dict(headers).items()
            if name not in ("content-type", "content-length")
        }
        return False, status, fields, body

    async def __call__(self, request: Any, response: Any) -> None:
        """The FastAPI dependency: raises ``fastapi.HTTPException`` when refused; adds
        the fields to the response when ``headers_on_success``."""
        admitted, status, fields, body = self.decide(request.scope)
        if admitted:
            for name, value in fields.items():
                response.headers[name] = value
            return
        from fastapi import HTTPException

        raise HTTPException(status_code=status, detail=body.decode().strip(), headers=fields)

    def limit(self, endpoint: Callable[..., Any]) -> Callable[..., Any]:
        """Wraps an async endpoint that takes the ``Request`` (Starlette's, or FastAPI's
        with a ``request: Request`` parameter): refused requests get the ``429`` without
        reaching it."""
        import functools

        from starlette.requests import Request
        from starlette.responses import Response

        @functools.wraps(endpoint)
        async def limited(*args: Any, **kwargs: Any) -> Any:
            request = next(
                (a for a in (*args, *kwargs.values()) if isinstance(a, Request)), None
            )
            if request is None:
                raise TypeError(
                    f"{endpoint.__name__} takes no Request: add a `request: Request` "
                    "parameter for RouteLimit.limit, or use the RouteLimit as a dependency"
                )
            admitted, status, fields, body = self.decide(request.scope)
            if not admitted:
                return Response(body, status_code=status, headers=fields, media_type="text/plain")
            result = endpoint(*args, **kwargs)
            if asyncio.iscoroutine(result):
                result = await result
            if fields and isinstance(result, Response):
                for name, value in fields.items():
                    result.headers[name] = value
            return result

        return limited


def _as_dict(headers: List[Tuple[bytes, bytes]]) -> Dict[str, str]:
    return {name.decode("latin-1"): value.decode("latin-1") for name, value in headers}


def _annotate_dependency() -> None:
    """FastAPI reads a dependency's parameter types from its annotations: give
    ``RouteLimit.__call__`` Starlette's ``Request`` and ``Response`` where they exist."""
    try:
        from starlette.requests import Request
        from starlette.responses import Response
    except ImportError:  # no Starlette: the dependency is not used either
        return
    RouteLimit.__call__.__annotations__.update(request=Request, response=Response)


_annotate_dependency()
