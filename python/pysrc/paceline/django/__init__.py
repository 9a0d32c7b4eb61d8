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
from .._http.limit import KeySource, Limit, limit_name
from .._http.storage import Storage
from .._http.storage import parse as parse_storage
from .._paceline import parse_rates
from ..wsgi._middleware import decide, head_of, refusal_parts, settle, warn_if_per_worker

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
            for part in [p.strip() for p in item.replace(",", ";").split(";") if p.strip()]:
                name = _name(f"site {part}")
                limits.append(Limit(name, part, **where.options(name)))
        else:
            raise ImproperlyConfigured(
                f"PACELINE_LIMITS holds rate text ('100/minute') or paceline.django.Limit "
                f"objects, not {item!r}"
            )
    return limits


def _name(text: str) -> str:
    return limit_name(text)


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
    if request.__class__.__name__ != "ASGIRequest":  # an ASGI server says nothing of workers
        warn_if_per_worker(checker, request.META)
    return decide(checker, head_of(request.META, checker.reads_headers), request)


async def _adecide(checker: _Checker, request: Any, on_loop: bool = True) -> Any:
    """``_decide_now`` for an async view or middleware: decided on the loop when nothing
    can wait (no limit in Redis, no wait mode; ``async def`` key functions awaited) and
    ``on_loop`` (the key reads nothing Django serves only to sync code, as
    ``request.user``), else in a worker thread."""
    if on_loop and checker.fleet is None and checker.wait_up_to is None:
        head = head_of(request.META, checker.reads_headers)
        return settle(await checker.acheck(head, request) if checker.is_async else checker.check(head, request))
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
        self._checker = _Checker(limits)
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


def _key_source(key: Any, group: str) -> KeySource:
    """django-ratelimit's ``key`` as a key source: ``"ip"`` (the peer address, IPv6 by
    /64, read by the layer), ``"user"``, ``"user_or_ip"``, ``"header:<name>"``,
    ``"get:<param>"``, ``"post:<param>"``, or a function ``(group, request)``. A request
    without the key (no such header, an anonymous user under ``"user"``) counts in one
    bucket shared by all such requests, as django-ratelimit counts its empty key."""
    if callable(key):
        return KeySource.callable(lambda request: _text(key(group, request)))
    if not isinstance(key, str):
        raise TypeError(f"key must be 'ip', 'user', 'header:...', 'get:...', 'post:...' or a function, got {key!r}")
    kind, _, arg = key.partition(":")
    if kind == "ip" and not arg:
        return KeySource.peer_ip()
    if kind == "user" and not arg:
        return KeySource.callable(_user)
    if kind == "user_or_ip" and not arg:
        from .._paceline import new_key_reader

        reader = new_key_reader(KeySource.peer_ip()._spec)

        def user_or_ip(request: Any) -> Optional[str]:
            user = _user(request)
            if user is not None:
                return user
            head = head_of(request.META, False)
            return reader.key(head["headers"], head["client"])

        return KeySource.callable(user_or_ip)
    if kind == "header" and arg:
        return KeySource.header(arg)
    if kind == "get" and arg:
        return KeySource.callable(lambda request: request.GET.get(arg))
    if kind == "post" and arg:
        return KeySource.callable(lambda request: request.POST.get(arg))
    raise ValueError(f"unknown key {key!r}: 'ip', 'user', 'user_or_ip', 'header:<name>', 'get:<param>', 'post:<param>' or a function")


#: The decorators' limits, by group (or view) and rate: one count for every view of a
#: group, and for a view decorated again on every call (``method_decorator``).
_decorated: Dict[tuple, _Checker] = {}


def _never(subject: Any) -> bool:
    """No request is exempt from a decorated view's limit (``OPTIONS`` included)."""
    return False


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

    source = _key_source(key, group or "")
    on_loop = not callable(key) and key.partition(":")[0] in ("ip", "header", "get")

    def decorate(view: Any) -> Any:
        name = group or f"{view.__module__}.{view.__qualname__}"
        identity = (name, rate, key if isinstance(key, str) else id(key), None if methods is None else tuple(methods))

        def checker() -> _Checker:
            made = _decorated.get(identity)
            if made is None:
                limits = []
                for part in [p.strip() for p in rate.replace(",", ";").split(";") if p.strip()]:
                    limit_name = _name(f"{name} {part}")
                    limits.append(Limit(limit_name, part, key=source, methods=methods,
                                        **storage().options(limit_name)))
                made = _decorated.setdefault(
                    identity, _Checker(limits, on_missing_key="shared", exempt=_never)
                )
            return made

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
                refused, _ = await _adecide(checker(), request, on_loop)
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


