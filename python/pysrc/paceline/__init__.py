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

from ._paceline import MAX_CAPACITY, MAX_HOLD, TABLE_FULL

from ._limiter import Limiter, _attach_limiter
from ._keyed import KeyedLimiter, _attach_keyed_limiter
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
