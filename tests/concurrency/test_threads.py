"""The one thread pool: results and errors through futures, the worker limit (resizable),
close, fork."""

from __future__ import annotations

import multiprocessing as mp
import threading

import pytest

from shardwise.concurrency.poll import wait_until
from shardwise.concurrency.threads import ThreadPool
from shardwise.errors import ConfigError


def _fail() -> None:
    raise KeyError("lost chunk")


def test_results_and_errors_come_back_through_futures() -> None:
    pool = ThreadPool(2, name="t")
    assert [f.result() for f in [pool.submit(lambda i=i: i * i) for i in range(5)]] == [
        0, 1, 4, 9, 16]
    with pytest.raises(KeyError, match="lost chunk"):
        pool.submit(_fail).result()
    pool.close()
    with pytest.raises(ConfigError, match="at least one worker"):
        ThreadPool(0, name="t")


def test_at_most_workers_jobs_run_at_once_and_the_limit_moves() -> None:
    pool = ThreadPool(2, name="t")
    lock, release = threading.Lock(), threading.Event()
    running, most = [0], [0]

    def job() -> None:
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
        release.wait(30)
        with lock:
            running[0] -= 1

    futures = [pool.submit(job) for _ in range(6)]
    wait_until(lambda: running[0] == 2, timeout=10, poll_interval=0.01, what="two jobs")
    assert most[0] == 2 and pool.running == 2
    pool.resize(4)
    wait_until(lambda: running[0] == 4, timeout=10, poll_interval=0.01, what="four jobs")
    assert most[0] == 4 and pool.running == 4
    release.set()
    for f in futures:
        f.result(timeout=30)
    pool.close()
    assert pool.running == 0


def test_close_cancels_queued_jobs() -> None:
    pool = ThreadPool(1, name="t")
    release = threading.Event()
    first = pool.submit(lambda: release.wait(30))
    queued = pool.submit(lambda: "never")
    wait_until(lambda: first.running(), timeout=10, poll_interval=0.01, what="the first job")
    release.set()
    pool.close()
    assert first.result() is True and queued.cancelled()
    with pytest.raises(RuntimeError, match="closed"):
        pool.submit(lambda: 1)


def _in_child(pool: ThreadPool, out: mp.Queue) -> None:  # type: ignore[type-arg]
    out.put((pool.running, pool.submit(lambda: "child").result(timeout=10)))


@pytest.mark.filterwarnings("ignore:.*fork.*:DeprecationWarning")  # Python >= 3.12
def test_a_forked_child_runs_its_own_threads() -> None:
    pool = ThreadPool(1, name="t")
    release = threading.Event()
    busy = pool.submit(lambda: release.wait(30))  # the parent's only thread is held
    wait_until(lambda: busy.running(), timeout=10, poll_interval=0.01, what="the job")
    ctx = mp.get_context("fork")
    out = ctx.Queue()
    child = ctx.Process(target=_in_child, args=(pool, out))
    child.start()
    got = out.get(timeout=30)
    child.join(30)
    release.set()
    pool.close()
    assert got == (0, "child") and child.exitcode == 0
