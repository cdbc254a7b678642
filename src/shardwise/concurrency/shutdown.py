"""shardwise's background threads end before the interpreter does.

Why: its threads are daemons (a reader must never keep a program alive), and a daemon
thread still inside native code while the interpreter finalises is killed when it takes
the GIL back; unwinding through C++ frames (torch's, and whatever torch frees on that
thread) then aborts the whole process with "terminate called without an active
exception" (SIGABRT): a torchrun rank dying after its last step, at random. (A thread in
numpy or xxhash is killed silently; one in torch aborts.) ``concurrent.futures`` joins its
workers at exit for the same reason.

Every thread shardwise runs is started by :func:`start_thread` (one place), on behalf of
an owner (a :class:`~.readahead.ReadAhead`, a :class:`~.threads.ThreadPool`) registered
here. At exit:

1. from then on no thread starts (:func:`start_thread` raises :class:`Exiting`: a
   thread pool runs the job in its caller instead; an exit handler or a finaliser that
   runs after this one, e.g. one registered before shardwise was imported, would
   otherwise start a thread nobody joins);
2. each owner is stopped (queued work dropped, running work finished, waiting threads
   woken) and joined for at most :data:`JOIN_SECONDS`, also owners that closing another
   one registered, and also after one whose close raised;
3. a thread still alive then is named on stderr with its Python stack, so that an abort
   that follows names its cause;
3b. torch's native threads that free Python objects after their work is done (a gloo
   run loop drops its last reference to a finished all-reduce, and with it the Python
   objects of its tensors: ``THPVariable_clear`` takes the GIL) are let finish, the GIL
   released, until each is idle (:func:`_let_native_threads_finish`): one taking the GIL
   once the interpreter finalises is ended inside a ``noexcept`` destructor, a SIGABRT
   ("terminate called without an active exception") after the run's last step. Under CPU
   load a run-loop thread descheduled between finishing the last all-reduce and freeing it
   outlives the few milliseconds the main thread needs to get there (seen in a core file
   of the Megatron test job, 2 aborts in 136 runs beside 3 busy loops);
4. if this process holds objects (:func:`hold_until_exit`), a garbage collection first
   frees the reference cycles that hold them too (a DDP model is one, and holds its process
   group from C++), then the held objects are dropped, here, on the main thread, before the
   interpreter finalises: an object whose destructor blocks (a process group joining its
   threads) must not run that destructor during finalisation, where it can abort.
"""

from __future__ import annotations

import atexit
import gc
import os
import sys
import threading
import time
import traceback
import weakref
from collections.abc import Callable
from typing import Protocol

JOIN_SECONDS = 10.0
IDLE_SECONDS = 5.0  # the longest the exit hook waits for torch's threads to go idle
# native threads (names as /proc shows them) that take the GIL after their work is done,
# to free Python objects it held (a finished all-reduce's tensors, its thread-local state):
# gloo's run loops, autograd's device threads
NATIVE_THREADS = ("pt_gloo_runloop", "pt_autograd")


class Stoppable(Protocol):
    def close_at_exit(self, timeout: float) -> None: ...


class Exiting(RuntimeError):
    """The interpreter is exiting: shardwise starts no thread now."""


_live: weakref.WeakSet[Stoppable] = weakref.WeakSet()
_threads: weakref.WeakSet[threading.Thread] = weakref.WeakSet()
_lock = threading.Lock()
_exiting: list[bool] = []  # [True] once the exit hook ran (a list: no global statement)
_held: dict[tuple[int, str], object] = {}  # (pid, key) -> what the exit hook drops
_inherited: dict[int, weakref.ref[object]] = {}  # id -> what a forked child never drops


def register(owner: Stoppable) -> None:
    """Stop ``owner`` at interpreter exit, if it is still alive then."""
    with _lock:
        _live.add(owner)


def hold_until_exit(key: str, obj: object) -> None:
    """Keep a reference to ``obj`` until the exit hook drops it (after shardwise's threads
    stopped, before the interpreter finalises), in place of what was held under ``key``
    by this process (dropped now, so at most one per key is kept). A forked child never
    drops what its parent held, not even as it finalises (:func:`_keep_inherited`): that
    object's threads are not in the child, and joining them there would never end."""
    with _lock:
        old = _held.pop((os.getpid(), key), None)
        _held[os.getpid(), key] = obj
    del old  # outside the lock: its destructor may block (it releases the GIL first)


def never_dropped_in_a_child(obj: object) -> None:
    """Keep ``obj`` for good in every child forked while it lives (:func:`_keep_inherited`):
    for an object whose destructor needs threads of this process, which a child does not
    have, or locks one of them may hold as it forks (an obstore client: its drop wakes
    tasks of its Tokio runtime, taking the scheduler's lock). In this process it is
    dropped as usual. ``obj`` must support weak references (not hashing)."""
    import ctypes  # noqa: F401 - imported here, so the child's hook finds it loaded

    key = id(obj)
    with _lock:
        _inherited[key] = weakref.ref(obj, lambda _: _inherited.pop(key, None))


def start_thread(owner: Stoppable, target: Callable[[], object], name: str) -> threading.Thread:
    """Start a daemon thread running ``target`` for ``owner`` (registered to be stopped
    at exit); raises :class:`Exiting` once the interpreter is exiting."""
    with _lock:
        if _exiting:
            raise Exiting(f"{name}: the interpreter is exiting; shardwise starts no thread "
                          "now (one started now would outlive the exit hook that joins them)")
        _live.add(owner)
        thread = threading.Thread(target=target, name=name, daemon=True)
        _threads.add(thread)
    thread.start()
    return thread


def _stop_all() -> None:
    with _lock:
        _exiting.append(True)
    stopped: set[int] = set()
    while True:
        with _lock:
            owners = [o for o in _live if id(o) not in stopped]
        if not owners:
            break
        for owner in owners:
            stopped.add(id(owner))
            try:
                owner.close_at_exit(JOIN_SECONDS)
            except Exception as e:  # noqa: BLE001 - the others are stopped all the same
                print(f"shardwise: stopping {owner!r} at exit failed: {e!r}", file=sys.stderr)
    _name_survivors()
    _let_native_threads_finish()
    _drop_held()


def _keep_inherited() -> None:
    """In a forked child: what the parent held (:func:`hold_until_exit`) or marked
    (:func:`never_dropped_in_a_child`) is kept for good (one reference that is never
    dropped), so neither the child's garbage collection nor its finalisation runs its
    destructor. Runs first thing in the child, before any of its Python code could.

    And what the child inherited is never garbage-collected there (``gc.freeze``): the
    parent's garbage not collected yet at the fork, collected in the child, runs its
    finalisers there, where the native state they touch (a runtime's threads, a library's
    locks) did not survive the fork. CI saw a build worker die so: SIGSEGV, its stack
    "Garbage-collecting" under the tokenizer's encode, forked from a process that had run
    Ray and gloo. Only what the child makes is collected."""
    gc.freeze()
    alive = (ref() for ref in list(_inherited.values()))
    kept = [*_held.values(), *(obj for obj in alive if obj is not None)]
    if kept:
        import ctypes

        for obj in kept:
            ctypes.pythonapi.Py_IncRef(ctypes.py_object(obj))


def _drop_held() -> None:
    with _lock:
        mine = [k for k in _held if k[0] == os.getpid()]
    if not mine:
        return
    gc.collect()  # cycles that hold them go now, while this hook still keeps them alive
    with _lock:
        dropped = [_held.pop(k) for k in mine if k in _held]
    dropped.clear()  # the last references, if nobody else holds them, end here


def _let_native_threads_finish(timeout: float = IDLE_SECONDS,
                                names: tuple[str, ...] = NATIVE_THREADS) -> bool:
    """Sleep (the GIL released) until each native thread named ``names`` is idle: asleep
    (state S) with the same count of context switches over one :data:`_IDLE_TICK`. A thread
    waiting for the GIL wakes every switch interval (5 ms) and one waiting for a CPU is
    runnable (R): neither is idle. An idle run loop sleeps on its queue without a timeout.
    True when all are idle (at once where there are none: no /proc, no torch); after
    ``timeout``, False, naming the others on stderr."""
    before = _native_threads(names)
    if not before:
        return True
    deadline = time.monotonic() + timeout
    while True:
        time.sleep(_IDLE_TICK)
        now = _native_threads(names)
        busy = {t: v for t, v in now.items() if v[1] != "S" or before.get(t) != v}
        if not busy:
            return True
        if time.monotonic() >= deadline:
            print(f"shardwise: torch threads {sorted(v[0] for v in busy.values())} were not "
                  f"idle {timeout:g} s after exit began; the process may abort as it "
                  "finalises", file=sys.stderr, flush=True)
            return False
        before = now


_IDLE_TICK = 0.012  # longer than the interpreter's switch interval (5 ms)


def _native_threads(names: tuple[str, ...]) -> dict[int, tuple[str, str, int]]:
    """{thread id: (name, state, context switches)} of this process's threads whose name
    starts with one of ``names`` (Linux's /proc; elsewhere none)."""
    out: dict[int, tuple[str, str, int]] = {}
    try:
        tasks = list(os.scandir("/proc/self/task"))
    except OSError:
        return out
    for task in tasks:
        try:
            with open(f"{task.path}/comm") as f:
                name = f.read().strip()
            if not name.startswith(names):
                continue
            with open(f"{task.path}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
            with open(f"{task.path}/status") as f:
                switches = sum(int(line.split()[1]) for line in f if "ctxt_switches:" in line)
        except (OSError, ValueError, IndexError):
            continue  # it ended meanwhile
        out[int(task.name)] = (name, state, switches)
    return out


def _name_survivors() -> None:
    """Name on stderr each shardwise thread still alive (it did not stop in
    :data:`JOIN_SECONDS`), with where it is."""
    with _lock:
        alive = [t for t in _threads if t.is_alive() and t is not threading.current_thread()]
    frames = sys._current_frames()
    for t in alive:
        where = "".join(traceback.format_stack(frames[t.ident])) if t.ident in frames else ""
        print(f"shardwise: thread {t.name!r} did not stop within {JOIN_SECONDS:g} s of "
              f"exit; the process may abort when it finalises. It is at:\n{where}",
              file=sys.stderr, flush=True)


atexit.register(_stop_all)
os.register_at_fork(after_in_child=_keep_inherited)

__all__ = ["JOIN_SECONDS", "Exiting", "hold_until_exit", "never_dropped_in_a_child", "register",
           "start_thread"]
