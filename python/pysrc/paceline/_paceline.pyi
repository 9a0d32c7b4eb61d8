"""Type stubs of the Rust half of paceline (booking, the FIFO queue, the arithmetic)."""

from typing import Any, Callable, Coroutine, Dict, List, Optional, Sequence, Tuple, Union

class Ticket:
    """A booked turn."""

    def ready_in(self) -> float:
        """Seconds until the turn comes (0.0 once it has)."""
    def cancel(self) -> None:
        """Gives the cells back if the turn has not come; once it has, they stay spent."""
    def done(self) -> None:
        """The turn was used: forget it, giving nothing back."""

class Core:
    """A limiter: a booking cell and (optionally) an execution cell of one quota. The
    same methods on SharedCore, whose cells are a shared file's two lanes."""

    def burst(self) -> int: ...
    def interval(self) -> float: ...
    def try_acquire(self, n: int = 1) -> bool:
        """Limiter.try_acquire itself (bound on each Limiter)."""
    def acquire(
        self, n: int = 1, timeout: Optional[float] = None
    ) -> Union["Ready", Coroutine[Any, Any, None]]:
        """Limiter.acquire itself: Ready when the cells were taken in the call, else the
        bound limiter's _acquire(n, timeout) coroutine."""
    def bind(self, method: Callable[..., Coroutine[Any, Any, None]]) -> None:
        """Where an acquire that must wait goes (the limiter's _acquire); set once."""
    def acquire_now(self, n: int) -> bool: ...
    def stats(self) -> Dict[str, Union[int, float]]: ...
    def remaining(self) -> int: ...
    def wait_time(self, n: int) -> float: ...
    def book(self, n: int, timeout: Optional[float] = None) -> Ticket: ...
    def run(self, n: int) -> Optional[Ticket]: ...
    def acquire_blocking(self, n: int, timeout: Optional[float] = None) -> None: ...
    def set_quota(self, count: int, per: float, burst: int) -> None: ...
    def hold(self, seconds: float) -> None: ...
    def reset(self) -> None: ...

class KeyedCore:
    """A limiter per str key; the same methods on SharedKeyedCore."""

    def burst(self) -> int: ...
    def try_acquire(self, key: str, n: int = 1) -> Union[bool, "TableFull"]:
        """KeyedLimiter.try_acquire itself (bound on each KeyedLimiter)."""
    def acquire(
        self, key: str, n: int = 1, timeout: Optional[float] = None
    ) -> Union["Ready", Coroutine[Any, Any, None]]:
        """KeyedLimiter.acquire itself (see Core.acquire)."""
    def bind(self, method: Callable[..., Coroutine[Any, Any, None]]) -> None: ...
    def acquire_now(self, key: str, n: int) -> bool: ...
    def stats(self) -> Dict[str, Union[int, float]]: ...
    def remaining(self, key: str) -> int: ...
    def wait_time(self, key: str, n: int) -> float: ...
    def book(self, key: str, n: int, timeout: Optional[float] = None) -> Ticket: ...
    def run(self, key: str, n: int) -> Optional[Ticket]: ...
    def acquire_blocking(self, key: str, n: int, timeout: Optional[float] = None) -> None: ...
    def set_quota(self, count: int, per: float, burst: int) -> None: ...
    def hold(self, key: str, seconds: float) -> None: ...
    def reset(self, key: str) -> None: ...
    def __len__(self) -> int: ...

class Ready:
    """The awaitable of an acquire whose cells were taken in the call: completes at once
    with None. It has a coroutine's methods, so asyncio takes it as one."""

    def __await__(self) -> "Ready": ...
    def __next__(self) -> None: ...
    def send(self, value: Any) -> None: ...
    def throw(self, typ: Any, value: Any = None, traceback: Any = None) -> None: ...
    def close(self) -> None: ...

class TableFull:
    """What a keyed try_acquire returns for a new key with no room to store it: false in
    a condition; the one instance is TABLE_FULL."""

    def __bool__(self) -> bool: ...

TABLE_FULL: TableFull
MAX_CAPACITY: int
MAX_HOLD: float

class SharedCore(Core): ...
class SharedKeyedCore(KeyedCore): ...

def new_core(count: int, per: float, burst: int, execution_bound: bool) -> Core: ...
def new_keyed_core(
    count: int, per: float, burst: int, execution_bound: bool, max_keys: Optional[int] = None
) -> KeyedCore: ...
def new_shared_core(
    path: str,
    count: int,
    per: float,
    burst: int,
    execution_bound: bool,
    mismatch: str,
    trust_user: Optional[int] = None,
    trust_group: Optional[int] = None,
) -> SharedCore: ...
def new_shared_keyed_core(
    path: str,
    count: int,
    per: float,
    burst: int,
    execution_bound: bool,
    capacity: int,
    mismatch: str,
    trust_user: Optional[int] = None,
    trust_group: Optional[int] = None,
) -> SharedKeyedCore: ...

class Followers:
    """One follower per upstream (a key), in a bounded table: paceline::upstream::Followers."""

    def __init__(
        self,
        core: object,
        max_hold: float,
        above_configured: bool,
        revert_after: Optional[float] = None,
    ) -> None: ...
    def acquire_now(self, key: str) -> bool: ...
    def book(self, key: str, timeout: Optional[float] = None) -> Ticket: ...
    def run(self, key: str) -> Optional[Ticket]: ...
    def acquire_blocking(self, key: str, timeout: Optional[float] = None) -> None: ...
    def sent(self, key: str) -> int: ...
    def observe(
        self, key: str, status: int, headers: list, sent: int
    ) -> Tuple[Optional[float], bool]: ...
    def quota(self, key: str) -> Tuple[int, float, int]: ...
    def above_configured(self, key: str) -> bool: ...
    def announced(self, key: str) -> Optional[float]: ...
    def wait_time(self, key: str) -> float: ...
    def __len__(self) -> int: ...

class Admitted:
    """A request the layer admitted, with the fields to add to its response."""

    fields: List[Tuple[bytes, bytes]]

class Refused:
    """A request the layer refused: the response to send and why."""

    status: int
    headers: List[Tuple[bytes, bytes]]
    body: bytes
    limit: Optional[str]
    wait: float
    table_full: bool

class Waiting:
    """A request of paceline.asgi waiting its booked turn."""

    def poll(self, wake: Callable[[], None]) -> Optional[Union[Admitted, Refused]]:
        """The outcome once the turn came, or None (then `wake` is called, from any
        thread, when to poll again)."""
    def cancel(self) -> None:
        """Gives every booking back."""

class SharedTable:
    """One limit's shared file, opened when its `Limit` is made."""

    def is_current(self) -> bool: ...
    def __len__(self) -> int: ...

class AsgiCore:
    """paceline's HTTP layer for one paceline.asgi middleware."""

    def check(
        self,
        method: str,
        path: str,
        headers: Sequence[Tuple[bytes, bytes]],
        client: Optional[Tuple[str, int]],
        keys: Optional[List[Optional[str]]] = None,
        costs: Optional[List[int]] = None,
        skips: Optional[List[bool]] = None,
    ) -> Union[Admitted, Refused, Waiting]: ...

def new_asgi_core(
    limits: List[Any],
    headers_on_success: bool,
    legacy_headers: bool,
    wait_up_to: Optional[float],
    missing: Optional[str],
    exempt_options: bool = True,
) -> AsgiCore: ...
def open_shared_table(
    path: Any,
    name: str,
    count: int,
    per: float,
    burst: int,
    capacity: int,
    mismatch: str,
    trust_user: Optional[int] = None,
    trust_group: Optional[int] = None,
) -> SharedTable: ...
def check_limit_name(name: str) -> None: ...
def check_key_source(spec: tuple) -> None: ...
def parse_rates(text: str) -> List[Tuple[int, float, int]]: ...


class KeyReader:
    """One limit's key source on its own, for a limit kept in Redis."""

    def key(
        self, headers: Sequence[Tuple[bytes, bytes]], client: Optional[Tuple[str, int]]
    ) -> Optional[str]:
        """The request's client key as text, or None when it has none."""

def new_key_reader(spec: tuple) -> KeyReader: ...

# The Rust fleet limiter's Lua scripts (paceline::redis_scripts), which paceline.redis runs.
REDIS_DECIDE_SCRIPT: str
REDIS_REFUND_SCRIPT: str
REDIS_MAX_WINDOW_NS: int

def redis_quota(count: int, per: float, burst: int) -> Tuple[int, int]:
    """`(interval, tolerance)` in nanoseconds, as the Rust fleet limiter sends them."""

# Budgets (python/src/budget.rs); paceline._budget wraps them.
class BudgetTurn:
    def settle(self, costs: List[Tuple[str, int]]) -> None: ...
    def release(self) -> None: ...
    def ended(self) -> bool: ...
    def cost(self, name: str) -> Optional[int]: ...

class BudgetWaiting:
    def poll(self, wake: Callable[[], None]) -> Optional[BudgetTurn]: ...
    def again_in(self) -> Optional[float]: ...
    def cancel(self) -> None: ...

class BudgetCore:
    def try_acquire(self, costs: List[Tuple[str, int]]) -> Optional[BudgetTurn]: ...
    def acquire(
        self, costs: List[Tuple[str, int]], timeout: Optional[float]
    ) -> BudgetWaiting: ...
    def acquire_blocking(
        self, costs: List[Tuple[str, int]], timeout: Optional[float]
    ) -> BudgetTurn: ...
    def wait_time(self, costs: List[Tuple[str, int]]) -> float: ...
    def remaining(self, name: str) -> int: ...
    def in_flight(self) -> int: ...
    def waiting(self) -> int: ...
    def follow(
        self, status: int, headers: List[Tuple[str, bytes]], max_hold: float
    ) -> int: ...
    def hold_for(self, seconds: float) -> None: ...
    def rates(self) -> List[Tuple[str, int, int]]: ...
    def in_flight_limit(self) -> Optional[int]: ...

def new_budget(
    rates: List[Tuple[str, int, float, int]], in_flight: Optional[int] = None
) -> BudgetCore: ...
def new_shared_budget(
    path: str,
    rates: List[Tuple[str, int, float, int]],
    in_flight: Optional[int],
    mismatch: str,
    trust_user: Optional[int] = None,
    trust_group: Optional[int] = None,
) -> BudgetCore: ...

# The fleet budget's decisions (paceline::budget::fleet), carried over redis-py by
# paceline.redis.RedisBudget.
BUDGET_READ_SCRIPT: str
BUDGET_WRITE_SCRIPT: str
FLEET_RENEW_EVERY: float
FLEET_LEASE: float

class FleetForeign(Exception): ...

_Write = Optional[Tuple[int, bytes, int, int, int]]

class FleetWaiter:
    def decide(self, value: Optional[bytes], secs: int, micros: int, owner: int) -> _Write: ...
    def ticket(self) -> Optional[int]: ...
    def answer(self, head: int, queue: int, local_ns: int) -> Optional[int]: ...
    def look(self, epochs: Optional[Tuple[int, int]], local_ns: int) -> Optional[float]: ...
    def cells(self) -> List[int]: ...

class FleetCore:
    def cells(self, costs: List[Tuple[str, int]]) -> List[int]: ...
    def settled(self, costs: List[Tuple[str, int]]) -> List[Optional[int]]: ...
    def index(self, name: str) -> int: ...
    def rates(self) -> List[Tuple[str, int, int]]: ...
    def cap(self) -> Optional[int]: ...
    def try_now(
        self, value: Optional[bytes], secs: int, micros: int, owner: int, cells: List[int]
    ) -> Tuple[Optional[int], _Write]: ...
    def end(
        self,
        value: Optional[bytes],
        secs: int,
        micros: int,
        owner: int,
        ticket: int,
        charged: List[int],
        actual: Optional[List[Optional[int]]] = None,
    ) -> Tuple[bool, _Write]: ...
    def renew(self, value: Optional[bytes], secs: int, micros: int, owner: int) -> _Write: ...
    def look(
        self, value: Optional[bytes], secs: int, micros: int, owner: int
    ) -> Tuple[Tuple[int, int, List[int]], _Write]: ...
    def wait_time(
        self, value: Optional[bytes], secs: int, micros: int, owner: int, cells: List[int]
    ) -> Tuple[float, _Write]: ...
    def follow(
        self,
        value: Optional[bytes],
        secs: int,
        micros: int,
        owner: int,
        status: int,
        headers: List[Tuple[str, bytes]],
        max_hold: float,
    ) -> Tuple[int, _Write]: ...
    def hold(
        self, value: Optional[bytes], secs: int, micros: int, owner: int, seconds: float
    ) -> _Write: ...
    def waiter(self, cells: List[int], timeout: Optional[float] = None) -> FleetWaiter: ...

def new_fleet_budget(
    rates: List[Tuple[str, int, float, int]], in_flight: Optional[int] = None
) -> FleetCore: ...
