"""The one process pool: worker processes that die with their parent.

:class:`ProcessPool` starts ``workers`` local processes (forked on Linux: no re-import of
the caller's ``__main__``; spawned elsewhere, then the work function must be picklable).
Each takes tasks from one queue and calls ``work(task, put)``; everything it ``put``\\ s
comes back, in arrival order, from :meth:`ProcessPool.get` in the parent. A worker's
exception comes back as a :class:`Failure` (the exception and its traceback text) and is
re-raised by ``get`` with that traceback attached as a note; a worker that dies without
reporting (killed, out of memory, segfault) raises :class:`WorkerCrashed` naming it and
its exit code or signal. A worker dies with its parent (``PR_SET_PDEATHSIG`` on Linux, a
parent-pid check between tasks elsewhere), so a killed job leaves no orphans. No shared
memory, no lock files.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import queue
import signal
import sys
import traceback
from collections.abc import Callable
from typing import Any

from shardwise.concurrency.local import ProcessLocal
from shardwise.errors import ConfigError, ShardwiseError

_POLL_SECONDS = 0.2  # how often a waiting get() checks that its workers are alive


class WorkerCrashed(ShardwiseError):
    """A worker process died without reporting (killed, out of memory, segfault)."""


class Failure:
    """A worker's exception, carried back to the parent with its traceback text."""

    def __init__(self, error: BaseException, tb: str) -> None:
        self.error, self.tb = error, tb

    @classmethod
    def of(cls, error: BaseException) -> Failure:
        """The exception being handled, as something that pickles (an exception that
        does not pickle travels as a RuntimeError with its repr)."""
        tb = traceback.format_exc()
        try:
            import pickle

            pickle.dumps(error)
        except Exception:
            error = RuntimeError(repr(error))
        return cls(error, tb)

    def reraise(self, where: str) -> None:
        """Raise the worker's exception here, its worker traceback shown as a note."""
        if hasattr(self.error, "add_note"):  # Python 3.11+
            self.error.add_note(f"raised in {where}:\n{self.tb}")
        raise self.error


def die_with_parent() -> None:
    """Ask Linux to SIGKILL this process when its parent dies (elsewhere: a no-op; the
    workers check their parent's pid between tasks)."""
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PDEATHSIG
        except OSError:
            pass


def default_start_method() -> str:
    """fork on Linux (no re-import of the caller's ``__main__``), spawn elsewhere."""
    return "fork" if sys.platform.startswith("linux") else "spawn"


def exit_status(exitcode: int | None) -> str:
    """``exit code 3`` or ``signal SIGKILL`` (multiprocessing reports -N for signal N)."""
    if exitcode is not None and exitcode < 0:
        try:
            return f"signal {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"signal {-exitcode}"
    return f"exit code {exitcode}"


def _worker_main(work: Callable[[Any, Callable[[Any], None]], None], tasks: Any,
                 results: Any, parent: int | None) -> None:
    """One worker: one thread of work (tokenizers and rayon kept to one thread each),
    tasks until the sentinel ``None``; an error is reported, then this worker stops.
    ``parent``: the pid of the process that started it (the pool's owner), or None where
    that is the fork server (``forkserver``), its parent from its start then."""
    parent = os.getppid() if parent is None else parent
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    os.environ["RAYON_NUM_THREADS"] = "1"
    # a forked worker inherits the parent's Python SIGTERM handler (Lightning's signal
    # connector, Ray's driver: handlers that note the signal and go on), and would outlive
    # close()'s terminate(); a worker dies on SIGTERM (close() kills one signalled before
    # it got here)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    die_with_parent()
    while True:
        task = tasks.get()
        if task is None or os.getppid() != parent:
            return
        try:
            work(task, results.put)
        except BaseException as e:
            results.put(Failure.of(e))
            return


class ProcessPool:
    """``work(task, put)`` over tasks in ``workers`` processes; use as a context manager.

    ``name`` is the workers' role (``"build"``: processes ``shardwise-build-0``..., errors
    "build worker ...");  ``hint`` is appended to a
    :class:`WorkerCrashed` message (what the user can do, e.g. rerun to resume).

    >>> with ProcessPool(square_into, workers=2, name="demo") as pool:  # doctest: +SKIP
    ...     pool.submit(3)
    ...     pool.get()
    9
    """

    def __init__(self, work: Callable[[Any, Callable[[Any], None]], None], workers: int, *,
                 name: str, start_method: str | None = None, hint: str = "") -> None:
        if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
            raise ConfigError(f"workers must be at least 1, got {workers!r}")
        self.name, self.hint = name, hint
        ctx: Any = mp.get_context(start_method or default_start_method())
        self._tasks, self._results = ctx.Queue(), ctx.Queue()
        # a forkserver worker's parent is the fork server, which ends with this process
        parent = None if ctx.get_start_method() == "forkserver" else os.getpid()
        procs = [ctx.Process(target=_worker_main, daemon=True,
                             args=(work, self._tasks, self._results, parent),
                             name=f"shardwise-{name}-{i}") for i in range(workers)]
        for p in procs:
            p.start()
        # the workers are this process's children: a forked copy of the pool (e.g. in a
        # DataLoader worker) has none (.local), so it never stops or waits on them
        self._procs: ProcessLocal[list[Any]] = ProcessLocal.now(procs, name=f"{name} workers")

    def __enter__(self) -> ProcessPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def submit(self, task: Any) -> None:
        """Queue ``task`` (not None: None is the workers' stop sentinel)."""
        self._tasks.put(task)

    def get(self) -> Any:
        """The next message a worker put; raises a worker's error, or WorkerCrashed."""
        while True:
            try:
                msg = self._results.get(timeout=_POLL_SECONDS)
            except queue.Empty:
                self._check_alive()
                continue
            if isinstance(msg, Failure):
                msg.reraise(f"a {self.name} worker")
            return msg

    def _check_alive(self) -> None:
        dead = [p for p in self._procs.made or () if not p.is_alive() and p.exitcode != 0]
        if dead and self._results.empty():
            p = dead[0]
            hint = f"; {self.hint}" if self.hint else ""
            raise WorkerCrashed(f"{self.name} worker {p.name} (pid {p.pid}) died with "
                                f"{exit_status(p.exitcode)} without reporting (killed, "
                                f"out of memory or crashed){hint}") from None

    def close(self) -> None:
        """Stop the workers (terminate, then join). In a forked copy of the owner (e.g. a
        DataLoader worker) this does nothing: the processes are not the copy's."""
        procs = self._procs.forget()
        if not procs:
            return
        for p in procs:
            if p.is_alive():
                p.terminate()
        for p in procs:
            p.join(timeout=2)  # SIGTERM kills at once; a worker still alive then got it
            if p.is_alive():  # before it reset its handler (see _worker_main): kill
                p.kill()
                p.join()
        for q in (self._tasks, self._results):
            q.close()
            q.cancel_join_thread()
