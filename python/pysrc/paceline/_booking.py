"""What the httpx transports and the aiohttp hook share when given a ``budget=``: the
booking of a request's estimate (``cost``), the following of each response's
per-dimension fields (``Budget.follow``), and the settle from its actual cost
(``settle_from``).

A cost function that raises, or returns something that is not a mapping of dimension
names to counts, raises in the caller's request before anything is booked or sent (it
is the caller's bug, and the request cannot be priced). A settle function that raises
or returns junk does not break the call: the turn keeps its estimate, and the
``paceline`` logger says why at WARNING level.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, Callable, Dict, Optional

from ._budget import Budget, Turn, _seconds

_log = logging.getLogger("paceline")


class Booking:
    """A budget, how a request is priced and how a response's cost is read."""

    def __init__(
        self,
        budget: Budget,
        cost: Optional[Callable[[Any], Mapping]],
        settle_from: Optional[Callable[[Any], Mapping]],
        max_hold: float,
    ) -> None:
        if not isinstance(budget, Budget):
            raise TypeError(f"budget must be a paceline.Budget, got {type(budget).__name__}")
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
        return self.budget.acquire_blocking(timeout=timeout, **self.costs(request))

    def follow(self, status: int, headers) -> None:
        self.budget.follow(status, headers, max_hold=self.max_hold)

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
