"""The Python API's arguments checked and converted, with errors in its words: counts,
quotas, timeouts, seconds, shared files' paths, capacities and trusted users."""

from __future__ import annotations

import os
from typing import Optional, Tuple

from ._paceline import MAX_CAPACITY

# The largest count of cells the Rust core takes (a u32).
_MAX_COUNT = 0xFFFF_FFFF


def _count(name: str, value: object, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if not minimum <= value <= _MAX_COUNT:
        raise ValueError(f"{name} must be between {minimum} and {_MAX_COUNT}, got {value}")
    return value


def _timeout(value: object) -> Optional[float]:
    """A timeout in seconds; ``None`` or infinity (as for ``asyncio.wait_for``) is none."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(
            f"timeout must be None or a number of seconds, got {type(value).__name__}"
        )
    value = float(value)
    if value == float("inf"):
        return None
    if not value >= 0.0:
        raise ValueError(f"timeout must be None or a number of seconds >= 0, got {value}")
    return value


def _finite(value: object, above_zero: bool, not_a_number: str, out_of_range: str) -> float:
    """``value`` as a float, finite and at least 0 (above 0 with ``above_zero``):
    ``TypeError`` "<not_a_number>, got <its type>" for anything but an int or a float,
    ``ValueError`` "<out_of_range>, got <value>" for one out of range (or NaN)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{not_a_number}, got {type(value).__name__}")
    value = float(value)
    if not ((value > 0.0 if above_zero else value >= 0.0) and value < float("inf")):
        raise ValueError(f"{out_of_range}, got {value}")
    return value


def _hold_seconds(value: object) -> float:
    return _finite(value, False, "seconds must be a number", "seconds must be a finite number >= 0")


def _path(path: object) -> str:
    """A shared file's path as the Rust side opens it, made absolute now: a limiter
    unpickled under another working directory opens the same file."""
    if not isinstance(path, (str, bytes, os.PathLike)):
        raise TypeError(
            f"path must be a str, bytes or os.PathLike, got {type(path).__name__}"
        )
    text = os.fsdecode(os.fspath(path))
    if "\0" in text:
        raise ValueError(f"path must not contain a NUL character, got {text!r}")
    if text.endswith("/"):
        raise ValueError(f"path names a directory (it ends with '/'), not a file: {text!r}")
    return os.path.abspath(text)


def _trusted(name: str, value: object, lookup) -> Optional[int]:  # type: ignore[no-untyped-def]
    """A user or group the caller trusts, by id (int) or name (str)."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise TypeError(f"{name} must be an int id or a str name, got bool")
    if isinstance(value, int):
        if not 0 <= value <= _MAX_COUNT:
            raise ValueError(f"{name} must be an id between 0 and {_MAX_COUNT}, got {value}")
        return value
    if isinstance(value, str):
        try:
            return lookup(value)
        except KeyError:
            raise ValueError(f"{name}: no such {name.split('_')[1]} {value!r}") from None
    raise TypeError(f"{name} must be an int id or a str name, got {type(value).__name__}")


def _uid(name: str) -> int:
    import pwd

    return pwd.getpwnam(name).pw_uid


def _gid(name: str) -> int:
    import grp

    return grp.getgrnam(name).gr_gid


def _capacity(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"capacity must be an int, got {type(value).__name__}")
    if not 1 <= value <= MAX_CAPACITY:
        raise ValueError(f"capacity must be between 1 and {MAX_CAPACITY} keys, got {value}")
    return value


def _quota(rate: object, per: object, burst: object) -> Tuple[int, float, int]:
    """A quota's ``(rate, per, burst)``, checked; ``burst`` ``None`` is the rate (the one
    rule of every constructor given only a count: "10 per second" lets 10 through at
    once, as in the Rust crate)."""
    rate = _count("rate", rate, 1)
    if burst is None:
        burst = rate
    if isinstance(per, bool) or not isinstance(per, (int, float)):
        raise TypeError(f"per must be a number of seconds, got {type(per).__name__}")
    per = float(per)
    if not 0.0 < per < float("inf"):
        raise ValueError(f"per must be a positive, finite number of seconds, got {per}")
    burst = _count("burst", burst, 1)
    return rate, per, burst
