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

Behind a proxy, one of the server and paceline resolves the client from
``X-Forwarded-For``, never both: uvicorn's proxy headers on (``--forwarded-allow-ips`` your
proxies) with ``KeySource.peer_ip()``, or ``--no-proxy-headers`` with
``KeySource.behind_proxies([...])``. paceline logs an error when it sees both.
"""

from __future__ import annotations

from .._http.checker import Admitted, Refused
from .._http.limit import KeySource, Limit, Rate
from ._middleware import RateLimitMiddleware, RefusalInfo
from ._exempt import exempt
from ._route import RouteLimit

__all__ = [
    "KeySource",
    "Limit",
    "Rate",
    "RateLimitMiddleware",
    "RefusalInfo",
    "RouteLimit",
    "exempt",
    "Admitted",
    "Refused",
]
