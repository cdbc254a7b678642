"""shardwise's loader without torch: this rank's micro-batches of the global order, as
numpy, with the position as its state.

:func:`numpy_loader` returns a :class:`Loader`: iterate it for dicts of numpy arrays (a
JAX or numpy training loop), checkpoint it with ``state_dict()``, restore it with
``load_state_dict()``. It is the core of :func:`shardwise.torch.loader` too: the torch
loader is this object's index stream handed to a ``DataLoader`` (workers, pinning), with
this object's state, so a state saved by one loads into the other::

    dl = sw.numpy_loader(ds, global_batch_size=64, micro_batch_size=8, world=world)
    for batch in dl: ...                     # {"input_ids": [8, L] ndarray, ...}
    state = dl.state_dict()                  # {"kind": "torch_loader", "consumed": ...}
    shardwise.torch.loader(ds, ...).load_state_dict(state)   # continues exactly

The state counts micro-batches *received* (the read-ahead of a remote cache is not
counted), converted to examples of the global order, so it is the same on every rank and
restores any world size for which the position is a whole step. The global batch size
is not in the state (:mod:`shardwise.read.sampler`): another one continues at the same
example. ``skip_steps`` leaves global steps out (the skip-and-resume recipe).

State keys: ``kind`` (``"torch_loader"``, the name states had before this loader lost its
torch; kept so saved states load), ``version``, ``fingerprint``, ``consumed``,
``config``, ``extra``.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from shardwise.checkpoint import Configured, LoaderState, Resumable, as_count
from shardwise.errors import ConfigError, StateError
from shardwise.read.ahead import (
    WORKER_AHEAD,
    CallerPace,
    batches_ahead_count,
    for_workers,
    made_ahead,
    reader_pace,
)
from shardwise.read.drops import Drop, describe_drops
from shardwise.read.epochs import refuse_epoch_view
from shardwise.read.examples import Output, with_output
from shardwise.read.guard import refuse_framework_sharding
from shardwise.read.placement import Placement
from shardwise.read.rows import Batch, stack_rows, stacked
from shardwise.read.sampler import BatchSampler, SamplerKind
from shardwise.world import World

LOADER_KIND = "torch_loader"  # the state kind of shardwise's loader (numpy and torch)
MAX_LOOK_AHEAD = 1024  # micro-batches whose indices the adaptive look-ahead holds at most


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


class IndexStream:
    """This rank's micro-batches of indices from the current position, and the position.

    A mutable holder (torch's loader hands it to ``DataLoader`` as the batch sampler), so a
    restored position takes effect on the next ``iter()``. ``prefetch`` (a dataset's, for
    a cache on an object store) sees each batch ``ahead`` batches early (None: as early as
    the cache asks; 0: never). ``received`` counts micro-batches handed to the caller since
    ``start``; the caller counts them (only it knows what was handed over). ``workers``
    (set by a loader that sends the batches to DataLoader worker processes reading a
    remote cache): each batch carries its worker's reads ahead and the caller's ``pace``
    (:func:`~shardwise.read.ahead.for_workers`)."""

    def __init__(self, sampler: BatchSampler,
                 prefetch: Callable[[list[int]], bool | None] | None = None,
                 ahead: int | None = 0) -> None:
        self.sampler = sampler
        self.start = sampler.consumed
        self.received = 0
        self.prefetch, self.ahead = prefetch, ahead
        self.stopped = False  # set to end the current index stream early
        self.workers = 0
        self.pace = CallerPace()

    @property
    def consumed(self) -> int:
        """Examples of the global order received by all ranks together."""
        if self.sampler.skip:  # skipped ranges make the position jump
            return self.sampler.advance(self.received)
        return self.start + self.received * self.sampler.step_examples

    def restart(self, consumed: int) -> None:
        self.sampler = dataclasses.replace(self.sampler, consumed=consumed)
        self.start, self.received = consumed, 0

    def __iter__(self) -> Iterator[list[int]]:
        refuse_framework_sharding("a shardwise loader's batch sampler")
        self.stopped = False
        batches = iter(self.sampler)
        if self.prefetch is not None and self.ahead != 0:
            batches = look_ahead(batches, self.prefetch, self.ahead)
        if self.workers:  # reads ahead where the chunks are fetched ahead
            batches = for_workers(batches, self.workers, self.pace,
                                  WORKER_AHEAD if self.ahead != 0 else 0)
        return self._until_stopped(batches)

    def _until_stopped(self, batches: Iterator[list[int]]) -> Iterator[list[int]]:
        for batch in batches:
            if self.stopped:
                return
            yield batch

    def __len__(self) -> int:
        return len(self.sampler)


def fetch_numpy(dataset: Any, indices: list[int]) -> Batch:
    """One micro-batch as a dict of stacked numpy arrays: ``get_batch`` (one call, no
    per-row dicts) where the dataset has it, else its ``__getitems__`` or items stacked."""
    if hasattr(dataset, "get_batch"):
        return dict(dataset.get_batch(indices))
    rows = (dataset.__getitems__(indices) if hasattr(dataset, "__getitems__")
            else [dataset[i] for i in indices])
    batch = stacked(rows)
    return dict(batch) if batch is not None else stack_rows(list(rows))


class Loader(Resumable):
    """This rank's micro-batches of a map-style dataset as dicts of numpy arrays, resumable.

    Every ``iter()`` continues from the current position (the number of examples of the
    global order consumed so far), so an interrupted loop picks up where it stopped.
    :class:`shardwise.torch.ShardwiseLoader` holds one of these as its core.
    """

    state_kind = LOADER_KIND

    def __init__(self, dataset: Any, sampler: BatchSampler, *,
                 look_ahead: int | None = 0, batches_ahead: int = 0) -> None:
        self.dataset, self.batches_ahead = dataset, batches_ahead
        self.indices = IndexStream(sampler, getattr(dataset, "prefetch", None), look_ahead)

    @property
    def consumed(self) -> int:
        """Examples of the global order received by all ranks together."""
        return self.indices.consumed

    @property
    def sampler(self) -> BatchSampler:
        return self.indices.sampler

    def __len__(self) -> int:
        """Micro-batches this rank has left (a finite run: ``epochs`` or ``total_samples``)."""
        return len(self.indices)

    def __iter__(self) -> Iterator[Batch]:
        pos, ds = self.begin(), self.dataset
        indices = iter(pos)  # here: its guard looks at the caller's frames, not a thread's
        for batch in made_ahead(lambda: (fetch_numpy(ds, ix) for ix in indices),
                                self.batches_ahead, reader_pace(ds)):
            pos.received += 1
            yield batch

    def begin(self) -> IndexStream:
        """Start a pass at the current position (what every ``iter()`` does first)."""
        refuse_epoch_view(self.dataset, "a shardwise loader")
        self.indices.restart(self.consumed)
        return self.indices

    def state_config(self) -> dict[str, Any]:
        return sampler_state_config(self.dataset, self.sampler)

    def _position(self) -> tuple[int, dict[str, Any]]:
        hints = (self.dataset.seek_hints(self.consumed)  # e.g. a Blend's counts: O(1) seek
                 if isinstance(self.dataset, Configured) else {})
        return self.consumed, hints

    def _seek(self, st: LoaderState) -> None:
        """Continue from a saved position; refuse a position past the end of this run. The
        global batch size may differ from the saved run's: the continuation is the same
        global order."""
        self.sampler.check_in_run(st.consumed)
        step = self.sampler.step_examples
        if st.consumed % step:
            raise StateError(f"the state is at {st.consumed} examples, not a multiple of "
                             f"micro_batch_size × world size = {step}; resume with a layout "
                             "that divides it (states saved at global-batch boundaries fit "
                             "every layout whose micro-batch × world size divides the "
                             "global batch)")
        if isinstance(self.dataset, Configured):
            self.dataset.apply_seek_hints(st.consumed, st.extra)
        self.indices.restart(st.consumed)

    def describe(self) -> dict[str, Any]:
        """The run at a glance: layout, length, position, and what is left out (``drops``:
        the dataset's and the sampler's) or padded (``padding``: masked eval examples)."""
        s = self.sampler
        drops = dataset_drops(self.dataset) + s.drops()
        return {"dataset": repr(self.dataset), "sampler": s.kind.value,
                "global_batch_size": s.global_batch_size,
                "micro_batch_size": s.micro_batch_size,
                "world": f"{s.world.rank}/{s.world.size}", "epoch_examples": s.n,
                "batches_ahead": self.batches_ahead,
                "run_examples": s.end, "consumed": self.consumed,
                "skip": [list(r) for r in s.skip],
                "drops": [d.to_dict() for d in drops], "padding": s.padding(),
                "summary": describe_drops(drops)}

    def __repr__(self) -> str:
        return describe_line(type(self).__name__, self.dataset, self.describe())


def describe_line(name: str, dataset: Any, d: dict[str, Any]) -> str:
    """A loader's :meth:`Loader.describe` in one line (its ``repr``)."""
    run = "endless" if d["run_examples"] is None else f"{d['run_examples']:,} examples"
    pad = f"; pads {d['padding']:,} masked examples" if d["padding"] else ""
    return (f"{name}({type(dataset).__name__} of {d['epoch_examples']:,} examples, "
            f"sampler={d['sampler']!r}, global batch {d['global_batch_size']}, "
            f"micro batch {d['micro_batch_size']}, rank {d['world']}, run {run}, "
            f"at {d['consumed']:,}; {d['summary']}{pad})")


def sampler_state_config(dataset: Any, s: BatchSampler) -> dict[str, Any]:
    """The dataset's config (its order) and the sampler's (how it is placed,
    :meth:`BatchSampler.state`): what a state of a shardwise loader (or of
    :mod:`shardwise.integrations.torchdata`'s sampler) must match."""
    cfg = dict(dataset.state_config()) if isinstance(dataset, Configured) else {
        "dataset": type(dataset).__qualname__, "len": len(dataset)}
    return {**cfg, **s.state()}


def dataset_drops(dataset: Any) -> list[Drop]:
    drops = getattr(dataset, "drops", None)
    return list(drops()) if callable(drops) else []


def _check_eval(dataset: Any, sampler: BatchSampler) -> None:
    """An eval pass sees every example once: refuse a dataset that drops data, or one
    that cannot make the masked padding examples (index -1) the last step needs."""
    drops = dataset_drops(dataset)
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


def _map_style_len(dataset: Any, what: str, fix: str) -> int:
    """``len(dataset)``: the loader places a map-style dataset; an iterable reader places
    its own examples (``world=``) and has no ``len`` to plan steps over."""
    if not hasattr(dataset, "__len__"):
        raise ConfigError(f"{what} walks map-style datasets; {type(dataset).__name__} is "
                          f"iterable and places itself (world=, default World.detect()): "
                          f"iterate it, or use {fix}")
    return len(dataset)


def plan_sampler(dataset: Any, placement: Placement, *, world: World | None = None,
                 consumed: int = 0, what: str = "shardwise.numpy_loader",
                 iterable_fix: str = "a plain loop batching what it yields") -> BatchSampler:
    """The batch sampler of ``placement`` over ``dataset`` for this rank, checked: the one
    place every loader (numpy, torch, OLMo's, torchdata's sampler) places a dataset.
    ``what``/``iterable_fix``: the loader, and what an iterable reader takes instead."""
    n = _map_style_len(dataset, what, iterable_fix)
    batches = placement.batch_sampler(n, World.resolve(world, reader=what), consumed)
    if batches.kind is SamplerKind.EVAL:
        _check_eval(dataset, batches)
    return batches


def ahead_count(look_ahead: int | None) -> int | None:
    return None if look_ahead is None else as_count(look_ahead, "look_ahead",
                                                    error=ConfigError)


def numpy_loader(dataset: Any, *, global_batch_size: int | None = None,
                 micro_batch_size: int | None = None, world: World | None = None,
                 sampler: str = "single", seed: int = 0, data_sharding: bool = True,
                 epochs: int | None = None, total_samples: int | None = None, consumed: int = 0,
                 look_ahead: int | None = None,
                 skip_steps: Iterable[Sequence[int]] | None = None,
                 output: Output | None = None, placement: Placement | None = None,
                 batches_ahead: int | None = None) -> Loader:
    """This rank's loader over ``dataset`` (a TokenDataset, a Blend or any map-style
    dataset), yielding dicts of numpy arrays; no torch needed.

    The arguments mean what :func:`shardwise.torch.loader`'s do:
    ``global_batch_size = micro_batch_size × world size × accumulation``; ``world``
    defaults to :meth:`World.detect`; ``epochs`` or ``total_samples`` bound the run
    (default: endless); ``consumed`` starts at a position; ``sampler`` is ``single``
    (the dataset's global order), ``cyclic`` (Megatron's) or ``eval`` (one padded pass);
    ``look_ahead`` prefetches a remote cache's coming chunks; ``skip_steps`` leaves global
    steps out; ``output``: the examples' form (:class:`~shardwise.read.examples.Output`,
    e.g. ``Output(dtype="int32")`` for JAX); ``placement``: all of the placement's
    arguments as one :class:`~shardwise.read.placement.Placement` (then leave them out);
    ``batches_ahead``: micro-batches made ahead on a thread while the caller trains
    (default: :data:`BATCHES_AHEAD` for a cache on an object store, 0 for a local one,
    whose batches take microseconds).

    >>> dl = numpy_loader(ds, global_batch_size=64, micro_batch_size=8,  # doctest: +SKIP
    ...                   world=World(0, 2))
    """
    placed = Placement.of(placement, global_batch_size=global_batch_size,
                          micro_batch_size=micro_batch_size, sampler=sampler, seed=seed,
                          data_sharding=data_sharding, epochs=epochs,
                          total_samples=total_samples, skip_steps=skip_steps)
    batches = plan_sampler(dataset, placed, world=world, consumed=consumed)
    return Loader(with_output(dataset, output), batches, look_ahead=ahead_count(look_ahead),
                  batches_ahead=batches_ahead_count(batches_ahead, dataset))


__all__ = ["LOADER_KIND", "IndexStream", "Loader", "fetch_numpy",
           "look_ahead", "numpy_loader", "plan_sampler", "sampler_state_config"]
