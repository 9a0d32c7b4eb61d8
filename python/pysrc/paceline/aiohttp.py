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
"""

from __future__ import annotations

import asyncio
from typing import Callable, Optional, Union

import aiohttp

from . import KeyedLimiter, Limiter
from ._upstream import Hosts

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


def trace_config(
    limiter: Union[Limiter, KeyedLimiter],
    *,
    key: Optional[Callable[[str], str]] = None,
    max_hold: float = 300.0,
    above_configured: bool = False,
    revert_after: Optional[float] = None,
) -> aiohttp.TraceConfig:
    """An ``aiohttp.TraceConfig`` that paces a session's requests by ``limiter`` (per host
    with a ``KeyedLimiter``) and follows each response."""
    hosts = Hosts(limiter, key, max_hold, above_configured, revert_after)
    config = aiohttp.TraceConfig()

    async def on_request_start(session, context, params) -> None:
        request_key = hosts.key(params.url.host or "")
        try:
            await hosts.acquire(request_key, _budget(session))
        except TimeoutError:
            raise _TIMEOUT(
                "paceline: the turn to send this request is further away than the "
                "session's timeout allows (nothing was sent)"
            ) from None
        context.paceline_sent = hosts.sent(request_key)

    async def on_request_end(session, context, params) -> None:
        response = params.response
        headers = [(name.decode("latin-1"), value) for name, value in response.raw_headers]
        request_key = hosts.key(params.url.host or "")
        sent = getattr(context, "paceline_sent", None)
        hosts.observe(request_key, response.status, headers, sent)

    config.on_request_start.append(on_request_start)
    config.on_request_end.append(on_request_end)
    # For a look at what each upstream said (tests, debugging).
    config._paceline_hosts = hosts  # type: ignore[attr-defined]
    return config
