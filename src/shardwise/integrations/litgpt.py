"""litgpt: a ``DataModule`` over a shardwise cache, for litgpt's own ``pretrain``.

litgpt's pretraining loop asks its data module for a train and a val ``DataLoader``,
passes both through Lightning Fabric's ``setup_dataloaders`` and slices each batch, a
tensor of ``block_size + 1`` token ids per row, into inputs and next-token targets. Its
checkpoint holds the train loader (``state["train_dataloader"]``) through Fabric's
``save``/``load``, which call its ``state_dict``/``load_state_dict``.

:class:`ShardwiseData` gives it :func:`shardwise.torch.loader`\\ s: every rank reads its
own slice of each global batch (the loader's ``sampler`` is a placed
:class:`~shardwise.integrations.torch.PlacedSampler`, so Fabric injects no
``DistributedSampler``), and the checkpoint holds the position of the one global order,
so a resume continues exactly (also on another number of devices)::

    from litgpt.pretrain import setup
    from shardwise.litgpt import ShardwiseData

    setup("pythia-14m", data=ShardwiseData(cache="cache/", seed=1234), ...)

Each batch is the window of ``block_size + 1`` tokens a TokenDataset example comes from
(``input_ids`` and the last label). litgpt trains on every next token, so a reader that
masks part of the loss (``eod_mask_loss``, SFT records) is refused rather than trained on
unmasked. The val loader reads ``val_cache`` (default: the training cache) in stored
order, from its start at every validation (litgpt stops it after ``eval.max_iters``
batches), each rank its share; its last partial step is left out (``describe()``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from shardwise.errors import ConfigError, MissingExtraError
from shardwise.integrations.torch import loader
from shardwise.integrations.torch_indices import PlacedLoader, PlacedSampler
from shardwise.read.loader import IndexStream
from shardwise.read.rows import stacked
from shardwise.read.sampler import BatchSampler
from shardwise.world import World

try:
    import torch
    from litgpt.data import DataModule
    from litgpt.tokenizer import Tokenizer
    from torch.utils.data import DataLoader
except ImportError as e:  # pragma: no cover - exercised only without litgpt
    raise MissingExtraError("shardwise.litgpt needs litgpt: pip install 'shardwise[litgpt]'"
                            ) from e


def windows(data: Any) -> torch.Tensor:
    """A micro-batch of examples → litgpt's batch: each row's ``seq_len + 1`` window
    (``input_ids`` then the last next-token label). Refuses rows whose labels are not the
    next tokens (a masked loss litgpt's format cannot carry)."""
    batch = stacked(data)
    if batch is None:
        raise ConfigError("shardwise.litgpt reads shardwise examples (input_ids, labels); "
                          f"got {type(data).__name__}")
    ids, labels = np.asarray(batch["input_ids"]), np.asarray(batch["labels"])
    if not np.array_equal(labels[:, :-1], ids[:, 1:]) or (labels[:, -1:] < 0).any():
        raise ConfigError("litgpt's pretrain trains on every next token, but these "
                          "examples mask part of the loss (labels -100: eod_mask_loss, "
                          "padding or SFT records); read a TokenDataset without "
                          "eod_mask_loss, or train with a loop that takes labels")
    return torch.from_numpy(np.concatenate([ids, labels[:, -1:]], axis=1))


class _Passes(PlacedLoader, DataLoader):  # type: ignore[type-arg,misc]
    """litgpt's val loader: every ``iter()`` is a new pass from the start (litgpt
    validates with the same loader again and again, and breaks after ``eval.max_iters``),
    so it keeps no position (not a resumable loader); placed as a ShardwiseLoader is."""

    def __init__(self, dataset: Any, batches: BatchSampler, num_workers: int) -> None:
        indices = IndexStream(batches)  # restarts at the sampler's consumed (0) each iter()
        self._placed = PlacedSampler(indices)
        super().__init__(dataset, batch_sampler=indices, collate_fn=windows,
                         num_workers=num_workers)


@dataclass
class ShardwiseData(DataModule):  # type: ignore[misc]
    """litgpt's data module over shardwise caches (see the module docs).

    ``cache``: the training cache (a directory, a Megatron prefix or a bucket URL);
    ``seed``, ``shuffle``: its global order; ``val_cache``: what validation reads (default
    ``cache``); ``num_workers``: DataLoader workers per rank. ``world`` is left to
    ``World.detect()`` (Fabric's processes). To read a Blend or other reader options,
    subclass and override :meth:`dataset`."""

    cache: str | Path | None = None
    seed: int = 0
    shuffle: str = "window"
    val_cache: str | Path | None = None
    num_workers: int = 0
    batch_size: int = field(init=False, repr=False, default=1)
    seq_length: int = field(init=False, repr=False, default=2048)

    def __post_init__(self) -> None:
        super().__init__()

    def connect(self, tokenizer: Tokenizer | None = None, batch_size: int = 1,
                max_seq_length: int | None = None, **kwargs: Any) -> None:
        """litgpt's call before it asks for loaders: the micro-batch size and the
        model's block size (a window is ``block_size + 1`` tokens)."""
        self.batch_size = batch_size
        if max_seq_length is not None:
            self.seq_length = max_seq_length

    def dataset(self, train: bool) -> Any:
        """The map-style reader for training (``train``) or validation: a TokenDataset of
        ``cache`` (or ``val_cache``, in stored order)."""
        from shardwise.read.tokens.dataset import TokenDataset

        path = self.cache if train or self.val_cache is None else self.val_cache
        if path is None:
            raise ConfigError("ShardwiseData needs cache= (the training cache's path)")
        return TokenDataset(str(path), seq_len=self.seq_length, seed=self.seed,
                            shuffle=self.shuffle if train else "none")

    def loader(self, dataset: Any, *, train: bool = True) -> DataLoader:  # type: ignore[type-arg]
        """This rank's loader over ``dataset`` in litgpt's batch format: endless for
        training, one pass per ``iter()`` for validation."""
        m, world = self.batch_size, World.detect()
        if train:
            return loader(dataset, global_batch_size=m * world.size, micro_batch_size=m,
                          world=world, collate_fn=windows, num_workers=self.num_workers)
        run = len(dataset) - len(dataset) % (m * world.size)
        return _Passes(dataset, BatchSampler(len(dataset), m * world.size, m, world,
                                             total=run), self.num_workers)

    def train_dataloader(self) -> DataLoader:  # type: ignore[type-arg]
        return self.loader(self.dataset(True))

    def val_dataloader(self) -> DataLoader:  # type: ignore[type-arg]
        return self.loader(self.dataset(False), train=False)


__all__ = ["ShardwiseData", "windows"]
