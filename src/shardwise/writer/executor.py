"""Executors run build tasks and hand their messages to the coordinator, in one thread.

:class:`LocalExecutor` runs ``workers`` local processes (forked on Linux, spawned
elsewhere). Each takes tasks from a queue
and reports :mod:`~shardwise.writer.worker` messages; a worker dies with its parent
(``PR_SET_PDEATHSIG`` on Linux, a parent-pid check elsewhere), so a killed build leaves
no orphan processes behind. No shared memory, no lock files.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import queue
import signal
import sys
import traceback
from collections.abc import Callable, Iterable
from typing import Any

from shardwise.errors import ConfigError, ShardwiseError
from shardwise.writer.worker import Job, Task, run_task

_POLL_SECONDS = 0.2


class WorkerCrashed(ShardwiseError):
    """A worker process died without reporting (killed, out of memory, segfault)."""


class _Failure:
    """A worker's exception, carried back to the coordinator."""

    def __init__(self, error: BaseException, tb: str) -> None:
        self.error = error
        self.tb = tb


def _die_with_parent() -> None:
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            libc = ctypes.CDLL("libc.so.6", use_errno=True)
            libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        except OSError:
            pass


def _worker_main(job: Job, tasks: Any, results: Any, parent: int) -> None:
    """Worker process: one thread of tokenization, tasks until the sentinel."""
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    os.environ["RAYON_NUM_THREADS"] = "1"
    _die_with_parent()
    while True:
        task = tasks.get()
        if task is None:
            return
        if os.getppid() != parent:
            return
        try:
            run_task(job, task, results.put)
        except BaseException as e:  # reported, then this worker stops
            try:
                results.put(_Failure(e, traceback.format_exc()))
            except Exception:
                results.put(_Failure(RuntimeError(repr(e)), traceback.format_exc()))
            return


class LocalExecutor:
    """Runs tasks on ``workers`` local processes; use as a context manager.

    >>> with LocalExecutor(workers=8) as ex:          # doctest: +SKIP
    ...     build(sources, "cache/", tokenizer="tokenizer.json", executor=ex)
    """

    def __init__(self, workers: int | None = None, *, start_method: str | None = None) -> None:
        n = workers if workers is not None else (os.cpu_count() or 1)
        if n < 1:
            raise ConfigError(f"workers must be at least 1, got {n}")
        self.workers = n
        # fork on Linux: no re-import of the caller's __main__ (a script without a
        # ``__name__`` guard would otherwise start its build again in every worker)
        self.start_method = start_method or ("fork" if sys.platform.startswith("linux")
                                             else "spawn")
        self._procs: list[Any] = []

    def __enter__(self) -> LocalExecutor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        for p in self._procs:
            if p.is_alive():
                p.terminate()
        for p in self._procs:
            p.join(timeout=5)
        self._procs = []

    def run(self, job: Job, tasks: Iterable[Task], on_message: Callable[[object], None]
            ) -> None:
        """Run every task; call ``on_message`` in this thread for each message, in the order
        received. Raises the first worker error (after stopping the others)."""
        task_list = list(tasks)
        if not task_list:
            return
        ctx: Any = mp.get_context(self.start_method)
        task_q, result_q = ctx.Queue(), ctx.Queue()
        for t in task_list:
            task_q.put(t)
        n = min(self.workers, len(task_list))
        for _ in range(n):
            task_q.put(None)
        self._procs = [ctx.Process(target=_worker_main, args=(job, task_q, result_q, os.getpid()),
                                   daemon=True, name=f"shardwise-build-{i}") for i in range(n)]
        for p in self._procs:
            p.start()
        try:
            self._pump(result_q, on_message, remaining=len(task_list))
        finally:
            self.close()
            task_q.close()
            result_q.close()

    def _pump(self, result_q: Any, on_message: Callable[[object], None], remaining: int
              ) -> None:
        from shardwise.writer.worker import TASK_END

        while remaining:
            try:
                msg = result_q.get(timeout=_POLL_SECONDS)
            except queue.Empty:
                dead = [p for p in self._procs if not p.is_alive() and p.exitcode != 0]
                if dead and result_q.empty():
                    p = dead[0]
                    raise WorkerCrashed(f"build worker {p.name} died with exit code "
                                        f"{p.exitcode} (killed or out of memory); the ledger "
                                        "is intact: run the same build again to resume"
                                        ) from None
                continue
            if isinstance(msg, _Failure):
                if hasattr(msg.error, "add_note"):  # Python 3.11+: --debug shows the worker's
                    msg.error.add_note(f"raised in a build worker:\n{msg.tb}")  # traceback
                raise msg.error
            on_message(msg)
            if isinstance(msg, TASK_END):
                remaining -= 1
