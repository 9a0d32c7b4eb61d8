"""``KeyedLimiter``: one quota per key, each key exactly like its own ``Limiter``."""

from __future__ import annotations

import os
from typing import Awaitable, Dict, Optional, Union

from ._args import _MAX_COUNT, _capacity, _count, _hold_seconds, _quota, _timeout
from ._blocking import _would_wait, warn_if_on_a_loop
from ._in_file import _PICKLE_HINT, _file_args, _file_path, _InAFile, _set_core
from ._paceline import new_keyed_core, new_shared_keyed_core
from ._waiting import _when_room


def _attach_keyed_limiter(  # type: ignore[no-untyped-def]
    path, rate, per, burst, capacity, execution_bound, uid=None, gid=None
):
    """Unpickles a shared keyed limiter: the same file, whatever quota it holds now."""
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


class KeyedLimiter(_InAFile):
    """One quota per key (a ``str``: a client, a tenant, an endpoint), each key exactly
    like its own ``Limiter`` (the burst defaults to ``rate``); ``max_keys`` bounds the keys stored, and a key longer than
    64 bytes is stored as a 128-bit digest of itself (seeded per process), so a client
    that sends a 1 MB key costs no more memory than one that sends a short one."""

    _attach = staticmethod(_attach_keyed_limiter)
    _refusal = _PICKLE_HINT.format("KeyedLimiter")

    def __init__(
        self,
        rate: int,
        per: float = 1.0,
        burst: Optional[int] = None,
        *,
        execution_bound: bool = True,
        max_keys: Optional[int] = None,
    ) -> None:
        rate, per, burst = _quota(rate, per, burst)
        if max_keys is not None:
            max_keys = _count("max_keys", max_keys, 1)
        _set_core(self, KeyedLimiter, new_keyed_core(rate, per, burst, bool(execution_bound), max_keys), None)

    @classmethod
    def shared(
        cls, path: "os.PathLike[str] | str", rate: int, per: float = 1.0, burst: Optional[int] = None,
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
        path, uid, gid = _file_args(path, trust_user, trust_group)
        self = cls.__new__(cls)
        core = new_shared_keyed_core(
            path, rate, per, burst, bool(execution_bound), capacity, on_mismatch, uid, gid
        )
        shared = (path, rate, per, burst, capacity, bool(execution_bound), uid, gid)
        _set_core(self, KeyedLimiter, core, shared)
        return self

    path = property(_file_path, doc="The file of a shared limiter; ``None`` in-process.")

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
        the key spent nothing. With the execution bound, an in-process limiter keeps the
        execution cells in a table of their own, which may have no room for a key the
        booking table holds: ``TABLE_FULL`` too, unless the key's quota is spent (False)."""
        return self._core.try_acquire(key, n)

    def remaining(self, key: str) -> int:
        """Cells of ``key`` a ``try_acquire`` would get right now."""
        return self._core.remaining(self._key(key))

    def wait_time(self, key: str, n: int = 1) -> float:
        """Seconds until ``n`` cells of ``key`` would be admitted (0.0: now)."""
        return self._core.wait_time(self._key(key), _count("n", n, 0))

    def acquire(
        self, key: str, n: int = 1, timeout: Optional[float] = None
    ) -> Awaitable[None]:
        """Waits this task's booked turn for ``n`` cells of ``key``:
        ``await keyed.acquire(key)`` (see ``Limiter.acquire``: when the cells fit now,
        the call itself takes them)."""
        return self._core.acquire(key, n, timeout)

    async def _acquire(self, key: object, n: object, timeout: object) -> None:
        """``acquire`` that was not admitted in the call (see ``Limiter._acquire``)."""
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
        timeout = _timeout(timeout)
        warn_if_on_a_loop(lambda: _would_wait(self._core.wait_time(key, n), timeout), "`await limiter.acquire(key)`")
        self._core.acquire_blocking(key, n, timeout)

    def set_quota(self, rate: int, per: float = 1.0, burst: Optional[int] = None) -> None:
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
