"""Background threads are stopped and joined at interpreter exit (concurrency/shutdown.py):
a daemon thread still in native code while the interpreter finalises aborts the process
("terminate called without an active exception"), a torchrun rank dying after its last
step."""

from __future__ import annotations

import os
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


LATE = textwrap.dedent("""
    import atexit, sys, time
    import torch

    def late():  # registered before shardwise's own exit hook, so it runs after it
        from shardwise.concurrency import ReadAhead, ThreadPool

        a = torch.ones(300, 300)

        def matmuls(_=None):  # inside torch's C++ most of the time
            end = time.monotonic() + 1.0
            while time.monotonic() < end:
                a @ a

        job = ThreadPool(1, name="sw-test-late").submit(matmuls)  # not waited for
        print("POOL", "done" if job.done() else "running", flush=True)
        try:
            ReadAhead.call(matmuls, None, name="sw-test-late-ahead")
        except RuntimeError as e:
            print("AHEAD", type(e).__name__, flush=True)

    atexit.register(late)
    import shardwise.concurrency  # its exit hook: registered after late(), runs before it
    sys.exit(0)
""")


def test_no_thread_starts_after_the_exit_hook() -> None:
    """A job handed to shardwise by code that runs after its exit hook (an exit handler
    registered before shardwise was imported, a finaliser) starts no thread: the pool
    runs it in its caller, a read-ahead refuses. Before, the job's thread outlived the
    hook, and being inside torch's C++ as the interpreter finalised, aborted the process
    ("terminate called without an active exception", exit -6)."""
    done = subprocess.run([sys.executable, "-c", LATE], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stdout + done.stderr
    assert "POOL done" in done.stdout and "AHEAD Exiting" in done.stdout, done.stdout + done.stderr


HELD = textwrap.dedent("""
    import atexit, os, sys, threading

    class Group:  # stands for a process group: its destructor joins threads
        def __init__(self, name):
            self.name = name
        def __del__(self):
            print("DROPPED", self.name, os.getpid() == PARENT, flush=True)

    def after():  # registered first: runs after shardwise's exit hook
        print("AFTER THE HOOK", flush=True)

    PARENT = os.getpid()
    atexit.register(after)
    from shardwise.concurrency import shutdown

    shutdown.hold_until_exit("group", Group("first"))
    shutdown.hold_until_exit("group", Group("second"))   # the first is dropped now
    print("REPLACED", flush=True)
    if os.fork() == 0:   # a child exiting normally never drops its parent's group
        sys.exit(0)
    os.wait()
    sys.exit(0)
""")


def test_what_is_held_until_exit_is_dropped_by_the_exit_hook_only_in_its_process() -> None:
    """The loader keeps torch's default process group until the exit hook so that torch
    destroys it with the GIL released (shardwise.integrations.torch): the hook drops it,
    before later exit handlers and the interpreter's finalisation; a new one replaces it;
    a forked child (whose group threads are its parent's) leaves it alone."""
    done = subprocess.run([sys.executable, "-c", HELD], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    # the child exits first (the parent waits for it): its exit handlers run, nothing dropped
    assert done.stdout.splitlines() == ["DROPPED first True", "REPLACED", "AFTER THE HOOK",
                                        "DROPPED second True", "AFTER THE HOOK"], done.stdout


NATIVE = textwrap.dedent("""
    import ctypes, sys, threading, time
    from shardwise.concurrency import shutdown

    libc = ctypes.CDLL(None)
    quiet_at = []

    def run_loop(busy, park):  # stands for torch's run loop: named as /proc shows it
        libc.prctl(15, b"pt_gloo_runloop", 0, 0, 0)  # PR_SET_NAME: this thread's name
        end = time.monotonic() + busy
        while time.monotonic() < end and not park.is_set():  # waking often, as a thread
            time.sleep(0.001)                                 # waiting for the GIL does
        quiet_at.append(time.monotonic())
        park.wait()  # asleep without a timeout, as an idle run loop

    park = threading.Event()
    busy = float(sys.argv[1])
    threading.Thread(target=run_loop, args=(busy, park), daemon=True).start()
    time.sleep(0.05)
    started = time.monotonic()
    idle = shutdown._let_native_threads_finish(timeout=float(sys.argv[2]))
    ended = time.monotonic()
    print(idle, bool(quiet_at) and quiet_at[0] <= ended, round(ended - started, 2))
    park.set()
""")


def _native(busy: float, timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", NATIVE, str(busy), str(timeout)],
                          capture_output=True, text=True, timeout=120)


def test_the_exit_hook_waits_for_torchs_run_loops_to_go_idle() -> None:
    """A torch run-loop thread still busy (or waiting for the GIL) as exit begins is let
    finish, the GIL released, before the interpreter finalises (where taking the GIL ends
    it inside a noexcept destructor: SIGABRT): the hook returns once it is asleep."""
    done = _native(busy=0.6, timeout=30)
    assert done.returncode == 0, done.stderr
    idle, after_quiet, waited = done.stdout.split()
    assert (idle, after_quiet) == ("True", "True"), done.stdout
    assert float(waited) >= 0.4, done.stdout  # it waited the thread's busy time out


def test_a_run_loop_that_never_goes_idle_is_named_and_the_exit_goes_on() -> None:
    done = _native(busy=60, timeout=0.5)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split()[:2] == ["False", "False"], done.stdout
    assert "torch threads ['pt_gloo_runloop'] were not idle 0.5 s" in done.stderr
