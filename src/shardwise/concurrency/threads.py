"""The one thread pool: a work queue served by up to ``workers`` daemon threads, resizable.

Why a pool of our own rather than ``concurrent.futures.ThreadPoolExecutor``: the number of
downloads a cache on an object store runs at once is sized from what it measures (how
long a request takes, how fast chunks are read; :mod:`shardwise.storage.prefetch`), so
the limit must move while the pool runs, and a forked child (a DataLoader worker) must not
wait on threads it did not inherit. Threads start on demand, never more than the limit and
never more than the queued work needs; one that finds the pool above its limit exits
after its current job::

    pool = ThreadPool(2, name="shardwise-io")
    f = pool.submit(job)          # a concurrent.futures.Future
    pool.resize(8)                # up to 8 jobs at once from now on
    pool.close()                  # queued jobs are cancelled; running ones finish

* **fork-safe and pickle-safe**: its queue and threads are a
  :class:`~.local.ProcessLocal`: in a forked child the parent's threads do not exist, so
  the child's pool is empty (the parent's queued futures are dropped, never waited on) and
  starts its own threads on its next ``submit``; a pickled pool carries its settings.
* errors of a job are set on its future, as ``ThreadPoolExecutor`` does.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from functools import partial
from typing import Any, TypeVar

from shardwise.concurrency import shutdown
from shardwise.concurrency.local import ProcessLocal
from shardwise.errors import ConfigError

T = TypeVar("T")
_IDLE_SECONDS = 5.0  # an idle thread exits after this long


def _check_workers(workers: int) -> int:
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ConfigError(f"a thread pool needs at least one worker, got {workers!r}")
    return workers


def _run(future: Future[Any], job: Callable[[], Any]) -> None:
    """Run one job into its future (its error too, as ``ThreadPoolExecutor`` does)."""
    if not future.set_running_or_notify_cancel():
        return
    try:
        future.set_result(job())
    except BaseException as e:  # handed to whoever waits on the future
        future.set_exception(e)


class _Work:
    """A pool's queue and threads in one process (held by :class:`~.local.ProcessLocal`:
    a forked child or an unpickled copy starts with none)."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.queue: deque[tuple[Future[Any], Callable[[], Any]]] = deque()
        self.threads: set[threading.Thread] = set()
        self.idle = 0
        self.closed = False


class ThreadPool:
    """Jobs run on at most ``workers`` daemon threads named ``name``."""

    def __init__(self, workers: int, *, name: str) -> None:
        self.name = name
        self.workers = _check_workers(workers)
        self._work = ProcessLocal(_Work, name=name)

    def __repr__(self) -> str:
        return f"ThreadPool({self.name!r}, workers={self.workers}, running={self.running})"

    @property
    def running(self) -> int:
        """Threads alive now."""
        return len(self._work.get().threads)

    def resize(self, workers: int) -> None:
        """Run up to ``workers`` jobs at once from now on (more threads start as work
        arrives; surplus ones exit after their job)."""
        w = self._work.get()
        with w.cond:
            self.workers = _check_workers(workers)
            self._spawn(w)
            w.cond.notify_all()

    def submit(self, job: Callable[[], T]) -> Future[T]:
        """Queue ``job``; its future holds its result or its error. While the interpreter
        exits (:mod:`.shutdown`), a job no thread of the pool can take runs here, now."""
        w = self._work.get()
        future: Future[T] = Future()
        with w.cond:
            if w.closed:
                raise RuntimeError(f"{self.name}: the thread pool is closed")
            w.queue.append((future, job))
            try:
                self._spawn(w)
            except shutdown.Exiting:
                if w.threads:  # a thread of the pool takes it
                    w.cond.notify()
                    return future
                w.queue.pop()
            else:
                w.cond.notify()
                return future
        _run(future, job)
        return future

    def _spawn(self, w: _Work) -> None:
        """Under the lock: start threads for queued work the idle ones cannot take."""
        while len(w.threads) < self.workers and len(w.queue) > w.idle:
            w.threads.add(shutdown.start_thread(self, partial(self._serve, w), self.name))

    def _next(self, w: _Work) -> tuple[Future[Any], Callable[[], Any]] | None:
        """Under the lock: the next job, or None when this thread should exit."""
        while True:
            if w.closed or len(w.threads) > self.workers:
                return None
            if w.queue:
                return w.queue.popleft()
            w.idle += 1
            woken = w.cond.wait(_IDLE_SECONDS)
            w.idle -= 1
            if not woken and not w.queue:
                return None

    def _serve(self, w: _Work) -> None:
        me = threading.current_thread()
        while True:
            with w.cond:
                item = self._next(w)
                if item is None:
                    w.threads.discard(me)
                    w.cond.notify_all()
                    return
            _run(*item)
            del item  # an idle thread holds no job, nor what the job refers to (a cache)

    def close_at_exit(self, timeout: float) -> None:
        """At interpreter exit (:mod:`.shutdown`): close, joining each thread for ``timeout``."""
        self.close(wait=True, timeout=timeout)

    def close(self, wait: bool = True, timeout: float | None = None) -> None:
        """Cancel queued jobs; with ``wait``, join the threads (running jobs finish; each
        join waits ``timeout`` seconds at most, None: until it ends)."""
        w = self._work.get()
        with w.cond:
            w.closed = True
            while w.queue:
                w.queue.popleft()[0].cancel()
            threads = list(w.threads)
            w.cond.notify_all()
        if wait:
            for t in threads:
                if t is not threading.current_thread():
                    t.join(timeout)


__all__ = ["ThreadPool"]
