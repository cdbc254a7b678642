"""build_once in one process: the load/lock/build protocol's edges (the races between
processes are in tests/read/test_plan_once.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from shardwise.concurrency import flock
from shardwise.concurrency.once import build_once
from shardwise.format.confined import LOCK, open_under


def _opener(path: Path):  # type: ignore[no-untyped-def]
    return lambda: open_under(path.parent, path.name, LOCK)


def test_a_failed_build_raises_and_leaves_the_lock_free(tmp_path: Path) -> None:
    target, lock = tmp_path / "value", tmp_path / "value.lock"

    def load() -> str | None:
        return target.read_text() if target.exists() else None

    def broken() -> None:
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        build_once(lock, load=load, build=broken, what="v", open_lock=_opener(lock))
    assert build_once(lock, load=load, build=lambda: target.write_text("ok"), what="v",
                      open_lock=_opener(lock)) == "ok"
    with flock.exclusive(_opener(lock)):  # released: taken at once
        pass


def test_damaged_is_rebuilt_and_a_build_that_publishes_nothing_is_a_bug(tmp_path: Path) -> None:
    target = tmp_path / "value"
    target.write_text("bad")

    def load() -> str | None:
        if not target.exists():
            return None
        if target.read_text() == "bad":
            raise ValueError("damaged")
        return target.read_text()

    got = build_once(tmp_path / "l", load=load, build=lambda: target.write_text("good"),
                     what="v", damaged=(ValueError,), open_lock=_opener(tmp_path / "l"))
    assert got == "good"
    with pytest.raises(RuntimeError, match="built, but nothing was published"):
        build_once(tmp_path / "l2", load=lambda: None, build=lambda: None, what="w",
                   open_lock=_opener(tmp_path / "l2"))
