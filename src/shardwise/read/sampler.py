"""Resumable distributed batch samplers: this rank's micro-batches of example indices.

A sampler is a pure function of ``(consumed, world, micro_batch_size, seed)``
(:mod:`shardwise.plan.batches`); it holds no cursor. Resuming is constructing it with the
``consumed`` count a checkpoint saved, in O(1).

* ``single``: walks the dataset's global order (which is already shuffled per epoch by
  the dataset); rank ``r``'s ``k``-th micro-batch is examples
  ``[c + k·m·W + r·m, c + k·m·W + (r+1)·m)``. The same order for every world size.
* ``cyclic``: Megatron's random sampler: reshuffles ``[0, n)`` every epoch itself (use it
  with ``shuffle="none"`` datasets or any map-style dataset), with or without data
  sharding (with it, each rank reads only its contiguous bucket, and the order depends on
  the world size).
* ``eval``: one pass in stored order; the last step is padded with index ``-1``, which
  :class:`~shardwise.read.tokens.dataset.TokenDataset` turns into fully masked examples.

**Skip ranges** (``skip=``, :mod:`shardwise.plan.skips`): half-open ranges of positions
in the global order left out, whole steps of ``micro_batch_size × world size`` — the
skip-and-resume recipe after a loss spike. Only the skipped steps change: every other
step reads exactly what it reads without a skip list. ``consumed`` stays a position in the
unskipped order (a skipped range just makes it jump), so position ``p`` and global step
``p // B`` mean the same examples with or without skips (``shardwise trace`` of a step
stays true), and ``total`` is a position too: the run ends where it would without skips,
serving fewer steps, so adding a skip never reads past the planned data (an epoch bound
stays an epoch). A loader's state records its skip list (``config["skip"]``); on resume,
ranges before the saved position must be the saved ones, later ones may change
(:meth:`shardwise.checkpoint.LoaderState.check_matches`). The ``eval`` sampler refuses a
skip list: an eval pass sees every example once. Stream placement has no sampler:
StreamDataset takes the same ranges itself (``skip=``, the same rules:
:mod:`shardwise.read.stream.skipping`); the other iterable readers (RecordStream,
PackedSFT, a Blend of streams) take no skip list, and a config that gives one for them
is refused with :func:`refuse_skip`.
"""

from __future__ import annotations

import operator
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any, ClassVar

from shardwise.checkpoint import SKIP_KEY, as_count, check_not_past_end
from shardwise.choice import Choice
from shardwise.errors import ConfigError
from shardwise.plan.batches import (
    cyclic_micro_batch_indices,
    eval_micro_batch_indices,
    iter_micro_batches,
    micro_batch_indices,
    num_eval_steps,
)
from shardwise.plan.skips import Skip, advance, served_segments, skipped_in
from shardwise.read.drops import Drop
from shardwise.read.guard import Placed
from shardwise.world import World


class SamplerKind(Choice):
    __option__ = "sampler"

    SINGLE = "single"
    CYCLIC = "cyclic"
    EVAL = "eval"



def accumulation_steps(global_batch_size: int, micro_batch_size: int, world_size: int) -> int:
    """``B = m × W × accumulation``; a clear error when the sizes do not fit."""
    global_batch_size = as_count(global_batch_size, "global_batch_size", minimum=1,
                                 error=ConfigError)
    micro_batch_size = as_count(micro_batch_size, "micro_batch_size", minimum=1,
                                error=ConfigError)
    step = micro_batch_size * world_size
    if global_batch_size % step:
        raise ConfigError(f"global_batch_size ({global_batch_size}) must be a multiple of "
                          f"micro_batch_size × world size ({micro_batch_size} × {world_size}"
                          f" = {step})")
    return global_batch_size // step


def _as_int(value: Any, where: str) -> int:
    if isinstance(value, bool) or getattr(value, "ndim", 0) != 0:
        raise ConfigError(f"{where} must be an integer position, got {value!r}")
    try:
        return operator.index(value)
    except TypeError:
        raise ConfigError(f"{where} must be an integer position, got {value!r} "
                          f"({type(value).__name__})") from None


def normalise_skip(ranges: Iterable[Any] | None, step: int, *, unit: str = "examples",
                   step_name: str = "micro_batch_size × world size") -> Skip:
    """``ranges`` sorted and merged (overlapping or touching ranges become one), each
    checked: two integers ``start < stop``, both multiples of ``step`` (a skip leaves out
    whole steps of ``micro_batch_size × world size``, so every rank skips the same step;
    ``step_name`` names it in the error)::

        normalise_skip([(8, 12), (0, 4), (4, 6)], 2) == ((0, 6), (8, 12))
    """
    out: list[tuple[int, int]] = []
    for r in ranges or ():
        if isinstance(r, (str, bytes)) or not hasattr(r, "__len__") or len(r) != 2:
            raise ConfigError(f"skip: each range is a pair (start, stop) of {unit}, got {r!r}")
        start = _as_int(r[0], f"skip range {tuple(r)!r}: start")
        stop = _as_int(r[1], f"skip range {tuple(r)!r}: stop")
        if not 0 <= start < stop:
            raise ConfigError(f"skip range ({start}, {stop}) of {unit} is empty or negative: "
                              "a range is half-open [start, stop) with 0 <= start < stop")
        if start % step or stop % step:
            lo, hi = start - start % step, -(-stop // step) * step
            raise ConfigError(f"skip range ({start}, {stop}) of {unit} is not a whole number "
                              f"of steps of {step_name} = {step}: every rank must skip the "
                              f"same steps; use ({lo}, {hi}) to cover it")
        out.append((start, stop))
    merged: list[tuple[int, int]] = []
    for start, stop in sorted(out):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(stop, merged[-1][1]))
        else:
            merged.append((start, stop))
    return tuple(merged)


def skip_from_steps(steps: Iterable[Any] | None, global_batch_size: int) -> Skip:
    """Global-step ranges ``[a, b)`` → position ranges ``[a·B, b·B)`` (not yet
    normalised): a step ``s`` is positions ``[s·B, (s+1)·B)``."""
    out = []
    for r in steps or ():
        if isinstance(r, (str, bytes)) or not hasattr(r, "__len__") or len(r) != 2:
            raise ConfigError(f"skip_steps: each range is a pair (first step, stop step), "
                              f"got {r!r}")
        a = _as_int(r[0], f"skip_steps range {tuple(r)!r}: start")
        b = _as_int(r[1], f"skip_steps range {tuple(r)!r}: stop")
        if not 0 <= a < b:
            raise ConfigError(f"skip_steps range ({a}, {b}) is empty or negative: a range "
                              "is half-open [start, stop) of global steps, 0 <= start < stop")
        out.append((a * global_batch_size, b * global_batch_size))
    return tuple(out)


def refuse_skip(skip: object, reader: str) -> None:
    """A ConfigError for a non-empty skip list given to a reader that cannot skip.

    Why not yet: an iterable reader's ranks read ahead of the training step (a prefetch
    thread per rank), so skipping a range means restarting that read-ahead at the range's
    end on every rank, from positions only the reader knows how to compute. StreamDataset
    does (:mod:`shardwise.read.stream.skipping`); records, packed SFT and blends of
    streams do not yet."""
    if skip:
        raise ConfigError(f"{reader} cannot skip ranges (skip={skip!r}); skip steps with "
                          "global placement (a TokenDataset or Blend through "
                          "shardwise.torch.loader(..., skip_steps=)) or with a "
                          "StreamDataset (skip=), or drop the skip list")


def skip_drop(skip: Skip, end: int | None, of: int | None) -> Drop:
    """What a skip list leaves out of a run ending at position ``end`` (``None``:
    endless, then the whole ranges), as a reader's :class:`~shardwise.read.drops.Drop`."""
    return Drop(skipped_in(skip, 0, end), "examples", f"the skip list {list(skip)} "
                "(positions of the global order; the run still ends at the same position)",
                of=of)


@dataclass(frozen=True)
class BatchSampler:
    """Yields this rank's micro-batches (lists of example indices) from ``consumed`` on.

    ``n`` is the dataset's length (one epoch); ``total`` the number of examples to serve
    in all (``None``: forever, epoch after epoch; eval: one pass).

    The global batch size does not enter the order (nor the state): example ``i`` is the
    same for every ``B``, so a position saved under one global batch size continues
    exactly under another (Megatron's batch-size ramp-up) whenever it is a whole number
    of the new ``micro_batch_size × world size`` steps.

    ``skip``: ranges of positions to leave out (see the module docs), normalised here
    (sorted, merged, whole steps).
    """

    n: int
    global_batch_size: int
    micro_batch_size: int
    world: World
    kind: SamplerKind = SamplerKind.SINGLE
    seed: int = 0
    data_sharding: bool = True
    consumed: int = 0
    total: int | None = None
    skip: Skip = ()

    STATE_KEYS: ClassVar[frozenset[str]] = frozenset({
        "sampler", "sampler_seed", "data_sharding", "world_size", "epoch_examples", SKIP_KEY})
    """The keys :meth:`state` adds to a dataset's config in a loader's state."""

    def __post_init__(self) -> None:
        for name in ("global_batch_size", "micro_batch_size"):
            object.__setattr__(self, name, as_count(getattr(self, name), name, minimum=1,
                                                    error=ConfigError))
        accumulation_steps(self.global_batch_size, self.micro_batch_size, self.world.size)
        object.__setattr__(self, "consumed", as_count(self.consumed, "consumed"))
        if self.total is not None:
            object.__setattr__(self, "total", as_count(self.total, "total_samples",
                                                       error=ConfigError))
        step = self.micro_batch_size * self.world.size
        if self.consumed % step:
            raise ConfigError(f"cannot resume at {self.consumed} consumed examples with "
                              f"micro_batch_size × world size = {step}: it is not a multiple "
                              "(save checkpoints at global-batch boundaries)")
        self.check_in_run(self.consumed)
        object.__setattr__(self, "skip", normalise_skip(self.skip, step))
        if self.skip and self.kind is SamplerKind.EVAL:
            raise ConfigError(f"sampler='eval' sees every example once, but skip={self.skip} "
                              "was given; skip ranges are for training samplers (single, "
                              "cyclic): drop the skip list for evaluation")

    @property
    def end(self) -> int | None:
        """Examples of the global order in the whole run (eval: padding included);
        ``None`` for an endless run."""
        if self.kind is SamplerKind.EVAL:
            return num_eval_steps(self.n, world_size=self.world.size,
                                  micro_batch_size=self.micro_batch_size) * self.step_examples
        return self.total

    def state(self) -> dict[str, Any]:
        """What this sampler adds to a state's config: how the dataset's examples are
        placed, as far as it decides *which* examples a position reads (never the batch
        sizes: another global batch size continues the same order)."""
        cfg: dict[str, Any] = {"sampler": self.kind.value}
        if self.kind is SamplerKind.CYCLIC:
            cfg.update(sampler_seed=self.seed, data_sharding=self.data_sharding)
            if self.data_sharding:
                cfg["world_size"] = self.world.size  # the order depends on it
            if self.n % self.step_examples:  # so does the epoch: whole steps of m × W
                cfg["epoch_examples"] = self.n - self.n % self.step_examples
        if self.kind is SamplerKind.EVAL:
            cfg["world_size"] = self.world.size
        if self.skip:  # compared by its own rule on resume (checkpoint.SKIP_KEY); absent
            cfg[SKIP_KEY] = [list(r) for r in self.skip]  # when empty: prints stay the same
        return cfg

    def check_in_run(self, consumed: int) -> None:
        """StateError if ``consumed`` is past the end of a finite run."""
        run = (f"one evaluation pass over {self.n:,} examples, padded"
               if self.kind is SamplerKind.EVAL
               else f"total_samples, or epochs × {self.n:,} examples per epoch")
        check_not_past_end(consumed, self.end, "examples", run)

    def drops(self) -> list[Drop]:
        """What this sampler leaves out: the examples of a finite run past its last whole
        step, and the cyclic sampler's remainder of every epoch (as Megatron's)."""
        step, out = self.step_examples, []
        if self.kind is SamplerKind.CYCLIC and self.n % step:
            where = ("the same last ids every epoch (data_sharding)" if self.data_sharding
                     else "a different set every epoch")
            out.append(Drop(self.n % step, "examples per epoch", f"cyclic sampler: an "
                            f"epoch is whole steps of micro_batch × world = {step}; {where}",
                            of=self.n))
        if self.kind is not SamplerKind.EVAL and self.total is not None and self.total % step:
            out.append(Drop(self.total % step, "examples", f"the run's last partial step "
                            f"({self.total:,} is not a multiple of micro_batch × world = "
                            f"{step})", of=self.total))
        if self.skip:
            end = None if self.total is None else self.total - self.total % step
            out.append(skip_drop(self.skip, end, self.total))
        return out

    def advance(self, k: int) -> int:
        """The position after this sampler serves ``k`` micro-batch steps from
        ``consumed`` (skipped ranges on the way are jumped)."""
        if not self.skip:
            return self.consumed + k * self.step_examples
        return advance(self.skip, self.consumed, k, self.step_examples)

    def skipped(self, lo: int, hi: int | None) -> int:
        """Positions in ``[lo, hi)`` the skip list leaves out."""
        return skipped_in(self.skip, lo, hi)

    def padding(self) -> int:
        """Masked padding examples an eval pass adds to fill its last step."""
        return 0 if self.kind is not SamplerKind.EVAL else (self.end or 0) - self.n

    @property
    def step_examples(self) -> int:
        """Examples consumed by all ranks per micro-batch step."""
        return self.micro_batch_size * self.world.size

    def __len__(self) -> int:
        """Micro-batches this rank has left (needs ``total`` or eval)."""
        if self.kind is SamplerKind.EVAL:
            steps = num_eval_steps(self.n, world_size=self.world.size,
                                   micro_batch_size=self.micro_batch_size)
            return max(0, steps - self.consumed // self.step_examples)
        if self.total is None:
            raise TypeError("an endless sampler has no len(); pass total= (or epochs=)")
        steps = max(0, self.total - self.consumed) // self.step_examples
        end = self.consumed + steps * self.step_examples
        return steps - self.skipped(self.consumed, end) // self.step_examples

    def micro_batch(self, k: int) -> list[int]:
        """This rank's ``k``-th micro-batch counted from ``consumed`` (skipped steps not
        counted)."""
        m, w = self.micro_batch_size, self.world
        if self.kind is SamplerKind.EVAL:
            idx = eval_micro_batch_indices(k + self.consumed // self.step_examples, n=self.n,
                                           rank=w.rank, world_size=w.size, micro_batch_size=m)
            return idx.tolist()
        return self._at(self.advance(k + 1) - self.step_examples)

    def _at(self, position: int) -> list[int]:
        """This rank's micro-batch of the step at ``position`` (single, cyclic)."""
        m, w = self.micro_batch_size, self.world
        if self.kind is SamplerKind.SINGLE:
            idx = micro_batch_indices(0, rank=w.rank, world_size=w.size, micro_batch_size=m,
                                      consumed=position)
        else:
            idx = cyclic_micro_batch_indices(0, n=self.n, rank=w.rank, world_size=w.size,
                                             micro_batch_size=m, seed=self.seed,
                                             consumed=position,
                                             data_sharding=self.data_sharding)
        return idx.tolist()

    def __iter__(self) -> Iterator[list[int]]:
        """This rank's micro-batches as :class:`~shardwise.read.guard.Placed` lists: the
        mark a map-style reader looks for in a multi-rank job (``read/guard``)."""
        return map(Placed, self._batches())

    def _batches(self) -> Iterator[list[int]]:
        if self.skip:
            yield from self._iter_skipping()
            return
        limit = None if (self.total is None and self.kind is not SamplerKind.EVAL) else len(self)
        if self.kind is SamplerKind.SINGLE:  # every step of pretraining: no per-step checks
            w = self.world
            yield from iter_micro_batches(rank=w.rank, world_size=w.size, steps=limit,
                                          micro_batch_size=self.micro_batch_size,
                                          consumed=self.consumed)
            return
        k = 0
        while limit is None or k < limit:
            yield self.micro_batch(k)
            k += 1

    def _iter_skipping(self) -> Iterator[list[int]]:
        """The served runs of positions between the skipped ranges, each read as without
        a skip list."""
        step, w = self.step_examples, self.world
        end = None if self.total is None else self.total - self.total % step
        for lo, hi in served_segments(self.skip, self.consumed, end):
            if self.kind is SamplerKind.SINGLE:
                yield from iter_micro_batches(rank=w.rank, world_size=w.size,
                                              micro_batch_size=self.micro_batch_size,
                                              consumed=lo,
                                              steps=None if hi is None else (hi - lo) // step)
                continue
            p = lo
            while hi is None or p < hi:
                yield self._at(p)
                p += step
