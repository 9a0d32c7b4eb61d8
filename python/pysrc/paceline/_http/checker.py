"""The Rust layer for a set of limits, and what Python adds around it per request: keys
and costs from functions (``async`` ones awaited), per-limit exemptions, tiers, the
exempt rule, the 500 of a server that gives no client address, the warning of a server
whose own proxy handling already rewrote the client, and the shared files watched."""

from __future__ import annotations

import logging
import time
from typing import Any, Callable, List, Optional, Sequence, Tuple

from .._paceline import Admitted, Refused, new_asgi_core
from .limit import _RESETS, Limit, Scope, _is_async, _tier, client_of, storable

_log = logging.getLogger("paceline.asgi")

#: How often the shared files are checked for having been removed or replaced (seconds).
_WATCH_EVERY = 1.0
#: How often a shared file that cannot be opened again is logged (seconds).
_LOG_AGAIN = 60.0

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


class _Pass:
    """Admitted, with no fields: the layer's answer when every limit is kept in Redis."""

    __slots__ = ()
    fields: List[Any] = []


PASS = _Pass()


class _NoAddress:
    """The 500 of a server that gives no client address (a ``Refused``'s shape)."""

    __slots__ = ("status", "headers", "body", "limit", "wait", "table_full")

    def __init__(self, body: bytes) -> None:
        self.status = 500
        self.headers = [(b"content-type", b"text/plain; charset=utf-8")]
        self.body = body
        self.limit = None
        self.wait = 0.0
        self.table_full = False


_warned = set()


def _warn_once(what: str, message: str) -> None:
    if what not in _warned:
        _warned.add(what)
        _log.error("%s", message)


def _no_address(limit: str) -> _NoAddress:
    message = (
        f"paceline: the rate limit {limit!r} keys clients by their address, but this "
        "server gives none (no scope['client'] under ASGI, no REMOTE_ADDR under WSGI, as "
        "over a unix socket). Serve over TCP; behind a proxy on a unix socket, let the "
        "server or the app take the client from the proxy's header (uvicorn --proxy-headers "
        "--forwarded-allow-ips=...; gunicorn --forwarded-allow-ips with werkzeug's "
        "ProxyFix) or key by a header the proxy sets (KeySource.header); or share one "
        "bucket on purpose with on_missing_key=\"shared\".\n"
    )
    _warn_once("no-address", message.strip())
    return _NoAddress(message.encode())


def _proxy_rewritten(limit: str) -> None:
    _warn_once(
        "proxy-rewritten",
        f"paceline: the rate limit {limit!r} reads X-Forwarded-For behind its own trusted "
        "proxies (KeySource.behind_proxies), but the server has already replaced the "
        "connection's address with one read from that header (uvicorn's proxy headers are "
        "on: its --forwarded-allow-ips list, default 127.0.0.1, decides whom it trusts). "
        "Two trust lists disagree, and a client the server trusts chooses its own key. "
        "Either run uvicorn with --no-proxy-headers and keep behind_proxies, or list your "
        "proxies in --forwarded-allow-ips and use KeySource.peer_ip().",
    )


def _check_rewritten(limit: str, client: Any, scope: Scope) -> None:
    """Logs (once) when the server already resolved the client from ``X-Forwarded-For``
    while ``limit`` reads it behind its own trusted proxies: uvicorn's proxy middleware
    writes the address it read there (with port 0, or the port written beside it) as the
    client, so the connection's address is the header's right-most entry."""
    if "x-forwarded-for" in _warned_about or scope.get("wsgi"):
        return  # a WSGI server writes no port it read from the header
    forwarded = None
    for name, value in scope.get("headers", ()):
        if name == b"x-forwarded-for":
            forwarded = value
    if forwarded is None:
        return
    last = forwarded.rsplit(b",", 1)[-1].strip().decode("latin-1")
    if last.startswith("["):  # [v6]:port
        last = last[1 : last.find("]")] if "]" in last else last
    elif last.count(":") == 1:  # v4:port
        last = last.split(":", 1)[0]
    if client[1] == 0 or last == client[0]:
        _warned_about.add("x-forwarded-for")
        _proxy_rewritten(limit)


_warned_about: set = set()


class RefusalInfo:
    """Why a request was refused, for a custom refusal response: the ``limit`` that admits
    it last, the ``wait`` in seconds until it would, ``retry_after`` (whole seconds,
    rounded up, at least 1), the ``status`` (429) and the ``headers`` the refusal carries
    (``Retry-After`` and the ``RateLimit`` fields: ``(bytes, bytes)`` pairs under ASGI,
    ``(str, str)`` under WSGI)."""

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
            if name in (b"retry-after", "Retry-After", "retry-after"):
                self.retry_after = int(value)

    def __repr__(self) -> str:
        return f"RefusalInfo(limit={self.limit!r}, wait={self.wait:.3f}, retry_after={self.retry_after})"


class _Checker:
    """The Rust layer for ``limits`` and the per-request Python around it."""

    def __init__(
        self,
        limits: Sequence[Limit],
        *,
        headers_on_success: bool = False,
        legacy_headers: bool = False,
        wait_up_to: Optional[float] = None,
        on_missing_key: object = None,
        on_refusal: Optional[Callable[..., Any]] = None,
        exempt: Optional[Callable[[Scope], bool]] = None,
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
                raise ValueError(
                    f"wait_up_to must be a finite number of seconds >= 0, got {wait_up_to}"
                )
        if exempt is not None and not callable(exempt):
            raise TypeError("exempt must be a function of the scope returning a bool")
        if on_refusal is not None and not callable(on_refusal):
            raise TypeError("on_refusal must be a function (scope, RefusalInfo) -> ASGI app")
        # Limits kept in Redis are decided after the layer's, in Python (`_fleet.py`).
        self.fleet = None
        fleet = [limit for limit in limits if limit.redis is not None]
        if fleet:
            from .fleet import FleetLimits

            self.fleet = FleetLimits(
                fleet,
                missing=_missing(on_missing_key),
                headers_on_success=bool(headers_on_success),
                legacy_headers=bool(legacy_headers),
            )
        every = limits
        self.every = every
        limits = [limit for limit in limits if limit.redis is None]
        self.limits = limits
        self.options = (
            bool(headers_on_success),
            bool(legacy_headers),
            None if wait_up_to is None else float(wait_up_to),
            _missing(on_missing_key),
            exempt is None,
        )
        self.legacy = bool(legacy_headers)
        self.wait_up_to = self.options[2]
        self.exempt = exempt
        self.exempt_async = exempt is not None and _is_async(exempt)
        self.on_refusal = on_refusal
        self._build()
        missing = self.options[3]
        # The first limit keyed by the client's address, when a server that gives none is
        # a misconfiguration to answer with a 500.
        # The limits keyed by the client's address, when a server that gives none is a
        # misconfiguration to answer with a 500 (for requests such a limit applies to).
        self.needs_address = []
        if missing is None:
            self.needs_address = [
                (limit.name, limit.methods) for limit in every if limit.key._by_address
            ]
        self.behind_proxies = next(
            (limit.name for limit in every if limit.key._spec[0] == "proxies"), None
        )
        # Whether the layer reads a request's headers (a key from a header or behind
        # proxies): a sync server then builds them for it, else it need not.
        # The limits kept in this process's memory (counted per worker under a pre-fork
        # server).
        self.in_memory = [limit.name for limit in every if limit.shared is None and limit.redis is None]
        self.reads_headers = any(limit.key._spec[0] in ("header", "proxies") for limit in every)
        self.watch_at = time.monotonic() + _WATCH_EVERY
        self.resets = _RESETS[0]
        self.watched = [limit for limit in limits if limit.shared is not None]

    def _build(self) -> None:
        """The Rust layer, and what Python computes per request, by Rust limit index."""
        # Each Limit's built limits (its counts), in order: `_watch` rebuilds the core when
        # a Limit was built anew (its shared file reopened, by this core or another).
        self.built = [limit._built for limit in self.limits]
        built = [one for limit in self.limits for one in limit._built]
        self.core = new_asgi_core(built, *self.options) if built else None
        specs = [spec for limit in self.limits for spec in limit._specs()]
        self.key_fns = [spec.limit.key._fn for spec in specs]
        self.tiers = [spec.limit.quota_for for spec in specs]
        self.cost_fns = [spec.limit.cost if callable(spec.limit.cost) else None for spec in specs]
        self.when_fns = [spec.limit.exempt_when for spec in specs]
        self.any_keys = any(self.key_fns)
        self.any_costs = any(self.cost_fns)
        self.any_when = any(self.when_fns)
        self.is_async = self.exempt_async or any(
            spec.limit.key._is_async
            or spec.limit._cost_async
            or (spec.limit.exempt_when is not None and _is_async(spec.limit.exempt_when))
            for spec in specs
        )

    def _watch(self) -> None:
        """Re-opens a shared file that was removed or replaced at its path (an operator,
        a cleaner of /tmp): every worker then joins the file the path leads to now,
        within a second, instead of each keeping a bound of its own."""
        self.watch_at = time.monotonic() + _WATCH_EVERY
        for limit in self.watched:
            if not limit._stale():
                continue
            try:
                limit._open()
            except Exception as e:  # noqa: BLE001 - the file keeps serving until it opens
                # A path that cannot be opened now (another user's file planted there,
                # say): this process keeps the file it has, and tries again later.
                now = time.monotonic()
                if now >= limit._reopen_logged + _LOG_AGAIN:
                    limit._reopen_logged = now
                    _log.error(
                        "paceline: the shared file %s of limit %r was removed or replaced, "
                        "and cannot be opened again (this process keeps the file it has, "
                        "and tries every second): %s",
                        limit.shared,
                        limit.name,
                        e,
                    )
                continue
            _log.warning(
                "paceline: the shared file %s of limit %r was removed or replaced: "
                "opened the path again",
                limit.shared,
                limit.name,
            )
        if any(limit._built is not built for limit, built in zip(self.limits, self.built)):
            self._build()

    def _parts(self, subject: Any) -> tuple:
        """What Python computes for this request (sync functions only)."""
        keys = costs = skips = None
        if self.any_keys:
            keys = []
            for fn, tier in zip(self.key_fns, self.tiers):
                key = None if fn is None else fn(subject)
                keys.append(_key(key, tier))
        if self.any_costs:
            costs = [1 if fn is None else _cost(fn(subject)) for fn in self.cost_fns]
        if self.any_when:
            skips = [False if fn is None else _flag(fn(subject)) for fn in self.when_fns]
        return keys, costs, skips

    async def _parts_async(self, subject: Any) -> tuple:
        """[`_parts`], awaiting the functions that are coroutines."""
        keys = costs = skips = None
        if self.any_keys:
            keys = []
            for fn, tier in zip(self.key_fns, self.tiers):
                key = None if fn is None else await _maybe(fn(subject))
                keys.append(_key(key, tier))
        if self.any_costs:
            costs = [1 if fn is None else _cost(await _maybe(fn(subject))) for fn in self.cost_fns]
        if self.any_when:
            skips = [
                False if fn is None else _flag(await _maybe(fn(subject))) for fn in self.when_fns
            ]
        return keys, costs, skips

    def _ask(self, scope: Scope, parts: tuple, wait_within: Optional[float] = None) -> Any:
        if time.monotonic() >= self.watch_at or self.resets != _RESETS[0]:
            self.resets = _RESETS[0]
            self._watch()
        client = client_of(scope)
        if self.needs_address and (not client or not client[0]):
            method = scope.get("method")
            for name, methods in self.needs_address:
                if methods is None or method in methods:
                    return _no_address(name)
        if self.behind_proxies is not None and client:
            _check_rewritten(self.behind_proxies, client, scope)
        if self.core is None:
            return PASS  # only limits kept in Redis: the middleware asks them next
        keys, costs, skips = parts
        return self.core.check(
            scope["method"], scope["path"], scope["headers"], client, keys, costs, skips, wait_within
        )

    def reset(self) -> None:
        """``Limit.reset`` for each limit (``TypeError`` for one kept in Redis: ``areset``)."""
        for limit in self.every:
            if limit.redis is not None:
                raise TypeError(
                    f"the limit {limit.name!r} is kept in Redis: reset with `await ....areset()`"
                )
        for limit in self.every:
            limit.reset()

    async def areset(self) -> None:
        """``Limit.areset`` for each limit, in every tier."""
        for limit in self.every:
            await limit.areset()

    def check(self, scope: Scope, subject: Any = None) -> Any:
        """The layer's answer for this request: ``None`` when exempt, ``Admitted``,
        ``Refused``, or a ``Waiting``. For limits whose functions are all plain ones.
        ``scope`` is the request's head as ASGI writes it (``method``, ``path``,
        ``headers``, ``client``); ``subject`` what the key, cost and exemption functions
        are given (the server's own request: the ASGI scope, a WSGI environ; default
        ``scope``)."""
        subject = scope if subject is None else subject
        if self.exempted(scope, subject):
            return None
        return self.decide(scope, subject)

    async def acheck(self, scope: Scope, subject: Any = None) -> Any:
        """[`check`], awaiting async key and cost functions."""
        subject = scope if subject is None else subject
        if await self.aexempted(scope, subject):
            return None
        return await self.adecide(scope, subject, time.monotonic())

    def exempted(self, scope: Scope, subject: Any) -> bool:
        """Whether no limit applies to the request: ``OPTIONS`` (a CORS preflight) unless
        the ``exempt`` function decides instead, for the limits here and in Redis alike."""
        if self.exempt is None:
            return scope["method"] == "OPTIONS"
        return _flag(self.exempt(subject))

    async def aexempted(self, scope: Scope, subject: Any) -> bool:
        """[`exempted`], awaiting an async ``exempt``."""
        if self.exempt is None:
            return scope["method"] == "OPTIONS"
        return _flag(await _maybe(self.exempt(subject)))

    def decide(self, scope: Scope, subject: Any, arrived: Optional[float] = None) -> Any:
        """The layer's answer for a request that is not exempt (sync functions only); in
        wait mode its turns come within ``wait_up_to`` of ``arrived``
        (``time.monotonic()``, default now)."""
        if self.is_async:
            raise TypeError(
                "a limit's key, cost or exemption function is async: this path decides "
                "synchronously (use the RouteLimit as a FastAPI dependency, or the middleware)"
            )
        return self._ask(scope, self._parts(subject), self._left(arrived))

    async def adecide(self, scope: Scope, subject: Any, arrived: Optional[float] = None) -> Any:
        """[`decide`], awaiting async key and cost functions (their time counts against
        ``wait_up_to`` too)."""
        parts = await self._parts_async(subject) if self.is_async else self._parts(subject)
        return self._ask(scope, parts, self._left(arrived))

    def _left(self, arrived: Optional[float]) -> Optional[float]:
        """What is left of a waiting request's ``wait_up_to`` (``None``: all of it)."""
        if arrived is None or self.wait_up_to is None:
            return None
        return self.wait_up_to - (time.monotonic() - arrived)


async def _maybe(value: Any) -> Any:
    if hasattr(value, "__await__"):
        return await value
    return value


def _key(key: Any, tier: Optional[Callable[[str], Any]]) -> Optional[str]:
    if key is None:
        return None
    if not isinstance(key, str):
        raise TypeError(f"a key function must return a str or None, got {key!r}")
    if tier is not None:
        # The Rust layer reads the client's quota from the key's prefix, which is always
        # there (empty: the limit's own), so the key's own text never reads as a quota.
        rate = tier(key)
        return f"{'' if rate is None else _tier(rate)}\x1f{storable(key)}"
    return storable(key)


def _flag(value: Any) -> bool:
    if hasattr(value, "__await__"):
        if hasattr(value, "close"):
            value.close()  # never awaited: no warning about it
        raise TypeError(
            "an exemption function returned an awaitable where a bool was expected: make "
            "it a plain function, or pass the async def itself (it is then awaited)"
        )
    return bool(value)


def _cost(cost: Any) -> int:
    if isinstance(cost, bool) or not isinstance(cost, int) or not 0 <= cost <= 0xFFFF_FFFF:
        raise TypeError(f"a cost function must return an int from 0 to 4294967295, got {cost!r}")
    return cost


__all__ = ["_Checker", "Admitted", "Refused", "PASS"]
