"""How event loops wait for booked turns: one timer per limiter and loop (``_Sleepers``),
the loops a limiter shares (``_Waiting``), a keyed booking's wait for room (``NoRoom``),
and the reset of that state in a forked child."""

from __future__ import annotations

import asyncio
import heapq
import itertools
import os
import threading
import time
import weakref
from typing import Dict, List, Optional, Tuple

from ._paceline import NoRoom, Ticket

async def _when_room(call, timeout: Optional[float]):  # type: ignore[no-untyped-def]
    """``call(timeout)`` (a booking), again after waiting for room each time a keyed
    limiter has no room to store a new key yet (``NoRoom``); the Rust side raises
    ``TimeoutError`` once room is further away than what is left of ``timeout``."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        try:
            return call(left)
        except NoRoom as e:
            await asyncio.sleep(e.args[0])


class _Sleepers:
    """The turns one event loop waits for on one limiter: a heap by deadline, and one
    timer (``loop.call_at``) for the earliest. Touched only from its loop's thread."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.heap: List[Tuple[float, int, Ticket, asyncio.Future]] = []
        self.seq = itertools.count()
        self.timer: Optional[asyncio.TimerHandle] = None
        self.armed_at = float("inf")
        self.refresh_pending = False

    def add(self, ticket: Ticket) -> asyncio.Future:
        future = self.loop.create_future()
        deadline = self.loop.time() + ticket.ready_in()
        heapq.heappush(self.heap, (deadline, next(self.seq), ticket, future))
        if deadline < self.armed_at:
            self._arm(deadline)
        return future

    def _arm(self, deadline: float) -> None:
        if self.timer is not None:
            self.timer.cancel()
        self.timer = self.loop.call_at(deadline, self.fire)
        self.armed_at = deadline

    def fire(self) -> None:
        self.timer = None
        self.armed_at = float("inf")
        now = self.loop.time()
        heap = self.heap
        while heap and heap[0][0] <= now:
            _, seq, ticket, future = heapq.heappop(heap)
            if future.done():  # cancelled meanwhile
                continue
            left = ticket.ready_in()
            if left > 0.0:
                # Its turn moved later (a quota change): wait again.
                heapq.heappush(heap, (now + left, seq, ticket, future))
                continue
            future.set_result(None)
        if heap:
            self._arm(heap[0][0])

    def moved(self) -> None:
        """Turns moved: re-read the deadlines once this loop gets to it. Any number of
        moves before then (a task group cancelling 50 000 waiters) cost one re-reading.
        Called from any thread; the flag is only a hint (a second scheduled refresh is
        harmless)."""
        if not self.refresh_pending:
            self.refresh_pending = True
            self.loop.call_soon_threadsafe(self.refresh)

    def refresh(self) -> None:
        """Re-reads every deadline: turns move earlier when a waiter ahead gives its
        cells back (on any loop or thread) or the quota changes."""
        self.refresh_pending = False
        now = self.loop.time()
        self.heap = [
            (now + ticket.ready_in(), seq, ticket, future)
            for (_, seq, ticket, future) in self.heap
            if not future.done()
        ]
        heapq.heapify(self.heap)
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        self.armed_at = float("inf")
        if self.heap:
            self._arm(self.heap[0][0])


class _Waiting:
    """What a limiter shares with the event loops that wait on it."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.loops: Dict[asyncio.AbstractEventLoop, _Sleepers] = {}
        _ALL_WAITING.add(self)

    def _after_fork_in_child(self) -> None:
        """A forked child has none of the parent's threads or running loops: another
        thread may have held the lock at the fork, and the loops recorded are the
        parent's. Start afresh (the Rust half restarts its own timer)."""
        self.lock = threading.Lock()
        self.loops = {}

    def sleepers(self) -> _Sleepers:
        loop = asyncio.get_running_loop()
        # A read of one entry is safe without the lock (with or without the GIL); only
        # adding a loop takes it.
        sleepers = self.loops.get(loop)
        if sleepers is not None:
            return sleepers
        with self.lock:
            sleepers = self.loops.get(loop)
            if sleepers is None:
                sleepers = self.loops[loop] = _Sleepers(loop)
            return sleepers

    def moved(self) -> None:
        """Turns moved (a cancel, a quota change): every loop re-reads its deadlines."""
        with self.lock:
            loops = [(loop, s) for loop, s in self.loops.items() if not loop.is_closed()]
            self.loops = dict(loops)
        for _, sleepers in loops:
            try:
                sleepers.moved()
            except RuntimeError:  # closed meanwhile
                sleepers.refresh_pending = False

    async def wait(self, ticket: Ticket) -> None:
        if ticket.ready_in() <= 0.0:
            ticket.done()
            return
        future = self.sleepers().add(ticket)
        try:
            await future
        except BaseException:
            # Cancelled (CancelledError, a wait_for timeout): before its turn the cells go
            # back and everyone behind moves up; after it, they stay spent.
            ticket.cancel()
            self.moved()
            raise
        ticket.done()


# Every limiter's waiting state, reset in a forked child (``os.fork``, multiprocessing's
# fork start method, gunicorn --preload): the limiter itself goes on working there.
_ALL_WAITING: "weakref.WeakSet[_Waiting]" = weakref.WeakSet()


def _reset_after_fork() -> None:
    for waiting in list(_ALL_WAITING):
        waiting._after_fork_in_child()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_after_fork)
