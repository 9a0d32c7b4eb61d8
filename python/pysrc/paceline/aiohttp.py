"""An aiohttp hook that paces every request by a paceline limiter and follows what the
upstream says (see ``paceline.httpx``, which does the same for httpx and can also retry).

    import aiohttp, paceline, paceline.aiohttp

    limiter = paceline.Limiter(100, burst=1)
    async with aiohttp.ClientSession(trace_configs=[paceline.aiohttp.trace_config(limiter)]) as s:
        ...

A request waits its booked turn when it starts; its response steers its upstream's
follower when it ends. (A trace configuration cannot send a request again: a 429 is the
caller's to retry, and its turn will already wait out the upstream's hold.)

The wait for a turn counts against the session's ``ClientTimeout`` (its ``total``, and
its ``connect`` for waiting to send): a turn further away than that raises aiohttp's
``ConnectionTimeoutError`` (an ``asyncio.TimeoutError``) at once, having booked nothing.
A trace hook cannot see a ``timeout=`` given to one request; the session's counts.

**A budget of several rates.** With ``budget=`` (a ``paceline.Budget``, with or without
a limiter), each request books ``cost(request)`` in one turn when it starts, and its
response steers the budget by its per-dimension fields (``Budget.follow``). A trace hook
sees no request body: ``cost`` gets an object with the request's ``method``, ``url``,
``headers`` and ``ctx``, the ``trace_request_ctx`` given to that request
(``session.post(url, json=body, trace_request_ctx={"tokens": 1200})``), and returns a
mapping of dimension names to counts (default: 1 in every dimension). With
``settle_from``, a success's body is read before the response is handed to you (so it
is not streamed) and the turn is settled with ``settle_from(response)``; without it,
for any other status, or when ``settle_from`` raises or returns junk, the turn ends
keeping its estimate when the response's headers arrive. A request that fails ends its
turn the same way.
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Callable, Optional, Union

import aiohttp
import yarl

from . import KeyedLimiter, Limiter
from ._booking import Booking
from ._budget import Budget
from ._upstream import Hosts, host_key

__all__ = ["trace_config"]

# aiohttp 3.10 and later: the error of a connect timeout, an asyncio.TimeoutError.
_TIMEOUT = getattr(aiohttp, "ConnectionTimeoutError", None) or getattr(
    aiohttp, "ServerTimeoutError", asyncio.TimeoutError
)


def _budget(session: aiohttp.ClientSession) -> Optional[float]:
    timeout = getattr(session, "timeout", None)
    parts = [getattr(timeout, "total", None), getattr(timeout, "connect", None)]
    parts = [p for p in parts if p is not None]
    return min(parts) if parts else None


def _left(session: aiohttp.ClientSession, context) -> Optional[float]:  # type: ignore[no-untyped-def]
    """What is left of the session's timeout for a request that started when its
    ``on_request_start`` ran (the whole of it for a hop of a redirect: ``total``
    counts from the first request)."""
    total = getattr(getattr(session, "timeout", None), "total", None)
    started = getattr(context, "paceline_started", None)
    budget = _budget(session)
    if total is None or started is None:
        return budget
    left = max(0.0, total - (asyncio.get_running_loop().time() - started))
    return left if budget is None else min(budget, left)


def _host(url: yarl.URL) -> str:
    """The host a request goes to, with its port unless the scheme's default."""
    return host_key(url.host or "", url.explicit_port, url.scheme)


def trace_config(
    limiter: Union[Limiter, KeyedLimiter, None] = None,
    *,
    key: Optional[Callable[[str], str]] = None,
    max_hold: float = 300.0,
    above_configured: bool = False,
    revert_after: Optional[float] = None,
    budget: Optional[Budget] = None,
    cost: Optional[Callable[[SimpleNamespace], object]] = None,
    settle_from: Optional[Callable[[aiohttp.ClientResponse], object]] = None,
) -> aiohttp.TraceConfig:
    """An ``aiohttp.TraceConfig`` that paces a session's requests by ``limiter`` (per host
    with a ``KeyedLimiter``) and ``budget``, and follows each response."""
    if limiter is None and budget is None:
        raise TypeError("give a limiter, a budget, or both")
    if budget is None and (cost is not None or settle_from is not None):
        raise TypeError("cost and settle_from price a budget's turns: give budget=")
    hosts = (
        None if limiter is None else Hosts(limiter, key, max_hold, above_configured, revert_after)
    )
    booking = None if budget is None else Booking(budget, cost, settle_from, max_hold)
    config = aiohttp.TraceConfig()

    async def on_request_start(session, context, params) -> None:
        context.paceline_started = asyncio.get_running_loop().time()
        request_key = "" if hosts is None else hosts.key(_host(params.url))
        try:
            if hosts is not None:
                await hosts.acquire(request_key, _budget(session))
            if booking is not None:
                request = SimpleNamespace(
                    method=params.method,
                    url=params.url,
                    headers=params.headers,
                    ctx=getattr(context, "trace_request_ctx", None),
                )
                context.paceline_turn = await booking.acquire(request, _budget(session))
        except TimeoutError:
            raise _TIMEOUT(
                "paceline: the turn to send this request is further away than the "
                "session's timeout allows (nothing was sent)"
            ) from None
        if hosts is not None:
            context.paceline_sent = hosts.sent(request_key)

    async def on_request_end(session, context, params) -> None:
        response = params.response
        headers = [(name.decode("latin-1"), value) for name, value in response.raw_headers]
        if hosts is not None:
            request_key = hosts.key(_host(params.url))
            sent = getattr(context, "paceline_sent", None)
            hosts.observe(request_key, response.status, headers, sent)
        turn = getattr(context, "paceline_turn", None)
        if booking is None or turn is None:
            return
        context.paceline_turn = None
        booking.follow(response.status, headers)
        if not booking.settles(response.status):
            turn.release()
            return
        try:
            await response.read()
        except BaseException:
            turn.release()
            raise
        booking.settle(turn, response)

    async def on_request_redirect(session, context, params) -> None:
        # A hop of a redirect: its response steers its host's follower, and the next hop,
        # a request of its own, waits its turn (the budget's turn covers the whole call).
        if hosts is None:
            return
        response = params.response
        headers = [(name.decode("latin-1"), value) for name, value in response.raw_headers]
        hop_key = hosts.key(_host(params.url))
        hosts.observe(hop_key, response.status, headers, getattr(context, "paceline_sent", None))
        location = response.headers.get("Location", "")
        try:
            next_url = params.url.join(yarl.URL(location))
        except ValueError:
            next_url = params.url
        next_key = hosts.key(_host(next_url if next_url.host else params.url))
        try:
            await hosts.acquire(next_key, _left(session, context))
        except TimeoutError:
            raise _TIMEOUT(
                "paceline: the turn to follow this redirect is further away than the "
                "session's timeout allows (nothing was sent)"
            ) from None
        context.paceline_sent = hosts.sent(next_key)

    async def on_request_exception(session, context, params) -> None:
        turn = getattr(context, "paceline_turn", None)
        if turn is not None:
            context.paceline_turn = None
            turn.release()

    config.on_request_start.append(on_request_start)
    config.on_request_end.append(on_request_end)
    config.on_request_redirect.append(on_request_redirect)
    config.on_request_exception.append(on_request_exception)
    # For a look at what each upstream said (tests, debugging).
    config._paceline_hosts = hosts  # type: ignore[attr-defined]
    return config
