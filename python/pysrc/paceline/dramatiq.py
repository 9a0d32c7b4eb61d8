"""One rate for a Dramatiq actor across every worker: ``@paced`` under ``@dramatiq.actor``.

    import dramatiq
    from paceline.dramatiq import paced

    @dramatiq.actor
    @paced("50/second", storage_uri="redis://localhost:6379/0")
    def call_api(document_id): ...

Each execution books a turn in the actor's rates (kept where ``storage_uri`` says) and
starts at it, as ``paceline.celery.paced`` does (the same arguments): a turn at most
``max_sleep`` seconds away is slept in the worker thread; a later one sends the message
back to the broker with that delay (Dramatiq's ``Retry``, not counted against
``max_retries``), carrying its booking in the message's options. A retry of the actor for
its own reasons books again. A Dramatiq worker releases a delayed message up to its
timeout late (``dramatiq_worker_timeout``, 1000 ms by default), so a handed-back message
is sent for that much before its turn and sleeps the rest in its thread: run the workers
with ``dramatiq_worker_timeout=100`` in their environment, or a paced actor's thread
sleeps up to a second per message. An actor with a ``retry_when`` or ``throws`` of its own
(which could refuse a hand-back's ``Retry``) waits its turn in its thread. Decorating installs ``Pacing``, the middleware that tells a
paced call which message it runs, on the broker set at that moment (set the broker
first); without it, or without Dramatiq's ``Retries`` middleware, a paced call waits its
turn in the thread that runs it.
"""

from __future__ import annotations

import contextvars
import time
from typing import Any, Callable

import dramatiq
from dramatiq.middleware import Retries

from ._tasks.pacer import MARK, PacedKeyError
from ._tasks.run import LEAD, Queue, decorator

__all__ = ["paced", "Pacing", "PacedKeyError"]

_MESSAGE: "contextvars.ContextVar[Any]" = contextvars.ContextVar("paceline_dramatiq_message", default=None)


class Pacing(dramatiq.Middleware):
    """Lets a paced actor's call see the message it runs (its retries and booking)."""

    def before_process_message(self, broker: Any, message: Any) -> None:
        _MESSAGE.set((broker, message))

    def after_process_message(self, broker: Any, message: Any, *, result: Any = None, exception: Any = None) -> None:
        _MESSAGE.set(None)

    after_skip_message = after_process_message


def paced(rate: Any = None, **options: Any) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Holds every execution of the decorated actor to ``rate``, with
    ``paceline.celery.paced``'s keyword arguments (see the module's text)."""
    return decorator(rate, options, _DramatiqQueue, _install)


def _install() -> None:
    broker = dramatiq.get_broker()
    if not any(isinstance(m, Pacing) for m in broker.middleware):
        broker.add_middleware(Pacing())


def _hands_back(broker: Any, message: Any) -> bool:
    """Whether a hand-back (a ``Retry``) is sure to be sent again: the ``Retries``
    middleware is there, and no ``retry_when`` or ``throws`` of the actor's could refuse
    it."""
    retries = [m for m in broker.middleware if isinstance(m, Retries)]
    if not retries or retries[0].retry_when is not None:
        return False
    try:
        options = broker.get_actor(message.actor_name).options
    except Exception:  # noqa: BLE001 - an actor this broker does not know: no hand-back
        return False
    return not any(source.get(name) for source in (options, message.options) for name in ("retry_when", "throws"))


class _DramatiqQueue(Queue):
    def __init__(self) -> None:
        current = _MESSAGE.get()
        self.message = None if current is None else current[1]
        self.can_hand_back = current is not None and _hands_back(*current)

    @property
    def early(self) -> float:  # type: ignore[override]
        # A worker releases a delayed message up to its timeout late.
        from dramatiq.worker import WORKER_TIMEOUT

        return WORKER_TIMEOUT / 1000 + 0.05

    def task_id(self) -> Any:
        return self.message.message_id

    def attempt(self) -> int:
        return int(self.message.options.get("retries", 0) or 0)

    def mark(self) -> Any:
        return self.message.options.get(MARK)

    def send_back(self, args: tuple, kwargs: dict, at: float, mark: Any) -> BaseException:
        """Dramatiq's ``Retry`` with the delay until ``at``; the message's options carry
        the mark, and its retries are set one back, which the ``Retries`` middleware
        counts forward again."""
        options = self.message.options
        options.pop(MARK, None)
        if mark is not None:
            options[MARK] = mark
        options["retries"] = self.attempt() - 1
        return dramatiq.Retry(delay=max(0, int((at - LEAD - self.early - time.time()) * 1000)))
