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
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from shardwise.checkpoint import as_count, check_not_past_end
from shardwise.choice import Choice
from shardwise.errors import ConfigError
from shardwise.plan.batches import (
    cyclic_micro_batch_indices,
    eval_micro_batch_indices,
    iter_micro_batches,
    micro_batch_indices,
    num_eval_steps,
)
from shardwise.read.drops import Drop
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


@dataclass(frozen=True)
class BatchSampler:
    """Yields this rank's micro-batches (lists of example indices) from ``consumed`` on.

    ``n`` is the dataset's length (one epoch); ``total`` the number of examples to serve
    in all (``None``: forever, epoch after epoch; eval: one pass).

    The global batch size does not enter the order (nor the state): example ``i`` is the
    same for every ``B``, so a position saved under one global batch size continues
    exactly under another (Megatron's batch-size ramp-up) whenever it is a whole number
    of the new ``micro_batch_size × world size`` steps.
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

    @property
    def end(self) -> int | None:
        """Examples of the global order in the whole run (eval: padding included);
        ``None`` for an endless run."""
        if self.kind is SamplerKind.EVAL:
            return num_eval_steps(self.n, world_size=self.world.size,
                                  micro_batch_size=self.micro_batch_size) * self.step_examples
        return self.total

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
        return out

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
        return max(0, self.total - self.consumed) // self.step_examples

    def micro_batch(self, k: int) -> list[int]:
        """This rank's ``k``-th micro-batch counted from ``consumed``."""
        m, w = self.micro_batch_size, self.world
        if self.kind is SamplerKind.SINGLE:
            idx = micro_batch_indices(k, rank=w.rank, world_size=w.size, micro_batch_size=m,
                                      consumed=self.consumed)
        elif self.kind is SamplerKind.CYCLIC:
            idx = cyclic_micro_batch_indices(k, n=self.n, rank=w.rank, world_size=w.size,
                                             micro_batch_size=m, seed=self.seed,
                                             consumed=self.consumed,
                                             data_sharding=self.data_sharding)
        else:
            idx = eval_micro_batch_indices(k + self.consumed // self.step_examples, n=self.n,
                                           rank=w.rank, world_size=w.size, micro_batch_size=m)
        return idx.tolist()

    def __iter__(self) -> Iterator[list[int]]:
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
