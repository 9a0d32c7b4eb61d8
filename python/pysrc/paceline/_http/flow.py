"""One request's decision when some of its limits are kept in Redis, written once for
every server: a generator that yields what it needs done (``Prepare``, ``Redis``,
``Turns``) and returns the verdict (``Admit``, ``Refuse`` or ``GONE``). An async server's
runner awaits each step on its own loop; a sync server's runner blocks for each, Redis's
calls going through the process's ``bridge`` loop. The rules live here alone:

* the layer's limits (in the process, in a shared file) are decided first; a refusal
  there is told the longest wait among every limit, those in Redis read without spending;
* without wait mode each limit in Redis takes its cells at once, in order;
* in wait mode a request has one deadline, ``wait_up_to`` from its arrival, across every
  limit: every turn in Redis is read before anything is booked, and a turn past the
  deadline refuses the request at once, spending nothing here or there; then the layer's
  turn is booked, every limit in Redis books its turn within what is left, and the request
  waits for the latest of them, giving every turn back if its client leaves meanwhile.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Generator, List, Optional

from .._paceline import Admitted, Refused
from .checker import PASS, _NoAddress


class Prepare:
    """Step: each limit in Redis that applies, with its key and cost (``FleetLimits.prepare``
    on an async server, ``prepare_sync`` on a sync one)."""

    __slots__ = ("scope", "subject")

    def __init__(self, scope: Any, subject: Any) -> None:
        self.scope, self.subject = scope, subject


class Decide:
    """Step: the layer's answer (``checker.adecide`` on an async server, ``decide`` on a
    sync one), its turns within ``wait_up_to`` of ``arrived``."""

    __slots__ = ("scope", "subject", "arrived")

    def __init__(self, scope: Any, subject: Any, arrived: float) -> None:
        self.scope, self.subject, self.arrived = scope, subject, arrived


class Redis:
    """Step: the coroutine ``call()`` makes, run to its end (Redis's calls). With
    ``watch``, a server that can tell cancels it when the client goes away (it may wait
    for a local share's turn while Redis is down) and sends back ``GONE``."""

    __slots__ = ("call", "watch")

    def __init__(self, call: Callable[[], Any], watch: bool = False) -> None:
        self.call, self.watch = call, watch


class Turns:
    """Step: wait for the request's turns, the latest in Redis (``instant``,
    ``time.monotonic()``) and then the layer's (``waiting``, booked and held: taken only
    now, so a request that ends earlier gives it back whole); give back what was
    ``booked`` in Redis and cancel ``waiting`` if the wait ends early. Sends back the
    layer's outcome, or ``None`` when the client went away meanwhile."""

    __slots__ = ("outcome", "waiting", "instant", "booked", "fleet")

    def __init__(self, outcome: Any, waiting: Any, instant: float, booked: List[Any], fleet: Any):
        self.outcome, self.waiting, self.instant = outcome, waiting, instant
        self.booked, self.fleet = booked, fleet


class Admit:
    """Verdict: pass the request on, adding the layer's ``outcome.fields`` and ``more``."""

    __slots__ = ("outcome", "more")

    def __init__(self, outcome: Any, more: List[Any]) -> None:
        self.outcome, self.more = outcome, more


class Refuse:
    """Verdict: answer with ``outcome`` (a ``Refused``'s shape)."""

    __slots__ = ("outcome",)

    def __init__(self, outcome: Any) -> None:
        self.outcome = outcome


#: Verdict: the client went away while it waited; every turn was given back.
GONE = object()


def _ignore() -> None:
    pass


def with_fleet(checker: Any, scope: Any, subject: Any, arrived: float) -> Generator[Any, Any, Any]:
    """The decision for a request that is not exempt, when the ``checker`` has limits
    in Redis; ``arrived`` is when the request came (``time.monotonic()``). The limits in
    Redis are prepared first (their key and cost functions called), then the layer asked,
    with what is left of the deadline."""
    fleet = checker.fleet
    asks = yield Prepare(scope, subject)
    outcome = yield Decide(scope, subject, arrived)
    kind = outcome.__class__
    if kind is _NoAddress:
        return Refuse(outcome)
    if kind is Refused:
        return Refuse((yield from _longest(fleet, outcome, asks)))
    if checker.wait_up_to is None:
        refusal, more = yield Redis(lambda: fleet.check(asks))
        return Admit(outcome, more) if refusal is None else Refuse(refusal)
    # Wait mode. The layer's turns are booked first and held (none taken yet); then every
    # limit in Redis is read, and one whose turn comes after the deadline refuses the
    # request, every turn here given back; then each books its turn within what is left.
    deadline = arrived + checker.wait_up_to
    waiting = None if outcome is PASS or kind is Admitted else outcome
    if waiting is not None:
        now = waiting.book()
        if now is not None:  # refused: a turn here is past the deadline
            return Refuse((yield from _longest(fleet, now, asks)))
    try:
        refusal, unreachable = yield Redis(lambda: fleet.too_far(asks, deadline))
        if refusal is None:
            booked = yield Redis(lambda: fleet.book(asks, deadline, unreachable), watch=True)
            if booked is GONE:
                if waiting is not None:
                    waiting.cancel()
                return GONE
            refusal, more, booked, instant = booked
    except BaseException:
        if waiting is not None:
            waiting.cancel()
        raise
    if refusal is not None:
        if waiting is not None:
            waiting.cancel()  # every turn here given back, those due at once included
        return Refuse(refusal)
    if waiting is not None or instant > time.monotonic():
        result = yield Turns(outcome, waiting, instant, booked, fleet)
        if result is None:
            return GONE
        if result.__class__ is not Admitted and result is not PASS:
            return Refuse((yield from _longest(fleet, result, asks)))
        outcome = result
    return Admit(outcome, more)


def _longest(fleet: Any, refused: Any, asks: List[Any]) -> Generator[Any, Any, Any]:
    """A refusal of the layer's, told the longest wait, those in Redis included."""
    if refused.__class__ is Refused and refused.status == 429:
        refused = yield Redis(lambda: fleet.also_refusing(refused, asks))
    return refused


def fields_of(verdict: Admit, legacy: bool) -> List[Any]:
    """The fields an admitted request's response gets."""
    from .fleet import tightest_legacy

    fields = verdict.outcome.fields + verdict.more
    return tightest_legacy(fields) if legacy else fields


def step(flow: Generator[Any, Any, Any], value: Any, error: Optional[BaseException]) -> Any:
    """Sends ``value`` (or throws ``error``) into ``flow``: its next step, or the verdict
    wrapped as ``Done``."""
    try:
        return flow.throw(error) if error is not None else flow.send(value)
    except StopIteration as done:
        return Done(done.value)


class Done:
    """The end of a flow: its ``verdict``."""

    __slots__ = ("verdict",)

    def __init__(self, verdict: Any) -> None:
        self.verdict = verdict
