"""checkpoint.staged: config entries that take effect from a position may change after a
state's position and nowhere before it (a blend schedule's stages, a skip list)."""

from __future__ import annotations

from typing import Any

import pytest

from shardwise.checkpoint import LoaderState, fingerprint, staged
from shardwise.errors import StateError


def state_at(consumed: int, config: dict[str, Any]) -> LoaderState:
    return LoaderState(fingerprint=fingerprint(config), consumed=consumed, config=config)


def check(state: LoaderState, config: dict[str, Any]) -> None:
    state.check_matches("loader", fingerprint(config), config)


def test_entries_from_the_saved_position_on_may_change() -> None:
    saved = {"seed": 1, "plan": staged([(10, "x"), (50, "y")])}
    at = state_at(50, saved)
    check(at, {"seed": 1, "plan": staged([(10, "x"), (50, "z"), (70, "w")])})
    check(at, {"seed": 1, "plan": staged([(10, "x")])})  # later entries removed
    check(state_at(5, saved), {"seed": 1})  # nothing started before 5: the key may go
    check(state_at(5, {"seed": 1}), {"seed": 1, "plan": staged([(5, "x")])})
    with pytest.raises(StateError, match=r"plan: the entry from example 10 differs"):
        check(at, {"seed": 1, "plan": staged([(10, "q"), (50, "y")])})
    with pytest.raises(StateError, match=r"plan: the entry from example 49 differs"):
        check(at, {"seed": 1, "plan": staged([(10, "x"), (49, "y")])})
    with pytest.raises(StateError, match=r"plan: the entry from example 10 differs"):
        check(at, {"seed": 1})
    with pytest.raises(StateError, match="seed: state has 1, this reader has 2"):
        check(at, {"seed": 2, "plan": staged([(10, "x"), (50, "y")])})


def test_a_value_that_only_looks_staged_is_compared_whole() -> None:
    at = state_at(50, {"plan": {"staged_from": "not a list"}})
    with pytest.raises(StateError, match="plan: state has"):
        check(at, {"plan": staged([(60, "x")])})
