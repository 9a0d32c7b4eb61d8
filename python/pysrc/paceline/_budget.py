"""Budgets: several rates (requests, tokens, ...) and a cap on calls in flight, admitting
a caller in one first-come-first-served turn, the cost settled after the call.

A model API limits requests per minute *and* tokens per minute *and* concurrent calls,
and a call's tokens are known only from its response::

    budget = paceline.Budget(
        requests=paceline.Rate(500, per=60.0),
        tokens=paceline.Rate(200_000, per=60.0),
        in_flight=8,
    )
    async with budget.acquire(tokens=estimate) as turn:   # one turn, every dimension
        response = await client.post(...)
        turn.settle(tokens=response.json()["usage"]["total_tokens"])

The queue, the admission and the settle arithmetic are the Rust crate's
(``paceline::budget``): threads (``acquire_blocking``) and every event loop share one
queue.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any, Dict, Iterable, List, Mapping, Optional, Tuple, Union

from ._args import _count, _finite, _timeout
from ._in_file import _file_args, _file_path, _InAFile
from ._blocking import tell_if_slow_blocking, tell_when_slow, warn_if_on_a_loop
from ._paceline import BudgetTurn, new_budget, new_shared_budget

__all__ = ["Rate", "Budget", "Turn"]

_RESERVED = ("timeout", "in_flight")


def _seconds(name: str, value: object) -> float:
    return _finite(
        value, False, f"{name} must be a number of seconds", f"{name} must be a finite number of seconds >= 0"
    )


def _fields(status: object, headers: Any) -> List[Tuple[str, bytes]]:
    """A response's status checked, and its headers as ``(name, value bytes)`` pairs,
    from pairs or a mapping of text or bytes."""
    if isinstance(status, bool) or not isinstance(status, int):
        raise TypeError(f"status must be an int, got {type(status).__name__}")
    if not 100 <= status <= 599:
        raise ValueError(f"status must be an HTTP status from 100 to 599, got {status}")
    if isinstance(headers, Mapping):
        headers = headers.items()
    elif isinstance(headers, (str, bytes)) or not isinstance(headers, Iterable):
        raise TypeError(
            f"headers must be (name, value) pairs or a mapping, got {type(headers).__name__}"
        )
    fields = []
    for pair in headers:
        if not isinstance(pair, (tuple, list)) or len(pair) != 2:
            raise TypeError(f"headers must be (name, value) pairs or a mapping, got an item {pair!r}")
        name, value = pair
        if isinstance(name, (bytes, bytearray)):
            name = bytes(name).decode("latin-1")
        if isinstance(value, str):
            value = value.encode("latin-1", "replace")
        if not isinstance(name, str) or not isinstance(value, (bytes, bytearray)):
            raise TypeError(f"a header's name and value must be str or bytes, got {pair!r}")
        fields.append((name, bytes(value)))
    return fields


def _costs(costs: Dict[str, object]) -> List[Tuple[str, int]]:
    return [(name, _count(name, cells, 0)) for name, cells in costs.items()]


class Rate:
    """``count`` per ``per`` seconds, at most ``burst`` at once (default: ``count``, as
    ``Limiter.per_second`` and the Rust ``Quota``: a provider's "200 000 tokens per
    minute" is a bucket of 200 000 that refills over the minute)."""

    __slots__ = ("count", "per", "burst")

    def __init__(self, count: int, per: float = 1.0, burst: Optional[int] = None) -> None:
        self.count = _count("count", count, 1)
        if isinstance(per, bool) or not isinstance(per, (int, float)):
            raise TypeError(f"per must be a number of seconds, got {type(per).__name__}")
        per = float(per)
        if not 0.0 < per < float("inf"):
            raise ValueError(f"per must be a positive, finite number of seconds, got {per}")
        self.per = per
        self.burst = self.count if burst is None else _count("burst", burst, 1)

    def __repr__(self) -> str:
        return f"Rate({self.count}, per={self.per}, burst={self.burst})"


class Turn:
    """An admitted turn: an in-flight permit and a charge in every dimension, until it
    ends. ``settle(**costs)`` ends it with the real costs of the dimensions named (less
    than charged gives the difference back, as far as no later admission relied on it;
    more is charged); ``release()`` ends it keeping the estimate. Either returns the
    permit. ``with turn:`` releases it at the end of the block unless it was settled."""

    __slots__ = ("_core",)

    def __init__(self, core: BudgetTurn) -> None:
        self._core = core

    def settle(self, **costs: int) -> None:
        """Ends the turn with the real costs (``tokens=812``); a dimension not named
        keeps its charge. ``ValueError`` for a dimension the budget does not have (the
        turn is left as it was); ``RuntimeError`` if the turn has already ended."""
        self._core.settle(_costs(costs))

    def release(self) -> None:
        """Ends the turn keeping its estimate; does nothing if it has already ended."""
        self._core.release()

    @property
    def ended(self) -> bool:
        """Whether the turn has been settled or released."""
        return self._core.ended()

    def cost(self, name: str) -> Optional[int]:
        """The cells charged to ``name`` at admission (``None`` once ended or unknown)."""
        return self._core.cost(name)

    def __enter__(self) -> "Turn":
        return self

    def __exit__(self, *exc: object) -> None:
        self._core.release()

    def __repr__(self) -> str:
        return f"<paceline.Turn {'ended' if self.ended else 'in flight'}>"


def _checked(rates: Dict[str, Rate], in_flight: Optional[int]) -> Optional[int]:
    """Checks a budget's rates and cap; returns the cap."""
    for name, rate in rates.items():
        if name in _RESERVED:
            raise ValueError(f"a dimension may not be named {name!r}")
        if not isinstance(rate, Rate):
            raise TypeError(f"{name} must be a paceline.Rate, got {type(rate).__name__}")
    if in_flight is not None:
        in_flight = _count("in_flight", in_flight, 1)
    if not rates and in_flight is None:
        raise ValueError("a budget needs at least one rate or an in_flight cap")
    return in_flight


def _attach_budget(path, wanted, in_flight, uid=None, gid=None):  # type: ignore[no-untyped-def]
    """Unpickles a shared budget: the same file, whatever budget it holds now."""
    self = Budget.__new__(Budget)
    self._core = new_shared_budget(path, list(wanted), in_flight, "adopt", uid, gid)
    self._shared = (path, tuple(wanted), in_flight, uid, gid)
    return self


def _settle(future: "asyncio.Future[None]") -> None:
    if not future.done():
        future.set_result(None)


#: What an ``_Acquiring`` holds while its ``async with`` waits for its turn.
_ENTERING: Any = object()


class _Acquiring:
    """``budget.acquire(...)``: await it for a ``Turn``, or ``async with`` it (the turn
    is released at the end of the block unless settled, an exception included)."""

    __slots__ = ("_core", "_costs", "_timeout", "_turn")

    def __init__(self, core: Any, costs: List[Tuple[str, int]], timeout: Optional[float]):
        self._core = core
        self._costs = costs
        self._timeout = timeout
        self._turn: Any = None  # None, _ENTERING, or the block's Turn

    def __await__(self):  # type: ignore[no-untyped-def]
        return self._wait().__await__()

    async def _wait(self) -> Turn:
        waiting = self._core.acquire(self._costs, self._timeout)
        loop = asyncio.get_running_loop()
        slow = None  # the debug line's timer, once the turn is not given at once
        try:
            while True:
                woken = loop.create_future()

                def wake(woken: "asyncio.Future[None]" = woken) -> None:
                    try:
                        loop.call_soon_threadsafe(_settle, woken)
                    except RuntimeError:
                        # The loop was closed with this task still waiting (a program
                        # that wanted only the first of several results): nobody will
                        # poll it, so its place is given up for those behind it.
                        waiting.cancel()

                turn = waiting.poll(wake)
                if turn is not None:
                    return Turn(turn)
                if slow is None:
                    slow = tell_when_slow("a budget", self._core.waiting)
                again_in = waiting.again_in()
                if again_in is None:
                    await woken
                else:
                    # A shared budget's wait: polled again on this loop's own timer.
                    await asyncio.sleep(again_in)
        except BaseException:
            # Cancelled, or a deadline: the place is given up, nothing was spent.
            waiting.cancel()
            raise
        finally:
            if slow is not None:
                slow.cancel()

    async def __aenter__(self) -> Turn:
        if self._turn is not None:
            raise RuntimeError(
                "one budget.acquire(...) serves one `async with` at a time: call "
                "budget.acquire(...) for each turn"
            )
        self._turn = _ENTERING
        try:
            turn = await self._wait()
        except BaseException:
            self._turn = None
            raise
        self._turn = turn
        return turn

    async def __aexit__(self, *exc: object) -> None:
        turn, self._turn = self._turn, None
        if isinstance(turn, Turn):
            turn.release()


class Budget(_InAFile):
    """Rates by name (``requests=Rate(500, per=60.0), tokens=Rate(200_000, per=60.0)``)
    and a cap on calls in flight (``in_flight=8``), admitting a caller when every rate
    admits it and a permit is free, first come first served.

    Costs are keywords: ``acquire(tokens=1200)`` is one request (a dimension not named
    costs 1) and 1 200 tokens. Nothing is charged before every dimension admits the
    caller; a caller cancelled before its turn has spent nothing. Threads
    (``acquire_blocking``) and tasks of any event loop share one queue. A dimension may
    not be named ``timeout`` or ``in_flight``.
    """

    _attach = staticmethod(_attach_budget)
    _refusal = (
        "an in-process paceline.Budget cannot be pickled (each process would get a budget "
        "of its own); use paceline.Budget.shared(path, ...) to share one between processes"
    )

    def __init__(self, *, in_flight: Optional[int] = None, **rates: Rate) -> None:
        in_flight = _checked(rates, in_flight)
        self._core = new_budget(
            [(name, r.count, r.per, r.burst) for name, r in rates.items()], in_flight
        )
        self._shared: Optional[tuple] = None

    @classmethod
    def shared(
        cls,
        path: "os.PathLike[str] | str",
        *,
        in_flight: Optional[int] = None,
        on_mismatch: str = "refuse",
        trust_user: "int | str | None" = None,
        trust_group: "int | str | None" = None,
        **rates: Rate,
    ) -> "Budget":
        """One budget for every process of the host that opens ``path``: gunicorn and
        uvicorn workers, ``multiprocessing`` pools, scripts started separately. Its state
        lives in that file (``/dev/shm/...`` keeps it in memory on Linux). The rates, the
        in-flight cap and first-come-first-served hold over every process: callers wait in
        one queue in the file, and the first is admitted when every rate admits it and a
        permit is free; a task cancelled before its turn has spent nothing; a turn's permit
        returns when it ends, and when its process is gone (killed, or exited without
        ending it). A waiter whose process stops asking for 10 seconds (an event loop
        closed under it) loses its place.

        The file is trusted as ``Limiter.shared``'s is (its owner, or ``trust_user`` /
        ``trust_group``; never through a link; new files ``0600``). A file holding another
        budget raises ``ValueError`` naming both, unless ``on_mismatch="adopt"`` (use the
        file's; ``rates`` then says what it holds). At most 8 dimensions, names of at most
        32 bytes. A shared budget pickles as its path: unpickled in another process, it
        opens the same file (adopting its budget)."""
        in_flight = _checked(rates, in_flight)
        path, uid, gid = _file_args(path, trust_user, trust_group)
        wanted = [(name, r.count, r.per, r.burst) for name, r in rates.items()]
        self = cls.__new__(cls)
        self._core = new_shared_budget(path, wanted, in_flight, on_mismatch, uid, gid)
        self._shared = (path, tuple(wanted), in_flight, uid, gid)
        return self

    path = property(_file_path, doc="The file of a shared budget; ``None`` in-process.")

    def __repr__(self) -> str:
        rates = ", ".join(f"{n}={r!r}" for n, r in self.rates.items())
        where = "" if self._shared is None else f", path={self._shared[0]!r}"
        return f"Budget({rates}, in_flight={self._core.in_flight_limit()}{where})"

    @property
    def rates(self) -> Dict[str, Rate]:
        """The dimensions and their rates (a shared budget's: its file's)."""
        return {
            name: Rate(burst, per=interval * burst / 1e9, burst=burst)
            for name, interval, burst in self._core.rates()
        }

    def acquire(self, *, timeout: Optional[float] = None, **costs: int) -> _Acquiring:
        """Waits this task's turn for ``costs``: ``async with budget.acquire(tokens=n) as
        turn:`` (released at the end unless settled) or ``turn = await
        budget.acquire(...)``. With ``timeout`` (seconds), raises ``TimeoutError`` at once,
        booking nothing, if the turn is further away by the rates as they stand, and
        gives the place up if it has not come when the timeout passes. ``ValueError``
        for a dimension the budget does not have, or a cost above its burst (it could
        never be admitted)."""
        return _Acquiring(self._core, _costs(costs), _timeout(timeout))

    def acquire_blocking(self, *, timeout: Optional[float] = None, **costs: int) -> Turn:
        """``acquire`` for threads: blocks (the GIL released) in the same queue. Use it as
        ``with budget.acquire_blocking(tokens=n) as turn:``. Ctrl-C ends the wait with
        ``KeyboardInterrupt`` and gives the place up. Never from an event loop's own
        thread: the turns it would wait for may be held by that loop's tasks (it warns
        there, once). A turn its rates put more than a second away says so in a debug
        line first."""
        wanted, timeout = _costs(costs), _timeout(timeout)
        warn_if_on_a_loop(lambda: self._blocks(wanted, timeout), "`await budget.acquire(...)`")
        tell_if_slow_blocking("a budget", lambda: self._core.wait_time(wanted), self._core.waiting)
        return Turn(self._core.acquire_blocking(wanted, timeout))

    def _blocks(self, costs: List[Tuple[str, int]], timeout: Optional[float]) -> bool:
        """Whether a blocking turn of ``costs`` would wait now (for its rates, a permit,
        or callers ahead), and not fail at once for its ``timeout``."""
        wait = self._core.wait_time(costs)
        cap = self._core.in_flight_limit()
        busy = (cap is not None and self._core.in_flight() >= cap) or self._core.waiting() > 0
        return (wait > 0 or busy) and (timeout is None or wait <= timeout)

    def try_acquire(self, **costs: int) -> Optional[Turn]:
        """A turn now, or ``None`` (someone waits ahead, a rate or the cap says not yet);
        never waits."""
        turn = self._core.try_acquire(_costs(costs))
        return None if turn is None else Turn(turn)

    def wait_time(self, **costs: int) -> float:
        """Seconds a turn of ``costs`` would wait if asked for now, by the rates as they
        stand (callers ahead included; ``inf``: never); spends nothing."""
        return self._core.wait_time(_costs(costs))

    def remaining(self, name: str) -> int:
        """Cells of ``name`` its rate would admit right now; spends nothing."""
        if not isinstance(name, str):
            raise TypeError(f"name must be a str, got {type(name).__name__}")
        return self._core.remaining(name)

    @property
    def in_flight(self) -> int:
        """Turns admitted and not yet ended."""
        return self._core.in_flight()

    def follow(
        self,
        status: int,
        headers: Union[
            Iterable[Tuple[Union[str, bytes], Union[bytes, str]]],
            Mapping[Union[str, bytes], Union[bytes, str]],
        ],
        *,
        max_hold: float = 300.0,
    ) -> int:
        """Steers the budget by what a response said: its status (an ``int`` from 100 to
        599) and its headers as ``(name, value)`` pairs or a mapping, text or bytes
        (httpx's ``response.headers.raw`` as it is). A dimension reported with nothing left admits nothing
        before its reset; one with ``r`` left admits at most ``r`` now; a ``Retry-After``
        (on a 429 or 503) holds every dimension. Read: ``x-ratelimit-{limit,remaining,
        reset}-{requests,tokens}`` (Go durations: ``6m0s``, ``1.5s``),
        ``anthropic-ratelimit-{requests,tokens,input-tokens,output-tokens}-{limit,
        remaining,reset}`` (RFC 3339 instants) and the IETF ``RateLimit`` /
        ``RateLimit-Policy`` fields' named policies. Names match the budget's dimensions
        with ``-`` and ``_`` alike; other dimensions are ignored, and so is any value that
        cannot be read. A limit announced below a dimension's configured rate (``q``
        per ``w`` for an IETF policy, per minute for the provider fields) paces that
        dimension at it, with the configured burst and the backlog kept in cells; an
        announcement at or above the configured rate gives that rate back. Nothing said
        makes a one-cell turn wait longer than ``max_hold`` seconds. Returns how many of its dimensions the response
        reported. The ``paceline.httpx`` transports and ``paceline.aiohttp`` hook call
        this for every response when given ``budget=``."""
        max_hold = _seconds("max_hold", max_hold)
        return self._core.follow(status, _fields(status, headers), max_hold)

    def hold_for(self, seconds: float) -> None:
        """Admits nothing for ``seconds`` from now (a longer hold already in force
        stays)."""
        self._core.hold_for(_seconds("seconds", seconds))

    @property
    def waiting(self) -> int:
        """Callers waiting in the queue (a shared budget's: in every process, waiting for
        a permit or for their booked instant)."""
        return self._core.waiting()
