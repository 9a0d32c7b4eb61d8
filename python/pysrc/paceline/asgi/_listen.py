"""Listening to a request while it waits: the body read meanwhile is kept (up to a
buffer) for the app, and a client that goes away cancels the wait."""

from __future__ import annotations

import asyncio
from typing import Any, Awaitable, Callable, List, MutableMapping, Optional, Tuple

Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]


async def watching(
    turn: Awaitable[Any], receive: Receive, buffer: int
) -> Tuple[Optional[Any], List[Message]]:
    """Awaits ``turn`` while listening for the client going away: the messages read
    meanwhile (the request's body) are kept for the app; once more than ``buffer`` bytes
    of body are kept, nothing more is read until the turn comes (the server's
    backpressure holds the rest, and a client that leaves then is noticed by the app). A
    disconnect cancels the turn (which gives its booking back) and returns ``None``."""
    kept: List[Message] = []

    async def listen() -> bool:
        """True when the client went away; False once the buffer is full."""
        held = 0
        while True:
            message = await receive()
            kept.append(message)
            if message["type"] == "http.disconnect":
                return True
            held += len(message.get("body", b""))
            if held > buffer or not message.get("more_body", False):
                break
        # The body is read (or the buffer full): from here on only a disconnect matters,
        # and a conforming server's next message is one. Anything else ends the watch.
        if held > buffer:
            return False
        message = await receive()
        kept.append(message)
        return message["type"] == "http.disconnect"

    waiting = asyncio.ensure_future(turn)
    listener = asyncio.ensure_future(listen())
    try:
        await asyncio.wait((waiting, listener), return_when=asyncio.FIRST_COMPLETED)
        if not waiting.done() and listener.done() and not listener.result():
            await waiting  # the body is read (or the buffer full): just wait the turn
    except BaseException:
        waiting.cancel()
        listener.cancel()
        raise
    if not waiting.done():
        waiting.cancel()
        try:
            await waiting
        except asyncio.CancelledError:
            pass
        return None, kept
    if not listener.done():
        listener.cancel()
        try:
            await listener
        except asyncio.CancelledError:
            pass
    return waiting.result(), kept


def replaying(kept: List[Message], receive: Receive) -> Receive:
    """``receive``, giving the ``kept`` messages first."""
    if not kept:
        return receive

    async def replay() -> Message:
        if kept:
            return kept.pop(0)
        return await receive()

    return replay
