"""OLMo-core: a data loader its ``Trainer`` drives, over any shardwise reader.

OLMo-core's Trainer takes a ``TextDataLoaderBase``: it calls ``reshuffle(epoch)``, iterates
this rank's batches, counts ``batches_processed``, saves ``state_dict()`` in every
checkpoint and restores it with ``load_state_dict()``. :class:`ShardwiseDataLoader` is one,
over shardwise's global order and placement::

    from shardwise.olmo import ShardwiseDataLoader
    ds = sw.TokenDataset("cache/", seq_len=4096, seed=1234)
    data_loader = ShardwiseDataLoader(ds, global_batch_size=512 * 4096,  # tokens, as OLMo
                                      micro_batch_size=4, work_dir="work/")
    trainer = trainer_config.build(train_module, data_loader)

``global_batch_size`` is in tokens, OLMo's unit (``examples × seq_len``); rank ``r`` of the
data-parallel world (``world=``, default :meth:`World.detect`) gets its slice of each
global batch, as the shardwise loader places it: ``micro_batch_size`` examples per
micro-step (OLMo's train module's ``rank_microbatch_size`` in examples; default: the whole
rank batch), each rank batch being its micro-steps in order, so the train module's split
trains micro-step ``a`` on exactly what ``shardwise trace`` names for it.

The state is shardwise's (:class:`~shardwise.checkpoint.LoaderState`, under
``"shardwise"``: the same on every rank, checked against the data and config on load)
plus OLMo's epoch counters. An OLMo epoch is ``len(dataset) // examples per batch``
global batches of the one global order; the position runs on across epochs (example
``p`` of the order, whatever the epoch), so nothing is dropped between epochs.

An iterable reader (``StreamDataset``, ``PackedSFT``, ``RecordStream``) places itself:
the loader takes its rank's examples in order, and its state is the reader's own.

State keys: ``shardwise`` (the loader's or the reader's state), ``epoch``,
``batches_processed``, ``tokens_processed``.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np

from shardwise.errors import ConfigError, MissingExtraError, StateError
from shardwise.read.loader import Loader, fetch_numpy, plan_sampler
from shardwise.read.placement import Placement
from shardwise.read.rows import Batch, stack_rows
from shardwise.world import World

try:
    import torch
    from olmo_core.data.collator import DataCollator
    from olmo_core.data.data_loader import TextDataLoaderBase
except ImportError as e:  # pragma: no cover - exercised only without olmo-core
    raise MissingExtraError("shardwise.olmo needs OLMo-core: pip install 'shardwise[olmo]'"
                            ) from e

KEYS = ("input_ids", "labels")  # what OLMo's train module takes (labels: next tokens)


class ShardwiseDataLoader(TextDataLoaderBase):
    """OLMo-core's data loader over a shardwise reader (see the module docs)."""

    _epoch: int | None  # DataLoaderBase's: the epoch being read, None before the first

    def __init__(self, dataset: Any, *, global_batch_size: int, work_dir: str | os.PathLike[str],
                 micro_batch_size: int | None = None, world: World | None = None,
                 seq_len: int | None = None, collator: DataCollator | None = None) -> None:
        world = World.resolve(world, reader="shardwise.olmo.ShardwiseDataLoader")
        self.dataset, self.seq_len = dataset, seq_len or _seq_len(dataset)
        self.examples = _examples(global_batch_size, self.seq_len, world.size)
        micro = micro_batch_size or self.examples // world.size
        super().__init__(collator=collator or DataCollator(pad_token_id=0), work_dir=work_dir,
                         global_batch_size=global_batch_size, dp_world_size=world.size,
                         dp_rank=world.rank)
        self.accumulation = self.examples // (micro * world.size)
        if hasattr(dataset, "__len__"):
            self._core: Loader | None = Loader(dataset, plan_sampler(
                dataset, Placement(self.examples, micro), world=world,
                what="shardwise.olmo.ShardwiseDataLoader"))
        else:
            self._core = None

    @property
    def total_batches(self) -> int | None:
        """Global batches in an OLMo epoch (None for an iterable reader: it ends itself)."""
        return None if self._core is None else len(self.dataset) // self.examples

    def reshuffle(self, epoch: int | None = None, **kwargs: Any) -> None:
        """Set the epoch; the global order needs no work per epoch (O(1) per index)."""
        epoch = (1 if self._epoch is None else self._epoch + 1) if epoch is None else epoch
        if epoch < 1:
            raise ConfigError(f"epoch must be at least 1 (OLMo counts from 1), got {epoch}")
        self._epoch = epoch

    def _epoch_start(self) -> int:
        """Examples of the global order before this epoch's first batch."""
        return (self.epoch - 1) * (self.total_batches or 0) * self.examples

    def _iter_batches(self) -> Iterable[dict[str, Any]]:
        if self._core is None:
            yield from self._iter_stream()
            return
        core, start = self._core, self._epoch_start()
        core.indices.sampler = dataclasses.replace(
            core.sampler, total=start + (self.total_batches or 0) * self.examples)
        core.indices.restart(start + self.batches_processed * self.examples)
        steps: list[list[int]] = []
        for indices in core.indices:
            steps.append(indices)
            if len(steps) == self.accumulation:
                batch = _concat([fetch_numpy(self.dataset, ix) for ix in steps])
                core.indices.received += len(steps)
                yield self._to_torch(batch, np.concatenate(steps))
                steps = []

    def _iter_stream(self) -> Iterator[dict[str, Any]]:
        """An iterable reader's examples, a rank batch at a time (it places itself)."""
        rows, rank_examples = [], self.examples // self.dp_world_size
        for example in self.dataset:
            rows.append(example)
            if len(rows) == rank_examples:
                yield self._to_torch(stack_rows(rows), None)
                rows = []

    def _to_torch(self, batch: Batch, index: np.ndarray | None) -> dict[str, Any]:
        """OLMo's batch: ``input_ids`` and ``labels`` as long tensors, and ``index`` (the
        examples' positions in the global order, as OLMo's own loader gives). A reader whose
        labels are not the next tokens (HF's convention: a record reader's) leaves them
        out: OLMo's train module then shifts ``input_ids`` itself."""
        keys = KEYS if getattr(self.dataset, "label_convention",
                               "next_token") == "next_token" else KEYS[:1]
        out: dict[str, Any] = {k: torch.from_numpy(np.asarray(batch[k], dtype=np.int64))
                               for k in keys}
        if index is not None:
            out["index"] = torch.from_numpy(np.asarray(index, dtype=np.int64))
        return out

    def state_dict(self) -> dict[str, Any]:
        inner = self.dataset if self._core is None else self._core
        return {"shardwise": inner.state_dict(), "epoch": self._epoch,
                "batches_processed": self.batches_processed,
                "tokens_processed": self.tokens_processed}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Continue where the state was saved; a state of other data, config or layout is
        refused, naming what differs."""
        if not isinstance(state_dict, dict) or "shardwise" not in state_dict:
            raise StateError("not a shardwise.olmo state (no 'shardwise' key): this data "
                             "loader restores only states it saved")
        inner = self.dataset if self._core is None else self._core
        inner.load_state_dict(state_dict["shardwise"])
        self._epoch = state_dict.get("epoch") or self._epoch
        self.batches_processed = int(state_dict["batches_processed"])
        self.tokens_processed = int(state_dict["tokens_processed"])
        if self._core is not None and self._epoch is not None:
            want = self._epoch_start() + self.batches_processed * self.examples
            if self._core.consumed != want:
                raise StateError(f"the state is at {self._core.consumed:,} examples, but epoch "
                                 f"{self._epoch} batch {self.batches_processed} of "
                                 f"{self.examples} examples is {want:,}: resume with the "
                                 "global batch size the state was saved with")

    def get_mock_batch(self) -> dict[str, Any]:
        rows = self.examples // self.dp_world_size
        zeros = torch.zeros((rows, self.seq_len), dtype=torch.long)
        return {"input_ids": zeros, "labels": zeros.clone()}


def _seq_len(dataset: Any) -> int:
    """Tokens per example (of ``input_ids``): the reader's config's, or a map-style
    reader's first example's (an iterable reader's first example would be consumed)."""
    seq_len = getattr(getattr(dataset, "config", None), "seq_len", None)
    if isinstance(seq_len, int):
        return seq_len
    if not hasattr(dataset, "__getitem__"):
        raise ConfigError(f"{type(dataset).__name__} does not say its examples' length; "
                          "pass seq_len= (tokens of input_ids per example)")
    return int(np.asarray(dataset[0]["input_ids"]).shape[-1])


def _examples(global_batch_size: int, seq_len: int, world_size: int) -> int:
    if global_batch_size % (seq_len * world_size):
        raise ConfigError(f"global_batch_size is in tokens (OLMo's unit): {global_batch_size:,}"
                          f" is not a whole number of examples of {seq_len} tokens for each "
                          f"of {world_size} ranks; use a multiple of {seq_len * world_size:,}")
    return global_batch_size // seq_len


def _concat(parts: list[Batch]) -> Batch:
    return {k: np.concatenate([p[k] for p in parts]) for k in KEYS if k in parts[0]}


__all__ = ["ShardwiseDataLoader"]
