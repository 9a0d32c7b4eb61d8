"""What ``Limiter``, ``KeyedLimiter`` and ``Budget`` share as objects that may live in a
file (their ``shared`` constructors): the file's arguments checked, ``path``, pickling as
the file, and a limiter's Rust core set up, its own methods bound on the limiter."""

from __future__ import annotations

from typing import Any, Callable, Optional, Tuple

from ._args import _gid, _path, _trusted, _uid
from ._waiting import _Waiting

_PICKLE_HINT = (
    "cannot pickle an in-process paceline.{0}: a copy in another process would be a "
    "limiter of its own, letting the quota through once per process. To share one quota "
    "across processes (multiprocessing, a ProcessPoolExecutor, gunicorn workers), use "
    "paceline.{0}.shared(path, ...): it pickles as its path and quota."
)


def _file_args(path: object, trust_user: object, trust_group: object) -> Tuple[str, Optional[int], Optional[int]]:
    """A shared file's path (absolute), and the trusted user and group ids."""
    return _path(path), _trusted("trust_user", trust_user, _uid), _trusted("trust_group", trust_group, _gid)


def _file_path(self: Any) -> Optional[str]:
    return None if self._shared is None else self._shared[0]


class _InAFile:
    """Pickles as its file: ``_shared`` holds the file's path first and what ``_attach``
    (a module function, as a static method) takes to open it again in another process;
    ``None`` in-process, which refuses to pickle with ``_refusal``."""

    _shared: Optional[tuple]
    _attach: Callable[..., Any]
    _refusal: str

    def __reduce__(self) -> tuple:
        if self._shared is None:
            raise TypeError(self._refusal)
        return (self._attach, self._shared)


def _set_core(self: Any, plain: type, core: Any, shared: Optional[tuple]) -> None:
    """Gives the limiter ``self`` its Rust core, a waiting room and its file's
    ``_shared`` (``None`` in-process), and makes ``try_acquire`` and ``acquire`` the
    core's own methods on it (no Python frame per call), unless its class overrides
    ``plain``'s. An ``acquire`` that must wait comes back to ``self._acquire``, which the
    core holds (a cycle with the limiter that the garbage collector sees and breaks)."""
    self._core = core
    self._waiting = _Waiting()
    self._shared = shared
    core.bind(self._acquire)
    cls = type(self)
    if cls.try_acquire is plain.try_acquire:
        self.try_acquire = core.try_acquire
    if cls.acquire is plain.acquire:
        self.acquire = core.acquire
