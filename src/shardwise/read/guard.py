"""The hook readers call to refuse a framework that would lose data around them, and the
registry that framework knowledge registers into.

shardwise's readers already serve one rank's share. A framework's wrapper that shards what
it is given again, reads it on one rank and scatters, or replays a run by skipping batches
silently drops (or funnels) data over such a reader; a trainer that accepts only its own
dataset types fails naming no fix. Which classes those are, what each does and what to do
instead is framework knowledge: it lives in :mod:`shardwise.integrations.guards`, which
registers :class:`Wrapper`, :class:`ForeignTrainer` and :class:`UnplacedFix` entries here
when ``shardwise`` is imported (the front door registers them, so a user who never
imports ``shardwise.hf`` is refused all the same, contract 7). This module knows only the mechanism:

- :func:`refuse_framework_sharding`, called as an iteration starts, looks up the Python call
  stack (a few frames, once per ``iter()``, never per example) for a frame of a registered
  wrapper class that spans more than one process and raises :class:`ConfigError`;
- :func:`refuse_sharding_sampler`, called from a map-style reader's ``__len__`` (every
  sampler asks it), does the same for a registered sampler that draws from the reader;
- :class:`GuardedReader`, the base of every reader, refuses a registered trainer's failed
  ``isinstance`` check on it;
- :class:`PlacedByLoader`, the base of the map-style readers whose indices are positions of
  the one global order (TokenDataset, Blend), refuses, in a job of more than one rank,
  examples asked for with indices that no shardwise placement dealt (:class:`Placed`).

The last one needs no registry and no frame walk: it goes by what happens. A sampler that
is not shardwise's (a DataLoader's own, torchtitan's ``ParallelAwareDataloader``'s, any
framework's that expects the dataset to shard itself) deals every rank the same indices
of the global order, so every rank would train on the same examples. shardwise's
placement (:class:`~shardwise.read.sampler.BatchSampler`, under every shardwise loader)
hands the reader :class:`Placed` lists; anything else is refused on its first read, in
the process that reads (a DataLoader worker too: a ``Placed`` list pickles as itself).

Detection point: the wrapper is on the stack when it starts iterating what it wraps (a
sharding batch sampler's ``__iter__`` → our batch sampler's ``__iter__``; a sharding
iterable wrapper's ``__iter__`` → the reader's; a dispatcher's fetch loop → torch's fetcher
→ the reader's, in the main process). A DataLoader *worker* process under a dispatcher has
no dispatcher frame and is not detected; the other cases are detected in workers too.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from shardwise.errors import ConfigError
from shardwise.world import World

if TYPE_CHECKING:
    from shardwise.read.ahead import WorkerAhead

MAX_FRAMES = 24
SHARDS_AGAIN = ("shards it a second time (shardwise readers already serve this rank's "
                "share: each rank would read 1/world_size of it)")


def _always(owner: object) -> bool:
    return True


@dataclass(frozen=True)
class Wrapper:
    """A framework class that, iterating (or dealing the indices of) a per-rank reader,
    would lose or funnel data. Matched by class name anywhere in an object's MRO, and by a
    frame's qualified name (``BatchSamplerShard.__iter__``)."""

    name: str  # the class name
    framework: str  # whose class it is, for the message ("accelerate"; "" when several)
    fix: str  # what to do instead
    does: str = SHARDS_AGAIN  # what it does to a reader that already serves one rank
    sampler: bool = False  # deals indices: refused from __len__ and by check_sampler too
    spans: Callable[[object], bool] = _always  # whether an instance spans > 1 process


@dataclass(frozen=True)
class ForeignTrainer:
    """Code (by qualified name, in a module of ``package``) that type-checks a dataset
    before anything of ours runs and would tokenize, pack and shard a reader again."""

    qualname: str  # "SFTTrainer.__init__"
    package: str  # "trl"
    fix: str


@dataclass(frozen=True)
class UnplacedFix:
    """How to walk a :class:`PlacedByLoader` reader inside ``framework`` (its shardwise
    integration), named when such a reader is asked for unplaced examples."""

    framework: str  # "torchtitan"
    fix: str  # "shardwise.torchtitan.ShardwiseDataLoader as the job's dataloader"


GUARDS: dict[str, Wrapper | ForeignTrainer | UnplacedFix] = {}
"""The registry, by class name (a wrapper) or qualified name (a trainer's method): the one
piece of module state here, filled by :mod:`shardwise.integrations.guards`."""


def register_guard(guard: Wrapper | ForeignTrainer | UnplacedFix,
                   guards: dict[str, Wrapper | ForeignTrainer | UnplacedFix] | None = None
                   ) -> None:
    """Refuse readers to ``guard`` from now on; registering the same entry again is a no-op,
    another entry under a taken name is refused."""
    known = GUARDS if guards is None else guards
    key = guard_key(guard)
    if known.get(key, guard) != guard:
        raise ConfigError(f"a guard for {key!r} is already registered ({known[key]!r}); "
                          "register each framework class once")
    known[key] = guard


def guard_key(guard: Wrapper | ForeignTrainer | UnplacedFix) -> str:
    """Where :data:`GUARDS` keeps ``guard``: a wrapper's class name, a trainer method's
    qualified name, ``"unplaced:<framework>"`` for an :class:`UnplacedFix`."""
    if isinstance(guard, Wrapper):
        return guard.name
    return guard.qualname if isinstance(guard, ForeignTrainer) else f"unplaced:{guard.framework}"


def wrappers(*, samplers: bool = False) -> dict[str, Wrapper]:
    """The registered wrappers by class name (only the samplers, if ``samplers``)."""
    return {k: g for k, g in GUARDS.items()
            if isinstance(g, Wrapper) and (g.sampler or not samplers)}


def _whose(w: Wrapper) -> str:
    return f"{w.framework}'s {w.name}" if w.framework else w.name


def sharding_class(obj: object, among: Collection[str] | None = None) -> str | None:
    """The first name in ``among`` (sorted; the registered wrappers by default) among
    ``obj``'s classes, else None."""
    names = {c.__name__ for c in type(obj).__mro__}
    hit = sorted(names.intersection(wrappers() if among is None else among))
    return hit[0] if hit else None


def frame_class(code: object) -> str:
    """The class part of a frame's qualified name (``BatchSamplerShard.__iter__``)."""
    qualname = getattr(code, "co_qualname", getattr(code, "co_name", ""))
    return str(qualname).split(".<locals>")[0].rpartition(".")[0]


def caller_classes(depth: int = 2) -> Iterator[tuple[str, Any]]:
    """``(class part of the qualified name, frame)`` of each caller frame from ``depth``
    frames up (at most :data:`MAX_FRAMES`). Reads no frame's locals: reading ``f_locals``
    pins a snapshot of a frame's locals on Python < 3.13, which would keep e.g. a deleted
    DataLoader iterator and its workers alive."""
    frame = sys._getframe(depth)
    for _ in range(MAX_FRAMES):
        frame = frame.f_back  # type: ignore[assignment]
        if frame is None:
            return
        yield frame_class(frame.f_code), frame


def _wrappers_on_stack(known: dict[str, Wrapper]) -> Iterator[tuple[Wrapper, object]]:
    """``(wrapper, self)`` of each caller frame whose code belongs to a class in ``known``
    and whose ``self`` spans more than one process (only a matching frame's ``self`` is
    looked at)."""
    for name, frame in caller_classes(3):
        if name not in known:
            continue
        owner = frame.f_locals.get("self")
        hit = None if owner is None else sharding_class(owner, known)
        if hit is not None and known[hit].spans(owner):
            yield known[hit], owner


def refuse_framework_sharding(what: str) -> None:
    """Raise if a registered sharding or dispatching wrapper is iterating ``what``."""
    for w, _ in _wrappers_on_stack(wrappers()):
        raise ConfigError(f"{what} is being read through {_whose(w)}, which {w.does}: "
                          f"{w.fix}")


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
    """For a per-rank map-style dataset's ``__len__``: raise if a registered sampler that
    splits indices across ranks is drawing from it. The dataset never sees such a sampler,
    but every sampler asks its length (torch's DistributedSampler in ``__init__``, a
    sampler wrapping another through its inner sampler), so the sampler is on the stack
    then. Matched by qualified name, like :func:`refuse_framework_sharding`."""
    for w, owner in _wrappers_on_stack(wrappers(samplers=True)):
        if draws_from(owner, dataset):
            raise ConfigError(f"{w.name} splits the indices across ranks, but {what} is "
                              "already this rank's share: each rank would read only "
                              "1/world_size of its own share (and never the rest). Iterate "
                              "it in order on every rank (a SequentialSampler or "
                              "shardwise.torch.loader(..., world=World.single())). "
                              f"{w.fix}")


def check_sampler(sampler_or_loader: Any) -> None:
    """Raise :class:`ConfigError` if a sampler (or a DataLoader's sampler / batch sampler)
    would split indices across ranks again over an already per-rank dataset."""
    candidates = [sampler_or_loader]
    for attr in ("sampler", "batch_sampler"):
        inner = getattr(sampler_or_loader, attr, None)
        if inner is not None:
            candidates += [inner, getattr(inner, "sampler", None)]
    known = wrappers(samplers=True)
    for obj in candidates:
        name = None if obj is None else sharding_class(obj, known)
        if name is not None:
            raise ConfigError(f"{name} splits the indices across ranks, but this dataset is "
                              "already this rank's share (is_sharded = True): each rank "
                              "would read only 1/world_size of its own share. Use a "
                              "per-rank sampler (ContiguousSampler, SequentialSampler or "
                              f"RandomSampler). {known[name].fix}")


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


def refuse_foreign_trainer(reader: object) -> None:
    """Raise if the caller's caller is a registered trainer type-checking ``reader`` (see
    :class:`GuardedReader`)."""
    frame = sys._getframe(2)
    hit = GUARDS.get(_frame_qualname(frame.f_code))
    if (isinstance(hit, ForeignTrainer)
            and str(frame.f_globals.get("__name__", "")).startswith(hit.package)):
        raise ConfigError(f"{type(reader).__name__} is a shardwise reader (already "
                          f"tokenized, packed, labelled and placed per rank); "
                          f"{hit.package}'s {frame_class(frame.f_code)} accepts only its "
                          f"own dataset types and would prepare and shard it again: "
                          f"{hit.fix}")


class GuardedReader:
    """A base of every reader: a trainer that refuses anything but its own dataset types
    is refused naming the fix instead (see :func:`refuse_foreign_trainer`).

    Detection point: ``isinstance(reader, C)`` for a class ``C`` the reader is not an
    instance of asks the reader's ``__class__`` (CPython's ``object_isinstance``); this
    property answers as ``object`` does, after looking at the one frame that asked. It costs
    a frame lookup per failed ``isinstance``, never per example."""

    @property  # type: ignore[misc]
    def __class__(self) -> type:  # type: ignore[override]
        refuse_foreign_trainer(self)
        return type(self)


class Placed(list):  # type: ignore[type-arg]
    """Example indices dealt to this rank by shardwise's placement (a
    :class:`~shardwise.read.sampler.BatchSampler` micro-batch): the mark a
    :class:`PlacedByLoader` reader looks for in a job of more than one rank. A list, so
    torch's and torchdata's fetchers hand it on as it is, and it pickles as itself into
    DataLoader workers. ``ahead`` (set only on a batch sent to a DataLoader worker): what
    that worker reads ahead, :class:`shardwise.read.ahead.WorkerAhead`."""

    __slots__ = ("ahead",)
    ahead: WorkerAhead


class PlacedByLoader:
    """Base of a map-style reader whose indices are positions of the one global order
    (TokenDataset, a Blend of them): the loader that walks it places it. In a job of more
    than one rank (:meth:`World.job_size`, or a multi-rank ``world=`` given), a read whose
    indices are not :class:`Placed` raises; ``world=World.single()`` opts one reader out
    (this process reads what it asks for, on purpose). The check costs a type test per
    read, plus one look at the job size for an unmarked read."""

    _world: World | None = None

    def _bind_world(self, world: World | None) -> None:
        if world is not None and not isinstance(world, World):
            raise ConfigError(f"world must be a shardwise.World, got {type(world).__name__}")
        self._world = world

    def check_placed(self, indices: object) -> None:
        """Raise if ``indices`` were not dealt by shardwise's placement in a multi-rank
        job (see the class docs)."""
        if type(indices) is Placed:
            return
        given = self._world
        if given is not None and given.deliberate:
            return
        if max(World.job_size(), 1 if given is None else given.size) > 1:
            raise ConfigError(_unplaced_message(self, indices, given))


def _unplaced_message(reader: object, indices: object, given: World | None) -> str:
    shown = list(indices)[:8] if isinstance(indices, list | tuple | range) else indices
    world = given if given is not None and given.size > 1 else World.detect()
    fixes = "; ".join(f"{g.framework}: {g.fix}" for g in GUARDS.values()
                      if isinstance(g, UnplacedFix))
    return (f"{type(reader).__name__} was asked for examples {shown!r} by a sampler that "
            f"is not shardwise's, in a job of {world.size} ranks (this process is "
            f"{world}). A map-style shardwise reader is placed by the loader that walks "
            "it; any other sampler (a DataLoader's own, or a framework's that expects the "
            "dataset to shard itself) asks every rank for the same indices, so every rank "
            "would train on the same examples. Walk it with shardwise's placement, which "
            "gives each rank its own slice of each global batch: shardwise.torch.loader(ds,"
            " global_batch_size=..., micro_batch_size=...)" + (f" ({fixes})" if fixes else "")
            + ". To read everything in this process on purpose (evaluation on one rank, a "
            "look at some examples), make the reader with world=World.single()")


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


__all__ = ["GUARDS", "MAX_FRAMES", "SHARDS_AGAIN", "ForeignTrainer",
           "GuardedReader", "Placed", "PlacedByLoader", "UnplacedFix",
           "Wrapper",
           "caller_classes", "check_sampler", "draws_from", "frame_class", "guard_key",
           "refuse_foreign_trainer", "refuse_framework_sharding", "refuse_sharding_sampler",
           "register_guard", "register_with_torch", "sampler_over", "sharding_class",
           "torch_worker", "wrappers"]
