"""torchtitan: a dataloader titan configures and builds itself, placed per data-parallel rank
and resumed exactly by titan's own checkpointer, also under another data-parallel size.

titan builds its dataloader from the job's config (``config.dataloader.build(dp_world_size=,
dp_rank=, tokenizer=, seq_len=, local_batch_size=, ...)``), iterates ``(input_dict, labels)``
pairs and saves the loader as one ``Stateful`` of its DCP checkpoint. Its own
``ParallelAwareDataloader`` leaves placement to the dataset (titan's datasets shard
themselves), so over a shardwise map-style reader every rank would get the same batches
(the reader refuses that: :class:`~shardwise.read.guard.PlacedByLoader`).
:class:`ShardwiseDataLoader` is a titan ``BaseDataLoader`` over
:func:`shardwise.torch.loader`: rank ``dp_rank`` of ``dp_world_size`` reads its slice of each
global batch; tensor/pipeline/context-parallel ranks of one data-parallel replica read the
same batches, as titan expects::

    from shardwise.torchtitan import ShardwiseDataLoader

    config.dataloader = ShardwiseDataLoader.Config(dataset_path="cache/", seed=1234)
    # or in a TrainSpec / config function: dataloader=ShardwiseDataLoader.Config(...)

Each batch is ``({"input": input_ids}, labels)``: shardwise's labels are next-token
targets with -100 where the loss is masked, titan's layout and ignore index. A reader made
with ``reset_position_ids=True`` adds ``"positions"`` (per-document positions, which
titan's trainer turns into document masks for flex/varlen attention).

**State.** titan's ``ParallelAwareDataloader`` saves its state under a per-rank key
(``dp_rank_{r}``) and refuses another data-parallel size on load. A shardwise state is
the position of the one global order and the same on every rank (contract 2), so this
loader saves it under one key, ``"shardwise"`` (the state as JSON text): DCP writes it once
(it deduplicates equal keys across ranks) and every rank of any data-parallel size reads
it back, so a checkpoint taken on 2 ranks resumes on 2 or on 1 (or 4), continuing the same
global order. The position counts micro-batches titan *received*: titan fetches one per
micro-step and checkpoints after the step, so the saved state is what was trained on.

To read something else than one cache (a Blend, other reader options), subclass,
override :meth:`ShardwiseDataLoader.dataset`, and give the subclass its own ``Config``
(titan builds the class that declares the ``Config``)::

    class BlendLoader(ShardwiseDataLoader):
        @dataclass(kw_only=True, slots=True)
        class Config(ShardwiseDataLoader.Config):
            weights: list[float] = field(default_factory=lambda: [0.7, 0.3])

        def dataset(self, config, seq_len):
            parts = [TokenDataset(p, seq_len=seq_len, seed=config.seed)
                     for p in config.dataset_path.split(",")]
            return Blend(parts, config.weights, seed=config.seed)
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from shardwise.errors import ConfigError, MissingExtraError
from shardwise.integrations.torch import loader
from shardwise.world import World

try:
    import torch
    from torchtitan.components.dataloader import BaseDataLoader
except ImportError as e:  # pragma: no cover - exercised only without torchtitan
    raise MissingExtraError("shardwise.torchtitan needs torchtitan: "
                            "pip install 'shardwise[torchtitan]'") from e

STATE_KEY = "shardwise"


class ShardwiseDataLoader(BaseDataLoader):
    """titan's dataloader over a shardwise cache (see the module docs). State key:
    ``"shardwise"``, the loader's state (``kind``, ``version``, ``fingerprint``,
    ``consumed``, ``config``, ``extra``) as JSON text."""

    @dataclass(kw_only=True, slots=True)
    class Config(BaseDataLoader.Config):
        """``dataset_path``: the cache (a directory, a Megatron prefix or a bucket URL);
        ``seed``, ``shuffle``: the global order; ``epochs``: ``None`` reads on, epoch
        after epoch, reshuffled (titan's ``training.steps`` ends the run), else the run
        ends after that many epochs; ``skip_steps``: global steps (of ``local_batch_size
        × dp``) left out, as ``shardwise.torch.loader``'s."""

        seed: int = 0
        shuffle: str = "window"
        epochs: int | None = None
        skip_steps: list[list[int]] = field(default_factory=list)
        num_workers: int = 0
        persistent_workers: bool = False
        pin_memory: bool = False
        prefetch_factor: int | None = None

    def __init__(self, config: Config, *, dp_world_size: int, dp_rank: int,
                 seq_len: int, local_batch_size: int, tokenizer: Any = None,
                 snapshot_every_n_steps: int | None = None, **kwargs: Any) -> None:
        # the tokenizer is titan's (the cache holds token ids already);
        # snapshot_every_n_steps is for StatefulDataLoader: this state is exact at any step
        self.config = config
        world = World(dp_rank, dp_world_size, deliberate=True)  # dp 1 under TP/PP is real
        extra: dict[str, Any] = {}
        if config.num_workers:
            extra = {"persistent_workers": config.persistent_workers,
                     "prefetch_factor": config.prefetch_factor}
        self.loader = loader(self.dataset(config, seq_len),
                             global_batch_size=local_batch_size * dp_world_size,
                             micro_batch_size=local_batch_size, world=world,
                             epochs=config.epochs, skip_steps=config.skip_steps or None,
                             num_workers=config.num_workers, pin_memory=config.pin_memory,
                             **extra)

    def dataset(self, config: Config, seq_len: int) -> Any:
        """The map-style reader to walk: a TokenDataset of ``config.dataset_path``.
        Override to read a Blend or pass other reader options (leave ``world=`` out:
        the loader places it)."""
        from shardwise.read.tokens.dataset import TokenDataset

        if not config.dataset_path:
            raise ConfigError("ShardwiseDataLoader.Config needs dataset_path= (the cache: a "
                              "directory, a Megatron prefix or a bucket URL)")
        return TokenDataset(str(config.dataset_path), seq_len=seq_len, seed=config.seed,
                            shuffle=config.shuffle)

    def __iter__(self) -> Iterator[tuple[dict[str, torch.Tensor], torch.Tensor]]:
        for batch in self.loader:
            inputs = {"input": batch["input_ids"]}
            if "position_ids" in batch:
                inputs["positions"] = batch["position_ids"]
            yield inputs, batch["labels"]

    def state_dict(self) -> dict[str, Any]:
        return {STATE_KEY: json.dumps(self.loader.state_dict())}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if not state_dict:  # titan loads nothing into a fresh run
            return
        self.loader.load_state_dict(json.loads(state_dict[STATE_KEY]))


__all__ = ["STATE_KEY", "ShardwiseDataLoader"]
