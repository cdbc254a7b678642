"""Which framework classes would lose data around a shardwise reader, what each does, and
what to do instead: registered with :mod:`shardwise.read.guard`, whose hook every reader
calls.

accelerate (and so HF Trainer) wraps what it is given: ``BatchSamplerShard`` splits a batch
sampler's batches over the ranks, ``IterableDatasetShard`` makes every rank read everything
and keep ``1/R``, ``DataLoaderDispatcher`` reads on rank 0 and scatters, and
``SkipBatchSampler`` replays a run by skipping batches. torch's ``DistributedSampler`` splits
indices over the ranks. TRL's ``SFTTrainer`` type-checks (and would prepare) the dataset
before anything of ours runs. A framework's own loader over a map-style reader (torchtitan's
``ParallelAwareDataloader``, a plain DataLoader) deals every rank the same indices: the
reader refuses that by itself (``read/guard.PlacedByLoader``); ``UNPLACED_FIXES`` only name
each framework's shardwise integration in its message. Lightning's fetchers read a
micro-batch ahead of the step they train (:func:`refuse_bare_lightning`, called by
shardwise's own loaders).

:func:`register_framework_guards` is called by ``import shardwise`` (the front door), so
every program that reads through shardwise is guarded whether or not it imports an
integration (contract 7). Nothing here imports a framework: classes are matched by name.
"""

from __future__ import annotations

from shardwise.errors import ConfigError
from shardwise.read.guard import (
    ForeignTrainer,
    UnplacedFix,
    Wrapper,
    caller_classes,
    register_guard,
)

FIX = ("use shardwise.hf.ShardwiseTrainer (or ShardwiseTrainerMixin) with HF Trainer; with "
       "accelerate, do not pass a shardwise loader or reader through accelerator.prepare() "
       "(iterate shardwise.torch.loader(...) / the reader yourself and move batches with "
       "batch.to(accelerator.device))")
TRAINER_FIX = ("use `class Trainer(ShardwiseTrainerMixin, SFTTrainer)` (from shardwise.hf "
               "import ShardwiseTrainerMixin) with the same arguments: it skips TRL's dataset "
               "preparation and reads in shardwise's order, each rank its share, with exact "
               "resume")


def _spans(owner: object) -> bool:
    """A wrapper over one process (accelerate's ``num_processes`` / ``state.num_processes``,
    torch's ``num_replicas``: 1) neither shards nor scatters."""
    n = getattr(owner, "num_processes", None)
    if n is None:
        state = getattr(owner, "state", None)
        n = getattr(state, "num_processes", getattr(owner, "num_replicas", None))
    return n is None or n > 1


WRAPPERS = (
    Wrapper("DistributedSampler", "torch", FIX, sampler=True, spans=_spans),
    Wrapper("DistributedBatchSampler", "", FIX, sampler=True, spans=_spans),
    Wrapper("BatchSamplerShard", "accelerate", FIX, sampler=True, spans=_spans),
    Wrapper("DataLoaderDispatcher", "accelerate", FIX, sampler=True, spans=_spans,
            does="reads on rank 0 and scatters (a bottleneck; with World.detect() the data "
                 "would also be sharded twice)"),
    Wrapper("IterableDatasetShard", "accelerate", FIX, spans=_spans),
    Wrapper("SkipBatchSampler", "accelerate", FIX, spans=_spans,
            does="replays the run by skipping batches from the start (shardwise resumes "
                 "from its state; skipping as well would skip twice)"),
)
TRAINERS = (ForeignTrainer("SFTTrainer.__init__", "trl", TRAINER_FIX),
            ForeignTrainer("SFTTrainer._prepare_dataset", "trl", TRAINER_FIX))
# where a framework's own loader would walk a map-style reader unplaced (every rank the
# same indices), the shardwise integration to use instead
UNPLACED_FIXES = (
    UnplacedFix("torchdata", "StatefulDataLoader(ds, batch_sampler="
                "shardwise.torchdata.batch_sampler(ds, ...))"),
    UnplacedFix("torchtitan", "shardwise.torchtitan.ShardwiseDataLoader.Config as "
                "the trainer's dataloader config (its ParallelAwareDataloader does not "
                "place a map-style dataset)"),
    UnplacedFix("Lightning Fabric / litgpt", "fabric.setup_dataloaders("
                "shardwise.torch.loader(ds, ...)), or shardwise.litgpt.ShardwiseData as "
                "litgpt's data module"),
    UnplacedFix("HF Trainer", "shardwise.hf.ShardwiseTrainer"),
)


def register_framework_guards() -> None:
    """Register every framework guard above (again: a no-op)."""
    for guard in (*WRAPPERS, *TRAINERS, *UNPLACED_FIXES):
        register_guard(guard)


LIGHTNING_FETCHERS = ("_DataFetcher", "_PrefetchDataFetcher", "_DataLoaderIterDataFetcher")
LIGHTNING_WRAPPER = "LightningLoader"  # shardwise.integrations.lightning's


def refuse_bare_lightning(what: str) -> None:
    """Raise if Lightning's fetcher iterates ``what`` directly. The fetcher reads a
    micro-batch ahead of the step it trains, so the loader's own state, saved in a
    checkpoint, would be one micro-batch past what was trained: a resume would skip it and
    shift every later step (contract 10). ``shardwise.lightning.loader`` between them
    saves the last *trained* position; a frame of it nearer on the stack than the fetcher
    means all is well."""
    for name, _ in caller_classes(2):  # from the loader's caller on
        if name == LIGHTNING_WRAPPER:
            return
        if name in LIGHTNING_FETCHERS:
            raise ConfigError(
                f"Lightning is iterating {what} directly; its fetcher reads a micro-batch "
                "ahead of the step it trains, so a checkpoint would hold a position one "
                "micro-batch past the trained one and a resume would skip data. Return "
                "shardwise.lightning.loader(your_loader) from train_dataloader() and add "
                "shardwise.lightning.TrainedPosition() to the Trainer's callbacks")


__all__ = ["FIX", "LIGHTNING_FETCHERS", "TRAINERS", "TRAINER_FIX", "UNPLACED_FIXES", "WRAPPERS",
           "refuse_bare_lightning", "register_framework_guards"]
