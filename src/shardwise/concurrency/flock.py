"""Advisory file locks that a forked child does not inherit.

``flock`` locks belong to an open file description, which ``fork`` shares: a child forked
while some thread of its parent holds a lock keeps a copy of the descriptor, so the lock
outlives the parent's release for as long as the child lives — and the child itself then
waits for ever on its own ``flock`` of the same file (a DataLoader worker forked while a
download thread held the node's download lock did exactly that). Every lock taken here is
recorded, and the fork hook of :mod:`.local` (the one) closes the child's copies, so only
the process that took a lock holds it.

>>> with exclusive(lambda: open_under(cache, ".lock", LOCK)):  # doctest: +SKIP
...     ...                                     # one process of the node at a time

The caller opens the lock file (``open_lock``): a lock beside a cache is opened through
:func:`~shardwise.format.confined.open_under`, which follows no symlink a cache ships.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import threading
from collections.abc import Callable, Iterator

from shardwise.concurrency.local import on_fork

_HELD: set[int] = set()
_GUARD = threading.Lock()


def _close_in_child() -> None:
    for fd in list(_HELD):
        with contextlib.suppress(OSError):
            os.close(fd)
    _HELD.clear()


def hold(fd: int) -> None:
    """Record ``fd`` as holding a lock: a forked child closes its copy."""
    on_fork(_close_in_child)
    with _GUARD:
        _HELD.add(fd)


def release(fd: int) -> None:
    """Close ``fd`` (releasing its lock) and forget it."""
    with _GUARD:
        _HELD.discard(fd)
    os.close(fd)


def try_lock(fd: int) -> bool:
    """A non-blocking exclusive ``flock`` of ``fd``."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False


@contextlib.contextmanager
def exclusive(open_lock: Callable[[], int]) -> Iterator[None]:
    """Hold an exclusive lock on the file ``open_lock()`` opens (a descriptor this takes
    over) for the block."""
    fd = open_lock()
    hold(fd)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        release(fd)
