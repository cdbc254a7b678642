"""Micro-batches made ahead of the caller while it trains: on one thread, or by DataLoader
worker processes that read ahead.

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

DataLoader worker processes make batches ahead themselves, and from inside one neither
the caller's pace nor the worker's coming batches can be seen: it is sent a batch when
its queue has room (back to back while it fills), and the index stream is walked in the
loader's process. :func:`for_workers` sends both with each batch (a
:class:`WorkerAhead`), and the worker hands them to its cache (:func:`worker_read`)::

    loader's process:  batch 0 → worker 0   ahead: pace None, coming 2, 4, …, 16
                       batch 1 → worker 1   ahead: pace None, coming 3, 5, …, 17
                       batch 2 → worker 0   ahead: pace 2 × the caller's, coming 18
    worker 0:          ranged reads of 0 and 2 at once, of 4, …, 16 once 0 is read, of
                       18 with 2; the chunks downloaded by the loader's process
"""

from __future__ import annotations

import itertools
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from shardwise.checkpoint import as_count
from shardwise.concurrency.readahead import ReadAhead
from shardwise.errors import ConfigError
from shardwise.read.guard import Placed

T = TypeVar("T")
_DONE: Any = object()
BATCHES_AHEAD = 4  # micro-batches made ahead on a thread by default, for a remote cache
TRAINS_S, TRAINS_BATCHES = 0.001, 3  # a caller seen training: the thread starts (made_ahead)
WORKER_AHEAD = 8  # a DataLoader worker's coming batches whose ranged reads it may start


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


def ready_for_workers(dataset: Any) -> None:
    """The caches behind ``dataset`` made ready for DataLoader workers forked from this
    process (``Cache.ready_for_workers``)."""
    for d in _readers(dataset):
        cache = getattr(d, "cache", None)
        if cache is not None and hasattr(cache, "ready_for_workers"):
            cache.ready_for_workers()


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
    try:
        yield from noting_pace(iter(lambda: ahead.get(_DONE), _DONE), own.append)
    finally:
        ahead.close()


def noting_pace(items: Iterable[T], note: Callable[[float], None]) -> Iterator[T]:
    """``items``, with ``note(s)`` told the caller's own time on each one it got: from
    handing it over to being asked for the next (the wait for the next left out)."""
    for item in items:
        handed = time.monotonic()
        yield item
        note(time.monotonic() - handed)


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


@dataclass(frozen=True)
class WorkerAhead:
    """What a batch sent to a DataLoader worker carries for its reads ahead (the
    :class:`~shardwise.read.guard.Placed` batch's ``ahead``): ``pace_s``, the caller's own
    time per batch of this worker's — its own time per batch times the workers, as each
    serves one batch in turn (None: not measured yet); ``coming``, the worker's next
    batches not sent to it before, whose ranged reads it starts now."""

    pace_s: float | None
    coming: tuple[tuple[int, ...], ...]


class CallerPace:
    """The caller's own time per batch, a moving average (None: not measured yet),
    measured in the loader's process (:func:`noting_pace`) for its workers."""

    def __init__(self) -> None:
        self.own_s: float | None = None

    def note(self, own_s: float) -> None:
        self.own_s = own_s if self.own_s is None else 0.7 * self.own_s + 0.3 * own_s


def for_workers(batches: Iterable[list[int]], workers: int, pace: CallerPace,
                ahead: int = WORKER_AHEAD) -> Iterator[list[int]]:
    """``batches`` as sent to ``workers`` DataLoader worker processes, each
    :class:`~shardwise.read.guard.Placed` one carrying a :class:`WorkerAhead`.

    torch deals a map-style dataset's batches to its workers in turn (batch ``k`` to worker
    ``k % workers``, from worker 0 at every ``iter()``), so worker ``k % workers``'s next
    batches are ``k + workers``, ``k + 2 × workers``, …: the first batch of each worker
    carries its next ``ahead``, every later one the one batch that is new. A worker that
    gets other batches than foreseen (one that died) only reads early what it then does
    not use. The stream is read ``workers × ahead`` batches ahead of what is sent;
    ``ahead`` 0 (a loader with ``look_ahead=0``): the pace only."""
    items = iter(batches)
    window: deque[list[int]] = deque(itertools.islice(items, workers * ahead + 1))
    sent = 0
    while window:
        batch = window.popleft()
        window.extend(itertools.islice(items, 1))
        if type(batch) is Placed:
            new = range(1 if sent < workers else ahead, ahead + 1) if ahead else range(0)
            batch.ahead = WorkerAhead(
                None if pace.own_s is None else pace.own_s * workers,
                tuple(tuple(window[j * workers - 1]) for j in new
                      if j * workers <= len(window)))
        sent += 1
        yield batch


def worker_read(dataset: Any, indices: Iterable[int], read: Callable[[], T]) -> T:
    """``read()`` (the batch ``indices``), in a DataLoader worker with the batch's
    :class:`WorkerAhead` (if it carries one) handed to ``dataset``: the caller's pace to its
    caches (:func:`reader_pace`: the worker's own gaps are not it — it reads back to back
    while its queue fills, which read as a reader flat out, and its next batch waited ~1 s
    for whole chunks), and the batches to ``dataset.read_early``: this one and the worker's
    next first, the later ones once this one is read. Why the order: every GET of a
    worker is Python's work (fsspec: obstore does not survive fork), on a machine busy
    downloading the chunks; a first batch sent behind all eight coming ones took 1.0–1.4 s,
    and one read alone 0.7 s but its next then waited 0.1–0.3 s. On the bench, 4 rounds
    each: this one 0.65–0.97 s, then 0.2–0.4 s of waits in all."""
    ahead = getattr(indices, "ahead", None)
    if ahead is None:
        return read()
    pace = reader_pace(dataset)
    if pace is not None:
        pace(ahead.pace_s)
    read_early = getattr(dataset, "read_early", None)
    if read_early is None:
        return read()
    for batch in (indices, *ahead.coming[:1]):
        read_early(list(batch))
    out = read()
    for batch in ahead.coming[1:]:
        read_early(list(batch))
    return out


def batches_ahead_count(batches_ahead: int | None, dataset: Any) -> int:
    """``batches_ahead`` checked; None: :data:`BATCHES_AHEAD` for a remote cache, else 0."""
    if batches_ahead is None:
        return BATCHES_AHEAD if reads_remotely(dataset) else 0
    return as_count(batches_ahead, "batches_ahead", error=ConfigError)


__all__ = ["BATCHES_AHEAD", "TRAINS_BATCHES", "TRAINS_S", "WORKER_AHEAD", "CallerPace",
           "WorkerAhead", "batches_ahead_count", "for_workers", "made_ahead", "noting_pace",
           "reader_pace", "reads_remotely", "ready_for_workers", "worker_read"]
