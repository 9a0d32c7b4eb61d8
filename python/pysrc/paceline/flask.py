"""Rate limiting for Flask, in flask-limiter's words, on paceline's decision: a flask-limiter
app moves by changing its import.

::

    from flask import Flask
    from paceline.flask import Limiter

    app = Flask(__name__)
    limiter = Limiter(app=app, default_limits=["200 per day", "50 per hour"],
                      storage_uri="file:///dev/shm/myapp")

    @app.route("/login", methods=["POST"])
    @limiter.limit("5 per minute")
    def login(): ...

    @app.route("/health")
    @limiter.exempt
    def health(): ...

Limits are GCRA, not fixed windows: ``"5 per minute"`` lets 5 through at once, then one
every 12 s (never the 10 in a few seconds that a fixed window allows across its edge).
Under ``gunicorn -w 4`` keep them in a file every worker opens (``file:///dev/shm/...``)
or in Redis (``redis://...``): ``memory://``, the default, counts per worker, and says so
in a warning the first time a worker serves a request.
"""

from __future__ import annotations

import functools
import logging
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple, Union

from flask import current_app, request

from ._http.checker import RefusalInfo, _Checker
from ._http.limit import KeySource, Limit, limit_name as _limit_name
from ._http.storage import parse as parse_storage
from ._paceline import parse_rates
from .wsgi._middleware import decide, head_of, refusal_parts, warn_if_per_worker

__all__ = ["Limiter", "RefusalInfo"]

#: The attribute a view or blueprint carries when ``Limiter.exempt`` marks it.
_EXEMPT = "__paceline_exempt__"
#: The attribute a view carries with its ``@limiter.limit``s, by limiter.
_ROUTES = "__paceline_limits__"
#: flask-limiter's settings that ``init_app`` reads.
_CONFIG = ("RATELIMIT_DEFAULT", "RATELIMIT_APPLICATION", "RATELIMIT_STORAGE_URI",
           "RATELIMIT_HEADERS_ENABLED", "RATELIMIT_ENABLED")
_log = logging.getLogger("paceline.flask")


class _RouteLimit:
    """A ``@limiter.limit`` on a view: its text, options and, once made, its ``Limit``s."""

    __slots__ = ("rates", "key_func", "cost", "methods", "exempt_when", "scope", "per_method", "shared")

    def __init__(self, rates: str, key_func: Any, cost: Any, methods: Any, exempt_when: Any,
                 scope: Optional[str], per_method: bool, shared: bool) -> None:
        self.rates, self.key_func, self.cost, self.methods = rates, key_func, cost, methods
        self.exempt_when, self.scope, self.per_method, self.shared = exempt_when, scope, per_method, shared


def _check_rates(text: object) -> str:
    """A rate as flask-limiter writes it (``"5 per minute"``, ``"10/second;1000/hour"``),
    checked now: a rate that cannot be read raises where it is written."""
    if callable(text):
        raise TypeError(
            "a rate given as a function is not supported: write the rate as text, or use "
            "paceline.asgi/wsgi Limit(quota_for=...) for rates per client"
        )
    if not isinstance(text, str):
        raise TypeError(f"a rate must be text such as '5 per minute', got {text!r}")
    parse_rates(text)  # ValueError naming the text and what is accepted
    return text


class Limiter:
    """flask-limiter's ``Limiter``: ``Limiter(key_func=None, *, app=None,
    default_limits=(), application_limits=(), storage_uri="memory://",
    headers_enabled=False, on_breach=None)``.

    - ``key_func()`` (no arguments, reading ``flask.request``, as flask-limiter calls
      it): whom a request counts against; default: the peer address (``REMOTE_ADDR``, IPv6
      grouped by /64). Behind a proxy, let werkzeug's ``ProxyFix`` set the address from
      the proxies you trust, or pass ``key=KeySource.behind_proxies([...])`` instead.
    - ``default_limits``: for every route without limits of its own, each route counted
      apart (as flask-limiter counts them); ``application_limits``: one count for all
      routes together.
    - ``storage_uri``: ``memory://``, ``file:///dev/shm/<app>`` (every worker of the
      host), ``redis://``, ``rediss://``, ``redis+cluster://`` (a fleet). Checked here.
    - ``headers_enabled``: the ``RateLimit`` fields on admitted responses too (refusals
      always carry them and ``Retry-After``).
    - ``on_breach(info)``: called for each refusal with a ``RefusalInfo``; a Flask
      response it returns is sent instead of the ``429`` text (the refusal's fields are
      added where it sets none).
    """

    def __init__(
        self,
        key_func: Optional[Callable[[], str]] = None,
        *,
        app: Any = None,
        default_limits: Iterable[str] = (),
        application_limits: Iterable[str] = (),
        storage_uri: str = "memory://",
        headers_enabled: bool = False,
        on_breach: Optional[Callable[[RefusalInfo], Any]] = None,
        key: Optional[KeySource] = None,
    ) -> None:
        if key_func is not None and not callable(key_func):
            raise TypeError(f"key_func must be a function of no arguments, got {key_func!r}")
        if key is not None and key_func is not None:
            raise ValueError("give key_func or key, not both")
        if on_breach is not None and not callable(on_breach):
            raise TypeError("on_breach must be a function (RefusalInfo) -> response or None")
        self._key_func = key_func
        self._key = key
        self._storage = parse_storage(storage_uri)
        self._defaults = [_check_rates(text) for text in _texts(default_limits)]
        self._application = [_check_rates(text) for text in _texts(application_limits)]
        self._headers = bool(headers_enabled)
        self._on_breach = on_breach
        # A blueprint's limits and exemptions, by the blueprint object's id.
        self._blueprint_routes: Dict[int, Tuple[Any, List[_RouteLimit]]] = {}
        self._exempt_blueprints: Dict[int, Any] = {}
        self._shared: Dict[str, List[Limit]] = {}  # shared_limit's Limits, by scope
        self._checkers: Dict[Tuple[int, str], Optional[_Checker]] = {}  # by (app, endpoint)
        self._explicit = {"default_limits": bool(self._defaults), "storage_uri": storage_uri != "memory://",
                          "application_limits": bool(self._application), "headers_enabled": bool(headers_enabled)}
        self._enabled = True
        if app is not None:
            self.init_app(app)

    def init_app(self, app: Any) -> None:
        """Limits the requests of ``app`` (the Flask application factory's way; one
        limiter may serve several apps). flask-limiter's settings in ``app.config`` are
        read where the constructor left them out: ``RATELIMIT_DEFAULT``,
        ``RATELIMIT_APPLICATION``, ``RATELIMIT_STORAGE_URI``,
        ``RATELIMIT_HEADERS_ENABLED``, ``RATELIMIT_ENABLED``; another ``RATELIMIT_*``
        setting is not supported, and a warning says so."""
        config = app.config
        if not self._explicit["default_limits"] and config.get("RATELIMIT_DEFAULT"):
            self._defaults = [_check_rates(t) for t in _texts(config["RATELIMIT_DEFAULT"].split(";"))]
        if not self._explicit["application_limits"] and config.get("RATELIMIT_APPLICATION"):
            self._application = [_check_rates(t) for t in _texts(config["RATELIMIT_APPLICATION"].split(";"))]
        if not self._explicit["storage_uri"] and config.get("RATELIMIT_STORAGE_URI"):
            self._storage = parse_storage(config["RATELIMIT_STORAGE_URI"])
        if not self._explicit["headers_enabled"] and config.get("RATELIMIT_HEADERS_ENABLED"):
            self._headers = True
        if config.get("RATELIMIT_ENABLED") is False:
            self._enabled = False
        unknown = sorted(k for k in config if k.startswith("RATELIMIT_") and k not in _CONFIG)
        if unknown:
            _log.warning("paceline.flask does not read %s (flask-limiter's settings)", ", ".join(unknown))
        app.before_request(self._before)
        if self._headers:
            app.after_request(self._after)
        app.extensions["paceline"] = self

    # The decorators.

    def limit(
        self,
        limit_value: str,
        *,
        key_func: Optional[Callable[[], str]] = None,
        cost: Union[int, Callable[[], int]] = 1,
        methods: Optional[Sequence[str]] = None,
        exempt_when: Optional[Callable[[], bool]] = None,
        per_method: bool = False,
        override_defaults: bool = True,
    ) -> Callable[[Any], Any]:
        """Limits one view (or every view of a blueprint): ``@limiter.limit("5 per
        minute")``. ``cost`` (an int, or a function of no arguments returning one) is the
        cells a request takes; ``methods`` the methods it counts; ``exempt_when()`` true
        for requests it skips; ``per_method`` counts each method apart. Checked here."""
        del override_defaults  # a view's own limits replace the defaults, as in flask-limiter
        route = _RouteLimit(_check_rates(limit_value), key_func, cost, methods, exempt_when,
                            None, per_method, False)
        return self._marking(route)

    def shared_limit(
        self,
        limit_value: str,
        scope: str,
        *,
        key_func: Optional[Callable[[], str]] = None,
        cost: Union[int, Callable[[], int]] = 1,
        methods: Optional[Sequence[str]] = None,
        exempt_when: Optional[Callable[[], bool]] = None,
    ) -> Callable[[Any], Any]:
        """One limit for several views, counted together: every view decorated with the
        same ``scope`` shares the count."""
        if not isinstance(scope, str) or not scope:
            raise ValueError(f"a shared limit's scope must be a non-empty str, got {scope!r}")
        route = _RouteLimit(_check_rates(limit_value), key_func, cost, methods, exempt_when,
                            scope, False, True)
        return self._marking(route)

    def exempt(self, view_or_blueprint: Any) -> Any:
        """No limit applies to this view, or to any view of this blueprint (and the
        blueprints registered inside it)."""
        if hasattr(view_or_blueprint, "deferred_functions"):
            self._exempt_blueprints[id(view_or_blueprint)] = view_or_blueprint
            return view_or_blueprint
        setattr(view_or_blueprint, _EXEMPT, True)
        return view_or_blueprint

    def _marking(self, route: _RouteLimit) -> Callable[[Any], Any]:
        def mark(view: Any) -> Any:
            if hasattr(view, "deferred_functions"):  # a blueprint: every view of it
                self._blueprint_routes.setdefault(id(view), (view, []))[1].append(route)
                return view
            # On the view function itself: a MethodView's or a factory's views, which
            # share a name, each keep their own.
            routes = view.__dict__.setdefault(_ROUTES, {})
            routes.setdefault(id(self), []).append(route)
            return view

        return mark

    def reset(self) -> None:
        """Starts every key of every limit of this limiter afresh, in every tier (tests,
        operators): ``Limit.reset`` for each limit its routes have used so far, and
        ``areset`` for those kept in Redis."""
        from ._http import bridge

        seen: Dict[int, Limit] = {}
        for checker in self._checkers.values():
            for limit in checker.every if checker is not None else ():
                seen[id(limit)] = limit
        for limits in self._shared.values():
            for limit in limits:
                seen[id(limit)] = limit
        for limit in seen.values():
            if limit.redis is None:
                limit.reset()
            else:
                bridge.run(limit.areset())

    # Per request.

    def _before(self) -> Any:
        endpoint = request.endpoint
        if endpoint is None or not self._enabled:
            return None  # no route: a 404 (or 405) that costs nothing
        app = current_app._get_current_object()
        checker = self._checkers.get((id(app), endpoint), False)
        if checker is False:
            checker = self._checkers[(id(app), endpoint)] = self._checker_for(app, endpoint, request.blueprints)
        if checker is None:
            return None
        environ = request.environ
        warn_if_per_worker(checker, environ)
        refused, fields = decide(checker, head_of(environ, checker.reads_headers), environ)
        if refused is None:
            if fields:
                request.environ["paceline.fields"] = fields
            return None
        return self._refusal(refused)

    def _after(self, response: Any) -> Any:
        for name, value in request.environ.get("paceline.fields", ()):
            if name not in response.headers:
                response.headers[name] = value
        return response

    def _refusal(self, refused: Any) -> Any:
        from flask import Response

        status, headers, body = refusal_parts(refused)
        kept = [(n, v) for n, v in headers if n.lower() not in ("content-type", "content-length")]
        if self._on_breach is not None and refused.limit is not None and status == 429:
            custom = self._on_breach(RefusalInfo(refused.limit, refused.wait, status, kept))
            if custom is not None:
                from flask import make_response

                custom = make_response(custom)
                for name, value in kept:
                    if name not in custom.headers:
                        custom.headers[name] = value
                return custom
        return Response(body, status=status, headers=headers)

    def _checker_for(self, app: Any, endpoint: str, blueprints: Sequence[str]) -> Optional[_Checker]:
        """The limits of one endpoint of ``app``, made on its first request (the
        blueprints it is in: innermost first, as Flask names them)."""
        view = app.view_functions.get(endpoint)
        if view is None or endpoint == "static" or getattr(view, _EXEMPT, False):
            return None
        blueprint_objects = [app.blueprints[name] for name in blueprints if name in app.blueprints]
        if any(id(bp) in self._exempt_blueprints for bp in blueprint_objects):
            return None
        routes = list(getattr(view, "__dict__", {}).get(_ROUTES, {}).get(id(self), ()))
        for bp in blueprint_objects:
            routes += self._blueprint_routes.get(id(bp), (None, []))[1]
        limits: List[Limit] = []
        taken: set = set()  # two limits of one view with one text (per method, say): two counts
        for route in routes:
            limits += self._limits_of(route, endpoint, taken)
        if not routes:
            for text in self._defaults:
                limits += self._made(text, "default", None, 1, None, None, taken, route=endpoint)
        for text in self._application:
            limits += self._shared_made(text, "application", None, 1, None, None)
        if not limits:
            return None
        return _Checker(limits, headers_on_success=self._headers)  # OPTIONS exempt

    def _limits_of(self, route: _RouteLimit, endpoint: str, taken: set) -> List[Limit]:
        if route.shared:
            return self._shared_made(route.rates, route.scope, route.key_func, route.cost,
                                     route.methods, route.exempt_when)
        return self._made(route.rates, "route", route.key_func, route.cost, route.methods,
                          route.exempt_when, taken, route=endpoint, per_method=route.per_method)

    def _shared_made(self, rates: str, scope: Any, key_func: Any, cost: Any, methods: Any,
                     exempt_when: Any) -> List[Limit]:
        made = self._shared.setdefault(f"{scope}|{rates}", [])
        if not made:
            made += self._made(rates, str(scope), key_func, cost, methods, exempt_when, set())
        return made

    def _made(self, rates: str, name: str, key_func: Any, cost: Any, methods: Any,
              exempt_when: Any, taken: set, *, route: Optional[str] = None,
              per_method: bool = False) -> List[Limit]:
        """The ``Limit``s of a rate text (one per rate: ``"10/second;1000/hour"`` is two),
        each named after what it is (``default``, ``route``, a shared scope,
        ``application``) and its rate. Limits counted per route key their clients by the
        route too, so the routes of one rate share one name (and one file under
        ``file://``), each counting apart."""
        key_func = key_func or self._key_func
        if key_func is None and not per_method and (route is None or self._storage.kind == "memory"):
            # The layer reads the peer itself (no Python per request). Kept in memory, a
            # route's limit is a Limit of its own, so the route needs no place in the key.
            key: Any = self._key or KeySource.peer_ip()
        else:
            key = _key_function(key_func, self._key, route, per_method)
        limits = []
        for part in _parts(rates):
            limit_name = _limit_name(f"{name} {part}")
            again = 1
            while limit_name in taken:
                again += 1
                limit_name = _limit_name(f"{name} {part} #{again}")
            taken.add(limit_name)
            limits.append(Limit(
                limit_name,
                part,
                key=key,
                cost=_flask_cost(cost),
                methods=methods,
                exempt_when=None if exempt_when is None else (lambda environ: exempt_when()),
                **self._storage.options(limit_name),
            ))
        return limits


def _texts(limits: Iterable[str]) -> List[str]:
    if isinstance(limits, str):
        return [limits]
    return list(limits)


def _parts(rates: str) -> List[str]:
    """A rate text's rates, one by one (``"10/second;1000/hour"``: two)."""
    return [part.strip() for part in rates.replace(",", ";").split(";") if part.strip()]


def _flask_cost(cost: Any) -> Any:
    if callable(cost):
        return lambda environ: cost()
    return cost


def _key_function(key_func: Any, source: Optional[KeySource], route: Any, per_method: bool) -> Any:
    """A key function of the environ: the user's ``key_func()`` (flask-limiter's), or the
    peer address, and the route (and the method) it counts for."""
    from ._paceline import new_key_reader

    reader = None
    if key_func is None:
        reader = new_key_reader((source or KeySource.peer_ip())._spec)

    reads_headers = source is not None and source._spec[0] in ("header", "proxies")

    def key(environ: Any) -> Optional[str]:
        if key_func is not None:
            client = key_func()
        elif reads_headers:
            scope = head_of(environ, True)
            client = reader.key(scope["headers"], scope["client"])
        else:
            address = environ.get("REMOTE_ADDR")
            client = reader.key([], (address, 0)) if address else None
        if client is None:
            return None
        if not isinstance(client, str):
            client = str(client)
        parts = [client]
        if route:
            parts.append(route)
        if per_method:
            parts.append(environ.get("REQUEST_METHOD", ""))
        return "\x1f".join(parts)

    functools.update_wrapper(key, key_func) if key_func is not None else None
    return KeySource.callable(key)
