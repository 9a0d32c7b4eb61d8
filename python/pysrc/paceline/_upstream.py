"""What the httpx transports and the aiohttp hook share: which limiter (and key) a request
waits on, and following what each response says (in Rust: paceline::upstream)."""

from __future__ import annotations

from typing import Callable, Dict, Iterable, Optional, Tuple, Union

from . import KeyedLimiter, Limiter
from ._paceline import Follower

# Methods a refusal may be retried for without the caller's say: they change nothing
# twice (RFC 9110, 9.2.2).
IDEMPOTENT = frozenset({"GET", "HEAD", "OPTIONS", "PUT", "DELETE", "TRACE"})


class Following:
    """A limiter, how a request's key is chosen, and one follower per key."""

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
        self.limiter = limiter
        self.keyed = isinstance(limiter, KeyedLimiter)
        # A keyed limiter's key is the request's host unless the caller says otherwise.
        self.key_of = key if key is not None else (lambda host: host)
        self.settings = (float(max_hold), bool(above_configured), revert_after)
        self.followers: Dict[Optional[str], Follower] = {}

    def key(self, host: str) -> Optional[str]:
        return self.key_of(host) if self.keyed else None

    async def acquire(self, key: Optional[str]) -> None:
        if key is None:
            await self.limiter.acquire()
        else:
            await self.limiter.acquire(key)

    def acquire_blocking(self, key: Optional[str]) -> None:
        if key is None:
            self.limiter.acquire_blocking()
        else:
            self.limiter.acquire_blocking(key)

    def observe(
        self, key: Optional[str], status: int, headers: Iterable[Tuple[str, bytes]]
    ) -> Optional[float]:
        """Steers the limiter by a response; returns the hold it applied, if any."""
        follower = self.followers.get(key)
        if follower is None:
            max_hold, above, revert_after = self.settings
            # A keyed limiter has one quota for every key: it follows each host's holds,
            # and no host's announced quota (a Limiter per upstream follows those).
            follower = self.followers[key] = Follower(
                self.limiter._core, key, max_hold, above, revert_after, not self.keyed
            )
        hold = follower.apply(status, list(headers))
        if hold:
            self.limiter._waiting.moved()
        return hold
