"""The one poller: how every reader and writer waits for something another process makes.

The rule, the same everywhere:

* **backoff**: the first check is immediate; then sleep ``min(10 ms, poll_interval)``,
  doubling after every unsuccessful check up to ``poll_interval`` (a producer that is
  about to publish is seen within milliseconds; a long wait costs one check per
  ``poll_interval``).
* **timeout** means *seconds without progress*: the wait fails once ``timeout`` seconds
  pass in which ``ready()`` stayed false and ``progress()`` (if given) kept returning the
  same value. Without ``progress`` that is simply the length of this one wait. A producer
  that keeps publishing something (e.g. a ledger that changes) therefore never times out,
  and a dead one is reported ``timeout`` seconds after its last sign of life.
  ``timeout=math.inf`` waits forever.
* a ``stop`` event, when given, interrupts the wait at once with :class:`Stopped`.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from shardwise.errors import ConfigError, ProducerTimeoutError

T = TypeVar("T")
FIRST_DELAY = 0.01


class Stopped(Exception):
    """The waiter was closed while waiting (internal: caught by the thread that waits)."""


def backoff(poll_interval: float) -> Iterator[float]:
    """The sleeps between checks: ``min(10 ms, poll_interval)``, doubling up to
    ``poll_interval``, then ``poll_interval`` for ever."""
    delay = min(FIRST_DELAY, poll_interval)
    while True:
        yield delay
        delay = min(delay * 2, poll_interval)


def check_wait_args(timeout: float, poll_interval: float) -> None:
    """Raise ConfigError unless ``timeout`` and ``poll_interval`` are positive numbers
    (``timeout`` may be ``math.inf``; ``poll_interval`` must be finite)."""
    for name, v in (("timeout", timeout), ("poll_interval", poll_interval)):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
            raise ConfigError(f"{name} must be a positive number of seconds, got {v!r}")
    if not math.isfinite(poll_interval):
        raise ConfigError(f"poll_interval must be finite, got {poll_interval!r}")


def wait_until(ready: Callable[[], T | None], *, timeout: float, poll_interval: float, what: str,
               progress: Callable[[], Any] | None = None,
               stop: threading.Event | None = None,
               on_timeout: Callable[[float], BaseException] | None = None) -> T:
    """Call ``ready()`` until it returns something truthy, and return that.

    Raises :class:`ProducerTimeoutError` ("waited N s for <what> ...") after ``timeout``
    seconds without progress (see the module docstring), or ``on_timeout(waited)`` if
    given (for callers whose failure is not a producer's, e.g. a lock held by another
    build); :class:`Stopped` as soon as ``stop`` is set.
    """
    check_wait_args(timeout, poll_interval)
    started = active = time.monotonic()
    stamp = progress() if progress is not None else None
    for delay in backoff(poll_interval):
        value = ready()
        if value:
            return value
        now = time.monotonic()
        if progress is not None and (fresh := progress()) != stamp:
            stamp, active = fresh, now
        idle = now - active
        if idle >= timeout:
            if on_timeout is not None:
                raise on_timeout(now - started)
            raise ProducerTimeoutError(
                f"waited {now - started:.1f} s for {what}, {idle:.1f} s of it without "
                f"progress (timeout={timeout:g} s); is the producer still running? Raise "
                "timeout= if it is just slow")
        sleep = min(delay, max(timeout - idle, 0.001))
        if stop is not None:
            if stop.wait(sleep):
                raise Stopped
        else:
            time.sleep(sleep)
    raise AssertionError("unreachable")  # backoff() never ends
