"""What a wait tells the user: a warning for a blocking wait made on an event loop's own
thread (``with limiter:`` inside ``async def`` stalls the loop, and every task on it,
until the turn comes), and a debug line for a turn that waits long."""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import warnings
from typing import Callable, Optional

_warned = False
#: The package's folder: the warning points at the first line outside it.
_HERE = os.path.dirname(os.path.abspath(__file__)) + os.sep


def warn_if_on_a_loop(would_wait: Callable[[], bool], asynchronous: str) -> None:
    """Warns (``RuntimeWarning``, once per process) when this thread runs an event loop
    and ``would_wait()`` says the blocking call is about to wait; ``asynchronous`` names
    the call to use instead. The warning points at the caller's line that blocks (the
    first frame outside paceline). Costs one lookup of the running loop otherwise."""
    global _warned
    if _warned or asyncio._get_running_loop() is None or not would_wait():
        return
    _warned = True
    frame = sys._getframe(1)
    while frame.f_back is not None and frame.f_code.co_filename.startswith(_HERE):
        frame = frame.f_back
    warnings.warn_explicit(
        "paceline: a blocking wait (`with limiter:`, acquire_blocking) on the thread of a "
        "running event loop stalls the loop and every task on it until the turn comes; "
        f"inside `async def` use `async with` or {asynchronous}",
        RuntimeWarning,
        frame.f_code.co_filename,
        frame.f_lineno,
        module=frame.f_globals.get("__name__", "<unknown>"),
        registry=frame.f_globals.setdefault("__warningregistry__", {}),
    )


def _would_wait(wait: float, timeout: Optional[float]) -> bool:
    """Whether a blocking call whose turn is ``wait`` seconds away waits (with a
    ``timeout`` shorter than that, it raises at once instead)."""
    return wait > 0 and (timeout is None or wait <= timeout)


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


def tell_if_slow_blocking(what: str, wait: Callable[[], float], waiting: Callable[[], int]) -> None:
    """For a thread about to block for a turn of ``what``: a debug line when its rates
    put the turn more than ``SLOW_TURN`` seconds away (asked only while debug lines are
    on)."""
    if not _log.isEnabledFor(logging.DEBUG):
        return
    try:
        seconds, count = wait(), waiting()
    except Exception:  # noqa: BLE001 - the line is a courtesy: never a failure of the wait
        return
    if seconds > SLOW_TURN:
        _log.debug(
            "paceline: a turn of %s will wait %.1f s by its rates (%d callers wait in its queue)",
            what,
            seconds,
            count,
        )
