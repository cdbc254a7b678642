"""Argument checks shared by the plan modules.

Every plan function takes plain integers or integer arrays; these helpers turn them into
``int64`` arrays and raise ``ValueError`` messages that say what was expected, what was
got and what to do, so the public functions can stay short.
"""

from __future__ import annotations

import math
import numbers

import numpy as np
import numpy.typing as npt

from shardwise.checkpoint import as_count
from shardwise.errors import ConfigError

IntArray = npt.NDArray[np.int64]
ANY_SIGN = -(1 << 255)  # a minimum no argument of a plan reaches: seeds are hashed, not cast
IndexLike = int | npt.ArrayLike


def check_int(value: object, name: str, *, minimum: int | None = None,
              maximum: int | None = None) -> int:
    """Return ``value`` as an ``int`` after checking its type and bounds.

    The type rule is the one for every count (:func:`~shardwise.checkpoint.as_count`:
    numpy and torch integers are integers, ``bool`` and floats are not); this adds an
    upper bound, and ``minimum=None`` for values of any sign (a seed, an offset). The
    error is a :class:`~shardwise.errors.ConfigError`, which is a ``ValueError``."""
    v = as_count(value, name, minimum=ANY_SIGN if minimum is None else minimum,
                 error=ConfigError)
    if maximum is not None and v > maximum:
        raise ConfigError(f"{name} must be <= {maximum}, got {v}")
    return v


def as_index_array(idx: IndexLike, name: str) -> tuple[IntArray, bool]:
    """``idx`` as an int64 array plus whether it was a scalar (so callers can unwrap)."""
    if isinstance(idx, numbers.Integral) and not isinstance(idx, bool):
        return np.asarray([int(idx)], dtype=np.int64), True
    arr = np.asarray(idx)
    if arr.size and not np.issubdtype(arr.dtype, np.integer):
        raise ValueError(f"{name} must be integers, got an array of dtype {arr.dtype}")
    return arr.astype(np.int64, copy=False), arr.ndim == 0


def as_position_array(idx: IndexLike, name: str) -> tuple[IntArray, bool]:
    """:func:`as_index_array` for positions and counts: every element ``>= 0``."""
    arr, scalar = as_index_array(idx, name)
    if arr.size and arr.min() < 0:
        raise ConfigError(f"{name} must be >= 0, got {arr.min()}")
    return arr, scalar


def check_in_range(arr: IntArray, n: int, name: str, what: str = "indices") -> None:
    """Raise if any element of ``arr`` is outside ``[0, n)``."""
    if arr.size == 0:
        return
    lo, hi = int(arr.min()), int(arr.max())
    if lo < 0 or hi >= n:
        bad = lo if lo < 0 else hi
        raise ValueError(
            f"{name}: {what} must be in [0, {n}), got {bad}; "
            f"valid {what} are 0..{n - 1}" if n > 0 else
            f"{name}: there are no valid {what} (n = 0), got {bad}"
        )


def unwrap(arr: IntArray, scalar: bool) -> int | IntArray:
    """Give back a Python int for scalar input, else the array."""
    return int(arr.reshape(-1)[0]) if scalar else arr


def divisors(n: int) -> list[int]:
    """The positive divisors of ``n``, ascending (for error messages that suggest a fix)."""
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))
