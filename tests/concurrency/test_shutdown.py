"""Background threads are stopped and joined at interpreter exit (concurrency/shutdown.py):
a daemon thread still in native code while the interpreter finalises aborts the process
("terminate called without an active exception"), a torchrun rank dying after its last
step."""

from __future__ import annotations

import subprocess
import sys
import textwrap

CHILD = textwrap.dedent("""
    import atexit, itertools, sys, threading, time

    def report():  # registered first, so it runs after shardwise's own exit hook
        alive = sorted(t.name for t in threading.enumerate() if t.name.startswith("sw-test"))
        print("ALIVE", alive, flush=True)

    atexit.register(report)
    from shardwise.concurrency import ReadAhead, ThreadPool

    ahead = ReadAhead(lambda: itertools.count(), name="sw-test-ahead", depth=2)
    next(iter(ahead))                    # its thread now waits for room in the queue
    pool = ThreadPool(1, name="sw-test-pool")
    started = threading.Event()
    pool.submit(lambda: (started.set(), time.sleep(0.3)))   # running at exit
    pool.submit(lambda: time.sleep(60))                     # queued at exit: dropped
    started.wait()
    sys.exit(0)
""")


def test_threads_are_stopped_and_joined_before_the_interpreter_finalises() -> None:
    done = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    assert "ALIVE []" in done.stdout, done.stdout + done.stderr
