"""One consumer's share of a record stream: its streams' readers, the processing of what
they read, and the interleaving of their examples in global order.

The consumer's next example is the next one of the stream ``s`` with the smallest
``(consumed_s, s)``: global example ``consumed_s · R* + s``, so the consumer's examples come
in ascending global order whatever subset of streams it serves (round robin over its
streams in the steady state). A stream that has ended (finite epochs) fills its turns with
pads while another of the consumer's streams still has examples, and the last round is
completed with pads: a consumer's count is a multiple of its number of streams.

Readers run ahead (up to ``2 × task_size`` records per stream); with ``workers > 0``
batches of ``task_size`` raw records are parsed and mapped in a :class:`ProcessPool` and
put back in each stream's order, so the output does not depend on the number of workers.
Each :class:`StreamPosition` advances only when the consumer receives an example.
"""

from __future__ import annotations

import heapq
import weakref
from collections import deque
from typing import Any

from shardwise.concurrency.pool import ProcessPool
from shardwise.errors import InputError
from shardwise.read.records.pool import Dropped, Keyed, Packed, Processor
from shardwise.read.records.ranges import RangeKind, RangePlan
from shardwise.read.records.streams import (
    END,
    Delta,
    StreamOrder,
    StreamPosition,
    StreamReader,
    Where,
)
from shardwise.sources.records import absolute_line

PAD_KEY = "__pad__"


def make_pad() -> dict[str, bool]:
    """A padding example (single-pass mode): ``{"__pad__": True}``."""
    return {PAD_KEY: True}


def is_pad(example: Any) -> bool:
    return isinstance(example, dict) and example.get(PAD_KEY) is True


class _Finished:
    """Returned by :meth:`Pipeline.next` when every stream of the consumer has ended."""


FINISHED = _Finished()
Entry = tuple[Delta, Any, Where]


def locate(err: InputError, plan: RangePlan, where: Where) -> InputError:
    """``err`` with the line counted from the file's start (JSONL byte ranges count the
    newlines before the record: only when an error is raised)."""
    rid, pos, line = where
    f = plan.source(rid)
    if f.kind is RangeKind.LINES:
        absolute = absolute_line(f.path, pos, 0)
    elif f.kind is RangeKind.STREAM:
        absolute = line + 1
    else:
        absolute = pos + 1
    msg = str(err).replace(f"{f.path}:{line + 1}:", f"{f.path}:{absolute}:", 1)
    return InputError(msg, path=f.path, line=absolute, reason=err.reason)


class Pipeline:
    """Examples of ``streams`` from ``positions`` (which it advances as it hands them out)."""

    def __init__(self, order: StreamOrder, positions: dict[int, StreamPosition],
                 processor: Processor, *, workers: int, raise_errors: bool,
                 task_size: int) -> None:
        self.order, self.positions, self.processor = order, positions, processor
        self.streams = sorted(positions)
        self.raise_errors, self.task_size = raise_errors, task_size
        self.readers = {s: StreamReader(order, s, positions[s]) for s in self.streams}
        self.ready: dict[int, deque[Entry]] = {s: deque() for s in self.streams}
        self.ended = {s: positions[s].done for s in self.streams}
        self.pool: ProcessPool | None = None
        if workers > 0:
            self.pool = ProcessPool(Keyed(processor), workers, name="record")
            self._finalizer = weakref.finalize(self, self.pool.close)
        self._max_inflight = 2 * workers
        self._inflight: dict[int, int] = {s: 0 for s in self.streams}  # records
        self._tasks = 0
        self._next_seq = {s: 0 for s in self.streams}
        self._next_accept = {s: 0 for s in self.streams}
        self._pending: dict[tuple[int, int], list[Any]] = {}
        self._results: dict[tuple[int, int], list[Any]] = {}
        self._file_of: list[int] = order.plan.file.tolist()
        self._heap = [(positions[s].consumed, s) for s in self.streams]
        heapq.heapify(self._heap)
        self._done = sum(positions[s].done for s in self.streams)

    def close(self) -> None:
        if self.pool is not None:
            self._finalizer()
            self.pool = None
        for r in self.readers.values():
            r.close()

    def next(self) -> Any:
        """The consumer's next example, a pad, or :data:`FINISHED`."""
        heap, positions = self._heap, self.positions
        while True:
            s = heap[0][1]
            p = positions[s]
            if p.done:
                if self._done == len(self.streams) and all(  # ... and the round is whole
                        positions[x].consumed == p.consumed for x in self.streams):
                    return FINISHED
                p.consumed += 1
                heapq.heapreplace(heap, (p.consumed, s))
                return make_pad()
            ready = self.ready[s]
            if not ready:
                self._fetch(s)
            delta, outcome, where = ready.popleft()
            p.apply(delta)
            if outcome is END:
                p.done = True
                self._done += 1
            elif outcome.__class__ is Dropped:
                if self.raise_errors and outcome.error is not None:
                    raise locate(outcome.error, self.order.plan, where)
                p.errors[outcome.reason] = p.errors.get(outcome.reason, 0) + 1
            else:
                p.consumed += 1
                heapq.heapreplace(heap, (p.consumed, s))
                return outcome

    def _items(self, steps: list[Any]) -> list[tuple[Any, int, int]]:
        file_of = self._file_of
        if steps and steps[-1][0] is END:
            steps = steps[:-1]
        return [(payload, file_of[w[0]], w[2] + 1) for payload, w, _ in steps]

    def _packed(self, steps: list[Any]) -> Packed | list[tuple[Any, int, int]]:
        """A task for the pool: lines packed into one blob when they are all lines."""
        if steps and steps[-1][0] is END:
            steps = steps[:-1]
        payloads = [st[0] for st in steps]
        if not all(type(p) is bytes for p in payloads):
            return self._items(steps)
        file_of = self._file_of
        return Packed(b"\n".join(payloads), [file_of[st[1][0]] for st in steps],
                      [st[1][2] + 1 for st in steps])

    def _fetch(self, s: int) -> None:
        if self.pool is None:
            steps = self.readers[s].take(self.task_size)
            self._extend(s, steps, self.processor(self._items(steps)))
            return
        if not self._inflight[s]:
            self._submit(s)
        self._top_up()
        while not self.ready[s]:
            key, outcomes = self.pool.get()
            self._accept(key, outcomes)
            self._top_up()

    def _extend(self, s: int, steps: list[Any], outcomes: list[Any]) -> None:
        it = iter(outcomes)
        ready = self.ready[s]
        for payload, where, delta in steps:
            ready.append((delta, END if payload is END else next(it), where))

    def _submit(self, s: int) -> None:
        steps = self.readers[s].take(self.task_size)
        if steps and steps[-1][0] is END:
            self.ended[s] = True
        key = (s, self._next_seq[s])
        self._next_seq[s] += 1
        self._pending[key] = steps
        self._inflight[s] += len(steps)
        if self.pool is not None and steps[0][0] is not END:
            self._tasks += 1
            self.pool.submit((key, self._packed(steps)))
        else:
            self._accept(key, [], counted=False)

    def _accept(self, key: tuple[int, int], outcomes: list[Any], counted: bool = True) -> None:
        self._tasks -= counted
        self._results[key] = outcomes
        s = key[0]
        while (s, self._next_accept[s]) in self._results:
            k = (s, self._next_accept[s])
            steps = self._pending.pop(k)
            self._extend(s, steps, self._results.pop(k))
            self._inflight[s] -= len(steps)
            self._next_accept[s] += 1

    def _top_up(self) -> None:
        """Keep every worker busy, reading ahead for the streams with least ahead."""
        limit = 2 * self.task_size
        while self._tasks < self._max_inflight:
            open_ = [s for s in self.streams if not self.ended[s]]
            if not open_:
                return
            s = min(open_, key=lambda x: (len(self.ready[x]) + self._inflight[x], x))
            if len(self.ready[s]) + self._inflight[s] >= limit:
                return
            self._submit(s)
