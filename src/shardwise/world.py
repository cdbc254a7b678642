"""The data-parallel world a reader serves, and the one set of rules for slicing data by rank.

Every reader takes ``world=`` and resolves it with :meth:`World.resolve`; leaving it out
means :meth:`World.detect`, the only code that reads torch.distributed or the environment::

    an initialised torch.distributed group   ->  its rank and size
    else RANK / WORLD_SIZE (torchrun, Slurm) ->  those
    else                                     ->  rank 0 of 1

A default that gives every rank all the data is a silent-duplication bug, so a reader given
a one-rank world inside a larger job (``World()`` under ``torchrun --nproc_per_node 2``)
raises, naming the fix. A process that reads everything on purpose (rank 0 evaluating
alone) says so with :meth:`World.single`.

The slicing rules (which items a rank owns) are methods here, so every reader splits the
same way and fails with the same messages:

* :meth:`World.round_robin`: items ``i`` with ``i % size == rank`` (chunks of a producer
  directory, the ``chunk_idx % world_size == rank`` layout);
* :meth:`World.stream_share` / :meth:`World.streams`: which examples of ``R*`` streams
  this rank serves (stream placement), for any number of ranks ``R`` (Levanter's rule);
* :meth:`World.contiguous`: an equal contiguous slice per rank, and how many items the
  split drops (contiguous placement).

A reader made before the data-parallel layout is known (slime's data source) takes its
World later with ``RecordStream.bind(world)``, before its first read.

Detecting a torch.distributed world also keeps torch's process groups until shardwise's exit
hook (:func:`_keep_groups`): a DDP model freed in a job that reads through shardwise never
destroys its group with the GIL held (contract 12).
"""

from __future__ import annotations

import math
import os
import sys
from dataclasses import dataclass, field
from typing import Any

from shardwise.concurrency import shutdown
from shardwise.errors import ConfigError


@dataclass(frozen=True)
class World:
    """Rank ``rank`` of ``size`` data-parallel readers (tensor/pipeline ranks of one
    data-parallel replica share a rank here). ``local_rank``/``local_size`` place the
    process on its node (None when unknown)."""

    rank: int = 0
    size: int = 1
    local_rank: int | None = field(default=None, compare=False)
    local_size: int | None = field(default=None, compare=False)
    deliberate: bool = field(default=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        for name in ("size", "rank"):  # numpy / torch integer scalars are integers too
            value = getattr(self, name)
            if not isinstance(value, int) and hasattr(value, "__index__"):
                object.__setattr__(self, name, value.__index__())
        if isinstance(self.size, bool) or not isinstance(self.size, int) or self.size < 1:
            raise ConfigError(f"world size must be a positive integer, got {self.size!r}")
        if (isinstance(self.rank, bool) or not isinstance(self.rank, int)
                or not 0 <= self.rank < self.size):
            raise ConfigError(f"rank must be in [0, {self.size}), got {self.rank!r}")

    def __str__(self) -> str:
        return f"rank {self.rank} of {self.size}"

    # -- where the world comes from ------------------------------------------------------
    @classmethod
    def detect(cls) -> World:
        """torch.distributed when initialised, else ``RANK``/``WORLD_SIZE`` (and
        ``LOCAL_RANK``/``LOCAL_WORLD_SIZE``), else rank 0 of 1."""
        local_rank, local_size = _env_int("LOCAL_RANK"), _env_int("LOCAL_WORLD_SIZE")
        dist = sys.modules.get("torch.distributed")
        if dist is not None and dist.is_available() and dist.is_initialized():
            _keep_groups(dist)
            return cls(dist.get_rank(), dist.get_world_size(), local_rank, local_size)
        rank, size = _env_int("RANK"), _env_int("WORLD_SIZE")
        if rank is not None and size is not None:
            return cls(rank, size, local_rank, local_size)
        return cls()

    @staticmethod
    def job_size() -> int:
        """The number of ranks :meth:`detect` would say, without building a World: cheap
        enough for a check on every read (a map-style reader asked for examples outside
        shardwise's placement, :func:`shardwise.read.guard.refuse_unplaced`)."""
        dist = sys.modules.get("torch.distributed")
        if dist is not None and dist.is_available() and dist.is_initialized():
            return int(dist.get_world_size())
        size = _env_int("WORLD_SIZE")
        return size if size is not None and _env_int("RANK") is not None else 1

    @classmethod
    def single(cls) -> World:
        """Rank 0 of 1 *on purpose*: this process reads all the data even inside a larger
        job (e.g. evaluation on one rank). :meth:`resolve` accepts it anywhere."""
        return cls(0, 1, deliberate=True)

    @classmethod
    def resolve(cls, world: World | None, *, reader: str = "this reader") -> World:
        """What a reader calls with its ``world=`` argument: ``None`` is
        :meth:`detect`; a one-rank world inside a larger job is refused (every rank would
        read, and train on, all the data)."""
        if world is not None and not isinstance(world, World):
            raise ConfigError(f"world must be a shardwise.World, got {type(world).__name__}")
        detected = cls.detect()
        if world is None:
            return detected
        if world.size == 1 and detected.size > 1 and not world.deliberate:
            raise ConfigError(
                f"{reader} was given world={world!r} inside a job of {detected.size} ranks "
                f"(this process is {detected}): every rank would read all the data and "
                "train on duplicates. Leave world= out (World.detect()), pass "
                "world=World.detect(), or world=World.single() if this process should "
                "read everything on purpose")
        return world

    def rebind(self, world: World | None, *, reader: str, started: bool) -> World | None:
        """The world a reader serving ``self`` switches to on ``reader.bind(world)`` (a
        reader made before the data-parallel layout is known: slime's
        ``set_train_parallel_config``), resolved as :meth:`resolve`; ``None`` when it is
        ``self`` (binding again is a no-op). ``started``: the reader has read since it was
        made or its state loaded, so its position belongs to ``self`` and cannot move."""
        world = World.resolve(world, reader=reader)
        if world == self:
            return None
        if started:
            raise ConfigError(f"{reader}.bind({world}): this reader has already read as "
                              f"{self}; bind the world before the first read "
                              "(get_next_batch()/iter()), or after load_state_dict()")
        return world

    # -- the slicing rules ---------------------------------------------------------------
    def round_robin(self, n: int) -> range:
        """Items ``i < n`` with ``i % size == rank``: ``World(1, 4).round_robin(10)`` is
        ``range(1, 10, 4)`` = 1, 5, 9."""
        return range(self.rank, n, self.size)

    def owns(self, i: int) -> bool:
        """Whether item ``i`` is this rank's under :meth:`round_robin`."""
        return i % self.size == self.rank

    def stream_share(self, n_streams: int, *, worker: tuple[int, int] = (0, 1)
                     ) -> StreamShare:
        """What this rank (``worker=(id, num_workers)``: this DataLoader worker of it)
        serves of ``n_streams`` streams: global examples ``i ≡ q (mod Q)`` with ``Q =
        size × workers`` readers and ``q = rank + id × size`` (see :class:`StreamShare`)."""
        w, workers = worker
        if (isinstance(n_streams, bool) or not isinstance(n_streams, int)
                or n_streams < 1):
            raise ConfigError(f"the number of streams must be a positive integer, got "
                              f"{n_streams!r}")
        if not (isinstance(workers, int) and workers >= 1 and isinstance(w, int)
                and 0 <= w < workers):
            raise ConfigError(f"worker must be (id, num_workers) with 0 <= id < "
                              f"num_workers, got {worker!r}")
        return StreamShare(n_streams, self.size * workers, self.rank + w * self.size)

    def streams(self, n_streams: int, *, worker: tuple[int, int] = (0, 1)) -> list[int]:
        """The streams this rank reads, in the order it needs them
        (:attr:`StreamShare.streams`): ``World(1, 2).streams(8)`` is [1, 3, 5, 7]; with
        ``worker=(1, 2)``, [3, 7]; ``World(1, 3).streams(4)`` is [1, 0, 3, 2] (every
        stream: 3 does not divide 4)."""
        return self.stream_share(n_streams, worker=worker).streams

    def contiguous(self, n: int) -> tuple[range, int]:
        """This rank's equal contiguous slice of ``n`` items, and how many items the split
        drops at the end (``n % size``, the same on every rank)::

            World(1, 3).contiguous(10) -> (range(3, 6), 1)     # item 9 is dropped
        """
        per_rank, dropped = divmod(n, self.size)
        if per_rank == 0:
            raise ConfigError(f"{n} items cannot give each of {self.size} ranks at least "
                              "one; use fewer ranks or more data")
        start = self.rank * per_rank
        return range(start, start + per_rank), dropped


@dataclass(frozen=True)
class StreamShare:
    """Reader ``reader`` of ``readers`` (``Q``) under stream placement with ``n_streams``
    (``R*``) streams. Example ``i`` of the global order is example ``i // R*`` of stream
    ``i % R*``; this reader serves the examples ``i ≡ reader (mod Q)``, its ``j``-th being
    ``i = j·Q + reader``. Levanter's rule, for any ``Q``::

        g = gcd(Q, R*)      streams read: s ≡ reader (mod g), R*/g of them
        step = Q / g        of each, every step-th example (the other readers of the
                            same streams take the rest)

        Q | R*   (Q=2, R*=4)  step 1: rank 0 reads streams 0 2, all of their examples
        R* | Q   (Q=8, R*=4)  rank 5 reads stream 1, examples 1 3 5 ... (global 5 13 21)
        other    (Q=3, R*=4)  g=1: every rank reads every stream, each example of it
                              once in 3 (global 0 3 6 9 = streams 0 3 2 1, examples
                              0 0 1 2)

    With ``Q | R*`` a rank reads only its own streams' chunks; otherwise several readers
    share a stream and each reads all of its chunks to take its share: locality is lost
    by design, the order is not.
    """

    n_streams: int
    readers: int
    reader: int

    @property
    def group(self) -> int:
        """``gcd(Q, R*)``: the streams this reader reads are ``s ≡ reader (mod group)``."""
        return math.gcd(self.readers, self.n_streams)

    @property
    def step(self) -> int:
        """This reader takes every ``step``-th example of each of its streams."""
        return self.readers // self.group

    @property
    def offset(self) -> int:
        """Which of the ``step`` readers sharing these streams this one is."""
        return self.reader // self.group

    @property
    def streams(self) -> list[int]:
        """The streams read, in the order the reader's examples cycle through them
        (``t``-th: the stream of its example ``j`` with ``j % len == t``)."""
        n, q = self.n_streams, self.readers
        return [(t * q + self.reader) % n for t in range(n // self.group)]

    def first(self, t: int) -> int:
        """The first example of ``streams[t]`` this reader takes (then every ``step``)."""
        return (t * self.readers + self.reader) // self.n_streams

    def example(self, j: int) -> tuple[int, int]:
        """This reader's ``j``-th example as ``(stream, example of the stream)``."""
        i = j * self.readers + self.reader
        return i % self.n_streams, i // self.n_streams


def keep_torch_groups() -> None:
    """:func:`_keep_groups` if torch.distributed is initialised (a loader calls it again as
    it starts: its world may have been resolved before ``init_process_group``)."""
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        _keep_groups(dist)


def _keep_groups(dist: Any) -> None:
    """Keep torch.distributed's process groups (the default one and every group torch knows
    now) until shardwise's exit hook drops them (:func:`shutdown.hold_until_exit`): there,
    on the main thread before the interpreter finalises, after a garbage collection has
    freed the models that hold them, so no model's destructor is what frees a group (a
    group that the drop frees is freed with the GIL released). Measured: the exit loop of
    ``scripts/exit_loop.py`` hung in 14 of 50 rank exits without this, 0 of 60 with it.

    Why (contract 12; torch's, seen with gdb and faulthandler in 2-rank gloo DDP jobs, with a
    plain generator as often as with shardwise): DDP's gradient all-reduces run inside
    ``backward``, whose thread-local state then holds a Python object (autograd's
    ``contextvars`` copy); each gloo work keeps that state and frees it on a
    ``pt_gloo_runloop`` thread, which takes the GIL for it. The DDP ``Reducer`` holds its
    group from C++, and a DDP model is in a reference cycle: it is freed by a garbage
    collection, often the interpreter's last one, during finalisation. Its group is then
    destroyed with the GIL held and joins the run-loop threads: a deadlock if one is still
    dropping a work, and during finalisation a thread that takes the GIL is ended inside a
    ``noexcept`` destructor: SIGABRT, "terminate called without an active exception". A
    group whose last reference is a Python one is destroyed with the GIL released (torch's
    holder for ``ProcessGroup``), so its threads finish first. Groups made later are not
    kept; a group torch replaced is dropped when the world is next detected."""
    world = getattr(getattr(dist, "distributed_c10d", None), "_world", None)
    groups = tuple(getattr(world, "pg_map", ()))  # torch's registry: every live group
    default = dist.group.WORLD
    shutdown.hold_until_exit("torch.distributed groups",
                             groups if default in groups else (default, *groups))


def _env_int(name: str) -> int | None:
    value = os.environ.get(name)
    if value is None or value == "":
        return None
    try:
        return int(value)
    except ValueError:
        raise ConfigError(f"{name}={value!r} is not an integer") from None
