"""The WSGI middleware: a request's environ as the decision's head, the decision, and the
outcome as a WSGI response; waits block the worker's thread."""

from __future__ import annotations

import http
import logging
import os
import threading
import time
from typing import Any, Callable, Iterable, List, Optional, Sequence, Tuple, Union

from .._http import bridge
from .._http.checker import PASS, Admitted, RefusalInfo, _Checker
from .._http.flow import Decide, Done, Prepare, Redis, Refuse, Turns, fields_of, step, with_fleet
from .._http.limit import Limit

_log = logging.getLogger("paceline.wsgi")

Environ = dict
StartResponse = Callable[..., Any]
WSGIApp = Callable[[Environ, StartResponse], Iterable[bytes]]


def head_of(environ: Environ, headers: bool = True) -> dict:
    """The decision's head for a request's environ: ``method``, ``path``, the headers
    as ``(bytes, bytes)`` (the server wrote them as latin-1 text: PEP 3333; none when
    ``headers`` is false: no limit reads them) and the ``client``."""
    fields = []
    for name, value in environ.items() if headers else ():
        if name.startswith("HTTP_"):
            field = name[5:].replace("_", "-").lower()
        elif name in ("CONTENT_TYPE", "CONTENT_LENGTH"):
            field = name.replace("_", "-").lower()
        else:
            continue
        if isinstance(value, str):
            fields.append((field.encode("latin-1"), value.encode("latin-1", "replace")))
    address = environ.get("REMOTE_ADDR") or None
    try:
        port = int(environ.get("REMOTE_PORT") or 0)
    except ValueError:
        port = 0
    return {
        "type": "http",
        "wsgi": True,
        "method": environ.get("REQUEST_METHOD", "GET"),
        "path": (environ.get("SCRIPT_NAME", "") + environ.get("PATH_INFO", "")) or "/",
        "headers": fields,
        "client": None if address is None else (address, port if 0 <= port <= 0xFFFF else 0),
    }


def wait_blocking(waiting: Any) -> Any:
    """Blocks this thread for a ``Waiting`` of the layer: polls it, sleeping until its
    waker (the timer's thread) says to poll again. Interrupted, it gives every turn back."""
    try:
        while True:
            woken = threading.Event()
            outcome = waiting.poll(woken.set)
            if outcome is not None:
                return outcome
            woken.wait()
    except BaseException:
        waiting.cancel()
        raise


def _text(fields: Sequence[Tuple[bytes, bytes]]) -> List[Tuple[str, str]]:
    return [(name.decode("latin-1"), value.decode("latin-1")) for name, value in fields]


def _adding(start_response: StartResponse, fields: List[Tuple[str, str]]) -> StartResponse:
    """``start_response``, adding ``fields`` but for those the app set itself."""

    def with_fields(status: str, headers: List[Tuple[str, str]], exc_info: Any = None) -> Any:
        names = {name.lower() for name, _ in headers}
        headers = list(headers) + [(n, v) for n, v in fields if n.lower() not in names]
        if exc_info is None:
            return start_response(status, headers)
        return start_response(status, headers, exc_info)

    return with_fields


def _status_line(status: int) -> str:
    try:
        return f"{status} {http.HTTPStatus(status).phrase}"
    except ValueError:
        return f"{status} Error"


class RateLimitMiddleware:
    """A PEP 3333 middleware that limits HTTP requests by ``limits`` (a list of
    ``Limit``), with ``paceline.asgi.RateLimitMiddleware``'s options:

    - ``headers_on_success``, ``legacy_headers``: the ``RateLimit`` fields (and the
      ``X-RateLimit-*`` ones) on admitted responses too.
    - ``wait_up_to``: seconds a request may wait for its turn (blocking its worker's
      thread) instead of being refused; one deadline across every limit.
    - ``on_missing_key``: ``None``, ``"shared"``, ``"skip"`` or a status (as in ASGI).
    - ``on_refusal``: ``(environ, RefusalInfo) -> WSGI app`` (a Flask or werkzeug
      ``Response`` is one) sent instead of the ``429`` text; the refusal's fields are
      added where it sets none.
    - ``exempt``: ``environ -> bool``, requests not limited at all (default: ``OPTIONS``).

    Key, cost and exemption functions get the request's ``environ``. Every limit is
    checked when the middleware is made, so a bad configuration fails at import.
    """

    def __init__(
        self, app: WSGIApp, limits: Union[Limit, Sequence[Limit]], *,
        headers_on_success: bool = False,
        legacy_headers: bool = False,
        wait_up_to: Optional[float] = None,
        on_missing_key: Union[str, int, None] = None,
        on_refusal: Optional[Callable[[Environ, RefusalInfo], Any]] = None,
        exempt: Optional[Callable[[Environ], bool]] = None,
    ) -> None:
        self.app = app
        self._checker = _Checker(
            limits, headers_on_success=headers_on_success, legacy_headers=legacy_headers,
            wait_up_to=wait_up_to, on_missing_key=on_missing_key, on_refusal=on_refusal,
            exempt=exempt,
        )
        _no_async(self._checker)

    def reset(self) -> None:
        """Starts every key of every limit here afresh (``Limit.reset`` for each, and
        ``areset`` for a limit kept in Redis, run on the process's bridge loop): for tests
        and operators."""
        bridge.run(self._checker.areset())

    def __call__(self, environ: Environ, start_response: StartResponse) -> Iterable[bytes]:
        checker = self._checker
        warn_if_per_worker(checker, environ)
        refused, fields = decide(checker, head_of(environ, checker.reads_headers), environ)
        if refused is not None:
            return _refuse(checker, environ, start_response, refused)
        return self.app(environ, _adding(start_response, fields) if fields else start_response)


def decide(checker: _Checker, scope: dict, subject: Any) -> Tuple[Any, List[Tuple[str, str]]]:
    """A sync server's decision for a request: ``(refusal, fields)``, the refusal to
    answer with (a ``Refused``'s shape; ``None``: pass the request on) and the fields to
    add to an admitted response, as text. Waits block this thread."""
    if checker.fleet is not None:
        arrived = time.monotonic()
        if checker.exempted(scope, subject):
            return None, []
        verdict = _run(with_fleet(checker, scope, subject, arrived), checker)
        if verdict.__class__ is Refuse:
            return verdict.outcome, []
        return None, _text(fields_of(verdict, checker.legacy))
    outcome = checker.check(scope, subject)
    if outcome is not None and outcome.__class__ is not Admitted and not hasattr(outcome, "status"):
        outcome = wait_blocking(outcome)  # a Waiting
    return settle(outcome)


def settle(outcome: Any) -> Tuple[Any, List[Tuple[str, str]]]:
    """The layer's outcome (not a ``Waiting``) as ``decide`` answers it."""
    if outcome is None:
        return None, []
    if outcome.__class__ is Admitted:
        return None, _text(outcome.fields) if outcome.fields else []
    return outcome, []


#: Whether this process told, once, that its limits count per worker (a forked worker
#: tells again).
_told = [False]
os.register_at_fork(after_in_child=lambda: _told.__setitem__(0, False))


def warn_if_per_worker(checker: _Checker, environ: Environ) -> None:
    """Logs once per worker process when ``checker`` keeps limits in this process's memory
    and the server says it runs several worker processes (``wsgi.multiprocess``; Django's
    test client says so too, from one process, and is not told)."""
    if _told[0] or not checker.in_memory or not environ.get("wsgi.multiprocess"):
        return
    if environ.get("SERVER_NAME") == "testserver":
        return
    _told[0] = True
    tell_per_worker(checker.in_memory)


def _no_async(checker: _Checker) -> None:
    """A sync server cannot await: a limit's ``async def`` function is an error now, not
    a 500 at every request."""
    from .._http.checker import _is_async

    functions = [fn for fn in (checker.exempt,) if fn is not None]
    for limit in checker.every:
        functions += [limit.key._fn, limit.exempt_when, limit.cost if callable(limit.cost) else None]
    if any(fn is not None and _is_async(fn) for fn in functions):
        raise TypeError(
            "a limit's key, cost or exemption function is async, and a WSGI server cannot "
            "await it: make it a plain function (or serve the app over ASGI)"
        )


def tell_per_worker(names: List[str]) -> None:
    """Logs that ``names`` count per worker."""
    _log.warning(
        "paceline: the rate limits %s are kept in this worker process's memory, and this "
        "server runs several worker processes (wsgi.multiprocess): each worker counts on "
        "its own, so a client gets its limit once per worker. Keep them where every worker "
        "counts together: storage_uri=\"file:///dev/shm/<app>\" (the workers of one host) "
        "or storage_uri=\"redis://...\" (a fleet).",
        ", ".join(repr(name) for name in names),
    )


def refusal_parts(outcome: Any) -> Tuple[int, List[Tuple[str, str]], bytes]:
    """A refusal's ``(status, headers, body)``, headers as text."""
    return outcome.status, _text(outcome.headers), outcome.body


def _refuse(checker: _Checker, environ: Environ, start_response: StartResponse, outcome: Any) -> Iterable[bytes]:
    status, headers, body = outcome.status, _text(outcome.headers), outcome.body
    if outcome.limit is not None and checker.on_refusal is not None and status == 429:
        kept = [(n, v) for n, v in headers if n.lower() not in ("content-type", "content-length")]
        response = checker.on_refusal(environ, RefusalInfo(outcome.limit, outcome.wait, status, kept))
        return response(environ, _adding(start_response, kept))
    headers.append(("Content-Length", str(len(body))))
    start_response(_status_line(status), headers)
    return [body]


def _run(flow: Any, checker: _Checker) -> Any:
    """Runs the shared decision (``paceline._http.flow``) on this thread: Redis's calls on
    the process's bridge loop, waits blocking."""
    fleet = checker.fleet
    value: Any = None
    error: Optional[BaseException] = None
    while (op := step(flow, value, error)).__class__ is not Done:
        value = error = None
        try:
            if op.__class__ is Prepare:
                value = fleet.prepare_sync(op.scope, op.subject)
            elif op.__class__ is Decide:
                value = checker.decide(op.scope, op.subject, op.arrived)
            elif op.__class__ is Redis:
                value = bridge.run(op.call())
            else:
                value = _turns(op)
        except BaseException as e:  # noqa: BLE001 - thrown into the flow, which decides
            error = e
    return op.verdict


def _turns(op: Turns) -> Any:
    """Blocks for a request's turns (``Turns``): the latest in Redis, then the layer's."""
    try:
        late = op.instant - time.monotonic()
        if late > 0:
            time.sleep(late)
        result = op.outcome if op.waiting is None else wait_blocking(op.waiting)
        if result.__class__ is not Admitted and result is not PASS:
            bridge.run(op.fleet.give_back(op.booked))
        return result
    except BaseException:
        if op.waiting is not None:
            op.waiting.cancel()
        bridge.run(op.fleet.give_back(op.booked))
        raise

