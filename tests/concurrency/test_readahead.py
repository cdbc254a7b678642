"""The one read-ahead thread: order, bound, errors with their traceback, close, fork, pickle."""

from __future__ import annotations

import multiprocessing as mp
import pickle
import threading
import traceback
from collections.abc import Iterator
from typing import Any

import pytest

from shardwise.concurrency.poll import wait_until
from shardwise.concurrency.readahead import ReadAhead
from shardwise.errors import ConfigError


def _letters() -> Iterator[str]:
    yield from "abcde"


def _fails_after_two() -> Iterator[int]:
    yield 1
    yield 2
    _raise_on_the_thread()


def _raise_on_the_thread() -> None:
    raise KeyError("lost chunk")


def test_items_come_in_order_then_the_end() -> None:
    ra = ReadAhead(_letters, name="t", depth=2)
    assert list(ra) == list("abcde")
    assert ra.get("end") == "end" and ra.ended


def test_it_reads_at_most_depth_items_ahead() -> None:
    produced: list[int] = []

    def source() -> Iterator[int]:
        for i in range(10):
            produced.append(i)
            yield i

    ra = ReadAhead(source, name="t", depth=2)
    ra.start()
    wait_until(lambda: len(produced) == 3, timeout=10, poll_interval=0.01, what="item 3")
    with ra.cond:  # items 0 and 1 are queued; item 2 waits for room
        assert list(ra.queue) == [0, 1]
    assert ra.get() == 0
    wait_until(lambda: len(ra.queue) == 2, timeout=10, poll_interval=0.01, what="room used")
    assert ra.close() == [1, 2] and len(produced) == 4  # 3 read, never queued


def test_an_error_is_raised_in_the_consumer_with_the_threads_traceback() -> None:
    ra = ReadAhead(_fails_after_two, name="t", depth=4)
    assert ra.get() == 1 and ra.get() == 2  # what was read before the error comes first
    with pytest.raises(KeyError, match="lost chunk") as info:
        ra.get()
    frames = [f.name for f in traceback.extract_tb(info.value.__traceback__)]
    assert "_raise_on_the_thread" in frames and "_fails_after_two" in frames
    with pytest.raises(KeyError):  # and again: the error does not go away
        ra.get()


def test_close_wakes_a_thread_waiting_for_room_and_a_consumer_waiting_for_items() -> None:
    full = ReadAhead(_letters, name="t", depth=1)
    full.start()
    wait_until(lambda: full.queue, timeout=10, poll_interval=0.01, what="the first item")
    assert full.close() == ["a"]
    assert full._thread is not None and not full._thread.is_alive()

    gate = threading.Event()

    def never() -> Iterator[int]:
        gate.wait()
        yield from ()

    empty: ReadAhead[int] = ReadAhead(never, name="t")
    errors: list[BaseException] = []

    def consume() -> None:
        try:
            empty.get()
        except BaseException as e:
            errors.append(e)

    consumer = threading.Thread(target=consume)
    consumer.start()
    empty.close(timeout=0)
    consumer.join(timeout=10)
    gate.set()
    assert not consumer.is_alive()
    assert [str(e) for e in errors] == ["t was closed; start a new iteration"]


def _in_child(ra: ReadAhead[str], out: Any) -> None:
    parents = ra._thread  # a copy of the parent's Thread object; no such thread runs here
    out.put((ra.get(), ra.get(), ra._thread is not parents))


def test_a_forked_child_forgets_the_parents_thread_and_starts_its_own() -> None:
    ra = ReadAhead(_letters, name="t", depth=2)
    assert ra.get() == "a"
    ctx = mp.get_context("fork")
    out = ctx.Queue()
    child = ctx.Process(target=_in_child, args=(ra, out))
    child.start()
    got = out.get(timeout=30)
    child.join(timeout=30)
    assert got == ("a", "b", True)  # its own thread, from the source's start
    assert ra.get() == "b"  # the parent's iteration is untouched


def test_pickling_keeps_the_source_and_settings_not_the_thread() -> None:
    ra = ReadAhead(_letters, name="t", depth=3)
    assert ra.get() == "a"
    copy = pickle.loads(pickle.dumps(ra))
    assert copy.depth == 3 and copy._thread is None
    assert list(copy) == list("abcde")
    ra.close()


def test_call_runs_one_function_in_the_background() -> None:
    assert ReadAhead.call(len, "abc", name="t").get() == 3
    with pytest.raises(TypeError):
        ReadAhead.call(len, 5, name="t").get()


def _report(put: Any) -> None:
    for i in range(5):
        put(i)
    raise OSError("disk full")


def test_a_producer_reporting_by_callback_is_read_ahead_the_same_way() -> None:
    ra: ReadAhead[int] = ReadAhead.pushed(_report, name="t", depth=2)
    assert [ra.get() for _ in range(5)] == [0, 1, 2, 3, 4]
    with pytest.raises(OSError, match="disk full"):
        ra.get()
    stopped: ReadAhead[int] = ReadAhead.pushed(_report, name="t", depth=1)
    stopped.start()
    wait_until(lambda: stopped.queue, timeout=10, poll_interval=0.01, what="the first item")
    stopped.close()  # put() raises Stopped inside the producer: the thread ends quietly
    assert stopped._thread is not None and not stopped._thread.is_alive()
    assert stopped.error is None


def test_depth_must_be_a_positive_integer() -> None:
    with pytest.raises(ConfigError, match="depth"):
        ReadAhead(_letters, name="t", depth=0)
