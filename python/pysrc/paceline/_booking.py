"""What the httpx transports and the aiohttp hook share when given a ``budget=``: the
booking of a request's estimate (``cost``), the following of each response's
per-dimension fields (``Budget.follow``), and the settle from its actual cost
(``settle_from``).

A fleet budget (``paceline.redis.RedisBudget``) books, settles and follows over Redis:
its settles and follows are sent in the background (each lands a round trip after the
response; a failure is logged), and it serves the asyncio transports only.

A cost function that raises, or returns something that is not a mapping of dimension
names to counts, raises in the caller's request before anything is booked or sent (it
is the caller's bug, and the request cannot be priced). A settle function that raises
or returns junk does not break the call: the turn keeps its estimate, and the
``paceline`` logger says why at WARNING level.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import Mapping
from typing import Any, Callable, Dict, Optional, Union

from ._budget import Budget, Turn, _seconds

_log = logging.getLogger("paceline")


class Booking:
    """A budget, how a request is priced and how a response's cost is read."""

    def __init__(
        self,
        budget: Union[Budget, Any],
        cost: Optional[Callable[[Any], Mapping]],
        settle_from: Optional[Callable[[Any], Mapping]],
        max_hold: float,
    ) -> None:
        self.fleet = _is_fleet(budget)
        if not isinstance(budget, Budget) and not self.fleet:
            raise TypeError(
                "budget must be a paceline.Budget or a paceline.redis.RedisBudget, got "
                f"{type(budget).__name__}"
            )
        # Follows of a fleet budget under way, kept alive until they land.
        self.following: "set[asyncio.Task]" = set()
        for name, f in (("cost", cost), ("settle_from", settle_from)):
            if f is not None and not callable(f):
                raise TypeError(f"{name} must be None or a function, got {type(f).__name__}")
        self.budget = budget
        self.cost = cost
        self.settle_from = settle_from
        self.max_hold = _seconds("max_hold", max_hold)

    def costs(self, request: Any) -> Dict[str, int]:
        """The estimate for ``request`` (default ``{}``: 1 in every dimension)."""
        if self.cost is None:
            return {}
        costs = self.cost(request)
        if not isinstance(costs, Mapping):
            raise TypeError(
                f"cost must return a mapping of dimension names to counts, got "
                f"{type(costs).__name__}"
            )
        return dict(costs)

    async def acquire(self, request: Any, timeout: Optional[float]) -> Turn:
        return await self.budget.acquire(timeout=timeout, **self.costs(request))

    def acquire_blocking(self, request: Any, timeout: Optional[float]) -> Turn:
        if self.fleet:
            raise TypeError(
                "a paceline.redis.RedisBudget serves asyncio clients: use it with "
                "paceline.httpx.AsyncTransport"
            )
        return self.budget.acquire_blocking(timeout=timeout, **self.costs(request))

    def follow(self, status: int, headers) -> None:
        if not self.fleet:
            self.budget.follow(status, headers, max_hold=self.max_hold)
            return
        task = asyncio.ensure_future(
            self.budget.follow(status, list(headers), max_hold=self.max_hold)
        )
        self.following.add(task)
        task.add_done_callback(_followed(self.following))

    def settles(self, status: int) -> bool:
        """Whether a response of ``status`` is settled from (a success, with a
        ``settle_from``); any other ends its turn keeping the estimate."""
        return self.settle_from is not None and 200 <= status < 300

    def settle(self, turn: Turn, response: Any) -> None:
        """Ends ``turn`` with ``settle_from(response)``, or keeping its estimate if that
        raises or is not a mapping of dimension names to counts. Never raises."""
        try:
            actual = self.settle_from(response) if self.settle_from is not None else {}
            if not isinstance(actual, Mapping):
                raise TypeError(f"settle_from returned {type(actual).__name__}, not a mapping")
            turn.settle(**dict(actual))
        except Exception:
            _log.warning(
                "paceline: settle_from failed; the turn keeps its estimate", exc_info=True
            )
        finally:
            turn.release()


def _is_fleet(budget: Any) -> bool:
    # Without redis-py installed there is no RedisBudget (and nothing to import).
    fleet = sys.modules.get("paceline._redis.budget_async")
    return fleet is not None and isinstance(budget, fleet.RedisBudget)


def _followed(following: "set[asyncio.Task]") -> Callable[["asyncio.Task"], None]:
    def done(task: "asyncio.Task") -> None:
        following.discard(task)
        if not task.cancelled() and task.exception() is not None:
            _log.warning(
                "paceline: following a response on the fleet budget failed",
                exc_info=task.exception(),
            )

    return done
