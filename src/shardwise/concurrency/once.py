"""Build a derived file once per node: one process builds, the others wait and load it.

Why: a document-shuffle plan is O(documents) of CPU and memory; eight ranks of a node
building it side by side pay eight times for identical bytes. With :func:`build_once`
one process (whoever takes the lock first) builds and publishes, and every other process
of the node waits, by the one poller, until it can load what was published::

    rank 0   load: absent ─ lock taken ─ build ─ publish ─ release ─▶ load
    rank 1   load: absent ─ lock busy … (10 ms doubling) … load: published ──────▶ load
    rank 2   (later)  load: published ───────────────────────────────────────────▶ load

A builder that dies (SIGKILL, out of memory) loses its ``flock`` with its last file
descriptor: the kernel releases it, so the next waiter to try the lock gets it, finds
nothing published (or finds it published after all) and builds it itself. No pid files,
no stale lock to clean up. A file that ``load`` finds damaged (it raises one of
``damaged``) is never returned: the process then takes the lock and, still finding it
damaged, rebuilds it.

>>> plan = build_once(Path("plans/F.lock"), load=load_plan, build=write_plan,
...                   open_lock=lambda: open_under(plans, "F.lock", LOCK),
...                   what="the plan F")                       # doctest: +SKIP
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from shardwise.concurrency import flock
from shardwise.concurrency.poll import wait_until

T = TypeVar("T")


def _load(load: Callable[[], T | None], damaged: tuple[type[BaseException], ...]) -> T | None:
    """What ``load()`` returns; ``None`` also when what is published is damaged."""
    try:
        return load()
    except damaged:
        return None


def build_once(lock_path: Path, *, load: Callable[[], T | None], build: Callable[[], None],
               open_lock: Callable[[], int], what: str,
               damaged: tuple[type[BaseException], ...] = (),
               timeout: float = math.inf, poll_interval: float = 0.1) -> T:
    """``load()`` if it returns something, else build once per ``lock_path`` and load.

    ``load()`` returns ``None`` while nothing is published, and raises one of ``damaged``
    for a published file it cannot use. ``build()`` publishes atomically (a temporary
    name, then a rename); it runs only while this process holds the exclusive lock on
    ``lock_path``, so it may delete leftovers of a builder that died. ``open_lock()``
    opens ``lock_path`` (created if missing; beside a cache through
    :func:`~shardwise.format.confined.open_under`: no symlink followed).
    Waiting follows :func:`~shardwise.concurrency.poll.wait_until`: ``timeout`` is
    seconds without the plan appearing (default: wait as long as a live builder builds;
    a dead one releases the lock at once).
    """
    value = _load(load, damaged)
    if value is not None:
        return value
    fd = open_lock()
    flock.hold(fd)  # a forked child must not keep the lock after this process dies

    def attempt() -> tuple[T] | None:
        got = _load(load, damaged)
        if got is not None:
            return (got,)  # published, perhaps by a builder not yet done releasing
        if not flock.try_lock(fd):
            return None
        got = _load(load, damaged)  # published between the two looks? (or damaged)
        if got is None:
            build()
            got = load()  # a fresh build that does not load is a bug: let it raise
            if got is None:
                raise RuntimeError(f"{what}: built, but nothing was published at "
                                   f"{lock_path.parent}")
        return (got,)

    try:
        return wait_until(attempt, timeout=timeout, poll_interval=poll_interval,
                          what=f"{what} (being built by another process; lock {lock_path})"
                          )[0]
    finally:
        flock.release(fd)


__all__ = ["build_once"]
