"""An aiohttp hook that paces every request by a paceline limiter and follows what the
upstream says (see ``paceline.httpx``, which does the same for httpx and can also retry).

    import aiohttp, paceline, paceline.aiohttp

    limiter = paceline.Limiter(100, burst=1)
    async with aiohttp.ClientSession(trace_configs=[paceline.aiohttp.trace_config(limiter)]) as s:
        ...

A request waits its booked turn when it starts; its response steers the limiter when it
ends. (A trace configuration cannot send a request again: a 429 is the caller's to retry,
and its turn will already wait out the upstream's hold.)
"""

from __future__ import annotations

from typing import Callable, Optional, Union

import aiohttp

from . import KeyedLimiter, Limiter
from ._upstream import Following

__all__ = ["trace_config"]


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
    following = Following(limiter, key, max_hold, above_configured, revert_after)
    config = aiohttp.TraceConfig()

    async def on_request_start(session, context, params) -> None:
        await following.acquire(following.key(params.url.host or ""))

    async def on_request_end(session, context, params) -> None:
        response = params.response
        headers = [(name.decode("latin-1"), value) for name, value in response.raw_headers]
        following.observe(following.key(params.url.host or ""), response.status, headers)

    config.on_request_start.append(on_request_start)
    config.on_request_end.append(on_request_end)
    return config
