"""Endpoints no limit applies to (``@exempt``), found for each request cheaply.

The middleware runs before the app routes the request, so it finds the endpoint the app
would choose by matching the request against the app's routes. Done for every request,
that costs a Starlette or FastAPI app with many routes as much as slowapi's whole check;
so once per app (again when its routes change) each exempt endpoint is looked up by name
(``url_path_for``), and a request whose path is none of theirs is not exempt without any
matching. Only a request to an exempt endpoint's path (or any request, when an exempt
endpoint's path has parameters) is matched against the routes, to be sure that route is
the one the app would choose.
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Callable, Dict, Optional, Sequence, Set, Tuple

Scope = Dict[str, Any]

_log = logging.getLogger("paceline.asgi")

#: The endpoints marked exempt (their ids; the functions are kept alive by their routes).
_marked: Set[int] = set()
_lock = threading.Lock()


def exempt(endpoint: Callable[..., Any]) -> Callable[..., Any]:
    """Marks a route's endpoint as not limited by any ``RateLimitMiddleware`` (a health
    check, a webhook with limits of its own)::

        @app.get("/health")
        @paceline.asgi.exempt
        async def health(): ...

    Works with Starlette's and FastAPI's routes, mounts and included routers. A request is
    matched against the routes only when its path is an exempt endpoint's (or when an
    exempt endpoint's path has parameters, every request is)."""
    endpoint.__paceline_exempt__ = True  # type: ignore[attr-defined]
    with _lock:
        _marked.add(id(endpoint))
    return endpoint


class _Paths:
    """An app's exempt endpoints as paths: ``static``, the paths to match, and whether
    some exempt endpoint's path has parameters (``dynamic``: match every request)."""

    __slots__ = ("routes", "count", "static", "dynamic")

    def __init__(self, routes: Sequence[Any], app: Any) -> None:
        self.routes = routes
        self.count = len(routes)
        self.static: Set[str] = set()
        self.dynamic = False
        for endpoint in _endpoints(routes):
            name = getattr(endpoint, "__name__", None)
            try:
                self.static.add(str(app.url_path_for(name)))
            except Exception:  # noqa: BLE001 - path parameters, or another route name
                self.dynamic = True


#: Per app (by id): its routes' exempt paths.
_apps: Dict[int, _Paths] = {}


def is_exempt(scope: Scope) -> bool:
    """Whether the request's route has an endpoint marked ``exempt``."""
    if not _marked:
        return False
    app = scope.get("app")
    router = getattr(app, "router", app)
    routes = getattr(router, "routes", None)
    if routes is None:
        return False
    paths = _apps.get(id(app))
    if paths is None or paths.routes is not routes or paths.count != len(routes):
        paths = _apps[id(app)] = _Paths(routes, app)
    if not paths.dynamic and scope.get("path") not in paths.static:
        return False
    return _first_match_is_exempt(routes, scope)


def _endpoints(routes: Sequence[Any]):
    """Every exempt endpoint among the routes, mounts and included routers."""
    for route in routes:
        endpoint = getattr(route, "endpoint", None)
        if endpoint is not None and getattr(endpoint, "__paceline_exempt__", False):
            yield endpoint
        inner = getattr(route, "routes", None)
        if inner is None:
            original = getattr(route, "original_router", None)  # FastAPI's included routers
            inner = getattr(original, "routes", None)
        if inner:
            yield from _endpoints(inner)


def _first_match_is_exempt(routes: Sequence[Any], scope: Scope) -> bool:
    try:
        from starlette.routing import Match
    except ImportError:  # no Starlette: no routes to match
        return False
    for route in routes:
        chosen = _chosen(route, dict(scope), Match)
        if chosen is not None:
            endpoint, inner, child = chosen
            if inner is not None:
                return _first_match_is_exempt(inner, {**scope, **child})
            return bool(getattr(endpoint, "__paceline_exempt__", False))
    return False


def _chosen(route: Any, scope: Scope, match_kind: Any) -> Optional[Tuple[Any, Any, Scope]]:
    """``(endpoint, inner routes, child scope)`` when ``route`` fully matches the request
    (inner routes for a mount), else ``None``."""
    select = getattr(route, "_match", None)
    if select is not None and hasattr(route, "original_router"):
        # FastAPI's included router: it selects among its own routes, with its prefix.
        try:
            match, child, inner_route, context = select(scope)
        except Exception:  # noqa: BLE001 - another FastAPI's internals: not exempt
            _unknown(route)
            return None
        if match != match_kind.FULL or inner_route is None:
            return None
        if hasattr(inner_route, "original_router"):
            return _chosen(inner_route, {**scope, **child}, match_kind)
        endpoint = getattr(inner_route, "endpoint", None) or getattr(context, "endpoint", None)
        return endpoint, None, child
    match, child = route.matches(scope)
    if match != match_kind.FULL:
        return None
    inner = getattr(route, "routes", None)
    if inner is not None and not hasattr(route, "endpoint"):
        return None, inner, child
    return getattr(route, "endpoint", None), None, child


_warned: Set[str] = set()


def _unknown(route: Any) -> None:
    kind = type(route).__name__
    if kind not in _warned:
        _warned.add(kind)
        _log.warning(
            "paceline: cannot look inside a route of type %s to find @exempt endpoints; "
            "requests it serves are limited (exempt them with the middleware's exempt= or "
            "a Limit's exempt_when=)",
            kind,
        )
