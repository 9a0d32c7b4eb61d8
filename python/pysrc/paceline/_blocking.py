"""What a wait tells the user: a warning for a blocking wait made on an event loop's own
thread (``with limiter:`` inside ``async def`` stalls the loop, and every task on it,
until the turn comes), and a debug line for a turn that waits long."""

from __future__ import annotations

import asyncio
import logging
import warnings
from typing import Callable, Optional

_warned = False


def warn_if_on_a_loop(would_wait: Callable[[], bool], asynchronous: str) -> None:
    """Warns (``RuntimeWarning``, once per process) when this thread runs an event loop
    and ``would_wait()`` says the blocking call is about to wait; ``asynchronous`` names
    the call to use instead. Costs one lookup of the running loop otherwise."""
    global _warned
    if _warned or asyncio._get_running_loop() is None or not would_wait():
        return
    _warned = True
    warnings.warn(
        "paceline: a blocking wait (`with limiter:`, acquire_blocking) on the thread of a "
        "running event loop stalls the loop and every task on it until the turn comes; "
        f"inside `async def` use {asynchronous}",
        RuntimeWarning,
        stacklevel=3,
    )


_log = logging.getLogger("paceline")

#: How long a turn waits before a debug line says so (seconds).
SLOW_TURN = 1.0


def tell_when_slow(what: str, waiting: Optional[Callable[[], int]] = None) -> asyncio.TimerHandle:
    """Logs at debug level, once, when a turn of ``what`` has waited ``SLOW_TURN``
    seconds and is still waiting (with how many callers wait in its queue, when
    ``waiting`` can say): a queue that holds callers for minutes is then seen. Cancel the
    handle when the wait ends."""

    def tell() -> None:
        try:
            count = "" if waiting is None else f" ({waiting()} callers wait in its queue)"
        except Exception:  # noqa: BLE001 - a count that cannot be read: the line without it
            count = ""
        _log.debug("paceline: a turn of %s has waited %g s and waits on%s", what, SLOW_TURN, count)

    return asyncio.get_running_loop().call_later(SLOW_TURN, tell)
