"""The ASGI middleware: asks the layer about each HTTP request, then passes it on (with
the fields to add), answers the refusal, or waits the request's turn."""

from __future__ import annotations

import asyncio
import time
from typing import Any, Awaitable, Callable, List, MutableMapping, Optional, Sequence, Tuple, Union

from .._http.checker import PASS, Admitted, Refused, RefusalInfo, _Checker, _NoAddress
from .._http.limit import Limit, Scope
from ._listen import replaying, watching
from ._exempt import is_exempt
from .._http.flow import GONE, Decide, Done, Prepare, Redis, Refuse, Turns, fields_of, step, with_fleet

Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

#: The most of a request's body kept while it waits its turn, by default (bytes).
WAIT_BUFFER = 64 * 1024


async def _wait(waiting: Any) -> Any:
    """Awaits a ``Waiting`` from the Rust layer: polls it, and when its waker fires (on
    the timer's thread) polls again on this loop. Cancelled, it gives every booking back."""
    loop = asyncio.get_running_loop()
    try:
        while True:
            woken = loop.create_future()

            def wake(woken: asyncio.Future = woken) -> None:
                loop.call_soon_threadsafe(_settle, woken)

            outcome = waiting.poll(wake)
            if outcome is not None:
                return outcome
            await woken
    except BaseException:
        waiting.cancel()
        raise


def _ignore() -> None:
    pass


def _settle(future: asyncio.Future) -> None:
    if not future.done():
        future.set_result(None)


def _adding(send: Send, fields: List[Tuple[bytes, bytes]]) -> Send:
    """``send``, adding ``fields`` to the response's start, but for those the app set
    itself (a second ``RateLimit`` field would contradict its own)."""

    async def with_fields(message: Message) -> None:
        if message["type"] == "http.response.start":
            message = dict(message)
            own = list(message.get("headers", ()))
            names = {name.lower() for name, _ in own}
            message["headers"] = own + [(n, v) for n, v in fields if n not in names]
        await send(message)

    return with_fields


async def _refuse(checker: _Checker, scope: Scope, receive: Receive, send: Send, outcome: Any) -> None:
    status, headers, body = outcome.status, list(outcome.headers), outcome.body
    if outcome.limit is not None and checker.on_refusal is not None and status == 429:
        kept = [
            (name, value)
            for name, value in headers
            if name not in (b"content-type", b"content-length")
        ]
        info = RefusalInfo(outcome.limit, outcome.wait, status, kept)
        response = checker.on_refusal(scope, info)
        if asyncio.iscoroutine(response):
            response = await response
        await response(scope, receive, _adding(send, kept))
        return
    headers.append((b"content-length", str(len(body)).encode()))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class RateLimitMiddleware:
    """An ASGI middleware that limits HTTP requests by ``limits`` (a list of ``Limit``).

    - ``headers_on_success``: add the ``RateLimit-Policy`` / ``RateLimit`` fields to
      admitted responses too (default: only to refusals; never over fields the app set).
    - ``legacy_headers``: also the ``X-RateLimit-Limit/Remaining/Reset`` fields of the
      tightest limit.
    - ``wait_up_to``: seconds a request may wait for its turn instead of being refused
      (booked in line, first come first served; a client that goes away gives its turn
      back). ``wait_buffer``: how much of a waiting request's body is read meanwhile
      (default 64 KiB; the message that crosses it is kept whole, the rest waits in the
      server's buffers, and a client that leaves after that is noticed by the app).
      Default: refuse at once.
    - ``on_missing_key``: a request without a key for a limit (no such header, a key
      function returning ``None``): ``None`` (default: keyless requests share one bucket,
      but a limit keyed by the client's address behind a server that gives none answers
      500 naming the fix), ``"shared"``, ``"skip"`` (the limit does not apply) or an HTTP
      status to refuse with.
    - ``on_refusal``: ``(scope, RefusalInfo) -> ASGI app`` (a Starlette ``Response``, say),
      sent instead of the default ``429`` text; the refusal's ``Retry-After`` and
      ``RateLimit`` fields are added where the response does not set them.
    - ``exempt``: ``scope -> bool``, requests not limited at all (default: ``OPTIONS``, so
      CORS preflights never eat a client's budget); endpoints decorated with
      ``paceline.asgi.exempt`` are exempt too.

    Non-HTTP scopes (websocket, lifespan) pass through. Every limit is checked when the
    middleware is made (and each ``Limit`` when it is), so a bad configuration fails at
    start-up.
    """

    def __init__(
        self, app: ASGIApp, limits: Union[Limit, Sequence[Limit]], *,
        headers_on_success: bool = False,
        legacy_headers: bool = False,
        wait_up_to: Optional[float] = None,
        wait_buffer: int = WAIT_BUFFER,
        on_missing_key: Union[str, int, None] = None,
        on_refusal: Optional[Callable[[Scope, RefusalInfo], Any]] = None,
        exempt: Optional[Callable[[Scope], bool]] = None,
    ) -> None:
        self.app = app
        if isinstance(wait_buffer, bool) or not isinstance(wait_buffer, int) or wait_buffer < 0:
            raise ValueError(f"wait_buffer must be an int of bytes >= 0, got {wait_buffer!r}")
        self._buffer = wait_buffer
        self._checker = _Checker(
            limits, headers_on_success=headers_on_success, legacy_headers=legacy_headers,
            wait_up_to=wait_up_to, on_missing_key=on_missing_key, on_refusal=on_refusal,
            exempt=exempt,
        )

    def reset(self) -> None:
        """Starts every key of every limit here afresh (``Limit.reset`` for each: tests,
        operators); ``await ....areset()`` when a limit is kept in Redis."""
        self._checker.reset()

    async def areset(self) -> None:
        """``reset``, in every tier (Redis too)."""
        await self._checker.areset()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or is_exempt(scope):
            await self.app(scope, receive, send)
            return
        checker = self._checker
        if checker.fleet is not None:
            await self._with_fleet(scope, receive, send)
            return
        outcome = await checker.acheck(scope) if checker.is_async else checker.check(scope)
        if outcome is None:
            await self.app(scope, receive, send)
            return
        kind = outcome.__class__
        if kind is not Admitted and kind is not Refused and kind is not _NoAddress:
            now = outcome.poll(_ignore)  # a turn that is due now is taken without a task
            if now is not None:
                outcome = now
            else:
                outcome, kept = await watching(_wait(outcome), receive, self._buffer)
                if outcome is None:
                    return  # the client went away while it waited
                receive = replaying(kept, receive)
            kind = outcome.__class__
        if kind is Admitted:
            fields = outcome.fields
            await self.app(scope, receive, _adding(send, fields) if fields else send)
            return
        await _refuse(checker, scope, receive, send, outcome)

    async def _with_fleet(self, scope: Scope, receive: Receive, send: Send) -> None:
        """``__call__`` when some limits are kept in Redis: the shared decision
        (``paceline._http.flow``), its steps awaited on this loop."""
        checker = self._checker
        fleet = checker.fleet
        arrived = time.monotonic()
        if await checker.aexempted(scope, scope):
            await self.app(scope, receive, send)
            return
        flow = with_fleet(checker, scope, scope, arrived)
        value: Any = None
        error: Optional[BaseException] = None
        while (op := step(flow, value, error)).__class__ is not Done:
            value = error = None
            try:
                if op.__class__ is Prepare:
                    value = await fleet.prepare(op.scope, op.subject)
                elif op.__class__ is Decide:
                    value = await checker.adecide(op.scope, op.subject, op.arrived)
                elif op.__class__ is Redis and not op.watch:
                    value = await op.call()
                elif op.__class__ is Redis:
                    value, kept = await watching(op.call(), receive, self._buffer)
                    receive = replaying(kept, receive)
                    if value is None:
                        value = GONE  # the client went away: the step gave back its turns
                else:
                    value, kept = await watching(_turns(op), receive, self._buffer)
                    receive = replaying(kept, receive)
            except BaseException as e:  # noqa: BLE001 - thrown into the flow, which decides
                error = e
        verdict = op.verdict
        if verdict is GONE:
            return  # the client went away while it waited: every turn given back
        if verdict.__class__ is Refuse:
            await _refuse(checker, scope, receive, send, verdict.outcome)
            return
        fields = fields_of(verdict, checker.legacy)
        await self.app(scope, receive, _adding(send, fields) if fields else send)


async def _turns(op: Turns) -> Any:
    """Waits for a request's turns (``Turns``): the latest in Redis, then the layer's."""
    try:
        late = op.instant - time.monotonic()
        if late > 0:
            await asyncio.sleep(late)
        result = op.outcome if op.waiting is None else await _wait(op.waiting)
        if result.__class__ is not Admitted and result is not PASS:
            await op.fleet.give_back(op.booked)
        return result
    except BaseException:
        if op.waiting is not None:
            op.waiting.cancel()
        await op.fleet.give_back(op.booked)
        raise
