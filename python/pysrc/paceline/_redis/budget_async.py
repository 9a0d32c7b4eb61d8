"""``paceline.redis.RedisBudget``: a ``paceline.Budget`` for every process and host that
uses one Redis, on a redis-py asyncio client: the asyncio shell around ``budget``'s
decisions, which sends their calls, waits, and holds its callers per event loop.
"""

from __future__ import annotations

import asyncio
import time
import weakref
from typing import Any, List, Optional, Tuple

from .._args import _timeout
from .._blocking import tell_when_slow
from .._budget import Rate, _costs
from .._paceline import FLEET_RENEW_EVERY
from .budget import _END_RETRY, _END_RETRY_MAX, _EPOCHS_FRESH, _MAX_CONFLICTS, Decide
from .budget import _Contended, _contended, _FleetCommon, _TurnCore
from .core import RedisLimitError, RedisRejected, RedisUnavailable, _is_async_client, _unanswered
from .wire import _AsyncWire


class FleetTurn(_TurnCore):
    """An admitted turn of a ``RedisBudget``: an in-flight permit and a charge in every
    dimension over the fleet, until it ends.

    ``settle(**costs)`` ends it with the real costs of the dimensions named;
    ``release()`` ends it keeping the estimate. Both send the end at once and return an
    awaitable that completes once Redis has it (awaiting is optional: an end not awaited
    still lands; ``async with`` waits for it at the end of the block). While Redis cannot
    answer the end is sent again until it lands; ``await`` raises
    ``RedisUnavailable`` once a try could not reach Redis (it goes on trying)."""

    __slots__ = ("_ending",)

    def __init__(self, budget: "RedisBudget", ticket: int, cells: List[int]) -> None:
        super().__init__(budget, ticket, cells)
        self._ending: "Optional[asyncio.Future[None]]" = None

    def settle(self, **costs: int) -> "asyncio.Future[None]":
        """Ends the turn with the real costs (``tokens=812``); a dimension not named keeps
        its charge. ``ValueError`` for a dimension the budget does not have (the turn is
        left as it was); ``RuntimeError`` if it has already ended."""
        actual = self._settled(self._ending is not None, costs)
        self._ending = self._budget._end_soon(self._ticket, self._cells, actual)
        return self._ending

    def release(self) -> "asyncio.Future[None]":
        """Ends the turn keeping its estimate (the end already sent, if it has ended)."""
        if self._ending is None:
            self._ending = self._budget._end_soon(self._ticket, self._cells, None)
        return self._ending

    @property
    def ended(self) -> bool:
        """Whether the turn has been settled or released."""
        return self._ending is not None

    async def __aenter__(self) -> "FleetTurn":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._budget._ended(self.release())

    def __repr__(self) -> str:
        return f"<paceline.redis.FleetTurn {'ended' if self.ended else 'in flight'}>"


class _FleetAcquiring:
    """``budget.acquire(...)``: await it for a ``FleetTurn``, or ``async with`` it (the
    turn is released at the end of the block unless settled, an exception included)."""

    __slots__ = ("_budget", "_costs", "_timeout", "_turn")

    def __init__(self, budget: "RedisBudget", costs: List[Tuple[str, int]], timeout: Optional[float]):
        self._budget = budget
        self._costs = costs
        self._timeout = timeout
        self._turn: Optional[FleetTurn] = None

    def __await__(self):  # type: ignore[no-untyped-def]
        return self._budget._wait(self._costs, self._timeout).__await__()

    async def __aenter__(self) -> FleetTurn:
        if self._turn is not None:
            raise RuntimeError(
                "one budget.acquire(...) serves one `async with` at a time: call "
                "budget.acquire(...) for each turn"
            )
        self._turn = await self._budget._wait(self._costs, self._timeout)
        return self._turn

    async def __aexit__(self, *exc: object) -> None:
        turn, self._turn = self._turn, None
        if turn is not None:
            await self._budget._ended(turn.release())


class RedisBudget(_FleetCommon, _AsyncWire):
    """Rates by name and a cap on calls in flight, as ``paceline.Budget``, for every
    process and host that uses the same Redis, ``prefix``, ``name`` and rates, on a
    redis-py asyncio client (``redis.asyncio.Redis``)::

        budget = paceline.redis.RedisBudget(
            redis.asyncio.Redis(), "model-api",
            requests=paceline.Rate(500, per=60.0),
            tokens=paceline.Rate(200_000, per=60.0),
            in_flight=8,
        )
        async with budget.acquire(tokens=estimate) as turn:
            response = await client.post(...)
            turn.settle(tokens=response.json()["usage"]["total_tokens"])

    The promises are the in-process budget's, over the fleet: one first-come-first-served
    queue in Redis for every client, whose first caller is admitted when every rate admits
    it and a permit is free, and only then charged, in every dimension at once; a task
    cancelled before its turn has spent nothing; settles give back what no later admission
    relied on. A turn's permit returns when it ends, and when its process is gone: a
    client renews a lease in Redis while it holds turns, and the turns of one whose lease
    lapses (10 s: killed, or cut off from Redis) end at their estimates.

    Decisions are made at the Redis server's clock. Each call is two round trips (read;
    write where the decision changes the budget); a waiter reads two counters between its
    asks. ``timeout`` (seconds, default 0.25) bounds each round trip: past it, or when
    Redis cannot be reached, the call raises ``RedisUnavailable`` and changes nothing (a
    budget fails closed). A value at the budget's key that is not this budget's (another
    application's, or a budget with other rates or another cap) raises ``RedisRejected``
    and is never overwritten. A Redis restart loses the budget: it starts whole again.
    Keys: ``<prefix>:{<name>}:budget`` and ``<prefix>:{<name>}:epochs`` (one hash tag:
    one slot of a cluster).
    """

    # Why a client could not renew its lease, in the log (``_FleetCommon._ended_found``).
    _LEASE_LAPSED = ": an event loop blocked, a process stopped, Redis out of reach; or "

    def __init__(
        self, client: Any, name: str, *, in_flight: Optional[int] = None,
        prefix: str = "paceline", timeout: float = 0.25, **rates: Rate
    ) -> None:
        if not _is_async_client(client):
            raise TypeError(
                "RedisBudget takes a redis-py asyncio client (redis.asyncio.Redis), got "
                f"{type(client).__name__}"
            )
        super().__init__(client, name, in_flight, prefix, timeout, rates)
        # The task that renews the lease while this client holds callers, per loop.
        self._renewers: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Task]" = (
            weakref.WeakKeyDictionary()
        )
        # Ends under way, kept alive until they land.
        self._ends: "set[asyncio.Task]" = set()
        # One transaction at a time per event loop (``_transact``).
        self._locks: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, tuple]" = (
            weakref.WeakKeyDictionary()
        )
        # The epochs' read shared by the waiters of each event loop (``_epochs``).
        self._epoch_reads: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, list]" = (
            weakref.WeakKeyDictionary()
        )
        self._wire()

    def _forked(self) -> None:
        self._renewers = weakref.WeakKeyDictionary()
        self._locks = weakref.WeakKeyDictionary()
        self._epoch_reads = weakref.WeakKeyDictionary()

    async def _call(self, args: tuple) -> Any:
        try:
            return await self._run(args, self._timeout)
        except Exception as e:
            raise _unanswered(e) from e

    async def _transact(self, decide: Decide, urgent: bool = False) -> Tuple[Any, Tuple[int, int, int]]:
        """``decide(value, secs, micros, owner) -> (result, write)`` on a fresh read, the
        write sent where it needs one; again from a new read where another client wrote
        first. The result and the epochs read. The tasks of one event loop take their
        turns at it one at a time: they would only overtake each other's writes (a
        hundred tasks arriving at once would each read and write up to a hundred
        times). An ``urgent`` one (the head's ask, an end) waits behind at most one other:
        the others queue on a lock of their own first."""
        loop = asyncio.get_running_loop()
        locks = self._locks.get(loop)
        if locks is None:
            locks = self._locks[loop] = (asyncio.Lock(), asyncio.Lock())
        turns, queue = locks
        if urgent:
            async with turns:
                return await self._transact_now(decide)
        async with queue:
            async with turns:
                return await self._transact_now(decide)

    async def _transact_now(self, decide: Decide) -> Tuple[Any, Tuple[int, int, int]]:
        for conflict in range(_MAX_CONFLICTS):
            result, write, epochs = self._decided(await self._call(self._read_args), decide)
            if write is None or int(await self._call(write)) == 1:
                return result, epochs
            if conflict >= 8:
                # Many clients at once: let the others through.
                await asyncio.sleep(0.0001 * (conflict % 8 + 1))
        raise _contended()

    async def _epochs(self) -> Tuple[int, int]:
        """The two epochs. The waiters of one event loop share their reads: one read in
        flight at a time, its answer good for ``_EPOCHS_FRESH`` (so a loop with hundreds
        of waiters reads them at most about every millisecond, not once per waiter)."""
        loop = asyncio.get_running_loop()
        shared = self._epoch_reads.get(loop)
        if shared is None:
            shared = self._epoch_reads[loop] = [None, None, 0.0]  # read, answer, when
        read, answer, when = shared
        if answer is not None and time.monotonic() - when < _EPOCHS_FRESH:
            return answer
        if read is None:
            read = shared[0] = loop.create_task(self._read_epochs(shared))
            # Retrieved by its waiters; if every one was cancelled, by no one.
            read.add_done_callback(lambda t: t.cancelled() or t.exception())
        return await asyncio.shield(read)

    async def _read_epochs(self, shared: list) -> Tuple[int, int]:
        try:
            shared[1], shared[2] = self._epochs_of(await self._call(self._read_epochs_args)), time.monotonic()
            return shared[1]
        finally:
            shared[0] = None

    def _hold(self) -> None:
        self._me()
        self._held += 1
        loop = asyncio.get_running_loop()
        renewer = self._renewers.get(loop)
        if renewer is None or renewer.done():
            self._renewers[loop] = loop.create_task(self._renew())

    def _release(self) -> None:
        self._held = max(self._held - 1, 0)

    async def _renew(self) -> None:
        while self._held > 0:
            await asyncio.sleep(FLEET_RENEW_EVERY)
            if self._held == 0:
                return
            try:
                await self._transact(self._renewal())
            except Exception:  # noqa: BLE001 - tried again next round; a lease outlasts three
                pass

    def _end_soon(
        self, ticket: int, cells: List[int], actual: Optional[list], turn: bool = True
    ) -> "asyncio.Future[None]":
        """Sends the end of caller ``ticket`` now, trying again until it lands (module
        docs); a future done when it has landed, or failed with ``RedisUnavailable`` once a
        try could not reach Redis (the end goes on trying)."""
        loop = asyncio.get_running_loop()
        landed: "asyncio.Future[None]" = loop.create_future()
        missed: "asyncio.Future[BaseException]" = loop.create_future()
        task = loop.create_task(self._end(ticket, cells, actual, landed, missed, turn))
        self._ends.add(task)
        task.add_done_callback(self._ends.discard)
        first = asyncio.ensure_future(self._first_tries(landed, missed))
        # An end nobody awaits: its failure is the end's own, still trying.
        first.add_done_callback(lambda f: f.cancelled() or f.exception())
        return first

    async def _first_tries(
        self, landed: "asyncio.Future[None]", missed: "asyncio.Future[BaseException]"
    ) -> None:
        # Queued behind other ends of this client is not a failure: only a try that
        # could not reach Redis is.
        await asyncio.wait((landed, missed), return_when=asyncio.FIRST_COMPLETED)
        if not landed.done():
            raise RedisUnavailable(
                "Redis unreachable or too slow: the turn's end is sent again until it lands"
            ) from missed.result()

    async def _end(
        self,
        ticket: int,
        cells: List[int],
        actual: Optional[list],
        landed: "asyncio.Future[None]",
        missed: "asyncio.Future[BaseException]",
        turn: bool,
    ) -> None:
        pause = _END_RETRY
        try:
            while True:
                try:
                    found, _ = await self._transact(self._ending(ticket, cells, actual), urgent=True)
                    self._ended_found(found, turn)
                    break
                except (RedisUnavailable, RedisLimitError) as e:
                    if isinstance(e, RedisRejected):
                        break  # Redis answered: it will not take it
                    if not missed.done():
                        missed.set_result(e)
                    await asyncio.sleep(pause)
                    pause = min(pause * 2, _END_RETRY_MAX)
        finally:
            self._release()
            if not landed.done():
                landed.set_result(None)

    async def _ended(self, ending: "asyncio.Future[None]") -> None:
        """Waits for an end at the end of an ``async with`` block: never raises for
        Redis (the end goes on trying)."""
        try:
            await ending
        except RedisLimitError:
            pass

    def acquire(self, *, timeout: Optional[float] = None, **costs: int) -> _FleetAcquiring:
        """Waits this task's turn for ``costs`` in the fleet's queue: ``async with
        budget.acquire(tokens=n) as turn:`` (released at the end unless settled) or ``turn
        = await budget.acquire(...)``. With ``timeout`` (seconds), raises ``TimeoutError``
        at once, booking nothing, if the turn is further away by the rates as they stand,
        and gives the place up if it has not come when the timeout passes. ``ValueError``
        for a dimension the budget does not have, or a cost above its burst."""
        return _FleetAcquiring(self, _costs(costs), _timeout(timeout))

    async def _wait(self, costs: List[Tuple[str, int]], timeout: Optional[float]) -> FleetTurn:
        cells = self._core.cells(costs)
        waiter = self._core.waiter(cells, timeout)
        self._hold()
        slow = tell_when_slow(f"the fleet budget {self._name!r}")
        try:
            while True:
                try:
                    _, epochs = await self._transact(self._asking(waiter), waiter.urgent())
                except _Contended:
                    await asyncio.sleep(0.001)
                    continue
                ticket, again = self._answer(waiter, epochs)
                if ticket is not None:
                    return FleetTurn(self, ticket, cells)
                while again is not None:
                    await asyncio.sleep(again)
                    again = self._looked(waiter, await self._epochs())
        except BaseException:
            # Cancelled, a deadline, Redis gone: the place is given up (in the
            # background), nothing was spent.
            ticket = waiter.ticket()
            if ticket is None:
                self._release()
            else:
                # Given up before the task ends, as a rule: an event loop that is ending
                # (asyncio.run cancelling what is left) would not run an end sent after.
                leaving = self._end_soon(ticket, cells, None, turn=False)
                try:
                    await asyncio.wait((leaving,), timeout=self._timeout * 4)
                except BaseException:  # noqa: BLE001 - cancelled again: it goes on alone
                    pass
            raise
        finally:
            slow.cancel()

    async def try_acquire(self, **costs: int) -> Optional[FleetTurn]:
        """A turn now, or ``None`` (someone waits ahead, a rate or the cap says not yet);
        never waits."""
        cells = self._core.cells(_costs(costs))
        self._hold()
        decide, seen = self._trying(cells)
        try:
            ticket, _ = await self._transact(decide)
        except BaseException:
            if seen:
                leaving = self._end_soon(seen[-1], cells, None, turn=False)
                try:
                    await asyncio.wait((leaving,), timeout=self._timeout * 4)
                except BaseException:  # noqa: BLE001 - cancelled again: it goes on alone
                    pass
            else:
                self._release()
            raise
        if ticket is None:
            self._release()
            return None
        return FleetTurn(self, ticket, cells)

    async def _look(self) -> Tuple[int, int, List[int]]:
        result, _ = await self._transact(self._core.look)
        return result

    async def remaining(self, name: str) -> int:
        """Cells of ``name`` its rate would admit right now over the fleet; spends
        nothing."""
        index = self._index(name)
        return (await self._look())[2][index]

    async def in_flight(self) -> int:
        """Turns admitted and not yet ended, over the fleet."""
        return (await self._look())[0]

    async def waiting(self) -> int:
        """Callers waiting in the queue, over the fleet."""
        return (await self._look())[1]

    async def wait_time(self, **costs: int) -> float:
        """Seconds a turn of ``costs`` would wait for its rates if asked for now
        (``inf``: never); spends nothing."""
        result, _ = await self._transact(self._timing(costs))
        return result

    async def follow(self, status: int, headers: Any, *, max_hold: float = 300.0) -> int:
        """Steers the budget by what a response said, for the whole fleet: as
        ``paceline.Budget.follow``. Returns how many of its dimensions the response
        reported."""
        result, _ = await self._transact(self._following(status, headers, max_hold), urgent=True)
        return result

    async def hold_for(self, seconds: float) -> None:
        """Admits nothing for ``seconds`` from now, over the fleet (a longer hold already
        in force stays)."""
        await self._transact(self._holding(seconds))
