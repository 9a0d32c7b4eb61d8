"""One rate for an RQ job across every worker: ``@paced`` on the job's function.

    from paceline.rq import paced

    @paced("50/second", storage_uri="redis://localhost:6379/0")
    def call_api(document_id): ...

    queue.enqueue(call_api, 42)

Each execution books a turn in the function's rates (kept where ``storage_uri`` says)
and starts at it, with ``paceline.celery.paced``'s arguments. An RQ worker process runs
one job at a time, so a job waits its turn in the worker that runs it (there is no
cheaper place for it to wait): give paced jobs a queue and workers of their own, so that
other jobs do not queue behind their waits.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Mapping, Optional

from ._tasks.pacer import PacedKeyError
from ._tasks.run import Queue, Shell, check_early, paced_call

__all__ = ["paced", "PacedKeyError"]


def paced(
    rate: Any = None,
    *,
    storage_uri: Optional[str] = None,
    key: Optional[Callable[..., str]] = None,
    per: float = 1.0,
    burst: Optional[int] = None,
    name: Optional[str] = None,
    budget: Any = None,
    cost: Optional[Callable[..., Mapping[str, int]]] = None,
    settle: Optional[Callable[[Any], Mapping[str, int]]] = None,
    budget_timeout: Optional[float] = None,
    redis_timeout: float = 0.25,
    on_redis_failure: str = "closed",
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Holds every execution of the decorated job function to ``rate`` (see the
    module's text and ``paceline.celery.paced`` for each argument). With Redis gone and
    ``on_redis_failure="closed"`` the job fails with ``RedisUnavailable`` (RQ's
    ``Retry`` on enqueue runs it again)."""
    check_early(rate, storage_uri, per, burst)

    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        shell = Shell.make(
            fn, rate, storage_uri=storage_uri, key=key, per=per, burst=burst, name=name,
            max_sleep=0.0, budget=budget, cost=cost, settle=settle,
            budget_timeout=budget_timeout, redis_timeout=redis_timeout,
            on_redis_failure=on_redis_failure, retry_unavailable=1.0,
        )

        @functools.wraps(fn)
        def run(*args: Any, **kwargs: Any) -> Any:
            return paced_call(shell, Queue(), fn, args, kwargs)

        run.__paceline__ = shell  # type: ignore[attr-defined]
        return run

    return decorate
