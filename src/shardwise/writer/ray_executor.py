"""Run build tasks on a Ray cluster: :class:`RayExecutor`.

The same :class:`~shardwise.writer.worker.Task` s as the local build, run by the same
:func:`~shardwise.writer.worker.run_task`, one Ray task per segment; only the transport
differs. ``ray`` is imported here and nowhere else, and only when an executor is made.

::

    driver (holds the cache lock)                  Ray generator tasks, 1 CPU each
    ┌────────────────────────────┐   submit Task   ┌──────────────────────────────────┐
    │ RayExecutor.run            │ ──────────────▶ │ thread: run_task(job, task, put) │
    │   _Coordinator: the ledger │ ◀── yield msg ─ │   publishes chunk files          │
    └────────────────────────────┘   (streamed)    └──────────────────────────────────┘

**The coordinator stays in the driver.** The contract is "one writer of the ledger": the
driver's ``_Coordinator`` is that writer, and it is the process that holds the cache's
lock. A coordinating actor would be a second process that must own lock and ledger
alike, and it would die with the driver anyway (a non-detached actor shares its owner's
fate), so it would add a process and a hop, and no availability. Workers never touch the
ledger: each task is a Ray *streaming generator* that yields its messages as it makes
them; the driver applies them in one thread, as with
:class:`~shardwise.writer.executor.LocalExecutor`.

**Retries.** Ray re-runs a task whose worker or node died (``max_retries``; exceptions
raised by the build itself are not retried). The retry starts from the ledger position
the task was submitted with, so it re-publishes the same chunk files (same bytes) and
yields the same messages; Ray hands the driver only the ones past those it already has,
and fails the task if a replay yields a different number. A killed driver takes its
tasks with it; running the build again (with either executor) resumes from the ledger,
as after a local crash.

**No shared filesystem needed.** Sources and cache in a bucket (``s3://``, ``gs://``,
``az://``): each task reads its segment from the bucket by ranged GETs
(:mod:`shardwise.sources.bucket`) and publishes its chunks to it through the one
object-store client (:class:`~shardwise.remote.RemoteStore`, with its timeouts and
retries); only the driver writes the ledger. Credentials come from each node's
environment or from ``storage_options`` (sent with the job, never written). Local
paths instead are opened by the driver's absolute paths, so every node must see them at
the same paths (one machine, NFS, Lustre); a worker that cannot see one stops the build
naming its node.

>>> with RayExecutor(workers=64, address="auto") as ex:        # doctest: +SKIP
...     build(["s3://b/raw/*.jsonl.zst"], "s3://b/cache", tokenizer="tok.json", executor=ex)
"""

from __future__ import annotations

import os
import socket
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

from shardwise.checkpoint import as_count
from shardwise.concurrency.pool import WorkerCrashed
from shardwise.concurrency.readahead import ReadAhead
from shardwise.errors import ConfigError, MissingExtraError
from shardwise.remote.client import is_url
from shardwise.writer.worker import Job, Task, run_task

DEFAULT_MAX_RETRIES = 3
_POLL_SECONDS = 1.0  # only how often a wait wakes up to notice Ctrl-C
_QUEUE_ITEMS = 64
_INSTALL_HINT = "the Ray executor needs ray: pip install 'shardwise[ray]'"


def import_ray() -> Any:
    """The ``ray`` module, or :class:`MissingExtraError` with the install line."""
    try:
        import ray
    except ImportError:
        raise MissingExtraError(_INSTALL_HINT) from None
    return ray


@dataclass(frozen=True)
class _Finished:
    """A task's last item: the CPU seconds it took."""

    cpu_seconds: float


def _check_shared_paths(job: Job, task: Task) -> None:
    """A local cache directory or source must be on this node too (a URL is reached
    from every node alike)."""
    for what, path, ok in (("cache directory", job.root, os.path.isdir(job.root)),
                           ("source", task.info.path, os.path.exists(task.info.path))):
        if not ok and not is_url(path):
            raise ConfigError(f"{what} {path} does not exist on Ray node "
                              f"{socket.gethostname()}: the Ray executor reads sources and "
                              "writes chunks by the driver's paths, so they must be on a "
                              "filesystem every node mounts at the same path")


def _run_segment(job: Job, task: Task) -> Iterator[object]:
    """A Ray generator task: build one segment (in a thread, as ``run_task`` reports by
    callback) and yield its messages as they come, then :class:`_Finished`."""
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    os.environ["RAYON_NUM_THREADS"] = "1"
    cpu = time.process_time()
    _check_shared_paths(job, task)
    # run_task reports by callback: its messages come through the one read-ahead thread,
    # its error is re-raised here, in the task's own thread
    messages = ReadAhead.pushed(partial(run_task, job, task), name="shardwise-segment",
                                depth=_QUEUE_ITEMS)
    try:
        # not ``yield from``: Ray send()s to its generator, and ReadAhead has no send
        for msg in messages:  # noqa: UP028
            yield msg
    finally:  # a cancelled task: the thread stops at its next message
        messages.close(timeout=0)
    yield _Finished(time.process_time() - cpu)


class RayExecutor:
    """Runs build tasks on Ray, at most ``workers`` at once (1 CPU each).

    With ``address`` it connects to that cluster (``ray.init(address=...)``; ``"auto"``
    finds a running one); without, it starts a local Ray with ``num_cpus=workers`` (all
    cores by default). A process already connected to Ray uses that connection.
    ``close()`` shuts down only a connection this executor made. ``workers=None`` on an
    existing cluster means all its CPUs. ``task_cpu_seconds`` sums the CPU time of the
    tasks that succeeded.
    """

    def __init__(self, workers: int | None = None, *, address: str | None = None,
                 max_retries: int = DEFAULT_MAX_RETRIES) -> None:
        if workers is not None:  # None: every CPU of the cluster
            workers = as_count(workers, "workers", minimum=1, error=ConfigError)
        max_retries = as_count(max_retries, "max_retries", error=ConfigError)
        self._ray = import_ray()
        self.workers, self.address, self.max_retries = workers, address, max_retries
        self.task_cpu_seconds = 0.0
        self._owns_connection = False

    def __enter__(self) -> RayExecutor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def connect(self) -> RayExecutor:
        """Join the Ray this process is connected to, else connect or start one."""
        ray = self._ray
        if ray.is_initialized():
            current = ray.get_runtime_context().gcs_address
            if self.address not in (None, "auto", current):
                raise ConfigError(f"this process is already connected to the Ray cluster at "
                                  f"{current}, not {self.address!r}: call ray.shutdown() "
                                  "first, or leave the address out")
            return self
        if self.address is not None:
            ray.init(address=self.address)
        else:
            ray.init(address="local", num_cpus=self.workers or os.cpu_count() or 1,
                     include_dashboard=False)  # a new local Ray, never one already running
        self._owns_connection = True
        return self

    def close(self) -> None:
        if self._owns_connection:
            self._ray.shutdown()
            self._owns_connection = False

    def parallelism(self) -> int:
        if self.workers is not None:
            return self.workers
        return max(1, int(self._ray.cluster_resources().get("CPU", 1)))

    def run(self, job: Job, tasks: Iterable[Task], on_message: Callable[[object], None]
            ) -> None:
        """Run every task; call ``on_message`` in this thread for each message, in each
        task's order. Raises the first task error (after cancelling the others)."""
        todo = deque(tasks)
        if not todo:
            return
        ray = self.connect()._ray
        job_ref = ray.put(job if is_url(job.root)
                          else replace(job, root=os.path.abspath(job.root)))
        remote = ray.remote(_run_segment).options(
            num_returns="streaming", num_cpus=1, max_retries=self.max_retries,
            retry_exceptions=False)
        n = self.parallelism()
        live: dict[Any, Task] = {}  # generator -> its task
        try:
            while todo or live:
                while todo and len(live) < n:
                    task = todo.popleft()
                    live[remote.remote(job_ref, task)] = task
                ready, _ = ray.wait(list(live), num_returns=1, timeout=_POLL_SECONDS)
                for gen in ready:
                    self._take(ray, gen, live, on_message)
        finally:
            for gen in live:
                ray.cancel(gen, force=True)

    def _take(self, ray: Any, gen: Any, live: dict[Any, Task],
              on_message: Callable[[object], None]) -> None:
        """Hand the next message of a task that has one to ``on_message``."""
        task = live[gen]
        try:
            msg = ray.get(next(gen))
        except StopIteration:
            del live[gen]
            return
        except ray.exceptions.RayError as e:
            raise _task_error(ray, e, task, self.max_retries) from e
        if isinstance(msg, _Finished):
            self.task_cpu_seconds += msg.cpu_seconds
            return
        on_message(msg)


def _task_error(ray: Any, error: Exception, task: Task, retries: int) -> BaseException:
    """The build's own exception for a task that raised; ``WorkerCrashed`` for one whose
    worker or node kept dying."""
    if isinstance(error, ray.exceptions.RayTaskError) and isinstance(error.cause,
                                                                     BaseException):
        return error.cause
    first = str(error).strip().splitlines()[0] if str(error).strip() else ""
    return WorkerCrashed(f"the Ray task building {task.info.shown} segment {task.seg_index} "
                         f"failed after {retries} retries ({type(error).__name__}: {first}); "
                         "the ledger is intact: run the same build again to resume")


__all__ = ["DEFAULT_MAX_RETRIES", "RayExecutor", "import_ray"]
