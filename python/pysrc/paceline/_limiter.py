"""``Limiter``: one quota for coroutines on any event loop and plain threads."""

from __future__ import annotations

import os
from typing import Awaitable, Dict, Optional, Union

from ._args import _MAX_COUNT, _count, _hold_seconds, _quota, _timeout
from ._blocking import _would_wait, warn_if_on_a_loop
from ._in_file import _PICKLE_HINT, _file_args, _file_path, _InAFile, _set_core
from ._paceline import new_core, new_shared_core


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


class Limiter(_InAFile):
    """``rate`` cells per ``per`` seconds, at most ``burst`` at once (default: ``rate``;
    ``burst=1`` paces one at a time). At most ``burst + w * rate / per`` pass in any
    window of ``w`` seconds.

    One limiter serves coroutines on any number of event loops and plain threads at once,
    in one first-come-first-served queue. ``execution_bound`` (default True) also bounds
    the moment work runs, after event-loop stalls (see the module docs).
    """

    _attach = staticmethod(_attach_limiter)
    _refusal = _PICKLE_HINT.format("Limiter")

    def __init__(
        self, rate: int, per: float = 1.0, burst: Optional[int] = None, *, execution_bound: bool = True
    ) -> None:
        rate, per, burst = _quota(rate, per, burst)
        _set_core(self, Limiter, new_core(rate, per, burst, bool(execution_bound)), None)

    @classmethod
    def shared(
        cls, path: "os.PathLike[str] | str", rate: int, per: float = 1.0, burst: Optional[int] = None,
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
        path, uid, gid = _file_args(path, trust_user, trust_group)
        self = cls.__new__(cls)
        core = new_shared_core(path, rate, per, burst, bool(execution_bound), on_mismatch, uid, gid)
        _set_core(self, Limiter, core, (path, rate, per, burst, bool(execution_bound), uid, gid))
        return self

    path = property(_file_path, doc="The file of a shared limiter; ``None`` in-process.")

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
        return self._core.try_acquire(n)

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

    def acquire(self, n: int = 1, timeout: Optional[float] = None) -> Awaitable[None]:
        """Waits this task's booked turn for ``n`` cells: ``await limiter.acquire()``.

        When the cells fit now and nobody waits ahead, the call itself takes them and
        returns an awaitable that completes at once (a coroutine to ``asyncio``: a task
        or ``asyncio.run`` takes it too). Otherwise it returns a coroutine that books
        the turn when awaited. With ``timeout`` (seconds), books nothing and raises
        ``TimeoutError`` at once if the turn is further away than that. Cancelled while
        it waits, the cells go back.
        """
        return self._core.acquire(n, timeout)

    async def _acquire(self, n: object, timeout: object) -> None:
        """``acquire`` that was not admitted in the call: checks the arguments (their
        errors raise here, when awaited), then takes the cells or waits a booked turn."""
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
        timeout = _timeout(timeout)
        warn_if_on_a_loop(lambda: _would_wait(self._core.wait_time(n), timeout), "`await limiter.acquire()`")
        self._core.acquire_blocking(n, timeout)

    def set_quota(self, rate: int, per: float = 1.0, burst: Optional[int] = None) -> None:
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
