"""One rate for a Celery task across every worker node: ``@paced`` under ``@app.task``.

    from paceline.celery import paced

    @app.task
    @paced("50/second", storage_uri="redis://localhost:6379/0")
    def call_api(document_id): ...

Every execution of the task, on every worker node and child, books a turn in the task's
rates (kept where ``storage_uri`` says: ``file:///dev/shm/<app>`` for the workers of one
host, ``redis://...`` for a fleet, ``memory://`` for one process) and starts at it. A
turn at most ``max_sleep`` seconds away is slept in the worker; a later one hands the
task back to the broker with that instant as its ETA, keeping the booking, so the worker
child is free for other tasks meanwhile and the turn is neither lost nor spent twice
(the task's ``retries`` do not count it). A retry of the task for its own reasons books
again. ``key`` (a function of the task's arguments) gives each customer or endpoint its
own bucket; several rates at once are written ``"10/second;1000/hour"``.

``budget=`` (a ``paceline.Budget``, shared or in Redis) also takes a budget turn around
the body: ``cost(*args, **kwargs)`` prices it (a mapping of dimension names to counts;
one request by default), ``settle(result)`` reads what it really cost.

In a ``celery worker``, the turn is booked by the worker's main process as the task's
message arrives: a turn further than ``max_sleep`` makes the message one the worker
holds until that instant (as Celery holds a task sent with an ETA), so no child process
waits for it; a child that is handed the task sleeps at most ``max_sleep``. A task that
only starts well after its turn (every child busy) books a new turn rather than bunch
with the turns after it. A task called directly, or run eagerly
(``task_always_eager``, ``.apply()``), waits its turn in the caller.
"""

from __future__ import annotations

import datetime
import logging
import time
from typing import Any, Callable, Optional

from ._tasks.pacer import MARK, PacedKeyError, mark, marked
from ._tasks.run import LEAD, Queue, Shell, decorator

__all__ = ["paced", "PacedKeyError", "strategy"]

_log = logging.getLogger("paceline.celery")


def paced(rate: Any = None, **options: Any) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Holds every execution of the decorated task to ``rate`` (see the module's text).
    Put it under ``@app.task`` (``bind=True`` tasks too: the key function then gets the
    task first, as the body does). Its keyword arguments, the same for every queue:

    * ``storage_uri`` (required with a rate): ``memory://`` (one process's memory, for
      tests), ``file:///dev/shm/<app>`` (a file per rate, the workers of one host, with
      ``?capacity=N`` keys still limited), ``redis://``, ``rediss://``,
      ``redis+cluster://`` (a fleet);
    * ``key``: a function of the task's arguments giving a ``str``: a bucket per value;
    * ``per``, ``burst``: with a number for ``rate`` (a string carries its own);
    * ``name``: names the rates in their storage (default: the function's module and
      name, as Celery names the task);
    * ``max_sleep`` (0.05 s): a turn at most this far is slept in the worker; further,
      the task is handed back for it;
    * ``budget``, ``cost``, ``settle``, ``budget_timeout``: a ``paceline.Budget`` (or a
      ``paceline.redis.SyncRedisBudget``) turn around the body, priced by
      ``cost(*args, **kwargs)`` and settled from ``settle(result)``;
    * ``redis_timeout`` (0.25 s), ``on_redis_failure`` (``"closed"``: the task is
      handed back for ``retry_unavailable`` seconds later, nothing run; ``"open"``: it
      runs unlimited), ``retry_unavailable`` (1.0 s).
    """
    return decorator(rate, options, _CeleryQueue)


class _CeleryQueue(Queue):
    """What a paced call needs of Celery: the running task's attempt and mark, and how
    to hand it back."""

    def __init__(self) -> None:
        from celery import current_task

        task = current_task._get_current_object() if current_task else None
        request = getattr(task, "request", None) if task is not None else None
        self.task = task
        self.request = request
        self.can_hand_back = (
            request is not None
            and not getattr(request, "called_directly", True)
            and not getattr(request, "is_eager", False)
            and getattr(request, "id", None) is not None
        )

    def task_id(self) -> Any:
        return getattr(self.request, "id", None)

    @property
    def horizon(self) -> Optional[float]:  # type: ignore[override]
        return _horizon(getattr(self.task, "app", None))

    def attempt(self) -> int:
        return int(getattr(self.request, "retries", 0) or 0)

    def mark(self) -> Any:
        request = self.request
        value = getattr(request, MARK, None)
        if value is None:
            value = (getattr(request, "headers", None) or {}).get(MARK)
        return value

    def send_back(self, args: tuple, kwargs: dict, at: float, mark: Any) -> BaseException:
        """Sends the task again with ``at`` as its ETA, the mark in its headers, its
        ``retries`` as they are; ends this execution with ``Ignore`` (Celery acknowledges
        the message and records no result for it)."""
        from celery.exceptions import Ignore

        task, request = self.task, self.request
        headers = dict(getattr(request, "headers", None) or {})
        headers.pop(MARK, None)
        if mark is not None:
            headers[MARK] = mark
        eta = datetime.datetime.fromtimestamp(at - LEAD, tz=datetime.timezone.utc)
        # The message's own arguments (a bound task's body also gets the task first).
        signature = task.signature_from_request(
            request, None, None, eta=eta, retries=self.attempt(), headers=headers
        )
        signature.apply_async()
        return Ignore()


def strategy(task: Any, app: Any, consumer: Any, **kwargs: Any) -> Any:
    """Celery's default task strategy, with a paced task's turn booked as its message
    arrives in the worker's main process (set on every paced task when a worker starts;
    ``Strategy = "paceline.celery:strategy"`` on a task class does it by hand)."""
    from celery.worker.strategy import default

    handler = default(task, app, consumer, **kwargs)
    shell = getattr(getattr(task, "run", None), "__paceline__", None)
    if shell is None or shell.pacer is None:
        return handler
    shell.pacer.warm()
    failed = [-float("inf")]

    def paced_handler(message: Any, body: Any, ack: Any, reject: Any, callbacks: Any, **kw: Any) -> Any:
        if time.monotonic() - failed[0] >= 1.0:
            try:
                _book_on_arrival(shell, message, task)
            except Exception as e:  # noqa: BLE001 - the child books (and reports) instead
                failed[0] = time.monotonic()
                _log.debug("paceline: a paced task's turn is left to its child: %s", e)
        return handler(message, body, ack, reject, callbacks, **kw)

    return paced_handler


def _horizon(app: Any) -> Optional[float]:
    """Half the broker's visibility timeout, for a broker that delivers again a message
    held unacknowledged that long (Redis, SQS: an ETA past it runs twice); ``None`` for
    one that does not."""
    if app is None:
        return None
    url = app.conf.broker_url
    scheme = str(url[0] if isinstance(url, (list, tuple)) and url else url or "").split("://")[0].lower()
    if scheme not in ("redis", "rediss", "sentinel", "sqs", "redis+socket"):
        return None
    options = app.conf.broker_transport_options or {}
    return float(options.get("visibility_timeout", 3600)) / 2


def _book_on_arrival(shell: Shell, message: Any, task: Any) -> None:
    """Books the turn of a paced task's message (protocol 2, no ETA of its own, no turn
    booked for this attempt yet) and writes it into the message's headers: the mark,
    and the turn as its ETA when it is further than ``max_sleep``."""
    pacer = shell.pacer
    headers = getattr(message, "headers", None)
    if pacer is None or not isinstance(headers, dict) or "task" not in headers:
        return
    attempt, task_id = headers.get("retries") or 0, headers.get("id")
    if headers.get("eta") or marked(pacer, headers.get(MARK), task_id, attempt) is not None:
        return
    args, kwargs = message.decode()[:2]
    # A bound task's key function gets the task first, as its body does.
    bound = getattr(getattr(task, "run", None), "__self__", None) is task
    key = pacer.key_of((task, *args) if bound else tuple(args), dict(kwargs))
    horizon = _horizon(getattr(task, "app", None))
    if horizon is not None:
        ahead = pacer.ahead(key)
        if ahead > horizon:
            # Not booked: held until the turns ahead come within reach, then booked.
            due = time.time() + min(ahead - horizon / 2, horizon)
            headers["eta"] = datetime.datetime.fromtimestamp(due, tz=datetime.timezone.utc).isoformat()
            return
    # Every turn starts a fixed ``LEAD`` after its instant: the message is due at the
    # instant, and the child it is handed to sleeps the rest, so that the time Celery
    # takes to hand it over does not move one start closer to the next.
    booked = pacer.book(key, LEAD)
    headers[MARK] = mark(pacer, task_id, attempt, booked.at)
    if booked.wait() > shell.max_sleep + LEAD:
        due = booked.at - LEAD
        headers["eta"] = datetime.datetime.fromtimestamp(due, tz=datetime.timezone.utc).isoformat()
    booked.keep()


def _use_strategy(sender: Any = None, **_: Any) -> None:
    """At a worker's start: every paced task of its app books in the main process."""
    app = getattr(sender, "app", None)
    for task in list(getattr(app, "tasks", {}).values()):
        if getattr(getattr(task, "run", None), "__paceline__", None) is not None:
            task.Strategy = "paceline.celery:strategy"


def _connect() -> None:
    try:
        from celery.signals import worker_init
    except ImportError:  # pragma: no cover - the module is Celery's shell
        return
    worker_init.connect(_use_strategy, weak=False)


_connect()
