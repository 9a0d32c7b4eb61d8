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

from rest_framework import throttling

from .._http.checker import _Checker
from .._http.limit import KeySource, Limit
from . import _decide_now, _name, _never, storage

#: One decision per (scope, rate), made on first use in each process.
_checkers: Dict[Tuple[str, str], _Checker] = {}


def _checker(scope: str, rate: str) -> _Checker:
    checker = _checkers.get((scope, rate))
    if checker is None:
        limits = []
        for part in [p.strip() for p in rate.replace(",", ";").split(";") if p.strip()]:
            name = _name(f"drf {scope} {part}")
            limits.append(Limit(
                name,
                part,
                key=KeySource.callable(lambda request: getattr(request, "_paceline_key", None)),
                **storage().options(name),
            ))
        checker = _checkers[(scope, rate)] = _Checker(limits, on_missing_key="skip", exempt=_never)
    return checker


def _ident(request: Any) -> str:
    """The client's address as a key: the peer (IPv6 by /64), or with
    ``PACELINE_TRUSTED_PROXIES`` (networks) the right-most ``X-Forwarded-For`` address
    that is not a trusted proxy, read only when the peer is one. DRF's ``NUM_PROXIES`` is
    not read: a client that writes its own ``X-Forwarded-For`` gets no new bucket."""
    from django.conf import settings

    from .._paceline import new_key_reader
    from ..wsgi._middleware import head_of

    proxies = getattr(settings, "PACELINE_TRUSTED_PROXIES", None)
    source = KeySource.behind_proxies(proxies) if proxies else KeySource.peer_ip()
    reader = _readers.get(id(proxies))
    if reader is None:
        reader = _readers[id(proxies)] = new_key_reader(source._spec)
    head = head_of(request.META, bool(proxies))
    return reader.key(head["headers"], head["client"]) or request.META.get("REMOTE_ADDR", "")


_readers: Dict[int, Any] = {}


class _Paceline:
    """What the three throttles add to DRF's own classes: the decision is paceline's
    (atomic, where the cache says), and ``wait()`` its exact wait."""

    _paceline_wait: Optional[float] = None

    def get_ident(self, request: Any) -> str:
        return _ident(request)

    def parse_rate(self, rate: Optional[str]) -> Tuple[Optional[int], Optional[float]]:
        """DRF's ``(num_requests, duration)`` of the first rate of ``rate`` (paceline
        reads ``"10/s;100/h"`` as both)."""
        if rate is None:
            return None, None
        from .._paceline import parse_rates

        count, per, _ = parse_rates(rate)[0]
        return count, per

    def allow_request(self, request: Any, view: Any) -> bool:
        if getattr(self, "rate", None) is None:
            return True
        key = self.get_cache_key(request, view)  # type: ignore[attr-defined]
        if key is None:
            return True
        request._paceline_key = key
        refused, _ = _decide_now(_checker(self.scope or "", self.rate), request)  # type: ignore[attr-defined]
        if refused is None:
            return True
        self._paceline_wait = refused.wait if refused.wait > 0 else None
        return False

    def wait(self) -> Optional[float]:
        """Seconds until this request would be admitted (DRF's ``Retry-After``)."""
        return self._paceline_wait


class SimpleRateThrottle(_Paceline, throttling.SimpleRateThrottle):
    """DRF's ``SimpleRateThrottle`` on paceline's decision: subclass it as DRF's docs
    show (``scope``, ``get_cache_key``, ``cache_format``)."""


class AnonRateThrottle(_Paceline, throttling.AnonRateThrottle):
    """Anonymous requests, by client address; scope ``"anon"``."""


class UserRateThrottle(_Paceline, throttling.UserRateThrottle):
    """Each user (by id), anonymous ones by address; scope ``"user"``."""


class ScopedRateThrottle(_Paceline, throttling.ScopedRateThrottle):
    """Views with a ``throttle_scope``, each scope its own rate; by user or address."""

    def allow_request(self, request: Any, view: Any) -> bool:
        # DRF's own: the scope and its rate come from the view.
        self.scope = getattr(view, self.scope_attr, None)
        if not self.scope:
            return True
        self.rate = self.get_rate()
        self.num_requests, self.duration = self.parse_rate(self.rate)
        return _Paceline.allow_request(self, request, view)


def reset() -> None:
    """Starts every throttle's count afresh, in every tier (tests, operators)."""
    from .._http import bridge

    for checker in _checkers.values():
        bridge.run(checker.areset())
