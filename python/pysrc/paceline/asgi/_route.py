"""Limits for some routes only (``RouteLimit``: a FastAPI dependency, or a decorator), and
routes no limit applies to (``exempt``)."""

from __future__ import annotations

import asyncio
import functools
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

from .._http.checker import PASS, Admitted, _Checker
from .._http.limit import Limit, Scope

def _as_dict(headers: List[Tuple[bytes, bytes]]) -> Dict[str, str]:
    return {name.decode("latin-1"): value.decode("latin-1") for name, value in headers}


class RouteLimit:
    """Limits for some routes only, the same ``Limit``s and options as
    ``RateLimitMiddleware`` (its ``on_missing_key``, ``headers_on_success``, ``exempt``).

    In FastAPI, as a dependency (it raises ``HTTPException(429)`` with ``Retry-After`` and
    the ``RateLimit`` fields); after an authentication dependency, a key function can read
    what it set (``scope["state"]``)::

        login_limit = RouteLimit(Limit("login", "5/minute", shared="/dev/shm/myapp-login"))

        @app.post("/login", dependencies=[Depends(login_limit)])
        async def login(): ...

    On a Starlette endpoint (or any endpoint that takes the ``Request``), as a decorator
    that answers the ``429`` itself (a plain ``def`` endpoint runs in the thread pool, as
    FastAPI runs it)::

        @login_limit.limit
        async def login(request): ...

    Without ``shared=``, each worker process keeps its own count. A route limit refuses at
    once (``wait_up_to`` is the middleware's).
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
            limits, headers_on_success=headers_on_success, legacy_headers=legacy_headers,
            wait_up_to=None, on_missing_key=on_missing_key, on_refusal=None, exempt=exempt,
        )
        if self._checker.fleet is not None:
            raise ValueError(
                "a Limit kept in Redis needs RateLimitMiddleware (RouteLimit decides "
                "without waiting for Redis)"
            )

    @staticmethod
    def _decision(outcome: Any) -> Tuple[bool, int, Dict[str, str], bytes]:
        if outcome is None:
            return True, 200, {}, b""
        if outcome.__class__ is Admitted or outcome is PASS:
            return True, 200, _as_dict(outcome.fields), b""
        fields = {
            name: value
            for name, value in _as_dict(outcome.headers).items()
            if name not in ("content-type", "content-length")
        }
        return False, outcome.status, fields, outcome.body

    def reset(self) -> None:
        """Starts every key of every limit here afresh (``Limit.reset`` for each: tests,
        operators); ``await ....areset()`` when a limit is kept in Redis."""
        self._checker.reset()

    async def areset(self) -> None:
        """``reset``, in every tier (Redis too)."""
        await self._checker.areset()

    def decide(self, scope: Scope) -> Tuple[bool, int, Dict[str, str], bytes]:
        """The decision for a request's scope: ``(admitted, status, fields, body)``, with
        the fields to add (admitted) or to answer with (refused) as a ``str`` dict. For
        limits whose key and cost functions are plain ones; ``adecide`` awaits async ones."""
        return self._decision(self._checker.check(scope))

    async def adecide(self, scope: Scope) -> Tuple[bool, int, Dict[str, str], bytes]:
        """``decide``, awaiting async key and cost functions."""
        return self._decision(await self._checker.acheck(scope))

    async def __call__(self, request: Any, response: Any) -> None:
        """The FastAPI dependency: raises ``fastapi.HTTPException`` when refused; adds
        the fields to the response when ``headers_on_success``."""
        admitted, status, fields, body = await self.adecide(request.scope)
        if admitted:
            for name, value in fields.items():
                if name not in response.headers:
                    response.headers[name] = value
            return
        from fastapi import HTTPException

        raise HTTPException(status_code=status, detail=body.decode().strip(), headers=fields)

    def limit(self, endpoint: Callable[..., Any]) -> Callable[..., Any]:
        """Wraps an endpoint that takes the ``Request`` (Starlette's, or FastAPI's with a
        ``request: Request`` parameter): refused requests get the ``429`` without reaching
        it. A plain ``def`` endpoint runs in the thread pool. A result that is not a
        response (a dict, say) is sent as JSON with the fields; to keep FastAPI's response
        model, use the dependency form."""
        from starlette.concurrency import run_in_threadpool
        from starlette.requests import Request
        from starlette.responses import JSONResponse, Response

        is_async = asyncio.iscoroutinefunction(endpoint)

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
            admitted, status, fields, body = await self.adecide(request.scope)
            if not admitted:
                return Response(body, status_code=status, headers=fields, media_type="text/plain")
            if is_async:
                result = await endpoint(*args, **kwargs)
            else:
                result = await run_in_threadpool(endpoint, *args, **kwargs)
            if not isinstance(result, Response):
                try:
                    from fastapi.encoders import jsonable_encoder
                except ImportError:  # Starlette alone: the result as it is
                    def jsonable_encoder(value: Any) -> Any:
                        return value
                result = JSONResponse(jsonable_encoder(result))
            if fields:
                for name, value in fields.items():
                    if name not in result.headers:
                        result.headers[name] = value
            return result

        return limited


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
