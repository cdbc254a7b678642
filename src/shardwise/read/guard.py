"""Refusing a framework wrapper that would shard a per-rank reader again, or dispatch it.

shardwise's readers already serve one rank's share. accelerate (and so HF Trainer) wraps
what it is given: ``BatchSamplerShard`` splits a batch sampler's batches over the ranks,
``IterableDatasetShard`` makes every rank read everything and keep ``1/R``, and
``DataLoaderDispatcher`` reads on rank 0 and scatters. Over a shardwise reader each of these
silently drops (or funnels) data, so a reader calls :func:`refuse_framework_sharding` when
an iteration starts: it looks up the Python call stack (a few frames, once per ``iter()``,
never per example) for such a wrapper and raises :class:`ConfigError` naming the fix.

Detection point: the wrapper is on the stack when it starts iterating what it wraps
(``BatchSamplerShard.__iter__`` → our batch sampler's ``__iter__``;
``IterableDatasetShard.__iter__`` → the reader's; the dispatcher's fetch loop → torch's
fetcher → the reader's, in the main process). A DataLoader *worker* process under a
dispatcher has no dispatcher frame and is not detected; the batch sampler and
``IterableDatasetShard`` cases are detected in workers too.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator, Sequence
from typing import Any

from shardwise.errors import ConfigError

# class names (anywhere in the MRO) of samplers / loaders that split indices across ranks
SHARDING_SAMPLERS = ("DistributedSampler", "DistributedBatchSampler", "BatchSamplerShard",
                     "DataLoaderDispatcher")
SHARDING_WRAPPERS = (*SHARDING_SAMPLERS, "IterableDatasetShard", "SkipBatchSampler")
WHAT_IT_DOES = {"SkipBatchSampler": "replays the run by skipping batches from the start "
                "(shardwise resumes from its state; skipping as well would skip twice)",
                "DataLoaderDispatcher": "reads on rank 0 and scatters (a bottleneck; with "
                "World.detect() the data would also be sharded twice)"}
MAX_FRAMES = 24

FIX = ("use shardwise.hf.ShardwiseTrainer (or ShardwiseTrainerMixin) with HF Trainer; with "
       "accelerate, do not pass a shardwise loader or reader through accelerator.prepare() "
       "(iterate shardwise.torch.loader(...) / the reader yourself and move batches with "
       "batch.to(accelerator.device))")


def sharding_class(obj: object, among: Sequence[str] = SHARDING_WRAPPERS) -> str | None:
    """The first name in ``among`` (sorted) among ``obj``'s classes, else None."""
    names = {c.__name__ for c in type(obj).__mro__}
    hit = sorted(names.intersection(among))
    return hit[0] if hit else None


def _frame_class(code: object) -> str:
    """The class part of a frame's qualified name (``BatchSamplerShard.__iter__``)."""
    qualname = getattr(code, "co_qualname", getattr(code, "co_name", ""))
    return str(qualname).split(".<locals>")[0].rpartition(".")[0]


def _wrappers_on_stack(classes: tuple[str, ...], depth: int = 2
                       ) -> Iterator[tuple[str, object]]:
    """``(class name, self)`` of each caller frame (from ``depth`` frames up) whose code
    belongs to a class named in ``classes`` and that spans more than one process. Frames
    are matched by their code's qualified name; only a matching frame's ``self`` is looked
    at (reading ``f_locals`` pins a snapshot of a frame's locals on Python < 3.13, which
    would keep e.g. a deleted DataLoader iterator and its workers alive)."""
    frame = sys._getframe(depth)
    for _ in range(MAX_FRAMES):
        frame = frame.f_back  # type: ignore[assignment]
        if frame is None:
            return
        if _frame_class(frame.f_code) not in classes:
            continue
        owner = frame.f_locals.get("self")
        name = None if owner is None else sharding_class(owner)
        if name is not None and _shards(owner):
            yield name, owner


def refuse_framework_sharding(what: str) -> None:
    """Raise if a sharding or dispatching wrapper is iterating ``what`` (see module docs)."""
    for name, _ in _wrappers_on_stack(SHARDING_WRAPPERS):
        does = WHAT_IT_DOES.get(name, "shards it a second time (shardwise readers already "
                                "serve this rank's share: each rank would read "
                                "1/world_size of it)")
        raise ConfigError(f"{what} is being read through accelerate's {name}, which "
                          f"{does}: {FIX}")


LIGHTNING_FETCHERS = ("_DataFetcher", "_PrefetchDataFetcher", "_DataLoaderIterDataFetcher")
LIGHTNING_WRAPPER = "LightningLoader"  # shardwise.integrations.lightning's


def refuse_bare_lightning(what: str) -> None:
    """Raise if Lightning's fetcher iterates ``what`` directly. The fetcher reads a
    micro-batch ahead of the step it trains, so the loader's own state, saved in a
    checkpoint, would be one micro-batch past what was trained: a resume would skip it and
    shift every later step (contract 10). ``shardwise.lightning.loader`` between them
    saves the last *trained* position; a frame of it nearer on the stack than the fetcher
    means all is well."""
    frame = sys._getframe(1)  # the loader's own frame: the walk starts at its caller
    for _ in range(MAX_FRAMES):
        frame = frame.f_back  # type: ignore[assignment]
        if frame is None:
            return
        name = _frame_class(frame.f_code)
        if name == LIGHTNING_WRAPPER:
            return
        if name in LIGHTNING_FETCHERS:
            raise ConfigError(
                f"Lightning is iterating {what} directly; its fetcher reads a micro-batch "
                "ahead of the step it trains, so a checkpoint would hold a position one "
                "micro-batch past the trained one and a resume would skip data. Return "
                "shardwise.lightning.loader(your_loader) from train_dataloader() and add "
                "shardwise.lightning.TrainedPosition() to the Trainer's callbacks")


def _shards(owner: object) -> bool:
    """A wrapper over one process (``num_processes`` / ``num_replicas`` 1) neither shards
    nor scatters."""
    n = getattr(owner, "num_processes", None)
    if n is None:
        state = getattr(owner, "state", None)
        n = getattr(state, "num_processes", getattr(owner, "num_replicas", None))
    return n is None or n > 1


def draws_from(obj: object, dataset: object) -> bool:
    """Whether ``dataset`` is reached from sampler ``obj`` through the attributes samplers
    keep (a BatchSamplerShard's batch sampler's sampler's data source, ...)."""
    level = [obj]
    for _ in range(4):
        nxt = []
        for o in level:
            for attr in ("dataset", "data_source", "sampler", "batch_sampler"):
                inner = getattr(o, attr, None)
                if inner is dataset:
                    return True
                if inner is not None:
                    nxt.append(inner)
        level = nxt
    return False


def refuse_sharding_sampler(dataset: object, what: str) -> None:
    """For a per-rank map-style dataset's ``__len__``: raise if a sampler that splits
    indices across ranks (torch's DistributedSampler, accelerate's BatchSamplerShard) is
    drawing from it. The dataset never sees such a sampler, but every sampler asks its
    length — DistributedSampler in ``__init__``, BatchSamplerShard through its inner
    sampler — so the sampler is on the stack then. Matched by qualified name, like
    :func:`refuse_framework_sharding`."""
    for name, owner in _wrappers_on_stack(SHARDING_SAMPLERS):
        if draws_from(owner, dataset):
            raise ConfigError(f"{name} splits the indices across ranks, but {what} is "
                              "already this rank's share: each rank would read only "
                              "1/world_size of its own share (and never the rest). Iterate "
                              "it in order on every rank (a SequentialSampler, "
                              "shardwise.torch.loader(..., world=World.single()), or "
                              f"shardwise.hf.ShardwiseTrainer with HF Trainer). {FIX}")


def check_sampler(sampler_or_loader: Any) -> None:
    """Raise :class:`ConfigError` if a sampler (or a DataLoader's sampler / batch sampler)
    would split indices across ranks again over an already per-rank dataset."""
    candidates = [sampler_or_loader]
    for attr in ("sampler", "batch_sampler"):
        inner = getattr(sampler_or_loader, attr, None)
        if inner is not None:
            candidates += [inner, getattr(inner, "sampler", None)]
    for obj in candidates:
        name = None if obj is None else sharding_class(obj, SHARDING_SAMPLERS)
        if name is not None:
            raise ConfigError(f"{name} splits the indices across ranks, but this dataset is "
                              "already this rank's share (is_sharded = True): each rank "
                              "would read only 1/world_size of its own share. Use a "
                              "per-rank sampler (ContiguousSampler, SequentialSampler or "
                              "RandomSampler); with accelerate / HF Trainer, build the "
                              "DataLoader yourself and do not pass it through prepare()")


def sampler_over(dataset: Any, names: Sequence[str], depth: int = 12
                 ) -> tuple[Any, dict[str, Any]] | None:
    """The nearest caller that is a sampler drawing from ``dataset`` whose class (anywhere
    in its MRO) is named in ``names``, with the locals of that call (a sampler asking
    ``len`` from its ``__init__`` has not set all its attributes yet), or None.

    Why: a dataset never sees the sampler a framework wraps around it, but every sampler
    asks the dataset's ``len``: torch's ``DistributedSampler`` in ``__init__``,
    accelerate's ``BatchSamplerShard`` in ``__len__``/``__iter__`` through its batch
    sampler's ``SequentialSampler``. So a dataset's ``__len__`` calls this to see, among
    its callers' ``self``, which sampler is about to deal its indices.
    """
    frame = sys._getframe(1)
    for _ in range(depth):
        frame = frame.f_back  # type: ignore[assignment]
        if frame is None:
            return None
        local = frame.f_locals
        obj = local.get("self")
        if (obj is not None and obj is not dataset
                and any(c.__name__ in names for c in type(obj).__mro__)
                and draws_from(obj, dataset)):
            return obj, dict(local)
    return None


def torch_worker() -> tuple[int, int] | None:
    """``(id, num_workers)`` inside a torch DataLoader worker; torch is never imported
    here, only looked up if the program already imported it."""
    data = sys.modules.get("torch.utils.data")
    info = data.get_worker_info() if data is not None else None
    return None if info is None else (int(info.id), int(info.num_workers))


# code (by qualified name, in a module of the package named) that type-checks a dataset
# before anything of ours runs, and would tokenize, pack and shard a shardwise reader again
FOREIGN_TRAINERS = {"SFTTrainer.__init__": "trl", "SFTTrainer._prepare_dataset": "trl"}
TRAINER_FIX = ("use `class Trainer(ShardwiseTrainerMixin, SFTTrainer)` (from shardwise.hf "
               "import ShardwiseTrainerMixin) with the same arguments: it skips TRL's dataset "
               "preparation and reads in shardwise's order, each rank its share, with exact "
               "resume")


def refuse_foreign_trainer(reader: object) -> None:
    """Raise if the caller's caller is a trainer of :data:`FOREIGN_TRAINERS` type-checking
    ``reader`` (see :class:`GuardedReader`)."""
    frame = sys._getframe(2)
    package = FOREIGN_TRAINERS.get(_frame_qualname(frame.f_code))
    if package is not None and str(frame.f_globals.get("__name__", "")).startswith(package):
        name = _frame_class(frame.f_code)
        raise ConfigError(f"{type(reader).__name__} is a shardwise reader (already "
                          f"tokenized, packed, labelled and placed per rank); {package}'s "
                          f"{name} accepts only datasets' Dataset / IterableDataset and would "
                          f"prepare and shard it again: {TRAINER_FIX}")


class GuardedReader:
    """A base of every reader: a trainer that refuses anything but its own dataset types
    (TRL's SFTTrainer: ``TypeError: train_dataset must be a Dataset or IterableDataset``,
    naming no fix) is refused naming the fix instead.

    Detection point: ``isinstance(reader, C)`` for a class ``C`` the reader is not an
    instance of asks the reader's ``__class__`` (CPython's ``object_isinstance``); this
    property answers as ``object`` does, after looking at the one frame that asked. It costs
    a frame lookup per failed ``isinstance``, never per example."""

    @property  # type: ignore[misc]
    def __class__(self) -> type:  # type: ignore[override]
        refuse_foreign_trainer(self)
        return type(self)


def _frame_qualname(code: object) -> str:
    return str(getattr(code, "co_qualname", getattr(code, "co_name", "")))


def register_with_torch(cls: type) -> None:
    """Make ``DataLoader(reader, batch_size=None)`` treat an iterable reader as an
    iterable dataset (a virtual subclass of ``IterableDataset``: registering imports
    nothing), if the program has imported torch."""
    data = sys.modules.get("torch.utils.data")
    base = getattr(data, "IterableDataset", None)
    if base is not None and not issubclass(cls, base):
        base.register(cls)


__all__ = ["FIX", "FOREIGN_TRAINERS", "SHARDING_SAMPLERS", "SHARDING_WRAPPERS", "TRAINER_FIX",
           "GuardedReader", "check_sampler", "draws_from", "refuse_foreign_trainer",
           "refuse_framework_sharding", "refuse_sharding_sampler", "register_with_torch",
           "sampler_over", "sharding_class", "torch_worker"]
