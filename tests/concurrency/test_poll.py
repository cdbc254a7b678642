"""The one poller: its backoff rule and its one meaning of timeout."""

from __future__ import annotations

import math
import threading
from itertools import count, islice

import pytest

from shardwise.concurrency.poll import Stopped, backoff, check_wait_args, wait_until
from shardwise.errors import CacheError, ConfigError, ProducerTimeoutError


def test_backoff_starts_at_10ms_and_doubles_up_to_the_poll_interval() -> None:
    assert list(islice(backoff(0.1), 6)) == [0.01, 0.02, 0.04, 0.08, 0.1, 0.1]
    assert list(islice(backoff(0.004), 3)) == [0.004] * 3  # a finer interval from the start


def test_a_ready_value_is_returned_at_the_first_check() -> None:
    calls = count(1)
    assert wait_until(lambda: next(calls) and "ok", timeout=1, poll_interval=1,
                      what="x") == "ok"
    assert next(calls) == 2  # checked exactly once


def test_timeout_without_progress_names_what_was_waited_for() -> None:
    with pytest.raises(ProducerTimeoutError, match=r"for chunk 7, .*timeout=0.02 s"):
        wait_until(lambda: False, timeout=0.02, poll_interval=0.01, what="chunk 7")


def test_progress_keeps_a_slow_producer_alive() -> None:
    """timeout counts seconds WITHOUT progress: a producer that keeps changing its stamp
    never times out, even when the whole wait is far longer than timeout."""
    checks, stamps = count(), count()
    got = wait_until(lambda: next(checks) == 6, timeout=0.001, poll_interval=0.002,
                     what="ledger", progress=lambda: next(stamps))
    assert got is True
    with pytest.raises(ProducerTimeoutError):  # the same wait without progress fails
        checks = count()
        wait_until(lambda: next(checks) == 6, timeout=0.001, poll_interval=0.002,
                   what="ledger")


def test_on_timeout_chooses_the_error() -> None:
    with pytest.raises(CacheError, match="held"):
        wait_until(lambda: False, timeout=0.01, poll_interval=0.01, what="lock",
                   on_timeout=lambda waited: CacheError(f"held for {waited:.2f}s"))


def test_stop_interrupts_the_wait() -> None:
    stop = threading.Event()
    stop.set()
    with pytest.raises(Stopped):
        wait_until(lambda: False, timeout=math.inf, poll_interval=10, what="x", stop=stop)


@pytest.mark.parametrize("timeout, poll", [(0, 1), (-1, 1), (1, 0), (True, 1), (1, math.inf),
                                           ("1", 1)])
def test_bad_arguments_are_named(timeout: object, poll: object) -> None:
    with pytest.raises(ConfigError, match="timeout|poll_interval"):
        check_wait_args(timeout, poll)  # type: ignore[arg-type]
    check_wait_args(math.inf, 0.5)  # waiting for ever is allowed
