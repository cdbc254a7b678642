"""The one bounded cache (concurrency/bounded.py): bounds, eviction order, the hook,
pickling empty."""

from __future__ import annotations

import pickle
from typing import Any

import numpy as np
import pytest

from shardwise.concurrency.bounded import Bounded

EVICTED: list[tuple[Any, Any]] = []


def _note(cache: Bounded[Any, Any], key: Any, value: Any) -> None:
    EVICTED.append((key, value))


def test_the_least_recently_used_entry_goes_first() -> None:
    b: Bounded[str, int] = Bounded(3)
    for k, v in zip("abc", range(3), strict=True):
        b.put(k, v)
    assert b.get("a") == 0  # a is now the most recent
    b.put("d", 3)
    assert b.keys() == ["c", "a", "d"] and "b" not in b and len(b) == 3
    assert b.get("b") is None
    b.put("c", 9)  # replacing makes it the most recent, not a second entry
    assert b.keys() == ["a", "d", "c"] and b.get("c") == 9


def test_a_weight_bound_keeps_the_newest_even_when_it_alone_is_over() -> None:
    b: Bounded[int, np.ndarray] = Bounded(weight=10, weigh=len)
    b.put(0, np.zeros(4))
    b.put(1, np.zeros(4))
    assert b.held == 8
    b.put(2, np.zeros(4))  # 12 > 10: the oldest goes
    assert b.keys() == [1, 2] and b.held == 8
    b.put(3, np.zeros(30))  # heavier than the bound: kept alone
    assert b.keys() == [3] and b.held == 30
    assert b.pop(3) is not None and b.held == 0 and not b


def test_both_bounds_and_the_hook() -> None:
    EVICTED.clear()
    b: Bounded[int, str] = Bounded(3, weight=5, weigh=len, on_evict=_note)
    for k, v in enumerate(["x", "y", "z", "w"]):
        b.put(k, v)  # the count bound evicts 0
    b.put(9, "long")  # the weight bound evicts 1 and 2 (w + long = 5)
    assert EVICTED == [(0, "x"), (1, "y"), (2, "z")] and b.keys() == [3, 9]
    b.pop(3)  # asked for: no hook
    assert len(EVICTED) == 3
    b.clear()  # dropped: the hook sees each
    assert EVICTED[3:] == [(9, "long")] and len(b) == 0 and b.held == 0


def test_it_pickles_empty_with_its_bounds_and_hook() -> None:
    b: Bounded[int, np.ndarray] = Bounded(2, weight=100, weigh=len, on_evict=_note)
    b.put(0, np.arange(50))
    copy = pickle.loads(pickle.dumps(b))
    assert len(copy) == 0 and copy.held == 0 and len(b) == 1
    assert (copy.items, copy.weight, copy.weigh, copy.on_evict) == (2, 100, len, _note)
    EVICTED.clear()
    for k in range(3):
        copy.put(k, np.arange(1))
    assert [k for k, _ in EVICTED] == [0]


@pytest.mark.parametrize("kwargs", [{}, {"items": 0}, {"weight": -1, "weigh": len},
                                    {"weight": 10}])
def test_a_cache_without_a_sound_bound_is_refused(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="Bounded: "):
        Bounded(**kwargs)
