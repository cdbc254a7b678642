"""Megatron-LM's loader vocabulary over :func:`shardwise.torch.loader`:
``build_pretraining_data_loader`` (``--dataloader-type``, ``consumed_samples``, the
skip-and-resume recipe) and the ``--rampup-batch-size`` arithmetic.

Why its own module: Megatron keeps the two halves apart too — the datasets
(:mod:`shardwise.integrations.megatron`: ``--data-path``, ``--split``, sample dicts and
masks) describe *what* the examples are; this half is *how a run walks them*: which
micro-batches a data-parallel rank reads from a position, and how many per step. It takes
any map-style dataset (a :class:`~shardwise.integrations.megatron.GPTDataset` or a plain
shardwise reader); ``from shardwise.megatron import ...`` gives both halves.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from shardwise.checkpoint import as_count
from shardwise.choice import Choice
from shardwise.errors import ConfigError
from shardwise.integrations.torch import ShardwiseLoader, loader
from shardwise.plan.skips import advance
from shardwise.read.sampler import accumulation_steps, normalise_skip, skip_from_steps
from shardwise.world import World


class DataloaderType(Choice):
    """Megatron's ``--dataloader-type``."""

    __option__ = "dataloader_type"
    SINGLE = "single"
    CYCLIC = "cyclic"
    EXTERNAL = "external"


def build_pretraining_data_loader(dataset: Any, consumed_samples: int, *,
                                  micro_batch_size: int, world: World | None = None,
                                  dataloader_type: str = "single", data_sharding: bool = True,
                                  seed: int = 0, num_workers: int = 0,
                                  full_validation: bool = False,
                                  skip_steps: Sequence[Sequence[int]] | None = None,
                                  global_batch_size: int | None = None,
                                  **loader_kwargs: Any) -> ShardwiseLoader | Any:
    """Megatron's ``build_pretraining_data_loader``: this data-parallel rank's
    micro-batches from ``consumed_samples`` on (all ranks' samples, as Megatron counts).

    ``single``: the dataset's own order (shuffled per epoch by the dataset), the same for
    every world size. ``cyclic``: Megatron's random sampler (reshuffles each epoch; with
    ``data_sharding`` each rank reads its own contiguous bucket). ``external``: the
    dataset is already a loader and is returned as it is — refused for a map-style dataset,
    which every rank would read whole. ``world`` is the data-parallel world (with tensor or
    pipeline parallelism: ``World(mpu.get_data_parallel_rank(),
    mpu.get_data_parallel_world_size())``). ``full_validation``: one padded pass.

    ``skip_steps``: iterations ``[a, b)`` of ``global_batch_size`` (constant: no ramp-up)
    whose data is never read, the skip-and-resume recipe. Unlike ``--iterations-to-skip``
    (which reads, discards and counts them) ``consumed_samples`` then counts the samples
    trained on; it is turned into the data position here. Megatron's checkpoint holds no
    skip list to check: keep the ranges before the resume point as the run had them.
    """
    if dataset is None:
        return None
    kind = DataloaderType.parse(dataloader_type)
    if kind is DataloaderType.EXTERNAL:
        if hasattr(dataset, "__getitems__") or (hasattr(dataset, "__getitem__")
                                                and hasattr(dataset, "__len__")):
            raise ConfigError(f"dataloader_type='external' passes the dataset through as a "
                              f"loader, but {type(dataset).__name__} is map-style: every rank "
                              "would iterate all of it. Use dataloader_type='single' or "
                              "'cyclic', or pass a shardwise stream or loader")
        if skip_steps:  # ignoring them would train on the steps they name
            raise ConfigError(f"skip_steps={list(skip_steps)!r} with dataloader_type='external'"
                              ": give the StreamDataset skip=[(a×B, b×B)] (B: global batch)")
        return dataset
    w = World.resolve(world, reader="shardwise.megatron.build_pretraining_data_loader")
    sampler = "eval" if full_validation else kind.value
    micro_steps, position = _skipped_micro_steps(skip_steps, global_batch_size,
                                                 micro_batch_size, w, consumed_samples)
    return loader(dataset, global_batch_size=micro_batch_size * w.size,
                  micro_batch_size=micro_batch_size, world=w, sampler=sampler, seed=seed,
                  data_sharding=data_sharding, consumed=0 if full_validation
                  else position, num_workers=num_workers,
                  skip_steps=None if full_validation else micro_steps, **loader_kwargs)


def _skipped_micro_steps(skip_steps: Sequence[Sequence[int]] | None,
                         global_batch_size: int | None, micro_batch_size: int, world: World,
                         consumed_samples: int) -> tuple[Any, int]:
    """Iteration ranges → the loader's micro-steps (``m × W`` examples each), and the
    samples trained on → the position in the data order (the skipped ranges before it
    added back)::

        B = 8, m × W = 4, skip_steps [(1, 2)]:  micro-steps [(2, 4)]; 16 trained → 24
    """
    if not skip_steps:
        return None, consumed_samples
    if global_batch_size is None:
        raise ConfigError("skip_steps counts training iterations: pass global_batch_size= "
                          "(Megatron's --global-batch-size) too")
    accumulation_steps(global_batch_size, micro_batch_size, world.size)  # B = m × W × k
    step = micro_batch_size * world.size
    ranges = normalise_skip(skip_from_steps(skip_steps, global_batch_size), step)
    served = as_count(consumed_samples, "consumed_samples", error=ConfigError)
    if served % step:
        raise ConfigError(f"consumed_samples={served} is not a whole number of micro-batch "
                          f"× data-parallel size = {step}")
    return [(a // step, b // step) for a, b in ranges], advance(ranges, 0, served // step, step)


def global_batch_size_at(consumed_samples: int, global_batch_size: int,
                         rampup_batch_size: Sequence[int] | None = None) -> int:
    """Megatron's current global batch size after ``consumed_samples``
    (``--rampup-batch-size start increment samples``): ``start + k·increment`` where
    ``k = int(consumed / (samples / increments))``, then ``global_batch_size``::

        rampup [16, 16, 4800], gbs 64: consumed 0 → 16, 1600 → 32, 4801 → 64
    """
    if rampup_batch_size is None:
        return global_batch_size
    start, increment, samples = (int(x) for x in rampup_batch_size)
    diff = global_batch_size - start
    if start < 1 or increment < 1 or samples < 0 or diff < 0 or diff % increment:
        raise ConfigError(f"rampup_batch_size [start, increment, samples] = "
                          f"{list(rampup_batch_size)} must ramp from start >= 1 up to "
                          f"global_batch_size={global_batch_size} in whole increments")
    if consumed_samples > samples or diff == 0 or samples == 0:  # (Megatron: 0 / 0 there)
        return global_batch_size
    return start + int(consumed_samples / (samples / (diff // increment))) * increment


def num_microbatches(consumed_samples: int, *, global_batch_size: int, micro_batch_size: int,
                     data_parallel_size: int,
                     rampup_batch_size: Sequence[int] | None = None) -> int:
    """Micro-batches per rank in the next step (Megatron's ``get_num_microbatches()``)."""
    gbs = global_batch_size_at(consumed_samples, global_batch_size, rampup_batch_size)
    return accumulation_steps(gbs, micro_batch_size, data_parallel_size)  # B = m × W × k


__all__ = ["DataloaderType", "build_pretraining_data_loader", "global_batch_size_at",
           "num_microbatches"]
