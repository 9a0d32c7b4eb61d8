"""What a limit is: its name, its rates, whom a request counts against, what it costs,
which requests it applies to, and where its keys live. Everything is checked when the
``Limit`` is made (by the Rust layer's own checks), so a bad configuration fails at
import, not at the first request."""

from __future__ import annotations

import asyncio
import hashlib
import ipaddress
import logging
import math
import os
import stat
from typing import Any, Awaitable, Callable, Dict, Iterable, List, MutableMapping, Optional, Tuple, Union

from .._args import _capacity, _count, _gid, _path, _quota, _trusted, _uid
from .._paceline import (
    build_limit,
    check_key_source,
    check_limit_name,
    open_shared_table,
    parse_rates,
)

Scope = MutableMapping[str, Any]

_log = logging.getLogger("paceline.asgi")

#: A rate: requests per ``per`` seconds (an int or a float), or text as the ``limits``
#: package writes it (``"10/second"``, ``"100 per 2 hours"``, several joined by ``;``).
Rate = Union[int, float, str]


class KeySource:
    """Which client a request counts against, for one limit."""

    __slots__ = ("_spec", "_fn", "_by_address", "_is_async")

    def __init__(self, spec: tuple, fn: Optional[Callable[[Scope], Any]] = None):
        check_key_source(spec)
        self._spec = spec
        self._fn = fn
        self._by_address = spec[0] in ("peer", "proxies")
        self._is_async = fn is not None and _is_async(fn)

    def __repr__(self) -> str:
        return f"KeySource{self._spec!r}"

    @staticmethod
    def peer_ip(ipv6_prefix: int = 64) -> "KeySource":
        """The address the connection comes from (``scope["client"]``), IPv6 grouped by
        ``ipv6_prefix`` bits (128: each address on its own). A client the server names
        without an address (``TestClient``'s ``"testclient"``) is keyed by that name.
        Behind a proxy every client is the proxy: let the server resolve the client
        (uvicorn's ``--proxy-headers`` with your proxies in ``--forwarded-allow-ips``), or
        use ``behind_proxies`` with the server's proxy handling off."""
        return KeySource(("peer", _prefix(ipv6_prefix)))

    @staticmethod
    def behind_proxies(
        proxies: Iterable[str], *, forwarded_header: bool = False, ipv6_prefix: int = 64
    ) -> "KeySource":
        """The client behind trusted proxies: when the connection comes from one of
        ``proxies`` (networks such as ``"10.0.0.0/8"`` or addresses), the right-most
        address of ``X-Forwarded-For`` that is not itself a trusted proxy. What a client
        writes left of it is ignored, so a spoofed entry changes nothing; a request from
        anywhere else is keyed by its own address. With ``forwarded_header=True`` the RFC
        7239 ``Forwarded`` header is read instead: name the one your proxies write.

        The server's own proxy handling must be off (uvicorn ``--no-proxy-headers``):
        otherwise the server has already replaced the connection's address with one read
        from the header, and the trusted list here would be applied to that."""
        if isinstance(proxies, (str, bytes)):
            raise TypeError("proxies must be a list of networks, not one string")
        networks = []
        for network in proxies:
            if not isinstance(network, str):
                raise TypeError(f"a trusted proxy network must be a str, got {network!r}")
            try:
                ipaddress.ip_network(network, strict=False)
            except ValueError as e:
                raise ValueError(f"a trusted proxy network {network!r}: {e}") from None
            networks.append(network)
        return KeySource(("proxies", networks, bool(forwarded_header), _prefix(ipv6_prefix)))

    @staticmethod
    def header(name: str) -> "KeySource":
        """A header's value (an API key, a tenant); a request without it has no key (see
        ``on_missing_key``)."""
        if not isinstance(name, str) or not name or not all(
            c.isascii() and (c.isalnum() or c in "!#$%&'*+-.^_`|~") for c in name
        ):
            raise ValueError(f"{name!r} is not a header name")
        return KeySource(("header", name.lower()))

    @staticmethod
    def global_() -> "KeySource":
        """One key for every request: a limit on the whole service."""
        return KeySource(("global",))

    @staticmethod
    def callable(fn: Callable[[Scope], Union[Optional[str], Awaitable[Optional[str]]]]) -> "KeySource":
        """Any function of the ASGI scope returning the key as a ``str`` (``None``: no
        key); an ``async def`` is awaited. Keys longer than 64 bytes are stored as a
        digest, so any length costs the same memory."""
        if not callable(fn):
            raise TypeError(f"KeySource.callable needs a function of the scope, got {fn!r}")
        return KeySource(("callable",), fn)


def limit_name(text: str) -> str:
    """A limit's name made from any text (a route, a scope, a rate), as the ``RateLimit``
    fields and the files take it: printable ASCII without quotes, at most 64 bytes; a
    longer one keeps its first 55 characters and a digest of the whole, so two long
    texts are two names."""
    clean = "".join(c if 32 <= ord(c) < 127 and c not in '"\\{}' else "_" for c in text) or "limit"
    if len(clean) <= 64 and clean == text:
        return clean
    if len(clean) <= 64:
        return clean
    return f"{clean[:55]}~{hashlib.sha256(text.encode('utf-8', 'surrogatepass')).hexdigest()[:8]}"


def client_of(scope: Scope) -> Any:
    """The request's client as ``(host, port)``, ``None`` when the server names none:
    ASGI allows any pair (Daphne writes a list), and a port may be missing."""
    client = scope.get("client")
    if client is None or client.__class__ is tuple and len(client) == 2 and client[1].__class__ is int:
        return client
    try:
        host, port = client
    except (TypeError, ValueError):
        return None
    if not isinstance(host, str):
        return None
    return host, port if isinstance(port, int) and 0 <= port <= 0xFFFF else 0


def storable(key: str) -> str:
    """A key as Rust and Redis can hold it: the key itself, unless it cannot be written
    as UTF-8 (a key function's ``str`` holding a lone surrogate, as ``surrogateescape``
    decoding makes), which is kept as a digest of its code points, as a long key is: a
    key of its own, never an error."""
    if key.isascii():
        return key
    try:
        key.encode("utf-8")
    except UnicodeEncodeError:
        return "\x01" + hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()
    return key


def _prefix(prefix: object) -> int:
    if isinstance(prefix, bool) or not isinstance(prefix, int) or not 0 <= prefix <= 128:
        raise ValueError(f"ipv6_prefix must be an int from 0 to 128, got {prefix!r}")
    return prefix


def _is_async(fn: Callable[..., Any]) -> bool:
    call = getattr(fn, "__call__", None)
    return asyncio.iscoroutinefunction(fn) or asyncio.iscoroutinefunction(call)


def _rates(rate: object, per: object, burst: object) -> List[Tuple[int, float, int, str]]:
    """A limit's quotas as ``(count, per, burst, text)``: text naming each when several."""
    if isinstance(rate, str):
        if per != 1.0 or burst is not None:
            raise ValueError(
                "a rate written as text carries its own period and burst: leave per and "
                f"burst out, or write the rate as a number (got {rate!r}, per={per!r}, "
                f"burst={burst!r})"
            )
        parts = [p.strip() for p in rate.replace(",", ";").split(";") if p.strip()]
        return [(c, p, b, text) for (c, p, b), text in zip(parse_rates(rate), parts)]
    if isinstance(rate, float) and not isinstance(rate, bool):
        if not (rate > 0 and math.isfinite(rate)):
            raise ValueError(f"rate must be a positive, finite number, got {rate!r}")
        if rate.is_integer():
            rate = int(rate)
        else:
            # A fraction of a request per period: one request per period / rate.
            if isinstance(per, bool) or not isinstance(per, (int, float)):
                raise TypeError(f"per must be a number of seconds, got {type(per).__name__}")
            whole = max(1, math.floor(rate))
            count, every, most = _quota(1, float(per) / rate, whole if burst is None else burst)
            return [(count, every, most, "")]
    count, every, most = _quota(rate, per, rate if burst is None else burst)
    return [(count, every, most, "")]


class _Spec:
    """One limit of the Rust layer (a ``Limit`` with several rates makes one per rate):
    what ``paceline._paceline.new_asgi_core`` reads."""

    __slots__ = (
        "name",
        "count",
        "per",
        "burst",
        "key",
        "max_keys",
        "table",
        "cost",
        "methods",
        "python_when",
        "tiered",
        "admit_when_full",
        "limit",
    )


class Limit:
    """One named limit per client: ``rate`` requests per ``per`` seconds, up to ``burst``
    at once (default: ``rate``, as "10 per second" lets 10 through at once). ``rate`` may
    be a float (``0.5`` per second: one every 2 s) or text as slowapi and ``limits`` write
    it (``"5/minute"``; ``"100/day;10/second"`` is two limits at once).

    - ``key``: a ``KeySource``, or any function of the scope returning the key (``async``
      allowed); default: the peer address.
    - ``cost``: the cells a request takes (an int, or a function of the scope returning
      one, ``async`` allowed); a request costing more than the burst never passes.
    - ``methods``: the HTTP methods the limit applies to (default: all; ``GET`` includes
      ``HEAD``, which the frameworks serve with the ``GET`` endpoint);
      ``exempt_when``: a function of the scope, true for requests this limit skips.
    - ``quota_for``: a function of the key (a ``str``; the key must come from a function)
      returning that client's rate (as ``rate``, or ``(rate, per)``, ``(rate, per,
      burst)``), or ``None`` for this limit's own: tiers. In-process limits only.
    - ``max_keys`` bounds the clients kept in this process (default 1 000 000); ``shared``
      is a file every worker of the host opens instead (in ``/dev/shm`` to stay in
      memory), with room for at least ``capacity`` clients still limited (64 bytes each);
      the file holds this one limit, by name, and is opened under ``Limiter.shared``'s
      rules (``trust_user``, ``trust_group``, ``on_mismatch``). The file is opened here,
      so a bad one fails at import.
    - ``when_full``: what a new client gets when the table has no room for it: ``"503"``
      (default: ``503`` with ``Retry-After`` and no ``RateLimit`` field: it spent
      nothing) or ``"admit"`` (let through untracked).
    - ``redis`` (a ``redis.asyncio.Redis`` or ``RedisCluster``) keeps the limit in Redis
      instead: one bound per client for every server of a fleet that uses the same Redis
      and limit name (``paceline.redis``'s decisions, at Redis's clock; Redis keys
      ``paceline-asgi:<name>:{<client key>}``). ``redis_timeout`` bounds each call
      (seconds); past it, or when Redis cannot be reached, ``on_redis_failure`` decides:
      ``"closed"`` (default: ``503`` with ``Retry-After: 1`` and no ``RateLimit`` field),
      ``"open"``, or a local ``paceline.KeyedLimiter`` share. An error Redis answers is a
      ``503`` too, logged. One rate per limit; no ``quota_for``.
    - ``storage_uri`` says where instead, as the frameworks' settings write it:
      ``"memory://"`` (this process), ``"file:///dev/shm/myapp"`` (a file
      ``/dev/shm/myapp.<name>`` for every worker of the host, as ``shared``),
      ``"redis://host:6379/0"``, ``"rediss://..."``, ``"redis+cluster://..."`` (Redis, as
      ``redis``, one client per URI and process). Checked here.
    - ``name`` is the limit's name in the ``RateLimit`` fields (1 to 64 printable ASCII
      characters; with several rates each is named after its rate too).

    A ``Limit`` keeps its clients' counts: used by two middlewares or routes, it is one
    count for both (make two ``Limit``s for two counts).
    """

    __slots__ = (
        "name",
        "key",
        "cost",
        "methods",
        "exempt_when",
        "quota_for",
        "max_keys",
        "shared",
        "capacity",
        "on_mismatch",
        "trust_user",
        "trust_group",
        "when_full",
        "redis",
        "_rates",
        "_tables",
        "_built",
        "_reopen_logged",
        "_cost_async",
    )

    def __init__(
        self,
        name: str,
        rate: Rate,
        per: float = 1.0,
        burst: Optional[int] = None,
        *,
        key: Union[KeySource, Callable[[Scope], Any], None] = None,
        cost: Union[int, Callable[[Scope], Any]] = 1,
        methods: Optional[Iterable[str]] = None,
        exempt_when: Optional[Callable[[Scope], bool]] = None,
        quota_for: Optional[Callable[[str], Any]] = None,
        max_keys: Optional[int] = None,
        shared: "os.PathLike[str] | str | bytes | None" = None,
        capacity: int = 65_536,
        on_mismatch: str = "refuse",
        trust_user: "int | str | None" = None,
        trust_group: "int | str | None" = None,
        when_full: str = "503",
        redis: Any = None,
        redis_timeout: float = 0.25,
        on_redis_failure: Any = "closed",
        storage_uri: Optional[str] = None,
    ) -> None:
        if not isinstance(name, str) or not name:
            raise ValueError(f"a limit's name must be a non-empty str, got {name!r}")
        check_limit_name(name)
        if storage_uri is not None:
            from .storage import parse

            where = parse(storage_uri).options(name)
            if where and (shared is not None or redis is not None):
                raise ValueError("give a limit storage_uri, or shared= / redis=, not both")
            shared = where.get("shared", shared)
            redis = where.get("redis", redis)
            capacity = where.get("capacity", capacity)
        self.name = name
        self._rates = _rates(rate, per, burst)
        for _, _, _, text in self._rates:
            if len(self._rates) > 1:
                check_limit_name(f"{name} {text}")
        if key is None:
            key = KeySource.peer_ip()
        elif not isinstance(key, KeySource):
            key = KeySource.callable(key)
        self.key = key
        if callable(cost):
            self._cost_async = _is_async(cost)
        else:
            cost = _count("cost", cost, 0)
            self._cost_async = False
        self.cost = cost
        if methods is not None:
            if isinstance(methods, str):
                methods = [methods]
            methods = [str(m).upper() for m in methods]
            if "GET" in methods and "HEAD" not in methods:
                # Starlette and FastAPI serve HEAD with the GET endpoint: limit it alike.
                methods.append("HEAD")
        self.methods = methods
        if exempt_when is not None and not callable(exempt_when):
            raise TypeError("exempt_when must be a function of the scope returning a bool")
        self.exempt_when = exempt_when
        if quota_for is not None:
            if not callable(quota_for):
                raise TypeError("quota_for must be a function of the key returning a rate")
            if key._fn is None:
                raise ValueError(
                    "quota_for needs the key computed in Python: give key a function "
                    "(KeySource.callable) that returns the client's key"
                )
            if shared is not None:
                raise ValueError("a shared file holds one quota: quota_for is for in-process limits")
        self.quota_for = quota_for
        self.max_keys = None if max_keys is None else _count("max_keys", max_keys, 1)
        self.shared = None if shared is None else _path(shared)
        if self.shared is not None and max_keys is not None:
            raise ValueError("a shared limit's keys are bounded by capacity, not max_keys")
        if self.shared is not None and len(self._rates) > 1:
            raise ValueError(
                "a shared file holds one rate: give each rate a Limit and a path of its own"
            )
        self.capacity = _capacity(capacity)
        if on_mismatch not in ("refuse", "adopt", "replace"):
            raise ValueError(
                f'on_mismatch must be "refuse", "adopt" or "replace", got {on_mismatch!r}'
            )
        self.on_mismatch = on_mismatch
        self.trust_user = _trusted("trust_user", trust_user, _uid)
        self.trust_group = _trusted("trust_group", trust_group, _gid)
        if when_full not in ("503", "admit"):
            raise ValueError(f'when_full must be "503" or "admit", got {when_full!r}')
        self.when_full = when_full
        self.redis = None
        if redis is not None:
            self.redis = _fleet_limiter(self, redis, redis_timeout, on_redis_failure, max_keys)
        self._tables: List[Any] = []
        self._reopen_logged = -math.inf
        self._open()

    def _open(self) -> None:
        """Opens (again) the shared file, if any, and builds the limit in the Rust layer
        (every check of the layer runs here, so a bad limit fails where it is written): at
        start-up, and when the path no longer leads to the file this process has open.
        The built limit holds the counts, so every middleware or route it is part of
        shares them."""
        if self.shared is not None:
            self._open_file()
        self._built = [build_limit(spec) for spec in self._specs()]

    def _open_file(self) -> None:
        count, per, burst, _ = self._rates[0]
        self._tables = [
            open_shared_table(
                self.shared,
                self.name,
                count,
                per,
                burst,
                self.capacity,
                self.on_mismatch,
                self.trust_user,
                self.trust_group,
            )
        ]

    def _stale(self) -> bool:
        """Whether the shared file was removed or replaced at its path."""
        return any(not table.is_current() for table in self._tables)

    def reset(self) -> None:
        """Starts every key of this limit afresh, as if no request had come: for a test
        suite that must pass twice, and for an operator. In process, at once for every
        middleware and route the limit is part of; with ``shared=``, the file is removed
        and made anew, and every worker of the host follows within a second. A limit kept
        in Redis resets with ``await limit.areset()`` (a Redis call): this raises
        ``TypeError`` for one."""
        if self.redis is not None:
            raise TypeError(
                f"the limit {self.name!r} is kept in Redis: reset it with `await "
                "limit.areset()`"
            )
        self._reset_here()

    async def areset(self) -> None:
        """``reset`` for a limit in any tier, in Redis too: every key of this limit is
        deleted there, for every server of the fleet (each server's memory of a refusal
        it just made goes at once in this process; another process may refuse a key it
        refused itself for up to the wait Redis told it)."""
        if self.redis is None:
            self._reset_here()
            return
        await _reset_in_redis(self)

    def _reset_here(self) -> None:
        owner = None
        if self.shared is not None:
            try:
                owner = os.stat(self.shared)
                os.unlink(self.shared)
            except FileNotFoundError:
                pass  # removed already: the path is made anew
            except PermissionError as e:
                raise PermissionError(
                    f"cannot reset the limit {self.name!r}: its shared file {self.shared!r} "
                    f"cannot be removed by this user ({e.strerror}); remove it as its owner"
                ) from None
        self._open()
        if owner is not None and (owner.st_uid, owner.st_gid) != (os.geteuid(), os.getegid()):
            # Made anew as the old one was (another user's workers must open it again).
            try:
                os.chown(self.shared, owner.st_uid, owner.st_gid)
                os.chmod(self.shared, stat.S_IMODE(owner.st_mode))
            except OSError as e:
                raise PermissionError(
                    f"reset the limit {self.name!r}, but its new file {self.shared!r} could "
                    f"not be given to the old one's owner (uid {owner.st_uid}: {e.strerror}); "
                    "its workers cannot open it until it is: reset as that user or as root"
                ) from None
        _RESETS[0] += 1

    def __repr__(self) -> str:
        rates = ", ".join(f"{c}/{p:g}s" for c, p, _, _ in self._rates)
        return (
            f"Limit({self.name!r}, {rates}, key={self.key!r}"
            f"{'' if self.shared is None else f', shared={self.shared!r}'})"
        )

    def _specs(self) -> List[_Spec]:
        specs = []
        for i, (count, per, burst, text) in enumerate(self._rates):
            spec = _Spec()
            spec.name = self.name if len(self._rates) == 1 else f"{self.name} {text}"
            spec.count, spec.per, spec.burst = count, per, burst
            spec.key = self.key._spec
            spec.max_keys = self.max_keys
            spec.table = self._tables[i] if self._tables else None
            spec.cost = None if callable(self.cost) else self.cost
            spec.methods = self.methods
            spec.python_when = self.exempt_when is not None
            spec.tiered = self.quota_for is not None
            spec.admit_when_full = self.when_full == "admit"
            spec.limit = self
            specs.append(spec)
        return specs


#: How many resets this process made: the middlewares and routes rebuild what they hold
#: of their limits when it changes (a list: read and bumped in place).
_RESETS = [0]


async def _reset_in_redis(limit: Limit) -> None:
    """Deletes every key of ``limit`` in Redis (every node of a cluster)."""
    limiter = limit.redis
    client = limiter._client
    # Glob characters in the name match themselves.
    name = "".join("\\" + c if c in "*?[]\\" else c for c in limit.name)
    pattern = f"paceline-asgi:{name}:{{*"
    cluster = hasattr(client, "get_primaries")
    batch: List[Any] = []
    async for key in client.scan_iter(match=pattern, count=1000):
        if cluster:
            await client.unlink(key)  # one slot per key
            continue
        batch.append(key)
        if len(batch) >= 1000:
            await client.unlink(*batch)
            batch.clear()
    if batch:
        await client.unlink(*batch)
    limiter._refused.clear()


#: The quota each limit kept in Redis was last made with in this process, by name.
_redis_quotas: Dict[str, Tuple[int, float, int]] = {}


def _fleet_limiter(limit: Limit, client: Any, timeout: float, on_failure: Any, max_keys: Any) -> Any:
    """The ``paceline.redis.RedisLimiter`` of a limit kept in Redis."""
    if limit.shared is not None:
        raise ValueError("a limit is kept in a shared file or in Redis, not both")
    if max_keys is not None:
        raise ValueError("a limit kept in Redis has no max_keys: Redis keeps its keys")
    if limit.quota_for is not None:
        raise ValueError("a limit kept in Redis has one quota: quota_for is for in-process limits")
    if len(limit._rates) > 1:
        raise ValueError("a limit kept in Redis has one rate: give each rate a Limit of its own")
    if "{" in limit.name or "}" in limit.name:
        raise ValueError(
            f"a limit kept in Redis names its Redis keys, which take no braces: {limit.name!r}"
        )
    from ..redis import RedisLimiter

    count, per, burst, _ = limit._rates[0]
    quota = (count, per, burst)
    earlier = _redis_quotas.setdefault(limit.name, quota)
    if earlier != quota:
        _log.warning(
            "paceline: two limits named %r are kept in Redis with different quotas (%d per "
            "%g s, burst %d; then %d per %g s, burst %d): in Redis a limit's name is its "
            "count, so they share one, each deciding by its own quota. Give them two names.",
            limit.name,
            *earlier,
            *quota,
        )
        _redis_quotas[limit.name] = quota
    return RedisLimiter(
        client,
        count,
        per,
        burst,
        prefix=f"paceline-asgi:{limit.name}",
        timeout=timeout,
        on_failure=on_failure,
    )


def _tier(rate: object) -> str:
    """A ``quota_for`` answer as the key prefix the Rust layer reads
    (``"{count}/{per ns}/{burst}"``)."""
    if isinstance(rate, tuple):
        if not 1 <= len(rate) <= 3:
            raise ValueError(f"quota_for must give rate, (rate, per) or (rate, per, burst), got {rate!r}")
        rates = _rates(rate[0], rate[1] if len(rate) > 1 else 1.0, rate[2] if len(rate) > 2 else None)
    else:
        rates = _rates(rate, 1.0, None)
    if len(rates) != 1:
        raise ValueError(f"quota_for must give one rate per key, got {rate!r}")
    count, per, burst, _ = rates[0]
    return f"{count}/{round(per * 1e9)}/{burst}"
