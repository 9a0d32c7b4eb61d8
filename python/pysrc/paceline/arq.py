"""One rate for an arq job function across every worker: ``@paced`` on the ``async def``.

    from paceline.arq import paced

    @paced("50/second", storage_uri="redis://localhost:6379/1")
    async def call_api(ctx, document_id): ...

    class WorkerSettings:
        functions = [call_api]

Each execution books a turn in the function's rates (kept where ``storage_uri`` says)
and awaits it: arq runs jobs as tasks of one event loop, so a job waiting its turn holds
one of the worker's ``max_jobs`` slots, not a thread, and a job cancelled while it waits
(its ``job_timeout``, the worker stopping) gives its turn back. ``key`` is a function of
the job's arguments after ``ctx``; ``budget=`` takes a ``paceline.Budget`` or a
``paceline.redis.RedisBudget`` (awaited). With Redis gone and ``on_redis_failure="closed"``
the job is retried by arq after ``retry_unavailable`` seconds (``arq.Retry``); bookings
in Redis are made from a thread, never blocking the worker's loop.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from typing import Any, Awaitable, Callable

from ._tasks.pacer import PacedKeyError
from ._tasks.run import Shell, check_early, costs_of, settle_from

__all__ = ["paced", "PacedKeyError"]

_log = logging.getLogger("paceline.arq")


def paced(rate: Any = None, **options: Any) -> Callable[[Callable[..., Awaitable[Any]]], Callable[..., Awaitable[Any]]]:
    """Holds every execution of the decorated arq job function to ``rate``, with
    ``paceline.celery.paced``'s keyword arguments but ``max_sleep`` (see the module's
    text)."""
    check_early(rate, options.get("storage_uri"), options.get("per", 1.0), options.get("burst"))
    if "max_sleep" in options:
        raise TypeError("an arq job awaits its turn: max_sleep does not apply")

    def decorate(fn: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
        shell = Shell.make(fn, rate, asynchronous=True, **options)

        @functools.wraps(fn)
        async def run(ctx: Any, *args: Any, **kwargs: Any) -> Any:
            await _turn(shell, args, kwargs)
            if shell.budget is None:
                return await fn(ctx, *args, **kwargs)
            turn = await shell.budget.acquire(timeout=shell.budget_timeout, **costs_of(shell, args, kwargs))
            try:
                result = await fn(ctx, *args, **kwargs)
                settle_from(shell, turn, result)
                return result
            finally:
                turn.release()

        run.__paceline__ = shell  # type: ignore[attr-defined]
        return run

    return decorate


async def _turn(shell: Shell, args: tuple, kwargs: dict) -> None:
    from ._redis.core import RedisUnavailable

    pacer = shell.pacer
    if pacer is None:
        return
    key = pacer.key_of(args, kwargs)
    try:
        if pacer.storage.kind == "redis":
            booked = await asyncio.to_thread(pacer.book, key)
        else:
            booked = pacer.book(key)
    except RedisUnavailable as e:
        from arq.worker import Retry

        _log.warning("paceline: paced job %r not run: %s; arq retries it", pacer.name, e)
        raise Retry(defer=shell.retry_unavailable) from e
    try:
        await asyncio.sleep(booked.wait())
    except BaseException:
        booked.cancel()
        raise
    booked.taken()
