"""Where limits keep their counts, named by a URI as the frameworks' settings write it
(Flask's ``storage_uri``, Django's ``PACELINE_STORAGE_URI``): one parser for every
integration, checked when the app is imported.

* ``memory://``: this process's memory (each worker process counts on its own);
* ``file:///dev/shm/myapp``: a file per limit, ``/dev/shm/myapp.<limit name>``, that
  every process of the host opens (the shared-file tier, with its owner checks), each
  with room for 65 536 clients still limited (4 MiB); ``?capacity=4096`` sets that;
* ``redis://host:6379/0``, ``rediss://...`` (TLS), ``redis+cluster://host:7000``: Redis,
  for a fleet of hosts (one client per URI and process; it connects on first use, so an
  app starts while its Redis is down, and the failure policy answers meanwhile).
"""

from __future__ import annotations

import os
import urllib.parse
from typing import Any, Dict, Optional, Tuple

SCHEMES = ("memory://", "file:///path", "redis://", "rediss://", "redis+cluster://")

#: One Redis client per URI, kind of client and process.
_clients: Dict[Tuple[str, int], Any] = {}


class Storage:
    """A parsed storage URI: ``kind`` is ``"memory"``, ``"file"`` or ``"redis"``."""

    __slots__ = ("uri", "kind", "path", "cluster", "capacity")

    def __init__(self, uri: str, kind: str, path: str = "", cluster: bool = False,
                 capacity: Optional[int] = None) -> None:
        self.uri, self.kind, self.path, self.cluster = uri, kind, path, cluster
        self.capacity = capacity

    def __repr__(self) -> str:
        return f"Storage({self.uri!r})"

    def options(self, name: str) -> Dict[str, Any]:
        """A ``Limit``'s keyword arguments to keep the limit ``name`` here."""
        if self.kind == "memory":
            return {}
        if self.kind == "file":
            options: Dict[str, Any] = {"shared": f"{self.path}.{_file_safe(name)}"}
            if self.capacity is not None:
                options["capacity"] = self.capacity
            return options
        return {"redis": self.client()}

    def client(self) -> Any:
        """This process's ``redis.asyncio`` client for the URI (made once, connected on
        first use)."""
        key = (self.uri, os.getpid())
        client = _clients.get(key)
        if client is None:
            try:
                import redis.asyncio as aioredis
                from redis.asyncio.cluster import RedisCluster
            except ImportError:
                raise ImportError(
                    f"storage {self.uri!r} needs redis-py: pip install redis"
                ) from None
            if self.cluster:
                url = "redis" + self.uri[len("redis+cluster") :]
                client = RedisCluster.from_url(url)
            else:
                client = aioredis.Redis.from_url(self.uri)
            _clients[key] = client
        return client


def parse(uri: object) -> Storage:
    """``uri`` checked and parsed; ``ValueError`` naming it and what is accepted."""
    if isinstance(uri, Storage):
        return uri
    if not isinstance(uri, str):
        raise TypeError(f"a storage URI must be a str, got {type(uri).__name__}")
    accepted = f"accepted: {', '.join(SCHEMES)}"
    scheme, sep, rest = uri.partition("://")
    if not sep:
        raise ValueError(f"storage URI {uri!r} has no scheme ({accepted})")
    scheme = scheme.lower()
    if scheme == "memory":
        if rest not in ("", "/"):
            raise ValueError(f"storage URI {uri!r}: memory:// takes nothing after it")
        return Storage(uri, "memory")
    if scheme == "file":
        parsed = urllib.parse.urlsplit(uri)
        if parsed.netloc not in ("", "localhost") or parsed.fragment:
            raise ValueError(
                f"storage URI {uri!r}: a file URI names a path on this host, such as "
                "file:///dev/shm/myapp"
            )
        capacity = None
        for name, value in urllib.parse.parse_qsl(parsed.query, keep_blank_values=True):
            if name != "capacity" or not value.isdigit() or not 0 < int(value) <= 1 << 32:
                raise ValueError(
                    f"storage URI {uri!r}: a file URI takes one setting, capacity=<clients "
                    "kept per limit> (64 bytes each; default 65536)"
                )
            capacity = int(value)
        path = urllib.parse.unquote(parsed.path)
        if not path.startswith("/") or path.endswith("/") or "\x00" in path:
            raise ValueError(
                f"storage URI {uri!r}: give an absolute path for the limits' files (each "
                "limit's file is that path, a dot and its name), such as file:///dev/shm/myapp"
            )
        directory = os.path.dirname(path)
        if not os.path.isdir(directory):
            raise ValueError(f"storage URI {uri!r}: the directory {directory!r} does not exist")
        return Storage(uri, "file", path=path, capacity=capacity)
    if scheme in ("redis", "rediss", "redis+cluster"):
        parsed = urllib.parse.urlsplit(uri)
        try:
            parsed.port  # noqa: B018 - raises ValueError for a port that is not a number
        except ValueError as e:
            raise ValueError(f"storage URI {uri!r}: {e}") from None
        if not parsed.hostname and scheme != "redis":
            raise ValueError(f"storage URI {uri!r} names no host")
        return Storage(uri, "redis", cluster=scheme == "redis+cluster")
    raise ValueError(f"storage URI {uri!r}: unknown scheme {scheme!r} ({accepted})")


def _file_safe(name: str) -> str:
    """A limit's name as part of a file name: letters, digits, ``-``, ``_`` and ``.``
    as they are, any other byte as ``%XX``."""
    return urllib.parse.quote(name, safe="-_.")
