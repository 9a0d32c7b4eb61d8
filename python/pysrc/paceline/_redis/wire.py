"""How paceline.redis's asyncio classes talk to Redis: scripts by their SHA-1 (sent
again as text where the server lost them), each call bounded in time, a client's idle
connections closed when the event loop they belong to has gone."""

from __future__ import annotations

import asyncio
import hashlib
import os
import weakref
from typing import Any, Dict, Optional, Union

from .._paceline import BUDGET_READ_SCRIPT, BUDGET_WRITE_SCRIPT
from .core import (
    _DECIDE_SHA_B,
    _REFUND_SHA,
    _REFUND_TIMEOUT,
    _UNCANCEL,
    DECIDE_SCRIPT,
    REFUND_SCRIPT,
    _rexc,
    _Watchdog,
)

BUDGET_READ_SHA = hashlib.sha1(BUDGET_READ_SCRIPT.encode()).hexdigest().encode()
BUDGET_WRITE_SHA = hashlib.sha1(BUDGET_WRITE_SCRIPT.encode()).hexdigest().encode()

# Each script by its SHA-1, as text and as bytes (as the callers send it).
_SCRIPTS: Dict[Union[str, bytes], str] = {}
for _sha, _text in (
    (_DECIDE_SHA_B, DECIDE_SCRIPT),
    (_REFUND_SHA.encode(), REFUND_SCRIPT),
    (BUDGET_READ_SHA, BUDGET_READ_SCRIPT),
    (BUDGET_WRITE_SHA, BUDGET_WRITE_SCRIPT),
):
    _SCRIPTS[_sha] = _SCRIPTS[_sha.decode()] = _text


class _AsyncWire:
    """Calls on a redis-py asyncio client (``self._client``), each within its bound
    (``self._timeout`` for most)."""

    _client: Any
    _timeout: float

    def _wire(self) -> None:
        # The loop of the latest first call on a loop (``_new_loop``).
        self._last_loop: "Optional[weakref.ref[asyncio.AbstractEventLoop]]" = None
        # The timer that bounds calls, per event loop (a client serves one loop; a loop
        # that ends takes its entry with it).
        self._watchdogs: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Watchdog]" = (
            weakref.WeakKeyDictionary()
        )

    async def _send(self, args: tuple) -> Any:
        """The script's answer; a server without it in its cache (``NOSCRIPT``) gets the
        script itself, which loads it again."""
        execute = self._client.execute_command
        try:
            return await execute(*args)
        except _rexc.NoScriptError:
            return await execute("EVAL", _SCRIPTS[args[1]], *args[2:])

    async def _new_loop(self, loop: asyncio.AbstractEventLoop) -> None:
        """This limiter's first call on ``loop``. Where the loop it ran on before is closed
        (a framework's test client runs each block on a loop of its own, with a client
        made at import), the client's idle connections belong to that loop and would fail
        their next call after sending it: they are closed first, so the next call opens one
        on this loop."""
        previous, self._last_loop = self._last_loop, weakref.ref(loop)
        pid, self._last_pid = getattr(self, "_last_pid", None), os.getpid()
        if pid is not None and pid != self._last_pid:
            # A process forked from the one that used the client (gunicorn --preload,
            # after a call at import): the connections are the parent's. Forget them,
            # without closing what the parent still uses, as redis-py does after a fork.
            pool = getattr(self._client, "connection_pool", None)
            if pool is not None and hasattr(pool, "reset"):
                pool.reset()
                if isinstance(getattr(pool, "_lock", None), asyncio.Lock):
                    pool._lock = asyncio.Lock()  # bound to the parent's loop once contended
            return
        if previous is None:
            return  # the first loop it runs on
        last = previous()
        if last is not None and not last.is_closed():
            return  # that loop still runs: its connections are its own
        pool = getattr(self._client, "connection_pool", None)
        if pool is not None:
            try:
                await pool.disconnect(inuse_connections=False)
            except Exception:  # noqa: BLE001 - a transport of a closed loop may refuse
                pass

    async def _run(self, args: tuple, seconds: float) -> Any:
        """``_send`` within ``seconds``: past them, ``asyncio.TimeoutError``. The bound
        is kept by one timer per event loop for every call in flight (``_Watchdog``), not
        by a timer per call: ``asyncio.timeout`` costs more than a tenth of a loopback
        round trip, and this is every check's path."""
        loop = asyncio.get_running_loop()
        watchdog = self._watchdogs.get(loop)
        if watchdog is None:
            await self._new_loop(loop)
            # A quarter of the shortest bound it keeps (a call's, or a refund's).
            watchdog = self._watchdogs[loop] = _Watchdog(min(self._timeout, _REFUND_TIMEOUT) / 4)
        task = asyncio.current_task()
        watchdog.watch(loop, task, loop.time() + seconds)
        try:
            return await self._send(args)
        except asyncio.CancelledError:
            if task not in watchdog.expired:
                raise  # someone else's cancellation
            watchdog.expired.discard(task)
            # Before 3.11 a cancellation by someone else at the same moment cannot be told
            # apart, and is taken for the timeout.
            if _UNCANCEL and task.uncancel() > 0:  # type: ignore[union-attr]
                raise  # cancelled by someone else as well
            raise asyncio.TimeoutError(f"no answer from Redis within {seconds} s") from None
        finally:
            del watchdog.calls[task]
            if watchdog.expired:
                watchdog.expired.discard(task)
