"""One rate for an RQ job across every worker: ``@paced`` on the job's function.

    from paceline.rq import paced

    @paced("50/second", storage_uri="redis://localhost:6379/0")
    def call_api(document_id): ...

    queue.enqueue(call_api, 42)

Each execution books a turn in the function's rates (kept where ``storage_uri`` says)
and starts at it, with ``paceline.celery.paced``'s arguments. An RQ worker process runs
one job at a time, so a job waits its turn in the worker that runs it (there is no
cheaper place for it to wait): give paced jobs a queue and workers of their own, so that
other jobs do not queue behind their waits. ``memory://`` counts per process, and RQ's
default worker forks a process per job: there it limits nothing; use ``file://`` or
``redis://``.
"""

from __future__ import annotations

from typing import Any, Callable

from ._tasks.pacer import PacedKeyError
from ._tasks.run import Queue, decorator

__all__ = ["paced", "PacedKeyError"]


def paced(rate: Any = None, **options: Any) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Holds every execution of the decorated job function to ``rate``, with
    ``paceline.celery.paced``'s keyword arguments but ``max_sleep`` and
    ``retry_unavailable`` (see the module's text). With Redis gone and
    ``on_redis_failure="closed"`` the job fails with ``RedisUnavailable`` (RQ's ``Retry``
    on enqueue runs it again)."""
    for what in ("max_sleep", "retry_unavailable"):
        if what in options:
            raise TypeError(f"an RQ job waits its turn in its worker: {what} does not apply")
    return decorator(rate, options, Queue)
