"""Rate limiting for asyncio and threads, on one limiter.

"100 calls per second to an API, however long each call takes"::

    import asyncio, paceline

    limiter = paceline.Limiter(100, per=1.0, burst=1)

    async def call(i):
        async with limiter:          # a booked turn, first come first served
            await fake_api(i)

    asyncio.run(asyncio.gather(*(call(i) for i in range(300))))

Every caller books its turn in the limiter's queue (in Rust, the same queue for every
thread and event loop), so turns are first come, first served, heavy requests included,
never early; a task cancelled while it waits gives its cells back and the queue moves
up. An event loop only sleeps until the next turn it holds (one timer per limiter and
loop). By default the limiter also bounds the moment the work *runs*: a task that
resumes late (a loop that stalled) takes its cells again from an execution cell and
waits if the quota is used up there, so work never runs faster than the quota.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import os
import threading
import time
import weakref
from typing import Dict, List, Optional, Tuple, Union

from ._paceline import (
    MAX_CAPACITY,
    MAX_HOLD,
    TABLE_FULL,
    NoRoom,
    Ticket,
    new_core,
    new_keyed_core,
    new_shared_core,
    new_shared_keyed_core,
)

from ._budget import Budget, Rate, Turn

__all__ = [
    "Limiter",
    "KeyedLimiter",
    "Budget",
    "Rate",
    "Turn",
    "TABLE_FULL",
    "MAX_CAPACITY",
    "MAX_HOLD",
]

_PICKLE_HINT = (
    "cannot pickle an in-process paceline.{0}: a copy in another process would be a "
    "limiter of its own, letting the quota through once per process. To share one quota "
    "across processes (multiprocessing, a ProcessPoolExecutor, gunicorn workers), use "
    "paceline.{0}.shared(path, ...): it pickles as its path and quota."
)


# The largest count of cells the Rust core takes (a u32).
_MAX_COUNT = 0xFFFF_FFFF


def _count(name: str, value: object, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if not minimum <= value <= _MAX_COUNT:
        raise ValueError(f"{name} must be between {minimum} and {_MAX_COUNT}, got {value}")
    return value


def _timeout(value: object) -> Optional[float]:
    """A timeout in seconds; ``None`` or infinity (as for ``asyncio.wait_for``) is none."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(
            f"timeout must be None or a number of seconds, got {type(value).__name__}"
        )
    value = float(value)
    if value == float("inf"):
        return None
    if not value >= 0.0:
        raise ValueError(f"timeout must be None or a number of seconds >= 0, got {value}")
    return value


def _hold_seconds(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"seconds must be a number, got {type(value).__name__}")
    value = float(value)
    if not 0.0 <= value < float("inf"):
        raise ValueError(f"seconds must be a finite number >= 0, got {value}")
    return value


def _path(path: object) -> str:
    """A shared file's path as the Rust side opens it, made absolute now: a limiter
    unpickled under another working directory opens the same file."""
    if not isinstance(path, (str, bytes, os.PathLike)):
        raise TypeError(
            f"path must be a str, bytes or os.PathLike, got {type(path).__name__}"
        )
    return os.path.abspath(os.fsdecode(os.fspath(path)))


def _trusted(name: str, value: object, lookup) -> Optional[int]:  # type: ignore[no-untyped-def]
    """A user or group the caller trusts, by id (int) or name (str)."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise TypeError(f"{name} must be an int id or a str name, got bool")
    if isinstance(value, int):
        if not 0 <= value <= _MAX_COUNT:
            raise ValueError(f"{name} must be an id between 0 and {_MAX_COUNT}, got {value}")
        return value
    if isinstance(value, str):
        try:
            return lookup(value)
        except KeyError:
            raise ValueError(f"{name}: no such {name.split('_')[1]} {value!r}") from None
    raise TypeError(f"{name} must be an int id or a str name, got {type(value).__name__}")


def _uid(name: str) -> int:
    import pwd

    return pwd.getpwnam(name).pw_uid


def _gid(name: str) -> int:
    import grp

    return grp.getgrnam(name).gr_gid


def _capacity(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"capacity must be an int, got {type(value).__name__}")
    if not 1 <= value <= MAX_CAPACITY:
        raise ValueError(f"capacity must be between 1 and {MAX_CAPACITY} keys, got {value}")
    return value


def _quota(rate: object, per: object, burst: object) -> Tuple[int, float, int]:
    rate = _count("rate", rate, 1)
    if isinstance(per, bool) or not isinstance(per, (int, float)):
        raise TypeError(f"per must be a number of seconds, got {type(per).__name__}")
    per = float(per)
    if not 0.0 < per < float("inf"):
        raise ValueError(f"per must be a positive, finite number of seconds, got {per}")
    burst = _count("burst", burst, 1)
    return rate, per, burst


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


class Limiter:
    """``rate`` cells per ``per`` seconds, at most ``burst`` at once.

    One limiter serves coroutines on any number of event loops and plain threads at once,
    in one first-come-first-served queue. ``execution_bound`` (default True) also bounds
    the moment work runs, after event-loop stalls (see the module docs).
    """

    def __init__(
        self, rate: int, per: float = 1.0, burst: int = 1, *, execution_bound: bool = True
    ) -> None:
        rate, per, burst = _quota(rate, per, burst)
        self._core = new_core(rate, per, burst, bool(execution_bound))
        self._waiting = _Waiting()
        self._shared: Optional[tuple] = None

    @classmethod
    def shared(
        cls,
        path: "os.PathLike[str] | str",
        rate: int,
        per: float = 1.0,
        burst: int = 1,
        *,
        execution_bound: bool = True,
        on_mismatch: str = "refuse",
        trust_user: "int | str | None" = None,
        trust_group: "int | str | None" = None,
    ) -> "Limiter":
        """One limiter for every process of the host that opens ``path`` (a ``str``,
        ``bytes`` or ``os.PathLike``): gunicorn and uvicorn workers, ``multiprocessing``
        pools (fork or spawn), scripts started separately. Its state lives in that file
        (``/dev/shm/...`` keeps it in memory on Linux). Every method works as for an
        in-process limiter, and turns are first come, first served across the processes.

        Whoever can write the file can spend the quota or break it, so a file is opened
        only if this process's user owns it and no one else can write it (or its owner is
        ``trust_user`` / its group ``trust_group``, each an id or a name), never through a
        symbolic link, and new files are private to their owner (``0600``; ``0660`` and
        the trusted group's with ``trust_group``). Anything else at the path raises
        ``PermissionError`` or ``ValueError`` saying whose it is and what to do, and is
        left as it is.

        A file that already holds another quota raises ``ValueError`` naming both, unless
        ``on_mismatch`` is ``"adopt"`` (use the file's) or ``"replace"`` (set this one for
        every process). A shared limiter pickles as its absolute path and quota:
        unpickled in another process, it opens the same file (adopting its quota)."""
        rate, per, burst = _quota(rate, per, burst)
        path = _path(path)
        uid = _trusted("trust_user", trust_user, _uid)
        gid = _trusted("trust_group", trust_group, _gid)
        self = cls.__new__(cls)
        self._core = new_shared_core(
            path, rate, per, burst, bool(execution_bound), on_mismatch, uid, gid
        )
        self._waiting = _Waiting()
        self._shared = (path, rate, per, burst, bool(execution_bound), uid, gid)
        return self

    @property
    def path(self) -> Optional[str]:
        """The file of a shared limiter; ``None`` in-process."""
        return None if self._shared is None else self._shared[0]

    def __reduce__(self) -> tuple:
        if self._shared is None:
            raise TypeError(_PICKLE_HINT.format("Limiter"))
        return (_attach_limiter, self._shared)

    @classmethod
    def per_second(cls, rate: int, burst: Optional[int] = None, **kw: bool) -> "Limiter":
        """``rate`` per second; the burst defaults to ``rate``, as in the Rust crate."""
        return cls(rate, 1.0, rate if burst is None else burst, **kw)

    @classmethod
    def per_minute(cls, rate: int, burst: Optional[int] = None, **kw: bool) -> "Limiter":
        """``rate`` per minute; the burst defaults to ``rate``."""
        return cls(rate, 60.0, rate if burst is None else burst, **kw)

    @classmethod
    def per_hour(cls, rate: int, burst: Optional[int] = None, **kw: bool) -> "Limiter":
        """``rate`` per hour; the burst defaults to ``rate``."""
        return cls(rate, 3600.0, rate if burst is None else burst, **kw)

    @property
    def burst(self) -> int:
        """The most cells ever admitted at once."""
        return self._core.burst()

    def try_acquire(self, n: int = 1) -> bool:
        """Takes ``n`` cells now if they fit and nobody waits ahead; never waits."""
        if n.__class__ is int and 0 <= n <= _MAX_COUNT:
            return self._core.try_acquire(n)
        return self._core.try_acquire(_count("n", n, 0))

    def remaining(self) -> int:
        """Cells a ``try_acquire`` would get right now; spends nothing."""
        return self._core.remaining()

    def stats(self) -> Dict[str, Union[int, float]]:
        """What this limiter object's calls came to, since it was made: ``admitted`` (at
        once), ``waited`` (admitted after waiting a turn; a waiter cancelled before its
        turn counts too), ``refused`` (``try_acquire`` returning False, a ``timeout`` the
        turn was beyond), ``wait_seconds_total`` and ``wait_seconds_max`` of the waited
        ones. A shared limiter counts this process's calls."""
        return self._core.stats()

    def wait_time(self, n: int = 1) -> float:
        """Seconds until ``n`` cells would be admitted (0.0: now); spends nothing."""
        return self._core.wait_time(_count("n", n, 0))

    async def acquire(self, n: int = 1, timeout: Optional[float] = None) -> None:
        """Waits this task's booked turn for ``n`` cells.

        With ``timeout`` (seconds), books nothing and raises ``TimeoutError`` at once if
        the turn is further away than that. Cancelled while it waits, the cells go back.
        """
        core = self._core
        if n.__class__ is not int or not 0 <= n <= _MAX_COUNT:
            n = _count("n", n, 0)
        if timeout is not None:
            timeout = _timeout(timeout)
        # Room now, and nobody waiting ahead: no booking, no sleep.
        if core.acquire_now(n):
            return
        await self._waiting.wait(core.book(n, timeout))
        run = core.run(n)
        if run is not None:
            await self._waiting.wait(run)

    def acquire_blocking(self, n: int = 1, timeout: Optional[float] = None) -> None:
        """Blocks this thread (the GIL released) for its booked turn for ``n`` cells,
        with the same ``timeout`` rule as ``acquire``."""
        n = _count("n", n, 0)
        self._core.acquire_blocking(n, _timeout(timeout))

    def set_quota(self, rate: int, per: float = 1.0, burst: int = 1) -> None:
        """Changes the quota while running: what was spent stays spent, waiters keep
        their places in the queue."""
        rate, per, burst = _quota(rate, per, burst)
        self._core.set_quota(rate, per, burst)
        self._waiting.moved()

    def hold(self, seconds: float) -> None:
        """Holds every turn back for ``seconds`` (what an upstream's ``Retry-After``
        asks): nothing is admitted before then, booked turns included; they move to the
        end of the hold together, in their order and spaced, never as one burst. A shared
        limiter's hold lives in its file, past the process that set it: at most
        ``MAX_HOLD`` seconds (``ValueError`` beyond), and ``reset()`` ends it."""
        self._core.hold(_hold_seconds(seconds))
        self._waiting.moved()

    def reset(self) -> None:
        """A shared limiter's operator action: forgets what was spent and any hold, for
        every process (turns already booked keep their instants). ``TypeError`` for an
        in-process limiter, whose state ends with it."""
        self._core.reset()
        self._waiting.moved()

    async def __aenter__(self) -> "Limiter":
        await self.acquire(1)
        return self

    async def __aexit__(self, *exc: object) -> None:
        return None

    def __enter__(self) -> "Limiter":
        self.acquire_blocking(1)
        return self

    def __exit__(self, *exc: object) -> None:
        return None


class KeyedLimiter:
    """One quota per key (a ``str``: a client, a tenant, an endpoint), each key exactly
    like its own ``Limiter``; ``max_keys`` bounds the keys stored, and a key longer than
    64 bytes is stored as a 128-bit digest of itself (seeded per process), so a client
    that sends a 1 MB key costs no more memory than one that sends a short one."""

    def __init__(
        self,
        rate: int,
        per: float = 1.0,
        burst: int = 1,
        *,
        execution_bound: bool = True,
        max_keys: Optional[int] = None,
    ) -> None:
        rate, per, burst = _quota(rate, per, burst)
        if max_keys is not None:
            max_keys = _count("max_keys", max_keys, 1)
        self._core = new_keyed_core(rate, per, burst, bool(execution_bound), max_keys)
        self._waiting = _Waiting()
        self._shared: Optional[tuple] = None

    @classmethod
    def shared(
        cls,
        path: "os.PathLike[str] | str",
        rate: int,
        per: float = 1.0,
        burst: int = 1,
        *,
        capacity: int = 65_536,
        execution_bound: bool = True,
        on_mismatch: str = "refuse",
        trust_user: "int | str | None" = None,
        trust_group: "int | str | None" = None,
    ) -> "KeyedLimiter":
        """A quota per key for every process of the host that opens ``path`` (see
        ``Limiter.shared``, whose rules on whom a file is opened for apply), in a table
        made for ``capacity`` keys when the file is made (1 to ``MAX_CAPACITY``; 64 bytes
        per key of capacity). The table stores at least ``capacity`` keys still limited;
        a key whose quota has refilled gives its slot to the next new key. A new key the
        table has no room for is never reported as a spent quota: ``try_acquire`` returns
        ``TABLE_FULL`` (false in a condition, ``is paceline.TABLE_FULL`` to tell), and
        ``acquire`` waits until room frees; no limited key is evicted. Keys are stored as
        a 128-bit digest, so they cost the same whatever their length."""
        rate, per, burst = _quota(rate, per, burst)
        capacity = _capacity(capacity)
        path = _path(path)
        uid = _trusted("trust_user", trust_user, _uid)
        gid = _trusted("trust_group", trust_group, _gid)
        self = cls.__new__(cls)
        self._core = new_shared_keyed_core(
            path, rate, per, burst, bool(execution_bound), capacity, on_mismatch, uid, gid
        )
        self._waiting = _Waiting()
        self._shared = (path, rate, per, burst, capacity, bool(execution_bound), uid, gid)
        return self

    @property
    def path(self) -> Optional[str]:
        """The file of a shared limiter; ``None`` in-process."""
        return None if self._shared is None else self._shared[0]

    def __reduce__(self) -> tuple:
        if self._shared is None:
            raise TypeError(_PICKLE_HINT.format("KeyedLimiter"))
        return (_attach_keyed_limiter, self._shared)

    @staticmethod
    def _key(key: object) -> str:
        if not isinstance(key, str):
            raise TypeError(f"key must be a str, got {type(key).__name__}")
        return key

    @property
    def burst(self) -> int:
        """The most cells ever admitted at once, per key."""
        return self._core.burst()

    def __len__(self) -> int:
        return len(self._core)

    def stats(self) -> Dict[str, Union[int, float]]:
        """``Limiter.stats``'s counts over every key, and ``keys``, the keys stored."""
        return self._core.stats()

    def try_acquire(self, key: str, n: int = 1) -> bool:
        """Takes ``n`` cells of ``key`` now if they fit and nobody waits ahead: True, or
        a false value: False, or ``TABLE_FULL`` when ``key`` is new and the limiter has no
        room to store it (``max_keys`` reached, or a shared table full of limited keys):
        the key spent nothing."""
        return self._core.try_acquire(self._key(key), _count("n", n, 0))

    def remaining(self, key: str) -> int:
        """Cells of ``key`` a ``try_acquire`` would get right now."""
        return self._core.remaining(self._key(key))

    def wait_time(self, key: str, n: int = 1) -> float:
        """Seconds until ``n`` cells of ``key`` would be admitted (0.0: now)."""
        return self._core.wait_time(self._key(key), _count("n", n, 0))

    async def acquire(self, key: str, n: int = 1, timeout: Optional[float] = None) -> None:
        """Waits this task's booked turn for ``n`` cells of ``key`` (see
        ``Limiter.acquire``)."""
        core = self._core
        if key.__class__ is not str:
            key = self._key(key)
        if n.__class__ is not int or not 0 <= n <= _MAX_COUNT:
            n = _count("n", n, 0)
        if timeout is not None:
            timeout = _timeout(timeout)
        if core.acquire_now(key, n):
            return
        await self._waiting.wait(await _when_room(lambda t: core.book(key, n, t), timeout))
        run = await _when_room(lambda _: core.run(key, n), None)
        if run is not None:
            await self._waiting.wait(run)

    def acquire_blocking(self, key: str, n: int = 1, timeout: Optional[float] = None) -> None:
        """Blocks this thread (the GIL released) for its booked turn."""
        key = self._key(key)
        n = _count("n", n, 0)
        self._core.acquire_blocking(key, n, _timeout(timeout))

    def set_quota(self, rate: int, per: float = 1.0, burst: int = 1) -> None:
        """Changes every key's quota while running."""
        rate, per, burst = _quota(rate, per, burst)
        self._core.set_quota(rate, per, burst)
        self._waiting.moved()

    def hold(self, key: str, seconds: float) -> None:
        """Holds every turn of ``key`` back for ``seconds`` (see ``Limiter.hold``)."""
        self._core.hold(self._key(key), _hold_seconds(seconds))
        self._waiting.moved()

    def reset(self, key: str) -> None:
        """A shared limiter's operator action: forgets what ``key`` spent and any hold
        on it (see ``Limiter.reset``)."""
        self._core.reset(self._key(key))
        self._waiting.moved()


def _attach_limiter(path, rate, per, burst, execution_bound, uid=None, gid=None):  # type: ignore[no-untyped-def]
    """Unpickles a shared limiter: the same file, whatever quota it holds now."""
    return Limiter.shared(
        path,
        rate,
        per,
        burst,
        execution_bound=execution_bound,
        on_mismatch="adopt",
        trust_user=uid,
        trust_group=gid,
    )


def _attach_keyed_limiter(  # type: ignore[no-untyped-def]
    path, rate, per, burst, capacity, execution_bound, uid=None, gid=None
):
    return KeyedLimiter.shared(
        path,
        rate,
        per,
        burst,
        capacity=capacity,
        execution_bound=execution_bound,
        on_mismatch="adopt",
        trust_user=uid,
        trust_group=gid,
    )
