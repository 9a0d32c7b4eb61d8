"""Rate limiting for Django, in django-ratelimit's and Django's words, on paceline's
decision: a middleware configured from settings, the ``ratelimit`` decorator for sync and
``async def`` views, and Django REST framework throttles (``paceline.django.rest``).

Settings:

* ``PACELINE_STORAGE_URI``: where the limits keep their counts, for every integration
  here: ``"memory://"`` (default; each worker process counts on its own),
  ``"file:///dev/shm/<app>"`` (every worker of the host: the shared-file tier), or
  ``"redis://host:6379/0"`` (``rediss://``, ``redis+cluster://``: a fleet).
* ``PACELINE_LIMITS``: the middleware's limits, as rate text (``"100/minute"``, one limit
  per client address) or ``paceline.django.Limit`` objects.

::

    # settings.py
    MIDDLEWARE = [..., "paceline.django.RateLimitMiddleware"]
    PACELINE_STORAGE_URI = "file:///dev/shm/mysite"
    PACELINE_LIMITS = ["100/minute"]

    # views.py
    from paceline.django import ratelimit

    @ratelimit(key="ip", rate="5/m", method="POST")
    def login(request): ...

Refusals are ``429`` with ``Retry-After`` and the IETF ``RateLimit`` fields (DRF's own
``Throttled`` shape for the throttles). Add ``"paceline.django"`` to ``INSTALLED_APPS``
to have the settings checked when Django starts.
"""

from __future__ import annotations

import asyncio
import functools
from typing import Any, Callable, Dict, List, Optional, Sequence, Union

from .._http.checker import RefusalInfo, _Checker
from .._http.limit import KeySource, Limit
from .._http.storage import Storage
from .._http.storage import parse as parse_storage
from .._paceline import parse_rates
from ..wsgi._middleware import decide, head_of, refusal_parts, warn_if_per_worker

__all__ = ["ALL", "UNSAFE", "KeySource", "Limit", "RateLimitMiddleware", "RefusalInfo", "ratelimit", "storage"]

#: django-ratelimit's method sets.
ALL = None
UNSAFE = ["DELETE", "PATCH", "POST", "PUT"]


def storage() -> Storage:
    """The ``PACELINE_STORAGE_URI`` setting, parsed (``memory://`` when unset)."""
    from django.conf import settings

    return parse_storage(getattr(settings, "PACELINE_STORAGE_URI", "memory://"))


def _limits_from_settings() -> List[Limit]:
    from django.conf import settings
    from django.core.exceptions import ImproperlyConfigured

    where = storage()
    limits = []
    for item in getattr(settings, "PACELINE_LIMITS", ()):
        if isinstance(item, Limit):
            limits.append(item)
        elif isinstance(item, str):
            parse_rates(item)
            name = _name(f"site {item}")
            limits.append(Limit(name, item, **where.options(name)))
        else:
            raise ImproperlyConfigured(
                f"PACELINE_LIMITS holds rate text ('100/minute') or paceline.django.Limit "
                f"objects, not {item!r}"
            )
    return limits


def _name(text: str) -> str:
    clean = "".join(c if 32 <= ord(c) < 127 and c not in '"\\' else "_" for c in text)
    return clean[:64] or "limit"


def _response(refused: Any, request: Any) -> Any:
    """The refusal: ``PACELINE_ON_REFUSAL`` (a dotted path to ``(request, RefusalInfo) ->
    HttpResponse``) when set, with the refusal's fields where it sets none; else ``429``
    text naming the limit."""
    from django.conf import settings
    from django.http import HttpResponse

    status, headers, body = refusal_parts(refused)
    hook = getattr(settings, "PACELINE_ON_REFUSAL", None)
    if hook and refused.limit is not None and status == 429:
        from django.utils.module_loading import import_string

        kept = [(n, v) for n, v in headers if n.lower() not in ("content-type", "content-length")]
        response = (import_string(hook) if isinstance(hook, str) else hook)(
            request, RefusalInfo(refused.limit, refused.wait, status, kept)
        )
        return _add(response, kept)
    response = HttpResponse(body, status=status, content_type="text/plain; charset=utf-8")
    for name, value in headers:
        if name.lower() not in ("content-type", "content-length"):
            response[name] = value
    return response


def _add(response: Any, fields: List[Any]) -> Any:
    for name, value in fields:
        if name not in response:
            response[name] = value
    return response


def _decide_now(checker: _Checker, request: Any) -> Any:
    """``(refusal, fields)`` for a Django request (its ``META`` is the WSGI environ, or
    what Django's ASGI handler builds alike)."""
    warn_if_per_worker(checker, request.META)
    return decide(checker, head_of(request.META, checker.reads_headers), request)


async def _adecide(checker: _Checker, request: Any) -> Any:
    """``_decide_now`` for an async view or middleware: decided on the loop when nothing
    can wait (no limit in Redis, no wait mode), else in a worker thread."""
    if checker.fleet is None and checker.wait_up_to is None and not checker.is_async:
        return _decide_now(checker, request)
    from asgiref.sync import sync_to_async

    return await sync_to_async(_decide_now, thread_sensitive=False)(checker, request)


class RateLimitMiddleware:
    """Django middleware limiting every request by ``PACELINE_LIMITS`` (sync and async
    stacks alike); key, cost and exemption functions of its ``Limit`` objects get the
    Django ``request``. ``OPTIONS`` is exempt."""

    sync_capable = True
    async_capable = True

    def __init__(self, get_response: Callable[[Any], Any]) -> None:
        from django.core.exceptions import MiddlewareNotUsed

        self.get_response = get_response
        limits = _limits_from_settings()
        if not limits:
            raise MiddlewareNotUsed("PACELINE_LIMITS is empty")
        self._checker = _Checker(
            limits,
            headers_on_success=False,
            legacy_headers=False,
            wait_up_to=None,
            on_missing_key=None,
            on_refusal=None,
            exempt=None,
        )
        self.is_async = asyncio.iscoroutinefunction(get_response)
        if self.is_async:
            from asgiref.sync import markcoroutinefunction

            markcoroutinefunction(self)

    def __call__(self, request: Any) -> Any:
        if self.is_async:
            return self._acall(request)
        refused, fields = _decide_now(self._checker, request)
        if refused is not None:
            return _response(refused, request)
        return _add(self.get_response(request), fields)

    async def _acall(self, request: Any) -> Any:
        refused, fields = await _adecide(self._checker, request)
        if refused is not None:
            return _response(refused, request)
        return _add(await self.get_response(request), fields)

    def reset(self) -> None:
        """Starts every key of every limit here afresh (tests, operators)."""
        from .._http import bridge

        bridge.run(self._checker.areset())


def _key_function(key: Any, group: str) -> Callable[[Any], Optional[str]]:
    """django-ratelimit's ``key`` as a function of the request: ``"ip"``, ``"user"``,
    ``"user_or_ip"``, ``"header:<name>"``, ``"get:<param>"``, ``"post:<param>"``, or a
    function ``(group, request)``."""
    if callable(key):
        return lambda request: _text(key(group, request))
    if not isinstance(key, str):
        raise TypeError(f"key must be 'ip', 'user', 'header:...', 'get:...', 'post:...' or a function, got {key!r}")
    kind, _, arg = key.partition(":")
    if kind == "ip" and not arg:
        return lambda request: request.META.get("REMOTE_ADDR") or None
    if kind == "user" and not arg:
        return lambda request: _user(request) or None
    if kind == "user_or_ip" and not arg:
        return lambda request: _user(request) or request.META.get("REMOTE_ADDR") or None
    if kind == "header" and arg:
        meta = "HTTP_" + arg.upper().replace("-", "_")
        return lambda request: request.META.get(meta)
    if kind == "get" and arg:
        return lambda request: request.GET.get(arg)
    if kind == "post" and arg:
        return lambda request: request.POST.get(arg)
    raise ValueError(f"unknown key {key!r}: 'ip', 'user', 'user_or_ip', 'header:<name>', 'get:<param>', 'post:<param>' or a function")


def _user(request: Any) -> Optional[str]:
    user = getattr(request, "user", None)
    if user is None or not getattr(user, "is_authenticated", False):
        return None
    return f"user:{user.pk}"


def _text(value: Any) -> Optional[str]:
    return None if value is None else str(value)


def ratelimit(
    group: Optional[str] = None,
    key: Union[str, Callable[[str, Any], Any]] = "ip",
    rate: Optional[str] = None,
    method: Union[str, Sequence[str], None] = ALL,
    block: bool = True,
) -> Callable[[Any], Any]:
    """django-ratelimit's decorator, for ``def`` and ``async def`` views (and class-based
    views' methods through ``method_decorator``): ``rate`` as it writes it (``"5/m"``,
    ``"100/h"``, ``"10/5s"``; several with ``;``), ``key`` (``"ip"`` by default),
    ``method`` (a method, a list, ``ALL`` or ``UNSAFE``), ``group`` (views of one group
    share their count; default: the view's own). Refused with ``block=True``: a ``429``
    with ``Retry-After`` and the ``RateLimit`` fields (django-ratelimit raises a 403);
    with ``block=False`` the view runs with ``request.limited = True``. Checked where it
    is written; kept where ``PACELINE_STORAGE_URI`` says."""
    if not isinstance(rate, str):
        raise TypeError(f"rate must be text such as '5/m', got {rate!r}")
    parse_rates(rate)
    methods = [method] if isinstance(method, str) else None if method is None else list(method)

    def decorate(view: Any) -> Any:
        name = group or f"{view.__module__}.{view.__qualname__}"
        key_fn = _key_function(key, name)
        made: Dict[str, _Checker] = {}

        def checker() -> _Checker:
            if "it" not in made:
                limit_name = _name(f"{name} {rate}")
                made["it"] = _Checker(
                    [Limit(limit_name, rate, key=KeySource.callable(key_fn), methods=methods,
                           **storage().options(limit_name))],
                    headers_on_success=False,
                    legacy_headers=False,
                    wait_up_to=None,
                    on_missing_key="skip",
                    on_refusal=None,
                    exempt=lambda request: False,
                )
            return made["it"]

        def request_of(args: Sequence[Any]) -> Any:
            # A function view's first argument, a method's second (self first).
            for arg in args[:2]:
                if hasattr(arg, "META"):
                    return arg
            raise TypeError(f"{view.__qualname__} got no request to limit")

        if asyncio.iscoroutinefunction(view):

            @functools.wraps(view)
            async def limited_async(*args: Any, **kwargs: Any) -> Any:
                request = request_of(args)
                refused, _ = await _adecide(checker(), request)
                request.limited = getattr(request, "limited", False) or refused is not None
                if refused is not None and block:
                    return _response(refused, request)
                return await view(*args, **kwargs)

            limited_async.paceline_checker = checker  # type: ignore[attr-defined]
            return limited_async

        @functools.wraps(view)
        def limited(*args: Any, **kwargs: Any) -> Any:
            request = request_of(args)
            refused, _ = _decide_now(checker(), request)
            request.limited = getattr(request, "limited", False) or refused is not None
            if refused is not None and block:
                return _response(refused, request)
            return view(*args, **kwargs)

        limited.paceline_checker = checker  # type: ignore[attr-defined]
        return limited

    return decorate


