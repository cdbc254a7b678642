"""PyTorch: a DataLoader that serves this rank's micro-batches and checkpoints its position.

:func:`loader` returns a :class:`ShardwiseLoader`, a ``torch.utils.data.DataLoader`` with
``state_dict()`` / ``load_state_dict()`` as torchdata's StatefulDataLoader has them. The
state counts micro-batches this process has *received* (prefetched batches are not
counted), converted to examples of the global order, so it is the same on every rank and
restores any world size for which the position is a whole step. Works with
``num_workers > 0``, ``pin_memory`` and ``persistent_workers``: the index stream is made
in the main process, workers only read.

**Another global batch size continues exactly.** The global order does not depend on the
batch size, so the state does not hold it: a state saved with global batch size 16
resumes under 8 (or 32) at the same example — what Megatron's batch-size ramp-up needs —
whenever the position is a whole number of the new ``micro_batch_size × world size``
(otherwise it is refused, naming that step). The next examples are ``[consumed, …)`` of
the one global order, whatever the sizes.

``describe()`` (and ``repr``) says what the run serves and what it leaves out: the
dataset's drops (a last partial window, …) and the sampler's (a finite run's last partial
step, a cyclic epoch's remainder, the examples a skip list leaves out); an eval pass
only pads.

**Skipping steps** (``skip_steps=[(a, b), …]``: global steps ``a`` to ``b - 1``, at the
global batch size given) — the skip-and-resume recipe after a loss spike. Only those steps
change; ``consumed`` stays a position in the unskipped order and the run's end is the same
position (:mod:`shardwise.read.sampler`). The skip list is in the state's config: a state
loads when the ranges before its position are the ones it was saved with; ranges at or
after it may be added or removed, and a position where a new range starts continues at
its end (:meth:`shardwise.checkpoint.LoaderState.check_matches`).

The position, the state and ``describe()`` are those of the torch-free core,
:class:`shardwise.read.loader.Loader` (``shardwise.numpy_loader``): a state saved by
either loader loads into the other.

State keys: ``kind``, ``version``, ``fingerprint``, ``consumed``, ``config``, ``extra``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from functools import partial
from typing import Any

from shardwise.checkpoint import LoaderState, Resumable
from shardwise.errors import ConfigError, MissingExtraError
from shardwise.integrations.guards import refuse_bare_lightning
from shardwise.integrations.torch_batches import arrays, collate, pin
from shardwise.integrations.torch_indices import PlacedLoader, PlacedSampler
from shardwise.read.ahead import (
    batches_ahead_count,
    made_ahead,
    noting_pace,
    reader_pace,
    reads_remotely,
    ready_for_workers,
)
from shardwise.read.examples import Output, with_output
from shardwise.read.loader import Loader, ahead_count, describe_line, plan_sampler
from shardwise.read.placement import Placement
from shardwise.read.sampler import BatchSampler
from shardwise.world import World, keep_torch_groups

try:
    import torch
    from torch.utils.data import DataLoader, IterableDataset
except ImportError as e:  # pragma: no cover - exercised only without torch
    raise MissingExtraError("shardwise.torch needs PyTorch: pip install 'shardwise[torch]'"
                            ) from e

def _register_iterables() -> None:
    """Streams are plain iterables (the core never imports torch); make DataLoader accept
    them as IterableDatasets even when torch was imported after they were created."""
    from shardwise.read.compose.sft_pack import PackedSFT
    from shardwise.read.external.producer_dir import ProducerDirStream
    from shardwise.read.records.stream import RecordStream
    from shardwise.read.stream.dataset import StreamDataset

    for reader in (StreamDataset, RecordStream, PackedSFT, ProducerDirStream):
        IterableDataset.register(reader)


_register_iterables()


class ShardwiseLoader(PlacedLoader, Resumable, DataLoader):  # type: ignore[type-arg,misc]
    """A DataLoader over this rank's micro-batches; iterate it, checkpoint it, restore it.

    Every ``iter()`` continues from the current position (the number of examples of the
    global order consumed so far), so an interrupted loop picks up where it stopped. The
    position, the state and ``describe()`` are its core's, a
    :class:`shardwise.read.loader.Loader` (the numpy loader): their states load into each
    other.
    """

    state_kind = Loader.state_kind

    def __init__(self, dataset: Any, sampler: BatchSampler, *, look_ahead: int | None = 0,
                 collate_fn: Callable[[Any], Any] | None = None, batches_ahead: int = 0,
                 **kwargs: Any) -> None:
        # the core lives on this plain attribute: DataLoader.__setattr__ runs Python checks
        # on every attribute set, which would cost each step
        self._core = Loader(dataset, sampler, look_ahead=look_ahead,
                            batches_ahead=batches_ahead)
        workers = kwargs.get("num_workers", 0)
        if workers > 0 and reads_remotely(dataset):  # they read, this process downloads
            self._core.indices.workers = workers
            if self._core.indices.prefetch is not None:
                self._core.indices.prefetch = partial(dataset.prefetch, early=False)
            ready_for_workers(dataset)
        self._placed = PlacedSampler(self._core.indices)
        fn = collate if collate_fn is None else collate_fn
        # workers send numpy arrays (one message) to a collate that takes them: it runs here
        self._here = (fn if kwargs.get("num_workers", 0) > 0
                      and getattr(fn, "takes_arrays", False) else None)
        super().__init__(dataset, batch_sampler=self._core.indices,
                         collate_fn=fn if self._here is None else arrays, **kwargs)

    @property
    def consumed(self) -> int:
        """Examples of the global order received by all ranks together."""
        return self._core.consumed

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]
        refuse_bare_lightning("a shardwise loader")
        keep_torch_groups()  # a world resolved before init_process_group did not
        pos = self._core.begin()
        if self._is_direct():  # the index stream started here: its guard sees the caller
            index_batches = iter(self._core.indices)
            batches = made_ahead(lambda: self._direct(index_batches), self._core.batches_ahead,
                                 reader_pace(self.dataset))
        else:
            batches = super().__iter__()
            if self._core.indices.workers:  # the pace their reads ahead follow
                batches = noting_pace(batches, self._core.indices.pace.note)
        if self._here is not None:
            batches = self._collated(batches, self._here)
        try:
            for batch in batches:
                pos.received += 1
                yield batch
        except GeneratorExit:  # the caller stopped early (break, del, garbage collection)
            if self.num_workers > 0:
                self._drain(batches)
            raise

    def _collated(self, batches: Iterator[Any], fn: Callable[[Any], Any]) -> Iterator[Any]:
        pinned = self.pin_memory and torch.cuda.is_available()
        for batch in batches:
            yield pin(fn(batch)) if pinned else fn(batch)

    def _drain(self, batches: Iterator[Any]) -> None:
        """End the index stream and receive the batches still in flight (at most
        ``prefetch_factor × num_workers``; not counted as received) before torch stops
        the workers.

        Why: a worker sends each batch from a queue feeder thread. Stopped while that
        thread is still inside torch's C++ (sharing the batch's storage), a *spawned*
        worker finalises its interpreter and CPython < 3.14 ends the thread with
        ``pthread_exit``, which aborts the process as it unwinds a ``noexcept`` frame
        ("terminate called without an active exception"; the main process then reports
        "DataLoader worker ... killed by signal: Aborted"). A worker with nothing in
        flight exits cleanly."""
        self._core.indices.stopped = True
        try:
            for _ in batches:
                pass
        except Exception:  # a worker's error on a batch nobody asked for: it was not
            pass  # received, so a run resumed from here reads it again and raises then

    def _is_direct(self) -> bool:
        """No worker processes and a batched dataset: fetch in this thread ourselves.
        (torch's single-process fetcher adds ~30 us of bookkeeping per micro-batch, a
        third of the whole read path.)"""
        return self.num_workers == 0 and hasattr(self.dataset, "__getitems__")

    def _direct(self, index_batches: Iterator[list[int]]) -> Iterator[Any]:
        """shardwise's collate takes the stacked arrays (``get_batch``: no per-row dicts);
        any other ``collate_fn`` gets torch's protocol, ``__getitems__``'s list."""
        ds, fn = self.dataset, self.collate_fn
        fast = fn is collate and hasattr(ds, "get_batch")
        getitems = ds.get_batch if fast else ds.__getitems__  # type: ignore[attr-defined]
        pinned = self.pin_memory and torch.cuda.is_available()
        for indices in index_batches:
            batch = fn(getitems(indices))
            yield (pin(batch) if pinned else batch)

    def state_config(self) -> dict[str, Any]:
        return self._core.state_config()

    def _position(self) -> tuple[int, dict[str, Any]]:
        return self._core._position()

    def _seek(self, st: LoaderState) -> None:
        self._core._seek(st)

    def describe(self) -> dict[str, Any]:
        """The run at a glance (:meth:`shardwise.read.loader.Loader.describe`)."""
        return self._core.describe()

    def __repr__(self) -> str:
        return describe_line(type(self).__name__, self.dataset, self.describe())


def loader(dataset: Any, *, global_batch_size: int | None = None,
           micro_batch_size: int | None = None, world: World | None = None,
           num_workers: int = 0, sampler: str = "single", seed: int = 0,
           data_sharding: bool = True, epochs: int | None = None,
           total_samples: int | None = None, consumed: int = 0, pin_memory: bool = False,
           persistent_workers: bool = False, prefetch_factor: int | None = None,
           look_ahead: int | None = None, collate_fn: Callable[[Any], Any] | None = None,
           skip_steps: Iterable[Sequence[int]] | None = None, output: Output | None = None,
           placement: Placement | None = None, batches_ahead: int | None = None,
           **dataloader_kwargs: Any) -> ShardwiseLoader:
    """This rank's loader over ``dataset`` (a TokenDataset or any map-style dataset).

    ``global_batch_size = micro_batch_size × world size × accumulation``; ``epochs`` or
    ``total_samples`` bound the run (default: endless); ``consumed`` resumes at a position
    (counts may be numpy or torch integers; past the end of the run is a StateError).
    ``sampler="eval"`` is one padded pass in stored order: every example once, the last
    step filled with masked examples; a dataset that drops data or cannot pad is refused.
    ``look_ahead``: for a cache on an object store, the chunks of coming micro-batches
    download in the background while earlier ones are read: by default as far ahead as the
    measured download latency and reading pace need, within the cache's ``local_bytes``
    (:mod:`shardwise.storage.prefetch`); an integer fixes it at that many micro-batches
    (0: only on demand). Local caches never prefetch. ``collate_fn`` (default
    :func:`collate`) gets what torch gives any collator: a list of per-example dicts (HF's
    ``default_data_collator`` works). ``skip_steps``: half-open ranges of global steps
    (of ``global_batch_size``) to leave out (see the module docs); ``epochs`` and
    ``total_samples`` still count positions of the order, skipped ones included, so the
    run ends where it would without skips and never reads past its planned data.
    ``output``: the examples' form (:class:`~shardwise.read.examples.Output`), made in the
    workers; ``expand(batch)`` restores a compact one on the device. ``placement``: the
    placement's arguments as one :class:`~shardwise.read.placement.Placement` (a read
    config's node; then leave them out). ``batches_ahead`` (no workers): micro-batches a
    thread makes while the caller trains (default: 4 on an object store, 0 on local disk).

    >>> dl = loader(ds, global_batch_size=64, micro_batch_size=8,  # doctest: +SKIP
    ...             world=World(0, 2))
    """
    placed = Placement.of(placement, global_batch_size=global_batch_size,
                          micro_batch_size=micro_batch_size, sampler=sampler, seed=seed,
                          data_sharding=data_sharding, epochs=epochs,
                          total_samples=total_samples, skip_steps=skip_steps)
    batches = plan_sampler(dataset, placed, world=world, consumed=consumed,
                           what="shardwise.torch.loader",
                           iterable_fix="torch.utils.data.DataLoader(reader, "
                                        "batch_size=micro_batch_size)")
    return ShardwiseLoader(with_output(dataset, output), batches, num_workers=num_workers,
                           pin_memory=pin_memory, look_ahead=ahead_count(look_ahead),
                           batches_ahead=_made_ahead(num_workers, batches_ahead, dataset),
                           collate_fn=collate_fn,
                           **_worker_options(num_workers, persistent_workers, prefetch_factor),
                           **dataloader_kwargs)


def _made_ahead(workers: int, batches_ahead: int | None, dataset: Any) -> int:
    """Micro-batches a thread makes ahead: none with worker processes (they do)."""
    if workers and batches_ahead:
        raise ConfigError(f"batches_ahead={batches_ahead} is for num_workers=0: worker "
                          "processes make batches ahead themselves (prefetch_factor)")
    return 0 if workers else batches_ahead_count(batches_ahead, dataset)


def _worker_options(workers: int, persistent: bool, prefetch_factor: int | None
                    ) -> dict[str, Any]:
    """DataLoader's options that exist only with worker processes."""
    if workers == 0:
        return {}
    extra: dict[str, Any] = {"persistent_workers": persistent}
    if prefetch_factor is not None:
        extra["prefetch_factor"] = prefetch_factor
    return extra
