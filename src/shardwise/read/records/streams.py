"""One stream of a record stream: its ranges per epoch, its shuffle buffer, its position.

Order (``R*`` streams, ``n`` ranges, stream ``s``; how a consumer interleaves its streams
— version 2 crosses epochs with all of them together, version 1 lets each start its next
epoch on its own — is in :mod:`.pipeline`):

1. *Ranges.* Epoch ``e`` orders the ranges by ``π_e``, the keyed
   :class:`~shardwise.plan.permutation.Permutation` of ``range(n)`` with seed
   ``derive_seed(seed, "record_ranges")``; the ``k``-th range of that order belongs to
   stream ``k % R*`` (:func:`~shardwise.plan.stream.chunks_of_stream`), and a stream reads
   its ranges in order. ``shuffle=False``: stored order.
2. *Shuffle buffer* of ``size`` records: top the buffer up to ``size`` with the next
   records read; draw slot ``j = ⌊u_t · len(buffer) / 2⁶⁴⌋`` where ``u_t`` is splitmix64
   at counter ``t`` (``mix64(key + (t + 1)·γ)``, ``key = derive_seed(seed,
   "record_buffer", s, e)``, ``t`` = draws so far this epoch); emit ``buffer[j]`` and move
   the last record into slot ``j``. The generator's position is the integer ``t``.
3. When the epoch's ranges and the buffer are both exhausted, epoch ``e + 1`` begins with
   an empty buffer; with a finite number of epochs the stream ends instead.

Worked example (buffer size 2, records ``a b c d`` in reading order, draws 1 0 1 0)::

    fill [a b]  j=1 → b, [a]   fill [a c]  j=0 → a, [c]   fill [c d]  j=1 → d, [c]
    (end of the ranges)  j=0 → c, []   → next epoch (or the end)

A :class:`StreamReader` runs ahead of the consumer (it holds record bytes); every record
it emits carries a :data:`Delta`, and the :class:`StreamPosition` applies the deltas of
what the consumer has *received*. The position is the checkpoint: plain integers, the
buffer as ``[range, pos, line]`` triples whose bytes are re-read on resume.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from shardwise.checkpoint import as_count
from shardwise.errors import ConfigError, StateError
from shardwise.plan.permutation import Permutation, derive_seed, mix64
from shardwise.plan.stream import chunks_of_stream
from shardwise.read.records.ranges import Payload, RangePlan, fetch, iter_range

ORDER_VERSION = 2
UNALIGNED_ORDER_VERSION = 1  # align_epochs=False: each stream's epochs its own
EMPTY_EPOCH_LIMIT = 64
_GAMMA = 0x9E37_79B9_7F4A_7C15
_BLOCK = 1024

Where = tuple[int, int, int]
"""``(range, pos, line)`` of a record."""
Delta = tuple[int, tuple[Where, ...], int, int, int | None, int]
"""``(epoch, records appended to the buffer, slot drawn or -1 at the end, range index,
pos, line)``: how one emission changed a stream's position."""


class _End:
    """Marks the end of a stream (finite epochs)."""


END = _End()


@dataclass(frozen=True)
class StreamOrder:
    """What fixes the order of every stream (see the module docstring)."""

    plan: RangePlan
    n_streams: int
    seed: int
    shuffle: bool
    buffer_size: int

    def ranges(self, s: int, epoch: int) -> list[int]:
        """Stream ``s``'s ranges in epoch ``epoch``, in reading order."""
        ks = chunks_of_stream(s, self.plan.n, self.n_streams)
        if not self.shuffle or ks.size == 0:
            return [int(k) for k in ks]
        perm = Permutation(self.plan.n, derive_seed(self.seed, "record_ranges"), epoch)
        return [int(k) for k in perm(ks)]

    @property
    def capacity(self) -> int:
        return max(1, self.buffer_size) if self.shuffle else 1


class Draws:
    """``slot(t, n)``: the buffer slot of draw ``t`` among ``n`` (splitmix64 at counter
    ``t``, computed a block of 1024 at a time)."""

    def __init__(self, seed: int, stream: int, epoch: int) -> None:
        self.key = np.uint64(derive_seed(seed, "record_buffer", stream, epoch))
        self._base = -1
        self._block: list[int] = []

    def slot(self, t: int, n: int) -> int:
        base = t - t % _BLOCK
        if base != self._base:
            counters = np.arange(base + 1, base + _BLOCK + 1, dtype=np.uint64)
            with np.errstate(over="ignore"):
                self._block = mix64(self.key + counters * np.uint64(_GAMMA)).tolist()
            self._base = base
        return (self._block[t - base] * n) >> 64


@dataclass
class StreamPosition:
    """Where a stream is, as received by the consumer: the checkpoint of one stream.

    Keys: ``epoch``, ``stop_epoch`` (None: forever), ``range`` (index into the epoch's
    ranges of this stream), ``pos``/``line`` (next record in that range; ``pos`` None: not
    started), ``draws``, ``buffer`` (``[range, pos, line]``), ``consumed`` (examples and
    pads received), ``epoch_consumed`` (of them, in ``epoch``), ``errors`` (skipped
    records by reason), ``done``.
    """

    epoch: int = 0
    stop_epoch: int | None = None
    range: int = 0
    pos: int | None = None
    line: int = 0
    draws: int = 0
    buffer: list[Where] = field(default_factory=list)
    consumed: int = 0
    epoch_consumed: int = 0
    errors: dict[str, int] = field(default_factory=dict)
    done: bool = False

    def apply(self, d: Delta) -> None:
        epoch, appended, slot, q, pos, line = d
        if epoch != self.epoch:
            self.epoch, self.draws, self.buffer, self.epoch_consumed = epoch, 0, [], 0
        self.buffer.extend(appended)
        if slot >= 0:
            buf = self.buffer
            buf[slot] = buf[-1]
            buf.pop()
            self.draws += 1
        self.range, self.pos, self.line = q, pos, line

    def to_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "stop_epoch": self.stop_epoch, "range": self.range,
                "pos": self.pos, "line": self.line, "draws": self.draws,
                "buffer": [list(w) for w in self.buffer], "consumed": self.consumed,
                "epoch_consumed": self.epoch_consumed, "errors": dict(self.errors),
                "done": self.done}

    @classmethod
    def from_dict(cls, d: Any, name: str, n_ranges: int) -> StreamPosition:
        """Checked: every field's type and bounds; :class:`StateError` names the field."""
        if not isinstance(d, dict):
            raise StateError(f"{name}: expected a dict, got {type(d).__name__}")
        fields = ("epoch", "stop_epoch", "range", "pos", "line", "draws", "buffer",
                  "consumed", "errors", "done")
        missing = [k for k in fields if k not in d]
        if missing:
            raise StateError(f"{name}: missing {missing}")
        d = {"epoch_consumed": 0, **d}  # states of order version 1 do not have it
        ints = {k: _int(d[k], f"{name}.{k}", k in ("stop_epoch", "pos"))
                for k in ("epoch", "stop_epoch", "range", "pos", "line", "draws", "consumed",
                          "epoch_consumed")}
        if not isinstance(d["buffer"], list):
            raise StateError(f"{name}.buffer: expected a list, got {type(d['buffer']).__name__}")
        buffer = [_where(w, f"{name}.buffer[{i}]", n_ranges) for i, w in enumerate(d["buffer"])]
        errors = d["errors"]
        if not isinstance(errors, dict) or not all(isinstance(k, str) for k in errors):
            raise StateError(f"{name}.errors: expected a dict of reason -> count")
        errors = {k: as_count(v, f"{name}.errors.{k}") for k, v in errors.items()}
        if not isinstance(d["done"], bool):
            raise StateError(f"{name}.done: expected true or false, got {d['done']!r}")
        stop = ints["stop_epoch"]
        if stop is not None and ints["epoch"] >= stop:
            raise StateError(f"{name}: epoch {ints['epoch']} is past the end of this run "
                             f"(the stream stops before epoch {stop}); the state was edited")
        return cls(buffer=buffer, errors=errors, done=d["done"], **ints)


_MAX = 1 << 62  # no file offset or count comes near it; past it, a seek fails (EINVAL)


def _int(v: Any, name: str, nullable: bool = False) -> Any:
    """A count of the state (numpy and torch integers too); ``None`` where allowed."""
    if v is None and nullable:
        return None
    count = as_count(v, name)
    if count > _MAX:
        raise StateError(f"{name}: {count} is past any file offset; the state was edited")
    return count


def _where(w: Any, name: str, n_ranges: int) -> Where:
    if not isinstance(w, list) or len(w) != 3:
        raise StateError(f"{name}: expected [range, pos, line], got {w!r}")
    rid, pos, line = (_int(x, name) for x in w)
    if rid >= n_ranges:
        raise StateError(f"{name}: range {rid} does not exist (the sources have {n_ranges})")
    return rid, pos, line


class StreamReader:
    """Reads one stream ahead of its consumer, starting from a :class:`StreamPosition`."""

    def __init__(self, order: StreamOrder, stream: int, start: StreamPosition) -> None:
        self.order, self.stream = order, stream
        self.epoch, self.stop_epoch = start.epoch, start.stop_epoch
        self.q, self.pos, self.line, self.t = start.range, start.pos, start.line, start.draws
        self.done = start.done
        self._ranges = order.ranges(stream, self.epoch)
        if self.q > len(self._ranges):
            raise StateError(f"streams.{stream}.range: {self.q} is past the "
                             f"{len(self._ranges)} ranges of this stream in epoch {self.epoch}")
        payloads = fetch(order.plan, start.buffer) if start.buffer else []
        self.buf: list[tuple[Payload, int, int, int]] = [
            (p, *w) for p, w in zip(payloads, start.buffer, strict=True)]
        self._draws = Draws(order.seed, stream, self.epoch)
        self._it: Any = None
        self._cap = order.capacity
        self._empty_epochs = 0
        self._emitted = bool(self.buf) or self.t > 0

    def close(self) -> None:
        if self._it is not None:
            self._it.close()
            self._it = None

    def take(self, n: int) -> list[tuple[Payload | _End, Where, Delta]]:
        """Up to ``n`` emissions; the last is ``END`` when the stream ends."""
        out: list[tuple[Payload | _End, Where, Delta]] = []
        while len(out) < n and not self.done:
            out.append(self._step())
        if self.done and (not out or out[-1][0] is not END):
            out.append((END, (-1, 0, 0), (self.epoch, (), -1, self.q, self.pos, self.line)))
        return out

    def _read(self) -> tuple[Payload, int, int, int] | None:
        while True:
            if self._it is None:
                if self.q >= len(self._ranges):
                    return None
                self._it = iter_range(self.order.plan, self._ranges[self.q], self.pos,
                                      self.line)
            rec = next(self._it, None)
            if rec is None:
                self._it, self.q, self.pos, self.line = None, self.q + 1, None, 0
                continue
            payload, start, line, end = rec
            self.pos, self.line = end, line + 1
            return payload, self._ranges[self.q], start, line

    def _step(self) -> tuple[Payload | _End, Where, Delta]:
        appended: list[Where] = []
        buf, cap = self.buf, self._cap
        while True:
            while len(buf) < cap:
                rec = self._read()
                if rec is None:
                    break
                buf.append(rec)
                appended.append(rec[1:])
            if buf:
                break
            if not self._next_epoch():
                return END, (-1, 0, 0), (self.epoch, (), -1, self.q, self.pos, self.line)
        slot = self._draws.slot(self.t, len(buf)) if len(buf) > 1 else 0
        self.t += 1
        item = buf[slot]
        buf[slot] = buf[-1]
        buf.pop()
        self._emitted = True
        return item[0], item[1:], (self.epoch, tuple(appended), slot, self.q, self.pos,
                                   self.line)

    def _next_epoch(self) -> bool:
        """Move to the next epoch; False (and ``done``) when the stream ends."""
        self._empty_epochs = 0 if self._emitted else self._empty_epochs + 1
        if self.stop_epoch is not None and self.epoch + 1 >= self.stop_epoch:
            self.done = True
            return False
        if self._empty_epochs >= EMPTY_EPOCH_LIMIT:
            raise ConfigError(f"stream {self.stream} found no record in {EMPTY_EPOCH_LIMIT} "
                              f"consecutive epochs: the sources hold too few records for "
                              f"{self.order.n_streams} streams; use fewer streams")
        self.epoch += 1
        self.q, self.pos, self.line, self.t, self._emitted = 0, None, 0, 0, False
        self._ranges = self.order.ranges(self.stream, self.epoch)
        self._draws = Draws(self.order.seed, self.stream, self.epoch)
        return True
