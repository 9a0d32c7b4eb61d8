"""One paced execution, whatever the queue: the turn (slept, or the task handed back for
it), then the budget turn around the body. A queue's shell gives what it knows of the
running task (``Queue``); everything else is here."""

from __future__ import annotations

import dataclasses
import functools
import inspect
import logging
import math
import time
from collections.abc import Mapping
from typing import Any, Callable, Dict, Optional

from .pacer import Pacer, TableFull, marked, sleep_until

_log = logging.getLogger("paceline.tasks")

#: How late a handed-back task may start on its booked turn (seconds); later, it books
#: a new one. Starts keep to the rates within this much.
LATE = 0.15

#: How long after its turn a task booked as its message arrived starts: what the queue
#: takes to hand the task to a worker process comes out of this, and the rest is slept,
#: so that every start keeps its turn's spacing (seconds).
LEAD = 0.1

#: How often one paced task logs that Redis could not be reached (seconds).
_LOG_AGAIN = 60.0


class Queue:
    """What a paced call needs of the queue that runs it (each shell has one)."""

    #: Whether the task can be sent back to its queue for a later instant (false for a
    #: direct or eager call: those wait their turn in the caller).
    can_hand_back = False
    #: How much before its turn a handed-back task is sent for (seconds): how late the
    #: queue may release it; the task sleeps the rest.
    early = 0.0

    #: How far ahead a task may be handed back for (seconds; ``None``: any): a broker
    #: that delivers a message held past its visibility timeout again needs a bound.
    horizon: Optional[float] = None

    def task_id(self) -> Any:
        """The running task's id (a mark is valid for that task only)."""
        return None

    def attempt(self) -> int:
        """Which attempt of the task this is (its retries so far)."""
        return 0

    def mark(self) -> Any:
        """The mark this execution was handed back with, if any."""
        return None

    def send_back(self, args: tuple, kwargs: dict, at: float, mark: Any) -> BaseException:
        """Sends the task back for ``at`` (``time.time()``) carrying ``mark``; the
        exception that ends this execution without running the body."""
        raise NotImplementedError


@dataclasses.dataclass
class Shell:
    """A paced task's settings, checked when the task is decorated (at import)."""

    pacer: Optional[Pacer]
    max_sleep: float
    budget: Any
    cost: Optional[Callable[..., Mapping[str, int]]]
    settle: Optional[Callable[[Any], Mapping[str, int]]]
    budget_timeout: Optional[float]
    retry_unavailable: float
    #: When this task last logged that Redis could not be reached (``time.monotonic()``).
    logged: float = -math.inf

    @classmethod
    def make(
        cls,
        fn: Callable[..., Any],
        rate: Any,
        *,
        storage_uri: Optional[str] = None,
        key: Optional[Callable[..., str]] = None,
        per: float = 1.0,
        burst: Optional[int] = None,
        name: Optional[str] = None,
        max_sleep: float = 0.05,
        budget: Any = None,
        cost: Any = None,
        settle: Any = None,
        budget_timeout: Optional[float] = None,
        redis_timeout: float = 0.25,
        on_redis_failure: str = "closed",
        retry_unavailable: float = 1.0,
        asynchronous: bool = False,
    ) -> "Shell":
        if not inspect.isfunction(fn) and not inspect.ismethod(fn):
            raise TypeError(f"paced decorates a function (def or async def), got {type(fn).__name__}")
        if inspect.iscoroutinefunction(fn) != asynchronous:
            raise TypeError(
                f"{fn.__qualname__} is async: this queue runs plain functions (for async "
                "bodies use paceline.arq.paced)"
                if not asynchronous
                else f"{fn.__qualname__} is not async: arq runs `async def` job functions"
            )
        if rate is None and budget is None:
            raise ValueError("paced needs a rate, a budget, or both")
        pacer = None
        if rate is not None:
            if storage_uri is None:
                raise ValueError(
                    "paced needs storage_uri: where every worker counts together "
                    '("file:///dev/shm/<app>" for the workers of one host, "redis://..." '
                    'for a fleet; "memory://" counts per process)'
                )
            pacer = Pacer(
                rate,
                storage_uri=storage_uri,
                name=name or f"{fn.__module__}.{fn.__qualname__}",
                key=key,
                per=per,
                burst=burst,
                redis_timeout=redis_timeout,
                on_redis_failure=on_redis_failure,
            )
        _seconds("max_sleep", max_sleep, 0.0)
        _seconds("retry_unavailable", retry_unavailable, 0.001)
        if budget_timeout is not None:
            _seconds("budget_timeout", budget_timeout, 0.0)
        wanted = "acquire" if asynchronous else "acquire_blocking"
        if budget is not None and not callable(getattr(budget, wanted, None)):
            raise TypeError(
                f"budget must be a paceline.Budget or a paceline.redis budget with "
                f"{wanted}(), got {type(budget).__name__}"
            )
        if (cost is not None or settle is not None) and budget is None:
            raise ValueError("cost and settle price a budget's turn: give budget= too")
        for what, fn_ in (("cost", cost), ("settle", settle)):
            if fn_ is not None and not callable(fn_):
                raise TypeError(f"{what} must be a function, got {type(fn_).__name__}")
        return cls(pacer, float(max_sleep), budget, cost, settle, budget_timeout, float(retry_unavailable))


def decorator(
    rate: Any,
    options: Dict[str, Any],
    queue: Callable[[], Queue],
    made: Optional[Callable[[], None]] = None,
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """A queue shell's ``paced``: checks what it can now, and decorates a plain function
    whose calls ask ``queue()`` about the running task (``made`` runs once the shell
    is made)."""
    check_early(rate, options.get("storage_uri"), options.get("per", 1.0), options.get("burst"))

    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        shell = Shell.make(fn, rate, **options)
        if made is not None:
            made()

        @functools.wraps(fn)
        def run(*args: Any, **kwargs: Any) -> Any:
            return paced_call(shell, queue(), fn, args, kwargs)

        run.__paceline__ = shell  # type: ignore[attr-defined]
        return run

    return decorate


def check_early(rate: Any, storage_uri: Optional[str], per: float, burst: Optional[int]) -> None:
    """What a paced decorator can check before it is given its function: the rate and
    the storage URI (``ValueError`` at import, never a task left unlimited)."""
    from .._http.limit import _rates
    from .._http.storage import parse

    if rate is not None:
        _rates(rate, per, burst)
    if storage_uri is not None:
        parse(storage_uri)


def _seconds(what: str, value: object, least: float) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
        least <= value < 86_400 * 365 and math.isfinite(value)
    ):
        raise ValueError(f"{what} must be seconds, at least {least:g}, got {value!r}")


def paced_call(shell: Shell, queue: Queue, fn: Callable[..., Any], args: tuple, kwargs: Dict[str, Any]) -> Any:
    """Runs ``fn`` at its turn (and in its budget), or hands the task back for it."""
    pacer = shell.pacer
    if pacer is not None:
        at = marked(pacer, queue.mark(), queue.task_id(), queue.attempt()) if queue.can_hand_back else None
        if at is not None and time.time() - at <= LATE:
            sleep_until(at, LEAD + shell.max_sleep + queue.early)
        else:
            # Unbooked, or run too late for its turn (the queue held it while its workers
            # were busy): started now it would bunch with the turns after it, so it books
            # again; the turn it missed stays spent.
            _take_turn(shell, pacer, queue, args, kwargs)
    if shell.budget is None:
        return fn(*args, **kwargs)
    return _in_budget(shell, fn, args, kwargs)


def _take_turn(shell: Shell, pacer: Pacer, queue: Queue, args: tuple, kwargs: Dict[str, Any]) -> None:
    from .._redis.core import RedisUnavailable

    key = pacer.key_of(args, kwargs)
    horizon = queue.horizon if queue.can_hand_back else None
    try:
        if horizon is not None:
            ahead = pacer.ahead(key)
            if ahead > horizon:
                # Not booked: handed back for when the turns ahead come within reach.
                raise queue.send_back(args, kwargs, time.time() + min(ahead - horizon / 2, horizon), None)
        booked = pacer.book(key, LEAD)
    except TableFull as e:
        if not queue.can_hand_back:
            raise
        raise queue.send_back(args, kwargs, time.time() + max(e.wait, 0.05), None) from None
    except RedisUnavailable as e:
        if not queue.can_hand_back:
            raise
        now = time.monotonic()
        if now - shell.logged >= _LOG_AGAIN:
            shell.logged = now
            _log.warning(
                "paceline: paced task %r not run: %s; handed back for %.3g s later",
                pacer.name,
                e,
                shell.retry_unavailable,
            )
        raise queue.send_back(args, kwargs, time.time() + shell.retry_unavailable, None) from None
    if booked.wait() <= shell.max_sleep + LEAD or not queue.can_hand_back:
        booked.sleep()
        return
    from .pacer import mark

    try:
        ending = queue.send_back(args, kwargs, booked.at, mark(pacer, queue.task_id(), queue.attempt(), booked.at))
    except BaseException:
        booked.cancel()
        raise
    booked.keep()
    raise ending


def costs_of(shell: Shell, args: tuple, kwargs: Dict[str, Any]) -> Dict[str, int]:
    """What a paced call's budget turn is priced at (one request when there is no
    ``cost`` function)."""
    if shell.cost is None:
        return {}
    costs = shell.cost(*args, **kwargs)
    if not isinstance(costs, Mapping):
        raise TypeError(f"a paced task's cost function must return a mapping of dimension names to counts, got {costs!r}")
    return dict(costs)


def settle_from(shell: Shell, turn: Any, result: Any) -> None:
    """Settles ``turn`` at what ``result`` says it cost; a settle function that fails
    leaves the turn at its estimate (the task ran: its result is not lost for that)."""
    if shell.settle is None:
        return
    try:
        actual = shell.settle(result)
        if not isinstance(actual, Mapping):
            raise TypeError(f"settle must return a mapping of dimension names to counts, got {actual!r}")
        turn.settle(**dict(actual))
    except Exception as e:  # noqa: BLE001 - the task ran; its turn keeps the estimate
        _log.warning("paceline: a paced task's settle failed, its turn keeps the estimate: %s", e)


def _in_budget(shell: Shell, fn: Callable[..., Any], args: tuple, kwargs: Dict[str, Any]) -> Any:
    turn = shell.budget.acquire_blocking(timeout=shell.budget_timeout, **costs_of(shell, args, kwargs))
    try:
        result = fn(*args, **kwargs)
        settle_from(shell, turn, result)
        return result
    finally:
        turn.release()
