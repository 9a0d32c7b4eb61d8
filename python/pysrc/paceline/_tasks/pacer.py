"""A paced task's rates and where they are kept, and the turns one execution books.

Each rate is a keyed limiter (one bucket per value of the task's ``key`` function, or one
for the task when it has none) kept where the storage URI says: this process's memory,
a shared file per rate that every worker process of the host opens, or Redis for a
fleet. An execution books a turn in every rate (never refused: the turn is as far ahead
as the rates make it) and starts at the latest of them.

A turn booked here and not waited for (its task handed back to the queue for that
instant) must stay booked after this call returns: a shared file's or this process's
turn is a reservation that gives its cells back when dropped, so the keeper holds it
until its instant and then lets it go spent. A Redis turn stays booked by itself.
"""

from __future__ import annotations

import ctypes
import hashlib
import heapq
import hmac
import logging
import math
import os
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

from .._http.limit import _rates, limit_name
from .._paceline import NoRoom
from .._http.storage import _file_safe
from .._http.storage import parse as parse_storage

_log = logging.getLogger("paceline.tasks")

#: The key of a task that has no key function: one bucket for every execution.
WHOLE_TASK = "*"


class PacedKeyError(ValueError):
    """A paced task's key function raised, or gave something that is not a key."""


class TableFull(Exception):
    """A shared file's table of keys has no room for a new key yet: ``wait`` is the
    seconds until a slot frees (a key whose quota has refilled gives its slot up)."""

    def __init__(self, name: str, wait: float) -> None:
        super().__init__(
            f"paced task {name!r}: the shared file's table of keys is full (no limited key is "
            f"evicted); a slot frees in {wait:.3g} s. Give the storage URI a larger "
            "?capacity=N for more keys at once"
        )
        self.wait = wait


def _leak(obj: Any) -> Any:
    """``obj``, with one reference that is never given back: the interpreter's exit does
    not free it, so the turns it holds are not given back by a process that ends."""
    ctypes.pythonapi.Py_IncRef(ctypes.py_object(obj))
    return obj


class _Keeper:
    """This process's turns booked for tasks handed back: each held until its instant,
    then let go spent. A process that ends (or forks) never gives them back."""

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._heap: List[Tuple[float, int, Any]] = _leak([])
        self._count = 0
        self._thread: Optional[threading.Thread] = None

    def keep(self, ticket: Any, due: float) -> None:
        """Holds ``ticket`` until ``due`` (``time.monotonic()``)."""
        with self._cond:
            self._count += 1
            heapq.heappush(self._heap, (due, self._count, ticket))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="paceline-keeper", daemon=True)
                self._thread.start()
            self._cond.notify()

    def _run(self) -> None:
        heap = self._heap
        while True:
            with self._cond:
                while not heap:
                    self._cond.wait()
                due = heap[0][0] - time.monotonic()
                if due > 0:
                    self._cond.wait(min(due, 60.0))
                    continue
                ticket = heapq.heappop(heap)[2]
            ticket.done()

    def after_fork_in_child(self) -> None:
        # The parent holds these turns; the child must neither hold nor give them back.
        self._cond = threading.Condition(threading.Lock())
        self._heap = _leak([])
        self._thread = None


KEEPER = _Keeper()
os.register_at_fork(after_in_child=KEEPER.after_fork_in_child)


class Booked:
    """The turns one execution booked: ``at`` is when the latest comes (``time.time()``)."""

    __slots__ = ("at", "_tickets", "_refunds")

    def __init__(self) -> None:
        self.at = time.time()
        self._tickets: List[Any] = []
        self._refunds: List[Callable[[], None]] = []

    def wait(self) -> float:
        """Seconds until every turn has come."""
        return max(0.0, self.at - time.time())

    def cancel(self) -> None:
        """Gives back every turn whose instant has not come."""
        for ticket in self._tickets:
            ticket.cancel()
        for refund in self._refunds:
            refund()
        self._tickets, self._refunds = [], []

    def sleep(self) -> None:
        """Blocks until every turn has come; interrupted, gives them back."""
        try:
            left = self.wait()
            while left > 0:
                time.sleep(min(left, 0.5))
                left = self.wait()
        except BaseException:
            self.cancel()
            raise
        self.taken()

    def taken(self) -> None:
        """Every turn has come and is used (none is given back)."""
        for ticket in self._tickets:
            ticket.done()
        self._tickets, self._refunds = [], []

    def keep(self) -> None:
        """Keeps every turn booked after this call (the task was handed back for ``at``)."""
        now = time.monotonic()
        for ticket in self._tickets:
            KEEPER.keep(ticket, now + ticket.ready_in())
        self._tickets, self._refunds = [], []


class Pacer:
    """A task's rates (``"10/second;1000/hour"``, a number per ``per`` seconds) kept in
    ``storage_uri`` under ``name``, per value of ``key(*args, **kwargs)``. Checked when
    made: an unreadable rate or storage URI raises here, at import."""

    def __init__(
        self,
        rate: Any,
        *,
        storage_uri: str,
        name: str,
        key: Optional[Callable[..., str]] = None,
        per: float = 1.0,
        burst: Optional[int] = None,
        redis_timeout: float = 0.25,
        on_redis_failure: str = "closed",
    ) -> None:
        self.rates = _rates(rate, per, burst)
        self.storage = parse_storage(storage_uri)
        if key is not None and not callable(key):
            raise TypeError(f"key must be a function of the task's arguments, got {type(key).__name__}")
        if on_redis_failure not in ("closed", "open"):
            raise ValueError(f'on_redis_failure must be "closed" or "open", got {on_redis_failure!r}')
        if isinstance(redis_timeout, bool) or not isinstance(redis_timeout, (int, float)) or not (
            0 < redis_timeout <= 60 and math.isfinite(redis_timeout)
        ):
            raise ValueError(f"redis_timeout must be seconds in (0, 60], got {redis_timeout!r}")
        if not isinstance(name, str) or not name:
            raise ValueError(f"a paced task needs a name, got {name!r}")
        self.name = name
        self.key = key
        self.redis_timeout = float(redis_timeout)
        self.on_redis_failure = on_redis_failure
        spec = repr((name, self.storage.uri, [r[:3] for r in self.rates]))
        #: Names this pacer in the instants handed-back tasks carry.
        self.fingerprint = hashlib.sha256(spec.encode()).hexdigest()[:16]
        self._opened: Tuple[int, List[Any]] = (-1, [])
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        rates = ";".join(r[3] or f"{r[0]}/{r[1]}s" for r in self.rates)
        return f"Pacer({self.name!r}, {rates!r}, storage_uri={self.storage.uri!r})"

    def key_of(self, args: tuple, kwargs: Dict[str, Any]) -> str:
        """The bucket an execution with these arguments books in."""
        if self.key is None:
            return WHOLE_TASK
        try:
            key = self.key(*args, **kwargs)
        except Exception as e:
            raise PacedKeyError(
                f"paced task {self.name!r}: its key function raised {type(e).__name__}: {e} "
                "(the task was not run)"
            ) from e
        if isinstance(key, str) and key:
            try:
                key.encode("utf-8")
            except UnicodeEncodeError:
                raise PacedKeyError(
                    f"paced task {self.name!r}: its key function returned text with a lone "
                    "surrogate, which no storage can hold (the task was not run)"
                ) from None
        if not isinstance(key, str) or not key:
            raise PacedKeyError(
                f"paced task {self.name!r}: its key function must return a non-empty str, "
                f"got {key!r} (the task was not run)"
            )
        return key

    def book(self, key: str, lead: float = 0.0) -> Booked:
        """Books a turn in every rate for ``key``; the caller waits for ``at`` (the latest
        turn, plus ``lead``: every start of the task comes that long after its turn, so
        that none comes early against another's), hands the task back for it, or
        cancels. Raises ``RedisUnavailable`` when Redis cannot be
        reached and the policy is ``"closed"`` (nothing booked), ``RedisRejected`` when
        Redis refused what it was sent."""
        booked = Booked()
        latest = 0.0
        try:
            for kind, limiter in self._limiters():
                if kind == "redis":
                    wait = _book_redis(limiter, key, self.on_redis_failure, booked)
                else:
                    try:
                        ticket = limiter._core.book(key, 1, None)
                    except NoRoom as e:
                        raise TableFull(self.name, float(e.args[0]) if e.args else 1.0) from None
                    booked._tickets.append(ticket)
                    wait = ticket.ready_in()
                latest = max(latest, wait)
        except BaseException:
            booked.cancel()
            raise
        booked.at = time.time() + latest + lead
        return booked

    def ahead(self, key: str) -> float:
        """Seconds until a turn of ``key`` would come in every rate; spends nothing."""
        latest = 0.0
        for kind, limiter in self._limiters():
            latest = max(latest, limiter.wait_time(key))
        return latest

    def secret(self) -> bytes:
        """The key that signs this storage's turns (made once, kept in the storage: a
        Redis key, a file beside the rates' files, this process's memory), so that only
        a process that can book in the storage can mark a task as booked."""
        cached = _secrets.get((self.storage.uri, os.getpid()))
        if cached is None:
            cached = _load_secret(self.storage, self.redis_timeout)
            _secrets[(self.storage.uri, os.getpid())] = cached
        return cached

    def warm(self) -> None:
        """Opens the rates' storage now (a Redis connection made and its script loaded),
        so that the first turn booked is not late by that."""
        try:
            for kind, limiter in self._limiters():
                if kind == "redis":
                    limiter.wait_time(WHOLE_TASK)
        except Exception as e:  # noqa: BLE001 - the first booking reports it
            _log.debug("paceline: a paced task's storage could not be opened yet: %s", e)

    def _limiters(self) -> List[Tuple[str, Any]]:
        pid = os.getpid()
        opened = self._opened
        if opened[0] == pid:
            return opened[1]
        with self._lock:
            if self._opened[0] != pid:
                self._opened = (pid, [self._open(r) for r in self.rates])
            return self._opened[1]

    def _open(self, rate: Tuple[int, float, int, str]) -> Tuple[str, Any]:
        from .. import KeyedLimiter

        count, per, burst, text = rate
        name = self.name if not text else f"{self.name}.{text}"
        storage = self.storage
        if storage.kind == "memory":
            return "memory", KeyedLimiter(count, per, burst, execution_bound=False)
        if storage.kind == "file":
            options: Dict[str, Any] = {}
            if storage.capacity is not None:
                options["capacity"] = storage.capacity
            path = f"{storage.path}.{_file_safe(limit_name(name))}"
            return "file", KeyedLimiter.shared(path, count, per, burst, execution_bound=False, **options)
        from ..redis import SyncRedisLimiter

        client = _sync_client(storage, self.redis_timeout)
        prefix = f"paceline-task:{limit_name(name)}"
        return "redis", SyncRedisLimiter(client, count, per, burst, prefix=prefix, on_failure=self.on_redis_failure)


def _book_redis(limiter: Any, key: str, policy: str, booked: Booked) -> float:
    """Books one turn of ``key`` in Redis: the seconds until it comes."""
    from .._redis.core import RedisUnavailable, _describe, _key
    from .._redis.limiter_sync import NoAnswer

    try:
        wait, give_back = limiter._book(_key(key), 1, None)
    except NoAnswer as e:
        if policy == "open":
            _log.warning("paceline: Redis unreachable, a paced task runs unlimited (policy open): %s", _describe(e.cause))
            return 0.0
        raise RedisUnavailable(f"Redis unreachable or too slow, failing closed: {_describe(e.cause)}") from e.cause
    booked._refunds.append(give_back)
    return wait / 1e9


#: One synchronous Redis client per URI and process.
_clients: Dict[Tuple[str, int], Any] = {}


def _sync_client(storage: Any, timeout: float) -> Any:
    key = (storage.uri, os.getpid())
    client = _clients.get(key)
    if client is None:
        try:
            import redis
            from redis.backoff import NoBackoff
            from redis.retry import Retry
        except ImportError:
            raise ImportError(f"storage {storage.uri!r} needs redis-py: pip install redis") from None
        options = dict(socket_timeout=timeout, socket_connect_timeout=timeout, retry=Retry(NoBackoff(), 0))
        if storage.cluster:
            from redis.cluster import RedisCluster

            client = RedisCluster.from_url("redis" + storage.uri[len("redis+cluster") :], **options)
        else:
            client = redis.Redis.from_url(storage.uri, **options)
        _clients[key] = client
    return client


# What a handed-back task carries: the pacer it was booked by, the attempt it belongs to,
# the instant it was booked for, and a signature over those and the task's id by the
# storage's secret: a producer cannot mark a task booked, nor move a mark to another.
MARK = "paceline_turn"


def _signature(pacer: Pacer, task_id: Any, attempt: int, at: float) -> str:
    text = f"{pacer.fingerprint}|{task_id}|{attempt}|{at!r}".encode()
    return hmac.new(pacer.secret(), text, hashlib.sha256).hexdigest()


def mark(pacer: Pacer, task_id: Any, attempt: int, at: float) -> Dict[str, Any]:
    return {"p": pacer.fingerprint, "r": attempt, "at": at, "s": _signature(pacer, task_id, attempt, at)}


def marked(pacer: Pacer, value: Any, task_id: Any, attempt: int) -> Optional[float]:
    """The instant a task handed back by ``pacer`` for this ``attempt`` of the task
    ``task_id`` was booked for; ``None`` when ``value`` is no such mark (a retry of the
    task's own, or a mark it was not given, books again)."""
    if not isinstance(value, dict) or value.get("p") != pacer.fingerprint or value.get("r") != attempt:
        return None
    at, signature = value.get("at"), value.get("s")
    if isinstance(at, bool) or not isinstance(at, (int, float)) or not math.isfinite(at):
        return None
    try:
        expected = _signature(pacer, task_id, attempt, float(at))
    except Exception as e:  # noqa: BLE001 - the storage cannot be read: book again
        _log.debug("paceline: a mark could not be checked: %s", e)
        return None
    if not isinstance(signature, str) or not hmac.compare_digest(signature, expected):
        return None
    return float(at)


#: The secrets of the storages this process uses (by URI and process).
_secrets: Dict[Tuple[str, int], bytes] = {}
#: The secret of ``memory://`` turns: this process's (a forked worker child shares it).
_MEMORY_SECRET = os.urandom(32)
_SECRET_KEY = "paceline-task:secret"


def _load_secret(storage: Any, timeout: float) -> bytes:
    if storage.kind == "memory":
        return _MEMORY_SECRET
    if storage.kind == "redis":
        client = _sync_client(storage, timeout)
        client.set(_SECRET_KEY, os.urandom(32).hex(), nx=True)
        value = client.get(_SECRET_KEY)
        if not isinstance(value, bytes) or len(value) < 32:
            raise ValueError(f"the task secret at {_SECRET_KEY!r} in {storage.uri!r} is not one paceline wrote")
        return value
    return _file_secret(f"{storage.path}.paceline-secret")


def _file_secret(path: str) -> bytes:
    """The secret in ``path``, made (readable by its owner only) when missing; refused
    when another user owns it or others may read or write it."""
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
    except FileExistsError:
        pass
    else:
        with os.fdopen(fd, "w") as f:
            f.write(os.urandom(32).hex())
    for _ in range(100):
        fd = os.open(path, flags)
        with os.fdopen(fd, "rb") as f:
            st = os.fstat(f.fileno())
            if st.st_uid != os.geteuid() or st.st_mode & 0o077:
                raise ValueError(
                    f"the task secret {path!r} is not this user's own, readable by it alone: "
                    "remove it, and let a worker make it anew"
                )
            value = f.read()
        if len(value) >= 64:
            return value
        time.sleep(0.01)  # its maker is writing it
    raise ValueError(f"the task secret {path!r} is empty")


def sleep_until(at: float, most: float) -> None:
    """Sleeps until ``at`` (``time.time()``), at most ``most`` seconds: a queue that runs
    a handed-back task a little early."""
    left = min(at - time.time(), most)
    if left > 0:
        time.sleep(left)
