"""shardwise's background threads end before the interpreter does.

Why: its threads are daemons (a reader must never keep a program alive), and a daemon
thread still inside native code while the interpreter finalises is killed when it takes
the GIL back; unwinding through C++ frames (numpy, torch) then aborts the whole process
with "terminate called without an active exception" (SIGABRT): a torchrun rank dying
after its last step, at random. ``concurrent.futures`` joins its workers at exit for the
same reason. Every :class:`~.readahead.ReadAhead` and :class:`~.threads.ThreadPool` that
starts a thread registers here; at exit each one is stopped (queued work dropped, running
work finished, waiting threads woken) and joined for at most :data:`JOIN_SECONDS`.
"""

from __future__ import annotations

import atexit
import threading
import weakref
from typing import Protocol

JOIN_SECONDS = 10.0


class Stoppable(Protocol):
    def close_at_exit(self, timeout: float) -> None: ...


_live: weakref.WeakSet[Stoppable] = weakref.WeakSet()
_lock = threading.Lock()


def register(owner: Stoppable) -> None:
    """Stop ``owner`` at interpreter exit, if it is still alive then."""
    with _lock:
        _live.add(owner)


def _stop_all() -> None:
    with _lock:
        owners = list(_live)
    for owner in owners:
        owner.close_at_exit(JOIN_SECONDS)


atexit.register(_stop_all)

__all__ = ["JOIN_SECONDS", "register"]
