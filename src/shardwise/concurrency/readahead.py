"""The one read-ahead thread: a bounded queue fed by one daemon thread.

:class:`ReadAhead` runs ``source()`` (an iterator factory) on a daemon thread, keeping up
to ``depth`` items ready (or, with ``admit``, as many as ``admit`` allows: the stream
reader's rule is "within its chunk budget"; :meth:`ReadAhead.pushed` serves a producer
that reports by callback instead); the next item is always produced once the
queue is empty, so the consumer never starves. ``prepare`` (e.g. loading an item's
bytes) runs on the thread after an item is admitted, so a rejected item costs nothing.

* **errors** raised on the thread are re-raised by :meth:`ReadAhead.get` in the consumer,
  as the same exception object: its traceback still shows where it was raised.
* :meth:`ReadAhead.close` never leaves the thread blocked: it wakes the thread wherever it
  waits (for room, or inside ``source`` through :class:`~shardwise.concurrency.poll.Stopped`
  and the shared ``stop`` event) and joins it.
* **fork-safe, pickle-safe**: its queue and thread are a
  :class:`~.local.ProcessLocal`: in a forked child (a DataLoader worker) the parent's
  thread does not exist, so the child forgets it and starts its own from ``source()`` on
  its first ``get``; a pickled ReadAhead carries only ``source`` and its settings, and
  starts afresh where it is unpickled.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from functools import partial
from typing import Any, Generic, TypeVar

from shardwise.concurrency import shutdown
from shardwise.concurrency.local import ProcessLocal
from shardwise.concurrency.poll import Stopped
from shardwise.errors import ConfigError

T = TypeVar("T")
_END: Any = object()
_WAKE_SECONDS = 0.5  # a safety net: every wait is also woken by notify_all


class ReadAhead(Generic[T]):
    """Items of ``source()`` produced ahead on one daemon thread; iterate or ``get()``."""

    def __init__(self, source: Callable[[], Iterator[T]], *, name: str, depth: int = 1,
                 admit: Callable[[T, Sequence[T]], bool] | None = None,
                 prepare: Callable[[T], object] | None = None,
                 lock: threading.Condition | None = None,
                 stop: threading.Event | None = None, closed_message: str = "") -> None:
        if isinstance(depth, bool) or not isinstance(depth, int) or depth < 1:
            raise ConfigError(f"read-ahead depth must be a positive integer, got {depth!r}")
        self.source, self.name, self.depth = source, name, depth
        self.admit, self.prepare = admit, prepare
        self._push = False  # source(put) pushes items instead of returning an iterator
        self.closed_message = closed_message or f"{name} was closed; start a new iteration"
        # this process's queue and thread; ``lock``/``stop`` (shared with the caller) serve
        # the process that made them, a copy elsewhere makes its own
        self._here: ProcessLocal[_Run[T]] = ProcessLocal.now(_Run(lock, stop), _Run, name=name)

    @classmethod
    def call(cls, fn: Callable[[Any], T], arg: Any, *, name: str) -> ReadAhead[T]:
        """``fn(arg)`` started now on its own thread; ``get()`` returns (or raises) its
        result, ``close(None)`` waits for it to finish and drops it."""
        ahead: ReadAhead[T] = cls(partial(_one, fn, arg), name=name)
        ahead.start()
        return ahead

    @classmethod
    def pushed(cls, run: Callable[[Callable[[T], None]], object], *, name: str,
               depth: int = 1) -> ReadAhead[T]:
        """Read ahead of a producer that reports by callback: ``run(put)`` runs on the
        thread and each ``put(item)`` waits for room (e.g. a build task's messages)."""
        ahead: ReadAhead[T] = cls(run, name=name, depth=depth)  # type: ignore[arg-type]
        ahead._push = True
        return ahead

    # -- this process's run ---------------------------------------------------------------
    @property
    def cond(self) -> threading.Condition:
        return self._here.get().cond

    @property
    def stop(self) -> threading.Event:
        return self._here.get().stop

    @property
    def queue(self) -> deque[T]:
        return self._here.get().queue

    @property
    def error(self) -> BaseException | None:
        return self._here.get().error

    @property
    def ended(self) -> bool:
        return self._here.get().ended

    @property
    def waited(self) -> float:
        """Seconds the consumer spent blocked in :meth:`get` (in this process)."""
        return self._here.get().waited

    @property
    def _thread(self) -> threading.Thread | None:
        return self._here.get().thread

    # -- the thread -----------------------------------------------------------------------
    def start(self) -> None:
        """Start the thread now (``get`` starts it otherwise)."""
        r = self._here.get()
        with r.cond:  # close() on another thread sees no thread, or a started one
            if r.thread is None and not r.stop.is_set():
                r.thread = shutdown.start_thread(self, partial(self._produce, r), self.name)

    def _has_room(self, r: _Run[T], item: T) -> bool:
        if not r.queue:
            return True
        if self.admit is not None:
            return self.admit(item, tuple(r.queue))
        return len(r.queue) < self.depth

    def _produce(self, r: _Run[T]) -> None:
        try:
            if self._push:
                self.source(partial(self._offer, r))  # type: ignore[call-arg]
            else:
                for item in self.source():
                    self._offer(r, item)
            r.put(_END)
        except Stopped:
            return
        except BaseException as e:  # handed to the consumer, which re-raises it
            with r.cond:
                r.error = e
                r.cond.notify_all()

    def _offer(self, r: _Run[T], item: T) -> None:
        """On the thread: wait for room, prepare ``item``, queue it (Stopped once closed)."""
        with r.cond:
            while not self._has_room(r, item) and not r.stop.is_set():
                r.cond.wait(_WAKE_SECONDS)
        if r.stop.is_set():
            raise Stopped
        if self.prepare is not None:
            self.prepare(item)
        r.put(item)

    # -- the consumer ---------------------------------------------------------------------
    def __iter__(self) -> Iterator[T]:
        return self

    def __next__(self) -> T:
        item = self.get()
        if item is _END:
            raise StopIteration
        return item

    def get(self, default: Any = _END) -> T:
        """The next item, blocking until it is ready; ``default`` once ``source`` ended
        (StopIteration from iteration). Re-raises the thread's error."""
        r = self._here.get()
        if r.thread is None:
            self.start()
        started = time.monotonic()
        try:
            with r.cond:
                while not r.queue:
                    self._check_usable(r)
                    r.cond.wait(_WAKE_SECONDS)
                item = r.queue[0]
                if item is _END:
                    r.ended = True
                    return default
                r.queue.popleft()
                r.cond.notify_all()
                return item
        finally:
            r.waited += time.monotonic() - started

    def _check_usable(self, r: _Run[T]) -> None:
        if r.error is not None:
            raise r.error
        if r.stop.is_set():
            raise RuntimeError(self.closed_message)
        if r.thread is not None and not r.thread.is_alive():
            raise RuntimeError(f"the {self.name} thread ended without a result")

    def close_at_exit(self, timeout: float) -> None:
        """At interpreter exit (:mod:`.shutdown`): stop and join the thread; drop its items."""
        self.close(timeout)

    def close(self, timeout: float | None = 30.0) -> list[T]:
        """Stop and join the thread (it is woken wherever it waits; ``timeout=None``: wait
        until it has finished what it is computing); return the items it had read ahead,
        for the caller to release."""
        r = self._here.get()
        r.stop.set()
        with r.cond:
            r.cond.notify_all()
            t = r.thread
        if t is not None and t is not threading.current_thread():
            t.join(timeout=timeout)
        with r.cond:
            left = [i for i in r.queue if i is not _END]
            r.queue.clear()
        return left


class _Run(Generic[T]):
    """A read-ahead's queue and thread in one process (a forked child or an unpickled copy
    makes its own: :class:`~.local.ProcessLocal`)."""

    def __init__(self, lock: threading.Condition | None = None,
                 stop: threading.Event | None = None) -> None:
        self.cond = lock if lock is not None else threading.Condition()
        self.stop = stop if stop is not None else threading.Event()
        self.queue: deque[T] = deque()
        self.error: BaseException | None = None
        self.ended = False
        self.waited = 0.0  # seconds the consumer spent blocked in get()
        self.thread: threading.Thread | None = None

    def put(self, item: T) -> None:
        with self.cond:
            self.queue.append(item)
            self.cond.notify_all()


def _one(fn: Callable[[Any], T], arg: Any) -> Iterator[T]:
    yield fn(arg)
