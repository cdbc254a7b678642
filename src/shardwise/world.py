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
* :meth:`World.streams`: the streams of ``R*`` this rank serves (stream placement);
* :meth:`World.contiguous`: an equal contiguous slice per rank, and how many items the
  split drops (contiguous placement).
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field

from shardwise.errors import ConfigError


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


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
            return cls(dist.get_rank(), dist.get_world_size(), local_rank, local_size)
        rank, size = _env_int("RANK"), _env_int("WORLD_SIZE")
        if rank is not None and size is not None:
            return cls(rank, size, local_rank, local_size)
        return cls()

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

    # -- the slicing rules ---------------------------------------------------------------
    def round_robin(self, n: int) -> range:
        """Items ``i < n`` with ``i % size == rank``: ``World(1, 4).round_robin(10)`` is
        ``range(1, 10, 4)`` = 1, 5, 9."""
        return range(self.rank, n, self.size)

    def owns(self, i: int) -> bool:
        """Whether item ``i`` is this rank's under :meth:`round_robin`."""
        return i % self.size == self.rank

    def streams(self, n_streams: int, *, worker: tuple[int, int] = (0, 1)) -> list[int]:
        """The streams this rank serves (``worker=(id, num_workers)``: this DataLoader
        worker's share of them), when size × workers divides ``n_streams``:
        ``World(1, 2).streams(8)`` is [1, 3, 5, 7]; with ``worker=(1, 2)``, [3, 7].
        Raises listing the world sizes that work otherwise."""
        w, workers = worker
        readers = self.size * workers
        if n_streams % readers:
            what = ("" if workers == 1
                    else f"world size × DataLoader workers ({self.size} × {workers}): ")
            raise ConfigError(f"{what}{n_streams} streams cannot be split over {readers} "
                              f"readers; world sizes that work: {_divisors(n_streams)} (or "
                              f"choose streams as a multiple of {readers})")
        return list(range(self.rank + w * self.size, n_streams, readers))

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


def _env_int(name: str) -> int | None:
    value = os.environ.get(name)
    if value is None or value == "":
        return None
    try:
        return int(value)
    except ValueError:
        raise ConfigError(f"{name}={value!r} is not an integer") from None
