"""The fleet budget without I/O: what ``RedisBudget`` (asyncio, ``budget_async``) and
``SyncRedisBudget`` (threads, ``budget_sync``) share.

The decisions, the value's format in Redis and the waiters' cadence are the Rust crate's
(``paceline::budget::fleet``, in the package's extension). Each call reads the budget's
value with the server's time (``BUDGET_READ_SCRIPT``), decides, and writes the value
back only where no other client wrote in between (``BUDGET_WRITE_SCRIPT``, a
compare-and-set on the value's generation), deciding again from a fresh read where one
did. This module builds the calls and the decisions; the two shells send the calls, wait
and hold their callers. A Rust ``paceline::redis::RedisBudget`` of the same prefix, name
and rates shares the budget.
"""

from __future__ import annotations

import logging
import os
import secrets
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

from .._budget import Rate, _checked, _costs, _fields, _seconds
from .._paceline import FLEET_LEASE as _LEASE
from .._paceline import FleetForeign, new_fleet_budget
from .core import RedisLimitError, RedisRejected, _call_timeout, _key, _prefix
from .wire import BUDGET_READ_SHA, BUDGET_WRITE_SHA

_log = logging.getLogger("paceline")

# Writes overtaken by another client's, in a row, before a call gives up.
_MAX_CONFLICTS = 200

# How long an end waits between its tries while Redis cannot answer (it tries until it
# lands, or its process goes and its lease lapses).
_END_RETRY = 0.2
_END_RETRY_MAX = 2.0

# How long an epochs' read serves the other waiters (of an event loop, or of a client).
_EPOCHS_FRESH = 0.0005

# The log's words for a turn whose end found it ended already, with why the lease lapsed.
_LOST_TURN = (
    "paceline: a turn of the fleet budget %r had already been ended for it (its client "
    "could not renew its lease for %s s{}Redis lost the budget): the cap did not count it "
    "meanwhile"
)

#: ``decide(value, secs, micros, owner) -> (result, write)``: a decision on a read.
Decide = Callable[[Optional[bytes], int, int, int], Tuple[Any, Any]]


class _Contended(RedisLimitError):
    """Other clients kept writing the budget first: nothing was done. A waiter asks again
    (its place is kept); other calls raise it."""


def _contended() -> _Contended:
    return _Contended("other clients kept writing the budget first; nothing was done (try again)")


def _int(value: Any) -> int:
    return 0 if value is None else int(value)


def _owner() -> int:
    return secrets.randbits(63) | 1


class _TurnCore:
    """What a fleet turn of either shell holds: its budget, its caller's ticket and the
    cells charged at admission."""

    __slots__ = ("_budget", "_ticket", "_cells")

    def __init__(self, budget: "_FleetCommon", ticket: int, cells: List[int]) -> None:
        self._budget = budget
        self._ticket = ticket
        self._cells = cells

    def _settled(self, ended: bool, costs: Dict[str, int]) -> list:
        """The real costs of a settle, checked before the turn changes."""
        if ended:
            raise RuntimeError("the turn has already ended")
        return self._budget._core.settled(_costs(costs))

    def cost(self, name: str) -> Optional[int]:
        """The cells charged to ``name`` at admission (``None`` for a name the budget
        lacks)."""
        try:
            return self._cells[self._budget._core.index(name)]
        except ValueError:
            return None


class _FleetCommon:
    """What the asyncio and the thread forms of the fleet budget share: the rules, the
    keys, the client's owner id, the callers it holds, the calls a transaction sends and
    the decisions it makes on their replies."""

    # Why a client could not renew its lease, as its shell tells it in the log.
    _LEASE_LAPSED = ", or "

    def __init__(
        self,
        client: Any,
        name: str,
        in_flight: Optional[int],
        prefix: str,
        timeout: float,
        rates: Dict[str, Rate],
    ) -> None:
        in_flight = _checked(rates, in_flight)
        self._name = _key(name)
        if "}" in self._name:
            # The name is the keys' hash tag: a "}" would end it early, and put the
            # budget's two keys on different slots of a cluster.
            raise ValueError(f"a budget's name must not hold '}}', got {name!r}")
        self._core = new_fleet_budget(
            [(n, r.count, r.per, r.burst) for n, r in rates.items()], in_flight
        )
        self._client = client
        self._timeout = _call_timeout(timeout)
        self._prefix = _prefix(prefix)
        base = f"{self._prefix}:{{{self._name}}}"
        self._keys = (f"{base}:budget", f"{base}:epochs")
        self._read_args = ("EVALSHA", BUDGET_READ_SHA, 2, *self._keys)
        self._read_epochs_args = ("HMGET", self._keys[1], "head", "queue")
        self._owner, self._pid = _owner(), os.getpid()
        # Callers of this client on record (waiters and turns): its lease is renewed
        # while there are any.
        self._held = 0

    def __repr__(self) -> str:
        rates = ", ".join(f"{n}={r!r}" for n, r in self.rates.items())
        return (
            f"{type(self).__name__}({self._name!r}, {rates}, in_flight={self._core.cap()}, "
            f"prefix={self._prefix!r})"
        )

    @property
    def rates(self) -> Dict[str, Rate]:
        """The dimensions and their rates."""
        return {
            name: Rate(burst, per=interval * burst / 1e9, burst=burst)
            for name, interval, burst in self._core.rates()
        }

    @property
    def name(self) -> str:
        """The budget's name in Redis."""
        return self._name

    def _forked(self) -> None:
        """A forked child's reset of what the parent's threads or loops held."""

    def _me(self) -> int:
        # A forked child is a client of its own.
        if os.getpid() != self._pid:
            self._owner, self._pid = _owner(), os.getpid()
            self._held = 0
            self._forked()
        return self._owner

    def _decided(self, reply: Any, decide: Decide) -> Tuple[Any, Optional[tuple], Tuple[int, int, int]]:
        """The decision on a read's reply: ``(result, write, (head, queue, read at))``,
        ``write`` the call that writes it (``None``: nothing to write)."""
        value, secs, micros, head, queue = reply
        if isinstance(value, str):
            value = value.encode("ascii", "replace")
        try:
            result, write = decide(value or None, int(secs), int(micros), self._me())
        except FleetForeign as e:
            raise RedisRejected(f"{e} ({self._keys[0]}); it is left as it is") from None
        if write is not None:
            expect, new, ttl_ms, moved_head, moved_queue = write
            write = ("EVALSHA", BUDGET_WRITE_SHA, 2, *self._keys, expect, new, ttl_ms, moved_head, moved_queue)
        # The local time of the read: the server's time was read then (half a round trip
        # before, at most), so a waiter's instants are reckoned from it.
        return result, write, (_int(head), _int(queue), time.monotonic_ns())

    @staticmethod
    def _epochs_of(reply: Any) -> Tuple[int, int]:
        head, queue = reply
        return _int(head), _int(queue)

    # The decisions each call makes on a read (``decide`` above).

    def _renewal(self) -> Decide:
        return lambda v, s, m, o: (None, self._core.renew(v, s, m, o))

    def _ending(self, ticket: int, cells: List[int], actual: Optional[list]) -> Decide:
        return lambda v, s, m, o: self._core.end(v, s, m, o, ticket, cells, actual)

    def _ended_found(self, found: bool, turn: bool) -> None:
        """Logs a turn whose end found it ended for it already (its lease had lapsed)."""
        if not found and turn:
            _log.warning(_LOST_TURN.format(self._LEASE_LAPSED), self._name, _LEASE)

    @staticmethod
    def _asking(waiter: Any) -> Decide:
        return lambda v, s, m, o: (None, waiter.decide(v, s, m, o))

    @staticmethod
    def _answer(waiter: Any, epochs: Tuple[int, int, int]) -> Tuple[Optional[int], Optional[float]]:
        """A waiter's answer to its ask: ``(ticket, None)`` when its turn came, else
        ``(None, seconds)`` until it looks at the epochs (``None``: it asks again now)."""
        ticket = waiter.answer(*epochs)
        if ticket is not None:
            return ticket, None
        return None, waiter.look(None, time.monotonic_ns())

    @staticmethod
    def _looked(waiter: Any, epochs: Tuple[int, int]) -> Optional[float]:
        """Seconds until the waiter looks again after reading ``epochs`` (``None``: it
        asks now)."""
        return waiter.look(epochs, time.monotonic_ns())

    def _trying(self, cells: List[int]) -> Tuple[Decide, List[int]]:
        """``try_acquire``'s decision, and the tickets it took (to give back if the call
        fails after a decision admitted it)."""
        seen: List[int] = []

        def decide(v: Optional[bytes], s: int, m: int, o: int) -> Tuple[Any, Any]:
            ticket, write = self._core.try_now(v, s, m, o, cells)
            if ticket is not None:
                seen.append(ticket)
            return ticket, write

        return decide, seen

    def _index(self, name: str) -> int:
        if not isinstance(name, str):
            raise TypeError(f"name must be a str, got {type(name).__name__}")
        return self._core.index(name)

    def _timing(self, costs: Dict[str, int]) -> Decide:
        cells = self._core.cells(_costs(costs))
        return lambda v, s, m, o: self._core.wait_time(v, s, m, o, cells)

    def _following(self, status: int, headers: Any, max_hold: float) -> Decide:
        max_hold = _seconds("max_hold", max_hold)
        fields = _fields(status, headers)
        return lambda v, s, m, o: self._core.follow(v, s, m, o, status, fields, max_hold)

    def _holding(self, seconds: float) -> Decide:
        seconds = _seconds("seconds", seconds)
        return lambda v, s, m, o: (None, self._core.hold(v, s, m, o, seconds))
