"""An event loop of the process's own, on a daemon thread, for sync servers (WSGI,
Flask, Django's sync views): the limits kept in Redis run their ``redis.asyncio`` calls
there, while the request's thread waits for the answer. One decision for both kinds of
server (``flow``), and one Redis client type.

Made on first use in each process (a worker forked by gunicorn after the app was
imported gets its own), so nothing runs before a server forks.
"""

from __future__ import annotations

import asyncio
import os
import threading
from typing import Any, Awaitable, Optional, Tuple

_lock = threading.Lock()
_loop: Optional[Tuple[int, asyncio.AbstractEventLoop]] = None


def _running() -> asyncio.AbstractEventLoop:
    global _loop
    with _lock:
        if _loop is not None and _loop[0] == os.getpid():
            return _loop[1]
        loop = asyncio.new_event_loop()
        ready = threading.Event()

        def serve() -> None:
            asyncio.set_event_loop(loop)
            loop.call_soon(ready.set)
            loop.run_forever()

        threading.Thread(target=serve, name="paceline-redis", daemon=True).start()
        ready.wait()
        _loop = (os.getpid(), loop)
        return loop


def run(coroutine: Awaitable[Any]) -> Any:
    """Runs ``coroutine`` on the process's bridge loop and blocks this thread for its
    result (or its exception). Interrupted (a signal's exception, a worker's timeout), it
    cancels the coroutine, which gives back what it booked, and waits for that."""
    future = asyncio.run_coroutine_threadsafe(coroutine, _running())  # type: ignore[arg-type]
    try:
        return future.result()
    except BaseException:
        if not future.done():
            future.cancel()
            try:
                future.result(timeout=5.0)
            except BaseException:  # noqa: BLE001 - cancelled, as asked
                pass
        raise
