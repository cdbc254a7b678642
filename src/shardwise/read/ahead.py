"""Micro-batches made ahead of the caller, on one thread, while it trains.

A loader with no worker processes makes each batch when it is asked for, so a batch's
own reading time — and, from an object store, a chunk that arrives a few steps late — is
waited for inside the training step. :func:`made_ahead` makes the next batches on the one
read-ahead thread (:class:`~shardwise.concurrency.readahead.ReadAhead`) instead, once the
caller is seen training; only batches handed over count as received, so positions,
states and resumes are what they are without it::

    loader(ds, ..., batches_ahead=4)   # the default for a cache on an object store
        batch 0, 1, 2 made on demand (the caller seen holding each >= 1 ms)
        then the thread keeps 4 made while the caller trains

A remote cache decides whether ranged reads keep up with the reader from the reader's own
time per batch; with a thread that time is the caller's (:func:`reader_pace`), not the
thread's, which asks again as soon as its queue has room.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

from shardwise.checkpoint import as_count
from shardwise.concurrency.readahead import ReadAhead
from shardwise.errors import ConfigError

T = TypeVar("T")
_DONE: Any = object()
BATCHES_AHEAD = 4  # micro-batches made ahead on a thread by default, for a remote cache
TRAINS_S, TRAINS_BATCHES = 0.001, 3  # a caller seen training: the thread starts (made_ahead)


def _readers(dataset: Any) -> list[Any]:
    """The readers of a cache behind ``dataset``: a blend's sources (theirs, in turn), or
    itself."""
    sources = getattr(dataset, "sources", None)
    if isinstance(sources, Sequence) and sources:
        return [r for d in sources for r in _readers(d)]
    return [dataset]


def reads_remotely(dataset: Any) -> bool:
    """Whether ``dataset`` (or a source of a blend) reads a cache whose store downloads
    ahead (an object store: worth a prefetch, and batches made ahead)."""
    stores = (getattr(getattr(d, "cache", None), "store", None) for d in _readers(dataset))
    return any(getattr(s, "prefetches", False) for s in stores)


def reader_pace(dataset: Any) -> Callable[[float | None], None] | None:
    """What takes the caller's own time per batch: ``dataset.reader_pace`` (a blend's
    sources', each); None if nothing does."""
    paces = [p for p in (getattr(d, "reader_pace", None) for d in _readers(dataset))
             if p is not None]

    def pace(own_s: float | None) -> None:
        for p in paces:
            p(own_s)
    return pace if paces else None


def made_ahead(batches: Callable[[], Iterator[T]], depth: int,
               pace: Callable[[float | None], None] | None = None) -> Iterator[T]:
    """The items of ``batches()``, made ``depth`` ahead on one thread while the caller
    trains (:class:`~shardwise.concurrency.readahead.ReadAhead`: errors re-raised here,
    the thread stopped when the caller stops); ``depth`` 0: made here, on demand.

    Why: a batch's own reading time, and a chunk that arrives late, are waited for in the
    training loop unless the batch was made during the step before. Only the batches
    handed over count as received, so the position (and a state saved) is unchanged.

    The thread starts once the caller is seen training: :data:`TRAINS_BATCHES` batches in
    a row, each held :data:`TRAINS_S` or longer before it asked for the next. A loop that
    asks again at once (a bench read flat out) gains nothing from a thread and would pay
    its hand-over, ~200 µs a batch (the GIL passing between two busy threads), so its
    batches are made here."""
    items = batches()
    if depth == 0:
        yield from items
        return
    training = 0
    for item in items:
        handed = time.monotonic()
        yield item
        training = training + 1 if time.monotonic() - handed >= TRAINS_S else 0
        if training == TRAINS_BATCHES:
            break
    else:
        return
    yield from _on_a_thread(items, depth, pace)


def _on_a_thread(items: Iterator[T], depth: int,
                 pace: Callable[[float | None], None] | None) -> Iterator[T]:
    """The rest of ``items`` made ``depth`` ahead on one thread. ``pace`` (a dataset's
    ``reader_pace``) gets the caller's own time on each batch, its waits excluded: the
    pace a remote cache reads ahead by is the caller's, not the thread's. The caller only
    notes its time; the thread hands it on before it makes the next batch: each call
    made on the caller's thread cost ~40 µs there after a training step (caches gone
    cold), a fifth of a 20 ms step's stall on the bench."""
    own: deque[float] = deque()  # the caller's own times, not yet handed to pace
    if pace is not None:
        pace(None)
    ahead: ReadAhead[T] = ReadAhead(lambda: items if pace is None else _paced(items, own, pace),
                                    name="shardwise-batches-ahead", depth=depth)
    handed: float | None = None
    try:
        while True:
            if handed is not None:
                own.append(time.monotonic() - handed)
            item = ahead.get(_DONE)
            if item is _DONE:
                return
            handed = time.monotonic()
            yield item
    finally:
        ahead.close()


def _paced(items: Iterator[T], own: deque[float], pace: Callable[[float | None], None]
           ) -> Iterator[T]:
    """``items``, with the caller's times noted since the last one handed to ``pace``
    before each is made (on the read-ahead thread)."""
    while True:
        while own:
            pace(own.popleft())
        try:
            item = next(items)
        except StopIteration:
            return
        yield item


def batches_ahead_count(batches_ahead: int | None, dataset: Any) -> int:
    """``batches_ahead`` checked; None: :data:`BATCHES_AHEAD` for a remote cache, else 0."""
    if batches_ahead is None:
        return BATCHES_AHEAD if reads_remotely(dataset) else 0
    return as_count(batches_ahead, "batches_ahead", error=ConfigError)


__all__ = ["BATCHES_AHEAD", "TRAINS_BATCHES", "TRAINS_S", "batches_ahead_count", "made_ahead",
           "reader_pace", "reads_remotely"]
