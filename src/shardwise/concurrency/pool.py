"""The one process pool: worker processes that die with their parent.

:class:`ProcessPool` starts ``workers`` local processes (forked on Linux: no re-import of
the caller's ``__main__``; spawned elsewhere, then the work function must be picklable).
Each takes tasks from one queue and calls ``work(task, put)``; everything it ``put``\\ s
comes back, in arrival order, from :meth:`ProcessPool.get` in the parent. A worker's
exception comes back as a :class:`Failure` (the exception and its traceback text) and is
re-raised by ``get`` with that traceback attached as a note; a worker that dies without
reporting (killed, out of memory, segfault) raises :class:`WorkerCrashed` naming it and
its exit code or signal, and — where it crashed in native code (SIGSEGV, SIGBUS...) — the
Python stack it crashed on (each worker's :mod:`faulthandler` writes to a file of its own,
read back by the parent). A worker dies with its parent (``PR_SET_PDEATHSIG`` on Linux, a
parent-pid check between tasks elsewhere), so a killed job leaves no orphans. No shared
memory, no lock files.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import queue
import signal
import sys
import tempfile
import traceback
from collections.abc import Callable
from typing import Any

from shardwise.concurrency import shutdown  # noqa: F401 - its fork hook: what a worker
from shardwise.concurrency.local import ProcessLocal  # inherits is never collected there
from shardwise.errors import ConfigError, ShardwiseError

_POLL_SECONDS = 0.2  # how often a waiting get() checks that its workers are alive


# the signals of a crash in native code (not a kill: SIGKILL is the OOM killer's or a user's)
CRASH_SIGNALS = frozenset({signal.SIGSEGV, signal.SIGBUS, signal.SIGILL, signal.SIGFPE,
                           signal.SIGABRT})


class WorkerCrashed(ShardwiseError):
    """A worker process died without reporting (killed, out of memory, segfault).
    ``crashed``: it died of a crash signal (:data:`CRASH_SIGNALS`), not a kill or an exit."""

    def __init__(self, message: str, *, crashed: bool = False) -> None:
        super().__init__(message)
        self.crashed = crashed

    def __reduce__(self) -> tuple[Any, ...]:
        return _crashed, (str(self), self.crashed)


def _crashed(message: str, crashed: bool) -> WorkerCrashed:
    return WorkerCrashed(message, crashed=crashed)


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


def is_crash(exitcode: int | None) -> bool:
    """Whether a process's exit code (multiprocessing's -N for signal N) is a crash signal."""
    return exitcode is not None and exitcode < 0 and -exitcode in CRASH_SIGNALS


_CRASH_LOG: list[Any] = []  # a worker's faulthandler file, kept open while it lives


def _log_crashes_to(path: str | None) -> None:
    """In a worker: where :mod:`faulthandler` writes the stack of a crash (read back by the
    parent, :meth:`ProcessPool._crash_stack`)."""
    if path:
        import faulthandler

        _CRASH_LOG.append(open(path, "w"))  # noqa: SIM115 - open while the worker lives
        # enable() only changes the file where faulthandler is on already (inherited: a
        # test runner's), even where another handler took the signals since (Ray's, at
        # ray.init): off, then on, so the handlers are faulthandler's again
        faulthandler.disable()
        faulthandler.enable(file=_CRASH_LOG[-1], all_threads=True)


def _worker_main(work: Callable[[Any, Callable[[Any], None]], None], tasks: Any,
                 results: Any, parent: int | None, crash_log: str | None = None) -> None:
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
    _log_crashes_to(crash_log)
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
        self._crash_logs = [_new_crash_log(name, i) for i in range(workers)]
        procs = [ctx.Process(target=_worker_main, daemon=True,
                             args=(work, self._tasks, self._results, parent, log),
                             name=f"shardwise-{name}-{i}")
                 for i, log in enumerate(self._crash_logs)]
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
            crashed = is_crash(p.exitcode)
            stack = self._crash_stack(p.name) if crashed else ""
            raise WorkerCrashed(f"{self.name} worker {p.name} (pid {p.pid}) died with "
                                f"{exit_status(p.exitcode)} without reporting (killed, "
                                f"out of memory or crashed){hint}{stack}",
                                crashed=crashed) from None

    def _crash_stack(self, worker: str) -> str:
        """What ``worker``'s faulthandler wrote as it crashed (its first 60 lines, not the
        list of extension modules), as a paragraph of the error; nothing where it wrote
        nothing."""
        i = int(worker.rsplit("-", 1)[1])
        try:
            with open(self._crash_logs[i], errors="replace") as f:
                lines = [line for line in f.read().strip().splitlines()
                         if not line.startswith("Extension modules")][:60]
        except OSError:
            return ""
        return "\n  its stack as it crashed:\n    " + "\n    ".join(lines) if lines else ""

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
        for log in self._crash_logs:
            with contextlib.suppress(OSError):
                os.unlink(log)


def _new_crash_log(name: str, i: int) -> str:
    """A new empty file for worker ``i``'s crash stack (removed by :meth:`ProcessPool.close`)."""
    fd, path = tempfile.mkstemp(prefix=f"shardwise-{name}-{i}-", suffix=".crash")
    os.close(fd)
    return path
