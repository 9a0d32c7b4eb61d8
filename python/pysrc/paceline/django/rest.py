"""Django REST framework throttles on paceline's decision: ``AnonRateThrottle``,
``UserRateThrottle`` and ``ScopedRateThrottle`` with DRF's names, scopes and settings
(``REST_FRAMEWORK["DEFAULT_THROTTLE_RATES"]``), so a DRF project moves by changing the
classes' module::

    REST_FRAMEWORK = {
        "DEFAULT_THROTTLE_CLASSES": [
            "paceline.django.rest.AnonRateThrottle",
            "paceline.django.rest.UserRateThrottle",
        ],
        "DEFAULT_THROTTLE_RATES": {"anon": "100/day", "user": "1000/day"},
    }

Each decision is one atomic step (no read-modify-write of a cache, which lets DRF's
throttles admit more than their rate when requests race), kept where
``PACELINE_STORAGE_URI`` says: under ``gunicorn -w 4``, ``file:///dev/shm/<site>`` makes
it one count for every worker. ``wait()`` is the exact time until the request would be
admitted, which DRF sends as ``Retry-After`` in its ``Throttled`` response. Rates are
GCRA: ``"100/day"`` admits 100 at once, then one every 864 s.
"""

from __future__ import annotations

from typing import Any, Dict, Optional, Tuple

from rest_framework.throttling import BaseThrottle

from .._http.checker import _Checker
from .._http.limit import KeySource, Limit
from . import _decide_now, _name, storage

#: One decision per (scope, rate), made on first use in each process.
_checkers: Dict[Tuple[str, str], _Checker] = {}


def _checker(scope: str, rate: str) -> _Checker:
    checker = _checkers.get((scope, rate))
    if checker is None:
        name = _name(f"drf {scope} {rate}")
        limit = Limit(
            name,
            rate,
            key=KeySource.callable(lambda request: getattr(request, "_paceline_key", None)),
            **storage().options(name),
        )
        checker = _checkers[(scope, rate)] = _Checker(
            [limit],
            headers_on_success=False,
            legacy_headers=False,
            wait_up_to=None,
            on_missing_key="skip",
            on_refusal=None,
            exempt=lambda request: False,
        )
    return checker


class _PacelineThrottle(BaseThrottle):
    """What the three throttles share: a scope and its rate, a key per request, and the
    exact wait of a refusal."""

    scope: Optional[str] = None
    THROTTLE_RATES: Any = None

    def __init__(self) -> None:
        self._wait: Optional[float] = None

    def get_rate(self, view: Any) -> Optional[str]:
        from rest_framework.settings import api_settings

        rates = self.THROTTLE_RATES if self.THROTTLE_RATES is not None else api_settings.DEFAULT_THROTTLE_RATES
        scope = self.get_scope(view)
        if scope is None:
            return None
        try:
            return rates[scope]
        except KeyError:
            from django.core.exceptions import ImproperlyConfigured

            raise ImproperlyConfigured(f"No default throttle rate set for '{scope}' scope") from None

    def get_scope(self, view: Any) -> Optional[str]:
        return self.scope

    def get_cache_key(self, request: Any, view: Any) -> Optional[str]:  # DRF's name
        raise NotImplementedError

    def allow_request(self, request: Any, view: Any) -> bool:
        rate = self.get_rate(view)
        if rate is None:
            return True
        key = self.get_cache_key(request, view)
        if key is None:
            return True
        request._paceline_key = key
        refused, _ = _decide_now(_checker(self.get_scope(view) or "", rate), request)
        if refused is None:
            return True
        self._wait = refused.wait if refused.wait > 0 else None
        return False

    def wait(self) -> Optional[float]:
        """Seconds until this request would be admitted (DRF's ``Retry-After``)."""
        return self._wait


def _user_key(request: Any) -> Optional[str]:
    user = getattr(request, "user", None)
    if user is not None and getattr(user, "is_authenticated", False):
        return f"user:{user.pk}"
    return None


class AnonRateThrottle(_PacelineThrottle):
    """Anonymous requests, by client address (DRF's ``get_ident``: ``NUM_PROXIES``
    decides whether ``X-Forwarded-For`` is read); scope ``"anon"``."""

    scope = "anon"

    def get_cache_key(self, request: Any, view: Any) -> Optional[str]:
        if _user_key(request) is not None:
            return None  # authenticated: not this throttle's
        return f"ip:{self.get_ident(request)}"


class UserRateThrottle(_PacelineThrottle):
    """Each user (by id), anonymous ones by address; scope ``"user"``."""

    scope = "user"

    def get_cache_key(self, request: Any, view: Any) -> Optional[str]:
        return _user_key(request) or f"ip:{self.get_ident(request)}"


class ScopedRateThrottle(_PacelineThrottle):
    """Views with a ``throttle_scope``, each scope its own rate; by user or address."""

    def get_scope(self, view: Any) -> Optional[str]:
        return getattr(view, "throttle_scope", None)

    def get_cache_key(self, request: Any, view: Any) -> Optional[str]:
        return _user_key(request) or f"ip:{self.get_ident(request)}"


def reset() -> None:
    """Starts every throttle's count afresh, in every tier (tests, operators)."""
    from .._http import bridge

    for checker in _checkers.values():
        bridge.run(checker.areset())
