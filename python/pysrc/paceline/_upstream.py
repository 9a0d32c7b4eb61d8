"""What the httpx transports and the aiohttp hook share: which limiter (and key) a request
waits on, the followers that carry what each upstream says, and the wait for a turn
within the caller's timeout (in Rust: paceline::upstream and paceline::http::client)."""

from __future__ import annotations

import asyncio
import time
from typing import Callable, Iterable, Optional, Tuple, Union

from . import KeyedLimiter, Limiter
from ._paceline import Followers

# Methods a refusal may be retried for without the caller's say: they change nothing
# twice (RFC 9110, 9.2.2).
IDEMPOTENT = frozenset({"GET", "HEAD", "OPTIONS", "PUT", "DELETE", "TRACE"})


_DEFAULT_PORTS = {"http": 80, "ws": 80, "https": 443, "wss": 443}


def host_key(host: str, port: Optional[int], scheme: str) -> str:
    """The host a request goes to, as the Rust layers key it: its name in lower case
    (no trailing dot), and its port unless it is the scheme's default, so
    ``http://h/`` and ``http://h:80/`` are one host and ``h:8001`` another. An IPv6
    address keeps its brackets beside a port (``[::1]:8080``)."""
    host = host.rstrip(".").lower()
    default = _DEFAULT_PORTS.get(scheme.lower())
    if port is None or port == default or (default is None and port in (80, 443)):
        return host
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"{host}:{port}"


class Hosts:
    """A limiter, how a request's key is chosen, and one follower per upstream (the
    Rust crate's ``Followers``, a bounded table): a request waits its turn on the
    limiter (the caller's quota), then on its upstream's follower (what the upstream
    said: holds, an announced or learned pace).

    With a ``Limiter`` every request goes to one upstream (one follower); with a
    ``KeyedLimiter`` each key (the request's host, unless ``key`` says otherwise) is an
    upstream of its own."""

    def __init__(
        self,
        limiter: Union[Limiter, KeyedLimiter],
        key: Optional[Callable[[str], str]],
        max_hold: float,
        above_configured: bool,
        revert_after: Optional[float],
    ) -> None:
        if not isinstance(limiter, (Limiter, KeyedLimiter)):
            raise TypeError(
                f"limiter must be a paceline.Limiter or KeyedLimiter, got {type(limiter).__name__}"
            )
        if isinstance(max_hold, bool) or not isinstance(max_hold, (int, float)):
            raise TypeError(f"max_hold must be a number of seconds, got {type(max_hold).__name__}")
        if revert_after is not None and (
            isinstance(revert_after, bool) or not isinstance(revert_after, (int, float))
        ):
            raise TypeError(
                f"revert_after must be None or seconds, got {type(revert_after).__name__}"
            )
        self.limiter = limiter
        self.keyed = isinstance(limiter, KeyedLimiter)
        # A keyed limiter's key is the request's host unless the caller says otherwise.
        self.key_of = key if key is not None else (lambda host: host)
        self.above_configured = bool(above_configured)
        self.followers = Followers(
            limiter._core,
            float(max_hold),
            self.above_configured,
            None if revert_after is None else float(revert_after),
        )

    def key(self, host: str) -> str:
        """The key of a request to ``host``: the limiter's key, and its follower's."""
        return self.key_of(host) if self.keyed else ""

    def _skip_limiter(self, key: str) -> bool:
        # With above_configured, an upstream that announced more than the limiter's quota
        # is followed: its follower alone paces it.
        return self.above_configured and self.followers.above_configured(key)

    async def acquire(self, key: str, timeout: Optional[float]) -> None:
        """Waits the turn of a request with ``key`` within ``timeout`` seconds (None: no
        maximum); ``TimeoutError`` past it, having given back any turn booked."""
        deadline = None if timeout is None else time.monotonic() + timeout

        def left() -> Optional[float]:
            return None if deadline is None else max(0.0, deadline - time.monotonic())

        self._refuse_past(key, left())
        if not self._skip_limiter(key):
            if self.keyed:
                await self.limiter.acquire(key, timeout=left())
            else:
                await self.limiter.acquire(timeout=left())
        followers = self.followers
        if followers.acquire_now(key):
            return
        waiting = self.limiter._waiting
        await _within(waiting.wait(followers.book(key, left())), left())
        run = followers.run(key)
        if run is not None:
            await _within(waiting.wait(run), left())

    def acquire_blocking(self, key: str, timeout: Optional[float]) -> None:
        """``acquire`` for threads (the GIL released while it waits)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        self._refuse_past(key, timeout)
        if not self._skip_limiter(key):
            if self.keyed:
                self.limiter.acquire_blocking(key, timeout=timeout)
            else:
                self.limiter.acquire_blocking(timeout=timeout)
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        self.followers.acquire_blocking(key, left)

    def _refuse_past(self, key: str, timeout: Optional[float]) -> None:
        """``TimeoutError`` at once, before the caller's own limiter is asked, when the
        upstream's turn is already further than ``timeout``: nothing is booked."""
        if timeout is not None and self.followers.wait_time(key) > timeout:
            raise TimeoutError("the upstream holds past the timeout; nothing was booked")

    def sent(self, key: str) -> int:
        """The instant a request with ``key`` leaves, to pass to ``observe``."""
        return self.followers.sent(key)

    def observe(
        self,
        key: str,
        status: int,
        headers: Iterable[Tuple[str, bytes]],
        sent: Optional[int] = None,
    ) -> Optional[float]:
        """Steers ``key``'s follower by a response to a request sent at ``sent``; returns
        the hold it applied, if any."""
        if sent is None:
            sent = self.followers.sent(key)
        hold, moved = self.followers.observe(key, status, list(headers), sent)
        if moved:
            # A hold, a new pace: every event loop re-reads its waiting turns.
            self.limiter._waiting.moved()
        return hold


async def _within(wait, timeout: Optional[float]) -> None:
    """Awaits ``wait`` for at most ``timeout`` seconds (None: no maximum); cancelled past
    it, the wait gives its turn back, and ``TimeoutError`` says so."""
    if timeout is None:
        await wait
        return
    try:
        await asyncio.wait_for(wait, timeout)
    except asyncio.TimeoutError:
        raise TimeoutError("the turn did not come within the timeout; it was given back")
