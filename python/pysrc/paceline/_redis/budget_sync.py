"""``paceline.redis.SyncRedisBudget``: the fleet budget for threads, on ``redis.Redis``:
the thread shell around ``budget``'s decisions.

The same decisions, value and keys as ``RedisBudget`` (a budget of the same prefix, name
and rates is one budget for both), each call blocking its thread. A synchronous call
cannot be cut short from outside, so each round trip is bounded by the client's
``socket_timeout`` (required), per attempt of the client's retry policy, as for
``SyncRedisLimiter``.
"""

from __future__ import annotations

import threading
import time
from typing import Any, List, Optional

from .._args import _timeout
from .._budget import Rate, _costs
from .._paceline import FLEET_RENEW_EVERY
from .budget import _END_RETRY, _END_RETRY_MAX, _EPOCHS_FRESH, _MAX_CONFLICTS, Decide
from .budget import _Contended, _contended, _FleetCommon, _TurnCore
from .core import RedisLimitError, RedisRejected, RedisUnavailable, _rexc, _unanswered
from .limiter_sync import _sync_bound
from .wire import _SCRIPTS


class SyncFleetTurn(_TurnCore):
    """An admitted turn of a ``SyncRedisBudget``: ``settle(**costs)`` or ``release()``
    ends it (blocking for one transaction; while Redis cannot answer, a daemon thread
    sends the end again until it lands, and the call raises ``RedisUnavailable``);
    ``with turn:`` releases it at the end of the block unless settled, never raising for
    Redis."""

    __slots__ = ("_ended",)

    def __init__(self, budget: "SyncRedisBudget", ticket: int, cells: List[int]) -> None:
        super().__init__(budget, ticket, cells)
        self._ended = False

    def settle(self, **costs: int) -> None:
        """Ends the turn with the real costs (``tokens=812``); ``ValueError`` for a
        dimension the budget does not have (the turn is left as it was); ``RuntimeError``
        if it has already ended."""
        actual = self._settled(self._ended, costs)
        self._ended = True
        self._budget._end(self._ticket, self._cells, actual, turn=True)

    def release(self) -> None:
        """Ends the turn keeping its estimate; nothing if it has already ended."""
        if not self._ended:
            self._ended = True
            self._budget._end(self._ticket, self._cells, None, turn=True)

    @property
    def ended(self) -> bool:
        """Whether the turn has been settled or released."""
        return self._ended

    def __enter__(self) -> "SyncFleetTurn":
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self.release()
        except RedisLimitError:
            pass  # the end goes on trying in the background

    def __repr__(self) -> str:
        return f"<paceline.redis.SyncFleetTurn {'ended' if self._ended else 'in flight'}>"


class SyncRedisBudget(_FleetCommon):
    """``RedisBudget`` for threads, on a synchronous redis-py client (``redis.Redis``)
    that has a ``socket_timeout``: ``acquire_blocking(**costs)`` (``with
    budget.acquire_blocking(tokens=n) as turn:``), ``try_acquire``, ``remaining``,
    ``in_flight()``, ``waiting()``, ``wait_time``, ``follow`` and ``hold_for``, without
    ``await``. The promises, the keys and the value are ``RedisBudget``'s; each round
    trip is bounded by the client's ``socket_timeout`` (see ``SyncRedisLimiter`` for the
    retry policy's part). A thread interrupted while it waits (Ctrl-C) gives its place
    up."""


    def __init__(
        self, client: Any, name: str, *, in_flight: Optional[int] = None,
        prefix: str = "paceline", **rates: Rate
    ) -> None:
        bound = _sync_bound(
            client,
            "SyncRedisBudget takes a synchronous redis-py client (redis.Redis), got "
            f"{type(client).__name__}; for redis.asyncio use paceline.redis.RedisBudget",
            "the client has no socket_timeout, so a Redis that stops answering would "
            "block every caller for ever: make it with one, e.g. redis.Redis(..., "
            "socket_timeout=0.25, socket_connect_timeout=0.25, retry=Retry(NoBackoff(), 0))",
        )
        super().__init__(client, name, in_flight, prefix, bound, rates)
        self._transacting = threading.Lock()
        self._queueing = threading.Lock()
        self._counting = threading.Lock()
        self._renewing = False
        self._epochs_read: Optional[tuple] = None  # ((head, queue), read at)

    def _forked(self) -> None:
        self._queueing = threading.Lock()
        self._transacting = threading.Lock()
        self._counting = threading.Lock()
        self._renewing = False

    def _call(self, args: tuple) -> Any:
        execute = self._client.execute_command
        try:
            try:
                return execute(*args)
            except _rexc.NoScriptError:
                return execute("EVAL", _SCRIPTS[args[1]], *args[2:])
        except Exception as e:
            raise _unanswered(e) from e

    def _transact(self, decide: Decide, urgent: bool = False) -> tuple:
        """As ``RedisBudget._transact``: this client's threads one at a time, an urgent
        one behind at most one other."""
        if urgent:
            with self._transacting:
                return self._transact_now(decide)
        with self._queueing, self._transacting:
            return self._transact_now(decide)

    def _transact_now(self, decide: Decide) -> tuple:
        for _ in range(_MAX_CONFLICTS):
            result, write, epochs = self._decided(self._call(self._read_args), decide)
            if write is None or int(self._call(write)) == 1:
                return result, epochs
        raise _contended()

    def _epochs(self) -> tuple:
        read = self._epochs_read
        if read is not None and time.monotonic() - read[1] < _EPOCHS_FRESH:
            return read[0]
        epochs = self._epochs_of(self._call(self._read_epochs_args))
        self._epochs_read = (epochs, time.monotonic())
        return epochs

    def _hold(self) -> None:
        self._me()
        with self._counting:
            self._held += 1
            if self._renewing:
                return
            self._renewing = True
        threading.Thread(target=self._renew, name="paceline-fleet-lease", daemon=True).start()

    def _release(self) -> None:
        with self._counting:
            self._held = max(self._held - 1, 0)

    def _renew(self) -> None:
        while True:
            time.sleep(FLEET_RENEW_EVERY)
            with self._counting:
                if self._held == 0:
                    self._renewing = False
                    return
            try:
                self._transact(self._renewal())
            except Exception:  # noqa: BLE001 - tried again next round; a lease outlasts three
                pass

    def _end_once(self, ticket: int, cells: List[int], actual: Optional[list], turn: bool) -> None:
        found, _ = self._transact(self._ending(ticket, cells, actual), urgent=True)
        self._ended_found(found, turn)

    def _end(self, ticket: int, cells: List[int], actual: Optional[list], turn: bool) -> None:
        """Ends caller ``ticket`` now; while Redis cannot answer, a daemon thread sends the
        end again until it lands, and this raises ``RedisUnavailable``."""
        try:
            self._end_once(ticket, cells, actual, turn)
        except RedisRejected:
            self._release()
            raise
        except (RedisLimitError, OSError) as e:
            threading.Thread(
                target=self._end_later, args=(ticket, cells, actual, turn), daemon=True
            ).start()
            if isinstance(e, RedisUnavailable):
                raise
            return
        self._release()

    def _end_later(self, ticket: int, cells: List[int], actual: Optional[list], turn: bool) -> None:
        pause = _END_RETRY
        try:
            while True:
                time.sleep(pause)
                try:
                    self._end_once(ticket, cells, actual, turn)
                    return
                except RedisRejected:
                    return
                except (RedisLimitError, OSError):
                    pause = min(pause * 2, _END_RETRY_MAX)
        finally:
            self._release()

    def _leave(self, ticket: Optional[int], cells: List[int]) -> None:
        """A waiter that failed or was interrupted gives its place up, from a daemon
        thread (the interrupted thread does not wait for Redis)."""
        if ticket is None:
            self._release()
        else:
            threading.Thread(
                target=self._end_later, args=(ticket, cells, None, False), daemon=True
            ).start()

    def acquire_blocking(self, *, timeout: Optional[float] = None, **costs: int) -> SyncFleetTurn:
        """Blocks this thread for its turn in the fleet's queue, as ``RedisBudget.acquire``:
        ``with budget.acquire_blocking(tokens=n) as turn:``."""
        cells = self._core.cells(_costs(costs))
        waiter = self._core.waiter(cells, _timeout(timeout))
        self._hold()
        try:
            while True:
                try:
                    _, epochs = self._transact(self._asking(waiter), waiter.urgent())
                except _Contended:
                    time.sleep(0.001)
                    continue
                ticket, again = self._answer(waiter, epochs)
                if ticket is not None:
                    return SyncFleetTurn(self, ticket, cells)
                while again is not None:
                    time.sleep(again)
                    again = self._looked(waiter, self._epochs())
        except BaseException:
            self._leave(waiter.ticket(), cells)
            raise

    def try_acquire(self, **costs: int) -> Optional[SyncFleetTurn]:
        """A turn now, or ``None``; never waits."""
        cells = self._core.cells(_costs(costs))
        self._hold()
        decide, seen = self._trying(cells)
        try:
            ticket, _ = self._transact(decide)
        except BaseException:
            self._leave(seen[-1] if seen else None, cells)
            raise
        if ticket is None:
            self._release()
            return None
        return SyncFleetTurn(self, ticket, cells)

    def remaining(self, name: str) -> int:
        """As ``RedisBudget.remaining``."""
        index = self._index(name)
        return self._transact(self._core.look)[0][2][index]

    def in_flight(self) -> int:
        """Turns admitted and not yet ended, over the fleet."""
        return self._transact(self._core.look)[0][0]

    def waiting(self) -> int:
        """Callers waiting in the queue, over the fleet."""
        return self._transact(self._core.look)[0][1]

    def wait_time(self, **costs: int) -> float:
        """As ``RedisBudget.wait_time``."""
        return self._transact(self._timing(costs))[0]

    def follow(self, status: int, headers: Any, *, max_hold: float = 300.0) -> int:
        """As ``RedisBudget.follow``."""
        return self._transact(self._following(status, headers, max_hold))[0]

    def hold_for(self, seconds: float) -> None:
        """As ``RedisBudget.hold_for``."""
        self._transact(self._holding(seconds))
