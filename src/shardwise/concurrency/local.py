"""The one lifecycle of a process-local resource (a thread, a pool, a client, a lock).

Why: a reader is copied into other processes twice over — pickled into a spawned
DataLoader worker, a Ray task or a torchrun rank, and duplicated by ``fork`` into a forked
worker. Neither copy may use what its parent made: a pickled thread or memory map is an
error or a copy of the data, and a forked child inherits a pool whose threads do not
exist there, a client whose runtime is dead (obstore's Tokio runtime: a request waits for
ever) and locks some other thread held. So every such resource is held as a
:class:`ProcessLocal`, which is, in every process, what torchdata's ``reset()`` is to a
node: the resource is made by its factory on first use in this process, never pickled,
forgotten by a forked child, closed once::

    self._pool = ProcessLocal(partial(ThreadPool, 2, name="shardwise-store"))
    self._pool.get().submit(job)   # made here on first use; a forked child makes its own
    pickle.dumps(self)             # carries the factory, not the pool
    self._pool.close()             # closes this process's pool (none made: nothing)

How a fork is seen: one ``os.register_at_fork`` hook (installed on first use, never at
import) bumps a process generation in the child; a value made under an older generation
is the parent's, so it is dropped without being closed (its threads are not here; closing
a parent's process pool from a child would kill the parent's workers). No pid is compared
anywhere. Other process state that a child must undo (locks a child must not hold:
:mod:`.flock`) registers with :func:`on_fork`, the same hook.

At interpreter exit (:mod:`.shutdown`) every value that can be stopped there (it has
``close_at_exit(timeout)``: a thread pool, a read-ahead) is stopped once with the threads,
joined for at most :data:`~.shutdown.JOIN_SECONDS`; other values are the garbage
collector's (a ``close()`` that may wait without a bound is never called at exit).

A factory must be picklable (a class, a ``functools.partial``, a module-level function or
a bound method of the owner: the owner pickles once, the factory refers back to it) and
quick: it runs under a lock held by no other wait, so it must not wait for another thread.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Any, Generic, TypeVar

from shardwise.concurrency import shutdown

T = TypeVar("T")

_GENERATION = [0]  # bumped in each forked child: values made under an older one are gone
_CHILD_HOOKS: list[Callable[[], None]] = []
_MAKING = [threading.RLock()]  # replaced in a forked child (a parent's thread may hold it)
_HOOKED: list[bool] = []


def _after_fork_in_child() -> None:
    _MAKING[0] = threading.RLock()
    _GENERATION[0] += 1
    for hook in list(_CHILD_HOOKS):
        hook()


def _hook() -> None:
    """Install the one fork hook (under ``_MAKING``; once per interpreter)."""
    if not _HOOKED:
        os.register_at_fork(after_in_child=_after_fork_in_child)
        _HOOKED.append(True)


def on_fork(hook: Callable[[], None]) -> None:
    """Run ``hook()`` in every child forked from now on (after this module forgets its
    values): for process state a child must undo, not just forget (a held lock's file)."""
    if hook in _CHILD_HOOKS:
        return
    with _MAKING[0]:
        _hook()
        if hook not in _CHILD_HOOKS:
            _CHILD_HOOKS.append(hook)


def generation() -> int:
    """This process's generation: it changes in every child forked from now on (what a
    record of per-process facts is keyed on, e.g. where a client's runtime started)."""
    if not _HOOKED:
        with _MAKING[0]:
            _hook()
    return _GENERATION[0]


class ProcessLocal(Generic[T]):
    """A resource made by ``make()`` on first use in each process (see the module doc).

    ``close``: how :meth:`close` closes a value (default: its ``close()`` method, if it has
    one). ``name`` is for messages only."""

    __slots__ = ("__weakref__", "_close", "_held", "make", "name")

    def __init__(self, make: Callable[[], T], *, close: Callable[[T], object] | None = None,
                 name: str = "") -> None:
        self.make, self._close, self.name = make, close, name
        self._held: tuple[int, T] | None = None  # (generation, value) of the process

    @classmethod
    def now(cls, value: T, make: Callable[[], T] | None = None, *,
            close: Callable[[T], object] | None = None, name: str = "") -> ProcessLocal[T]:
        """Held as made in this process now (e.g. worker processes started by a
        constructor); ``make``: what another process makes on first use (None: a copy in
        another process has none, and :meth:`get` there raises)."""
        local: ProcessLocal[T] = cls(make or _NoneElsewhere(name), close=close, name=name)
        with _MAKING[0]:
            _hook()
            local._keep(value)
        return local

    def get(self) -> T:
        """This process's value, made now if it has none."""
        held = self._held
        if held is not None and held[0] == _GENERATION[0]:
            return held[1]
        with _MAKING[0]:
            held = self._held
            if held is not None and held[0] == _GENERATION[0]:
                return held[1]
            _hook()
            return self._keep(self.make())

    def _keep(self, value: T) -> T:
        self._held = (_GENERATION[0], value)
        if callable(getattr(value, "close_at_exit", None)):
            shutdown.register(self)
        return value

    @property
    def made(self) -> T | None:
        """This process's value, or None if it has made none (nothing is made)."""
        held = self._held
        return held[1] if held is not None and held[0] == _GENERATION[0] else None

    def forget(self) -> T | None:
        """Drop this process's value without closing it and return it (None: none); the
        next :meth:`get` makes a new one."""
        with _MAKING[0]:
            value, self._held = self.made, None
        return value

    def close(self) -> None:
        """Close this process's value and forget it (nothing if it has none; a value a
        forked child inherited is never closed there)."""
        value = self.forget()
        if value is None:
            return
        if self._close is not None:
            self._close(value)
        elif callable(getattr(value, "close", None)):
            value.close()  # type: ignore[attr-defined]

    def close_at_exit(self, timeout: float) -> None:
        """At interpreter exit (:mod:`.shutdown`): stop this process's value, joining its
        threads for ``timeout`` at most."""
        value = self.forget()
        if value is not None:
            value.close_at_exit(timeout)  # type: ignore[attr-defined]

    def __reduce__(self) -> tuple[Any, ...]:
        """A copy for another process carries the factory, never the value."""
        return (_remade, (self.make, self._close, self.name))

    def __repr__(self) -> str:
        state = "made" if self.made is not None else "not made here"
        return f"ProcessLocal({self.name or self.make!r}, {state})"


def _remade(make: Callable[[], T], close: Callable[[T], object] | None,
            name: str) -> ProcessLocal[T]:
    return ProcessLocal(make, close=close, name=name)


class _NoneElsewhere:
    """The factory of a value made only where it was constructed (:meth:`ProcessLocal.now`)."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __call__(self) -> Any:
        raise RuntimeError(f"{self.name or 'this resource'} belongs to the process that "
                           "made it; a copy in another process (forked or unpickled) has "
                           "none: make a new owner there")


__all__ = ["ProcessLocal", "generation", "on_fork"]
