"""Executors run build tasks and hand their messages to the coordinator, in one thread.

:class:`LocalExecutor` runs ``workers`` local processes through the one process pool
(:class:`shardwise.concurrency.pool.ProcessPool`: forked on Linux, spawned elsewhere;
workers die with their parent, so a killed build leaves no orphan processes behind).
Each worker takes tasks from a queue and reports :mod:`~shardwise.writer.worker`
messages. No shared memory, no lock files.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Iterable

from shardwise.checkpoint import as_count
from shardwise.concurrency.pool import ProcessPool, default_start_method
from shardwise.errors import ConfigError
from shardwise.writer.worker import Job, Task, run_task

__all__ = ["LocalExecutor"]

_RESUME = "the ledger is intact: run the same build again to resume"


class LocalExecutor:
    """Runs tasks on ``workers`` local processes; use as a context manager.

    >>> with LocalExecutor(workers=8) as ex:          # doctest: +SKIP
    ...     build(sources, "cache/", tokenizer="tokenizer.json", executor=ex)
    """

    def __init__(self, workers: int | None = None, *, start_method: str | None = None) -> None:
        self.workers = (as_count(workers, "workers", minimum=1, error=ConfigError)
                        if workers is not None else (os.cpu_count() or 1))
        # fork on Linux: no re-import of the caller's __main__ (a script without a
        # ``__name__`` guard would otherwise start its build again in every worker)
        self.start_method = start_method or default_start_method()
        self._pool: ProcessPool | None = None

    def __enter__(self) -> LocalExecutor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._pool is not None:
            self._pool.close()
            self._pool = None

    def run(self, job: Job, tasks: Iterable[Task], on_message: Callable[[object], None]
            ) -> None:
        """Run every task; call ``on_message`` in this thread for each message, in the order
        received. Raises the first worker error (after stopping the others)."""
        from shardwise.writer.worker import TASK_END

        task_list = list(tasks)
        if not task_list:
            return
        self._pool = pool = ProcessPool(functools.partial(run_task, job),
                                        min(self.workers, len(task_list)),
                                        name="build", start_method=self.start_method,
                                        hint=_RESUME)
        try:
            for t in task_list:
                pool.submit(t)
            remaining = len(task_list)
            while remaining:
                msg = pool.get()
                on_message(msg)
                if isinstance(msg, TASK_END):
                    remaining -= 1
        finally:
            self.close()
