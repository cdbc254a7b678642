"""The one process pool: results, a worker's error with its traceback, a crash named."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from typing import Any

import pytest

from shardwise.concurrency.pool import ProcessPool, WorkerCrashed
from shardwise.errors import ConfigError


def _square(task: int, put: Callable[[Any], None]) -> None:
    put((task, task * task))


def _explode_in_the_worker(task: int, put: Callable[[Any], None]) -> None:
    raise ValueError(f"bad task {task}")


def _kill_self(task: int, put: Callable[[Any], None]) -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def _exit_3(task: int, put: Callable[[Any], None]) -> None:
    os._exit(3)


def _segfault_in_native_code(task: int, put: Callable[[Any], None]) -> None:
    import ctypes

    ctypes.string_at(0)  # reads address 0: SIGSEGV in C


def test_results_come_back_from_every_task() -> None:
    with ProcessPool(_square, 2, name="test") as pool:
        for t in range(5):
            pool.submit(t)
        assert sorted(pool.get() for _ in range(5)) == [(t, t * t) for t in range(5)]


def test_a_forkserver_pool_brings_the_results_back() -> None:
    """A worker started by the fork server has the server, not the pool's owner, for its
    parent: it once took that for its owner's death and ended before its first task, and
    the pool waited for ever (a worker that ends with exit code 0 is no crash)."""
    import threading

    got: list[object] = []

    def run() -> None:
        with ProcessPool(_square, 2, name="test", start_method="forkserver") as pool:
            for t in range(3):
                pool.submit(t)
            got.extend(sorted(pool.get() for _ in range(3)))

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(120)  # a loaded machine starts a spawned interpreter in seconds; a hang never ends
    assert got == [(t, t * t) for t in range(3)], "no results within 120 s"


def test_a_worker_error_is_raised_with_its_traceback() -> None:
    with ProcessPool(_explode_in_the_worker, 1, name="test") as pool:
        pool.submit(4)
        with pytest.raises(ValueError, match="bad task 4") as info:
            pool.get()
    note = "\n".join(getattr(info.value, "__notes__", []))
    assert "raised in a test worker" in note and "_explode_in_the_worker" in note


@pytest.mark.parametrize("work, status", [(_kill_self, "signal SIGKILL"),
                                          (_exit_3, "exit code 3")])
def test_a_crash_names_the_worker_and_its_signal_or_exit_code(
        work: Callable[[int, Callable[[Any], None]], None], status: str) -> None:
    with ProcessPool(work, 1, name="test", hint="rerun to resume") as pool:
        pool.submit(1)
        with pytest.raises(WorkerCrashed, match=rf"test worker shardwise-test-0 \(pid \d+\) "
                                                rf"died with {status}.*; rerun to resume"):
            pool.get()


def test_a_crash_in_native_code_brings_back_the_stack_it_crashed_on() -> None:
    """A segfault names its signal, is marked a crash (not a kill), and carries the Python
    stack the worker's faulthandler wrote as it died; the pool removes that file."""
    pool = ProcessPool(_segfault_in_native_code, 1, name="test")
    logs = list(pool._crash_logs)
    with pool:
        pool.submit(1)
        with pytest.raises(WorkerCrashed, match="died with signal SIGSEGV") as info:
            pool.get()
    assert info.value.crashed
    assert "its stack as it crashed" in str(info.value)
    assert "_segfault_in_native_code" in str(info.value)
    assert not any(os.path.exists(p) for p in logs)


def _in_a_parent_of_its_own(setup: str, work: str, after_submit: str = "pass") -> str:
    """What a fresh Python process prints that runs ``setup``, then a one-worker pool of
    ``work`` (an import binding ``work``) over one task: the result, or the error."""
    import subprocess
    import sys
    from pathlib import Path

    code = (setup + work + "from shardwise.concurrency.pool import ProcessPool\n"
            "with ProcessPool(work, 1, name='test') as pool:\n"
            f"    pool.submit(1)\n    {after_submit}\n"
            "    try: print('got', pool.get())\n"
            "    except Exception as e: print(e)")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, cwd=Path(__file__).parents[2]).stdout


def test_the_stack_comes_back_where_another_handler_took_the_signal_from_faulthandler(
        ) -> None:
    """A parent whose faulthandler is on (a test runner's) but whose SIGSEGV handler another
    library replaced since (Ray's, at ``ray.init``; here SIG_DFL): ``faulthandler.enable``
    in the worker would only change its file, and the crash left no stack."""
    out = _in_a_parent_of_its_own(
        "import faulthandler, signal; faulthandler.enable(); "
        "signal.signal(signal.SIGSEGV, signal.SIG_DFL)\n",
        "from tests.concurrency.test_pool import _segfault_in_native_code as work\n")
    assert "died with signal SIGSEGV" in out and "_segfault_in_native_code" in out, out


def _collect(task: int, put: Callable[[Any], None]) -> None:
    import gc

    put((task, gc.collect()))


def test_garbage_the_parent_left_is_never_collected_in_a_worker() -> None:
    """A forked worker inherits the parent's garbage not collected yet; collected in the
    worker, its finalisers run there, where the native state they touch (a runtime's
    threads, a library's locks) did not survive the fork. CI saw the build worker die so
    (SIGSEGV, its stack "Garbage-collecting" under the tokenizer's encode, in a process
    that had run Ray and gloo). Here a finaliser that crashes outside the process that made
    it is left in a cycle at the fork: the worker collects, and must not run it."""
    out = _in_a_parent_of_its_own(
        "import gc, os, ctypes\n"
        "class Native:\n"
        "    def __init__(self): self.pid, self.me = os.getpid(), self\n"
        "    def __del__(self):\n"
        "        if os.getpid() != self.pid: ctypes.string_at(0)\n"
        "gc.disable(); Native()  # a cycle: garbage until a collection, at the fork\n",
        "from tests.concurrency.test_pool import _collect as work\n",
        "gc.enable()")
    assert "got (1, " in out and "SIGSEGV" not in out, out


def test_a_kill_is_no_crash() -> None:
    with ProcessPool(_kill_self, 1, name="test") as pool:
        pool.submit(1)
        with pytest.raises(WorkerCrashed, match="SIGKILL") as info:
            pool.get()
    assert not info.value.crashed and "its stack" not in str(info.value)


def test_close_stops_every_worker() -> None:
    pool = ProcessPool(_square, 2, name="test")
    procs = list(pool._procs.made or ())
    pool.close()
    assert not any(p.is_alive() for p in procs)
    pool.close()  # twice is fine


def test_close_stops_workers_whose_parent_handles_sigterm() -> None:
    """A parent with a SIGTERM handler that notes the signal and goes on (Lightning's
    signal connector, Ray's driver: the suite's earlier tests install them) must not leave
    its forked workers immune to close()."""
    import signal

    old = signal.signal(signal.SIGTERM, lambda *_: None)
    try:
        pool = ProcessPool(_square, 2, name="test")
        procs = list(pool._procs.made or ())
        pool.close()
    finally:
        signal.signal(signal.SIGTERM, old)
    assert not any(p.is_alive() for p in procs)


@pytest.mark.parametrize("workers", [0, -1, True, 1.5])
def test_workers_must_be_a_positive_integer(workers: object) -> None:
    with pytest.raises(ConfigError, match="workers must be at least 1"):
        ProcessPool(_square, workers, name="test")  # type: ignore[arg-type]
