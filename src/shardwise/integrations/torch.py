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

State keys: ``kind``, ``version``, ``fingerprint``, ``consumed``, ``config``, ``extra``.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from shardwise.checkpoint import SKIP_KEY, Configured, LoaderState, Resumable, as_count
from shardwise.errors import ConfigError, MissingExtraError, StateError
from shardwise.integrations.guards import refuse_bare_lightning
from shardwise.integrations.torch_batches import collate, pin
from shardwise.read.drops import Drop, describe_drops
from shardwise.read.epochs import refuse_epoch_view
from shardwise.read.examples import Output, with_output
from shardwise.read.guard import refuse_framework_sharding
from shardwise.read.sampler import BatchSampler, SamplerKind, skip_from_steps
from shardwise.world import World

try:
    import torch
    from torch.utils.data import DataLoader, IterableDataset
except ImportError as e:  # pragma: no cover - exercised only without torch
    raise MissingExtraError("shardwise.torch needs PyTorch: pip install 'shardwise[torch]'"
                            ) from e

MAX_LOOK_AHEAD = 1024  # micro-batches whose indices the adaptive look-ahead holds at most


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


def look_ahead(batches: Iterator[list[int]], prefetch: Callable[[list[int]], bool | None],
               ahead: int | None) -> Iterator[list[int]]:
    """``batches`` unchanged, with ``prefetch(batch)`` called before each is handed on, so
    its chunks download while earlier batches are read.

    ``ahead`` batches early (a fixed look-ahead)::

        ahead=2:  prefetch b0, b1, b2 → yield b0 → prefetch b3 → yield b1 → …

    or, ``ahead=None``, as early as the cache asks: ``prefetch`` returns True while the
    cache's downloads ahead are fewer than its measured latency and reading pace need
    (:mod:`shardwise.storage.prefetch`), and then the next batch is prefetched before
    one is handed on; so the window grows until the latency is hidden (or ``local_bytes``
    is reached), and stays there (at most :data:`MAX_LOOK_AHEAD` batches)::

        wants more: prefetch b0 → prefetch b1 → prefetch b2 (enough) → yield b0 →
                    prefetch b3 (enough) → yield b1 → prefetch b4 (wants more) → …
    """
    window: collections.deque[list[int]] = collections.deque()
    for batch in batches:
        more = prefetch(batch)
        window.append(batch)
        if ahead is not None:
            if len(window) > ahead:
                yield window.popleft()
        elif not more or len(window) > MAX_LOOK_AHEAD:
            yield window.popleft()
    yield from window


class _Indices:
    """The batch sampler handed to torch: a mutable holder, so a restored position takes
    effect on the next ``iter()`` (also with persistent workers). ``prefetch`` (a
    dataset's, for a cache on an object store) sees each batch ``ahead`` batches early
    (None: as early as the cache asks; 0: never)."""

    def __init__(self, sampler: BatchSampler,
                 prefetch: Callable[[list[int]], bool | None] | None = None,
                 ahead: int | None = 0) -> None:
        self.sampler = sampler
        self.start = sampler.consumed
        self.received = 0  # micro-batches handed to the caller since ``start``
        self.prefetch, self.ahead = prefetch, ahead
        self.stopped = False  # set to end the current index stream early (see _drain)

    def __iter__(self) -> Iterator[list[int]]:
        refuse_framework_sharding("a shardwise loader's batch sampler")
        self.stopped = False
        batches = iter(self.sampler)
        if self.prefetch is not None and self.ahead != 0:
            batches = look_ahead(batches, self.prefetch, self.ahead)
        return self._until_stopped(batches)

    def _until_stopped(self, batches: Iterator[list[int]]) -> Iterator[list[int]]:
        for batch in batches:
            if self.stopped:
                return
            yield batch

    def __len__(self) -> int:
        return len(self.sampler)


class ShardwiseLoader(Resumable, DataLoader):  # type: ignore[type-arg]
    """A DataLoader over this rank's micro-batches; iterate it, checkpoint it, restore it.

    Every ``iter()`` continues from the current position (the number of examples of the
    global order consumed so far), so an interrupted loop picks up where it stopped.
    """

    state_kind = "torch_loader"

    def __init__(self, dataset: Any, sampler: BatchSampler, *, look_ahead: int | None = 0,
                 collate_fn: Callable[[Any], Any] | None = None, **kwargs: Any) -> None:
        # the position lives on this plain object: DataLoader.__setattr__ runs Python
        # checks on every attribute set, which would cost each step
        self._indices = _Indices(sampler, getattr(dataset, "prefetch", None), look_ahead)
        super().__init__(dataset, batch_sampler=self._indices,
                         collate_fn=collate if collate_fn is None else collate_fn, **kwargs)

    @property
    def consumed(self) -> int:
        """Examples of the global order received by all ranks together."""
        pos = self._indices
        if pos.sampler.skip:  # skipped ranges make the position jump
            return pos.sampler.advance(pos.received)
        return pos.start + pos.received * pos.sampler.step_examples

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]
        refuse_epoch_view(self.dataset, "a shardwise loader")
        refuse_bare_lightning("a shardwise loader")
        self._restart(self.consumed)
        pos = self._indices
        batches = self._direct() if self._is_direct() else super().__iter__()
        try:
            for batch in batches:
                pos.received += 1
                yield batch
        except GeneratorExit:  # the caller stopped early (break, del, garbage collection)
            if self.num_workers > 0:
                self._drain(batches)
            raise

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
        self._indices.stopped = True
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

    def _direct(self) -> Iterator[Any]:
        """shardwise's collate takes the stacked arrays (``get_batch``: no per-row dicts);
        any other ``collate_fn`` gets torch's protocol, ``__getitems__``'s list."""
        ds, fn = self.dataset, self.collate_fn
        fast = fn is collate and hasattr(ds, "get_batch")
        getitems = ds.get_batch if fast else ds.__getitems__  # type: ignore[attr-defined]
        pinned = self.pin_memory and torch.cuda.is_available()
        for indices in self._indices:
            batch = fn(getitems(indices))
            yield (pin(batch) if pinned else batch)

    def _restart(self, consumed: int) -> None:
        pos = self._indices
        pos.sampler = dataclasses.replace(pos.sampler, consumed=consumed)
        pos.start, pos.received = consumed, 0

    def state_config(self) -> dict[str, Any]:
        return sampler_state_config(self.dataset, self._indices.sampler)

    def _position(self) -> tuple[int, dict[str, Any]]:
        hints = (self.dataset.seek_hints(self.consumed)  # e.g. a Blend's counts: O(1) seek
                 if isinstance(self.dataset, Configured) else {})
        return self.consumed, hints

    def _seek(self, st: LoaderState) -> None:
        """Continue from a saved position; refuse a position past the end of this run. The
        global batch size may differ from the saved run's (see the module docs): the
        continuation is the same global order."""
        self._indices.sampler.check_in_run(st.consumed)
        step = self._indices.sampler.step_examples
        if st.consumed % step:
            raise StateError(f"the state is at {st.consumed} examples, not a multiple of "
                             f"micro_batch_size × world size = {step}; resume with a layout "
                             "that divides it (states saved at global-batch boundaries fit "
                             "every layout whose micro-batch × world size divides the "
                             "global batch)")
        if isinstance(self.dataset, Configured):
            self.dataset.apply_seek_hints(st.consumed, st.extra)
        self._restart(st.consumed)

    def describe(self) -> dict[str, Any]:
        """The run at a glance: layout, length, position, and what is left out (``drops``:
        the dataset's and the sampler's) or padded (``padding``: masked eval examples)."""
        s = self._indices.sampler
        drops = _dataset_drops(self.dataset) + s.drops()
        return {"dataset": repr(self.dataset), "sampler": s.kind.value,
                "global_batch_size": s.global_batch_size,
                "micro_batch_size": s.micro_batch_size,
                "world": f"{s.world.rank}/{s.world.size}", "epoch_examples": s.n,
                "run_examples": s.end, "consumed": self.consumed,
                "skip": [list(r) for r in s.skip],
                "drops": [d.to_dict() for d in drops], "padding": s.padding(),
                "summary": describe_drops(drops)}

    def __repr__(self) -> str:
        d = self.describe()
        run = "endless" if d["run_examples"] is None else f"{d['run_examples']:,} examples"
        pad = f"; pads {d['padding']:,} masked examples" if d["padding"] else ""
        return (f"ShardwiseLoader({type(self.dataset).__name__} of {d['epoch_examples']:,} "
                f"examples, sampler={d['sampler']!r}, global batch "
                f"{d['global_batch_size']}, micro batch {d['micro_batch_size']}, rank "
                f"{d['world']}, run {run}, at {d['consumed']:,}; {d['summary']}{pad})")


def sampler_state_config(dataset: Any, s: BatchSampler) -> dict[str, Any]:
    """The dataset's config (its order) and the sampler's (how it is placed): what a
    state of this loader (or of :mod:`shardwise.integrations.torchdata`'s sampler) must
    match."""
    cfg = dict(dataset.state_config()) if isinstance(dataset, Configured) else {
        "dataset": type(dataset).__qualname__, "len": len(dataset)}
    cfg["sampler"] = s.kind.value
    if s.kind is SamplerKind.CYCLIC:
        cfg.update(sampler_seed=s.seed, data_sharding=s.data_sharding)
        if s.data_sharding:
            cfg["world_size"] = s.world.size  # the order depends on it
        if s.n % s.step_examples:  # so does the epoch: whole steps of m × W
            cfg["epoch_examples"] = s.n - s.n % s.step_examples
    if s.kind is SamplerKind.EVAL:
        cfg["world_size"] = s.world.size
    if s.skip:  # compared by its own rule on resume (checkpoint.SKIP_KEY); absent when empty,
        cfg[SKIP_KEY] = [list(r) for r in s.skip]  # so states without skips keep their prints
    return cfg


def _dataset_drops(dataset: Any) -> list[Drop]:
    drops = getattr(dataset, "drops", None)
    return list(drops()) if callable(drops) else []


def _check_eval(dataset: Any, sampler: BatchSampler) -> None:
    """An eval pass sees every example once: refuse a dataset that drops data, or one
    that cannot make the masked padding examples (index -1) the last step needs."""
    drops = _dataset_drops(dataset)
    if drops:
        raise ConfigError(f"sampler='eval' must see every example, but {dataset!r} leaves "
                          f"out {'; '.join(map(str, drops))}; make the eval dataset with "
                          "drop_last=False (the last window is padded and masked)")
    if sampler.padding() and not getattr(dataset, "pads", False):
        raise ConfigError(f"sampler='eval' fills its last step with {sampler.padding()} "
                          f"masked padding examples (index -1), which "
                          f"{type(dataset).__name__} cannot make (index -1 would read its "
                          "last example again); use a TokenDataset, or a global batch that "
                          f"divides its {sampler.n} examples")


def _map_style_len(dataset: Any) -> int:
    """``len(dataset)``: the loader places a map-style dataset; an iterable reader places
    its own examples (``world=``) and has no ``len`` to plan steps over."""
    if not hasattr(dataset, "__len__"):
        raise ConfigError(f"shardwise.torch.loader walks map-style datasets; "
                          f"{type(dataset).__name__} is iterable and places itself "
                          "(world=, default World.detect()): iterate it, or use "
                          "torch.utils.data.DataLoader(reader, batch_size=micro_batch_size)")
    return len(dataset)


def loader(dataset: Any, *, global_batch_size: int, micro_batch_size: int,
           world: World | None = None, num_workers: int = 0, sampler: str = "single",
           seed: int = 0, data_sharding: bool = True, epochs: int | None = None,
           total_samples: int | None = None, consumed: int = 0, pin_memory: bool = False,
           persistent_workers: bool = False, prefetch_factor: int | None = None,
           look_ahead: int | None = None, collate_fn: Callable[[Any], Any] | None = None,
           skip_steps: Iterable[Sequence[int]] | None = None, output: Output | None = None,
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
    workers; ``expand(batch)`` restores a compact one on the device.

    >>> dl = loader(ds, global_batch_size=64, micro_batch_size=8,  # doctest: +SKIP
    ...             world=World(0, 2))
    """
    kind, n = SamplerKind.parse(sampler), _map_style_len(dataset)
    dataset = with_output(dataset, output)
    if look_ahead is not None:
        look_ahead = as_count(look_ahead, "look_ahead", error=ConfigError)
    world = World.resolve(world, reader="shardwise.torch.loader")
    if epochs is not None and total_samples is not None:
        raise ConfigError("give epochs or total_samples, not both")
    total = (total_samples if epochs is None
             else as_count(epochs, "epochs", minimum=1, error=ConfigError) * n)
    batches = BatchSampler(n, global_batch_size, micro_batch_size, world, kind,
                           seed, data_sharding, as_count(consumed, "consumed"), total,
                           skip_from_steps(skip_steps, global_batch_size))
    if kind is SamplerKind.EVAL:
        _check_eval(dataset, batches)
    return ShardwiseLoader(dataset, batches, num_workers=num_workers, pin_memory=pin_memory,
                           look_ahead=look_ahead, collate_fn=collate_fn,
                           **_worker_options(num_workers, persistent_workers, prefetch_factor),
                           **dataloader_kwargs)


def _worker_options(workers: int, persistent: bool, prefetch_factor: int | None
                    ) -> dict[str, Any]:
    """DataLoader's options that exist only with worker processes."""
    if workers == 0:
        return {}
    extra: dict[str, Any] = {"persistent_workers": persistent}
    if prefetch_factor is not None:
        extra["prefetch_factor"] = prefetch_factor
    return extra
