"""A lock held by a thread when the process forks is not held by the child: the hang a
DataLoader worker met when forked while a download thread held the node's lock."""

from __future__ import annotations

import functools
import multiprocessing
import threading
from pathlib import Path
from typing import Any

import pytest

from shardwise.concurrency import flock
from shardwise.format.confined import LOCK, open_under


def _opener(path: Path) -> functools.partial[int]:
    return functools.partial(open_under, path.parent, path.name, LOCK)


def _lock_in_child(path: Path, out: Any) -> None:
    with flock.exclusive(_opener(path)):
        out.put("locked")


@pytest.mark.filterwarnings("ignore:.*fork.*:DeprecationWarning")  # Python >= 3.12
def test_a_forked_child_does_not_keep_its_parents_lock(tmp_path: Path) -> None:
    path = tmp_path / ".lock"
    held, done = threading.Event(), threading.Event()

    def holder() -> None:
        with flock.exclusive(_opener(path)):
            held.set()
            done.wait(10)

    t = threading.Thread(target=holder)
    t.start()
    assert held.wait(5)
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    child = ctx.Process(target=_lock_in_child, args=(path, out))
    child.start()  # forked while the thread holds the lock
    done.set()
    t.join()  # the parent released it: the child must get it now
    child.join(20)
    if child.exitcode is None:
        child.kill()
        child.join()
    assert child.exitcode == 0, "the child waited for ever on a lock only it still held"
    assert out.get(timeout=1) == "locked"
