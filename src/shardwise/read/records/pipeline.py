"""One consumer's share of a record stream: its streams' readers, the processing of what
they read, and the interleaving of their examples in global order.

The consumer's next example is the next one of the stream ``s`` with the smallest
``(epoch_s, k_s, s)``, ``k_s`` its examples received in ``epoch_s``: round robin over the
consumer's streams, global example ``k_s · R* + s`` while every stream has examples left.
**Epochs are crossed together**: a stream that has finished epoch ``e`` gives its turns to
the consumer's other streams until each of them has finished ``e`` too, so one epoch of a
consumer is every record of its streams exactly once (version 1 let each stream start its
next epoch alone, and a consumer's first "epoch" repeated some records and missed others).
Worked example (two streams, 3 and 1 records per epoch)::

    stream 0: a b c | a' b' c'    stream 1: x | x'
    version 1:  a x b x' c x ...  (x twice before c)
    version 2:  a x b c | a' x' b' c'

A consumer that serves every stream (one rank, or slime's single data source) therefore
sees every record once per epoch; with several ranks each rank's epochs are its own (the
global order is the same for every world size until a stream runs out in an epoch).
A stream that has ended (finite epochs) fills its turns with pads while another of the
consumer's streams still has examples, and the last round is completed with pads: a
consumer's count is a multiple of its number of streams. A pass over an epoch that reads
records and accepts none raises :class:`ConfigError` with the counts by reason (it would
otherwise loop forever, or end silently empty): the consumer's pass when epochs are
crossed together, each stream's when not.

``align=False`` keeps order version 1 (the key is ``(consumed_s, s)``): every consumer's
examples are then at fixed global positions whatever the world size or the DataLoader
workers, at the price of epoch boundaries that leak as in the example above.

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
from shardwise.errors import ConfigError, InputError
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


def pad_batch(batch: list[Any], n: int) -> list[Any]:
    """``get_next_batch(n, pad=True)``'s last batch: a short one filled up to ``n`` with
    :func:`make_pad` examples (an empty one stays empty: the end is still seen)."""
    return batch + [make_pad() for _ in range(n - len(batch))] if batch else batch


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
                 task_size: int, align: bool = True) -> None:
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
        self.align = align
        self._heap = [self._key(positions[s], s) for s in self.streams]
        heapq.heapify(self._heap)
        self._done = sum(positions[s].done for s in self.streams)
        self.taken = sum(positions[s].consumed for s in self.streams)
        self._rejected: dict[int, dict[str, int]] = {s: {} for s in self.streams}
        self._epoch = min(positions[s].epoch for s in self.streams)  # aligned: the pass
        self._produced = sum(positions[s].epoch_consumed for s in self.streams
                             if positions[s].epoch == self._epoch) + any(
            positions[s].epoch > self._epoch for s in self.streams)  # unknown: assume some

    def _key(self, p: StreamPosition, s: int) -> tuple[int, int, int]:
        """Who goes next: ``(epoch, examples of it, s)`` when epochs are crossed together,
        else ``(0, examples, s)`` (order version 1: each stream's epochs its own)."""
        return (p.epoch, p.epoch_consumed, s) if self.align else (0, p.consumed, s)

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
            epoch, k, s = heap[0]
            if self.align and epoch > self._epoch:
                self._end_of_pass(self.streams, self._epoch, epoch)
            p = positions[s]
            if p.done:
                if self._done == len(self.streams):
                    if self.align:  # raises if the last pass was all rejected
                        self._end_of_pass(self.streams, self._epoch, self._epoch)
                    if all(self._key(positions[x], x)[:2] == (epoch, k)  # the round is whole
                           for x in self.streams):
                        return FINISHED
                return self._hand_out(p, s, make_pad())
            ready = self.ready[s]
            if not ready:
                self._fetch(s)
            delta, outcome, where = ready[0]
            if delta[0] != p.epoch or outcome is END:  # s has read all of its epoch
                if not self.align:
                    self._produced = p.epoch_consumed
                    self._end_of_pass([s], p.epoch, p.epoch)
                elif delta[0] > epoch:  # wait for the others to finish theirs
                    heapq.heapreplace(heap, (delta[0], 0, s))
                    continue
            ready.popleft()
            p.apply(delta)
            if outcome is END:
                p.done = True
                self._done += 1
            elif outcome.__class__ is Dropped:
                if self.raise_errors and outcome.error is not None:
                    raise locate(outcome.error, self.order.plan, where)
                p.errors[outcome.reason] = p.errors.get(outcome.reason, 0) + 1
                mine = self._rejected[s]
                mine[outcome.reason] = mine.get(outcome.reason, 0) + 1
            else:
                self._produced += 1
                return self._hand_out(p, s, outcome)

    def _hand_out(self, p: StreamPosition, s: int, example: Any) -> Any:
        p.consumed += 1
        p.epoch_consumed += 1
        self.taken += 1
        heapq.heapreplace(self._heap, self._key(p, s))
        return example

    def _end_of_pass(self, streams: list[int], epoch: int, next_epoch: int) -> None:
        """``streams`` have read all of ``epoch`` (aligned: all of the consumer's, counted
        together; else one stream): refuse a pass that read records and accepted none —
        it would loop forever, or end silently empty. Unaligned, one stream must produce,
        since every R*-th example is its own."""
        rejected: dict[str, int] = {}
        for s in streams:
            for k, v in self._rejected[s].items():
                rejected[k] = rejected.get(k, 0) + v
            self._rejected[s] = {}
        if rejected and not self._produced:
            counts = ", ".join(f"{k}: {v}" for k, v in sorted(rejected.items()))
            what = f"stream {streams[0]}" if len(streams) == 1 else f"streams {streams}"
            raise ConfigError(
                f"{what} read {sum(rejected.values())} records in epoch {epoch} and produced "
                f"no example: every one was rejected ({counts}). Check map_fn (does it return "
                "None or Reject for every record?) and the input's field names")
        self._epoch, self._produced = next_epoch, 0

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
