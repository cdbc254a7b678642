"""Lightning: checkpoints hold the position of the last *trained* micro-batch.

Lightning's fetcher pulls one micro-batch ahead of the one it trains (it must know whether
a batch is the last), so a loader's own ``state_dict()`` at ``on_train_batch_end`` — when
``ModelCheckpoint`` saves — counts a batch nobody trained on; a resume would skip it and
shift every later step. :func:`loader` wraps a shardwise loader (``shardwise.torch.loader``
or a torchdata ``StatefulDataLoader`` over ``shardwise.torchdata.batch_sampler``) so that
the state Lightning saves is the loader's state as it was right after handing out the last
micro-batch that finished training; :class:`TrainedPosition`, a callback, says which one
that is. Nothing else changes: the saved state is the loader's own (same keys, same
checks on resume), only taken at the right moment::

    class Data(L.LightningDataModule):
        def train_dataloader(self):
            return shardwise.lightning.loader(shardwise.torch.loader(ds, ...))

    trainer = L.Trainer(..., callbacks=[shardwise.lightning.TrainedPosition()])

The wrapper is not a ``DataLoader``, so Lightning's default ``use_distributed_sampler=True``
leaves it alone (shardwise already places every rank). With a cyclic sampler each
Lightning epoch is one epoch of shardwise's order (reshuffled per epoch by position, so no
``set_epoch`` is needed); otherwise one epoch is the whole run. Compact batches (a loader
made with ``output=shardwise.Output(compact=True)``) pass through as they are: expand
them on the device, ``batch = shardwise.torch.expand(batch)`` in ``training_step`` (or
``on_after_batch_transfer``).
"""

from __future__ import annotations

import collections
from collections.abc import Iterator
from typing import Any

from shardwise.errors import ConfigError, MissingExtraError, StateError
from shardwise.read.sampler import BatchSampler, SamplerKind

try:
    from lightning.pytorch.callbacks import Callback
except ImportError as e:  # pragma: no cover - exercised only without lightning
    raise MissingExtraError("shardwise.lightning needs Lightning: "
                            "pip install 'shardwise[lightning]'") from e

STATE_KINDS = ("torch_loader", "torchdata_batch_sampler")


def _order(inner: Any) -> BatchSampler:
    """The shardwise batch sampler behind ``inner`` (where the epochs are)."""
    for holder in (getattr(inner, "_indices", None), getattr(inner, "batch_sampler", None)):
        sampler = getattr(holder, "sampler", None)
        if isinstance(sampler, BatchSampler):
            return sampler
    raise ConfigError(f"shardwise.lightning.loader wraps a shardwise loader "
                      f"(shardwise.torch.loader, or a torchdata StatefulDataLoader over "
                      f"shardwise.torchdata.batch_sampler), got {type(inner).__name__}")


def _consumed(state: Any) -> int | None:
    """The shardwise position inside a loader state (a torchdata state nests it)."""
    if isinstance(state, dict):
        if state.get("kind") in STATE_KINDS and "consumed" in state:
            return int(state["consumed"])
        for value in state.values():
            found = _consumed(value)
            if found is not None:
                return found
    return None


class LightningLoader:
    """What a LightningDataModule's ``train_dataloader`` returns: iterates ``inner``, and
    ``state_dict()`` is ``inner``'s state after the last micro-batch marked trained."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.order = inner, _order(inner)
        self._it: Iterator[Any] | None = None
        self._handed: collections.deque[dict[str, Any]] = collections.deque()
        self._trained: dict[str, Any] | None = None
        self._marks = 0

    def _epoch_examples(self) -> int | None:
        s = self.order
        return s.n - s.n % s.step_examples if s.kind is SamplerKind.CYCLIC else None

    def __len__(self) -> int:
        epoch = self._epoch_examples()
        return len(self.inner) if epoch is None else epoch // self.order.step_examples

    def __iter__(self) -> Iterator[Any]:
        if self._it is None:
            self._it = iter(self.inner)
        self._handed.clear()
        self._trained = self.inner.state_dict()
        epoch, at = self._epoch_examples(), _consumed(self._trained)
        left = None if epoch is None or at is None else (
            (epoch - at % epoch) // self.order.step_examples)
        while left is None or left > 0:
            try:
                batch = next(self._it)
            except StopIteration:
                self._it = None
                return
            self._handed.append(self.inner.state_dict())
            left = None if left is None else left - 1
            yield batch

    def mark_trained(self) -> None:
        """The oldest micro-batch handed out has finished training."""
        if self._handed:
            self._trained = self._handed.popleft()
            self._marks += 1

    def state_dict(self) -> dict[str, Any]:
        if self._handed and not self._marks:
            raise StateError("shardwise.lightning.loader: a checkpoint is being saved but "
                             "no micro-batch was marked trained, so the position would "
                             "count batches Lightning fetched ahead; add "
                             "shardwise.lightning.TrainedPosition() to Trainer(callbacks=...)")
        return self.inner.state_dict() if self._trained is None else self._trained

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.inner.load_state_dict(state)
        self._it, self._trained = None, None
        self._handed.clear()


def _loaders(trainer: Any) -> list[LightningLoader]:
    found = trainer.train_dataloader
    items = (found.values() if isinstance(found, dict)
             else found if isinstance(found, (list, tuple)) else [found])
    return [x for x in items if isinstance(x, LightningLoader)]


class TrainedPosition(Callback):  # type: ignore[misc]
    """Marks each micro-batch trained at ``on_train_batch_end`` (before ModelCheckpoint,
    which Lightning runs after every other callback), so a checkpoint's loader state is
    the position of the last trained optimizer step."""

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        for dl in _loaders(trainer):
            dl.mark_trained()


def loader(inner: Any) -> LightningLoader:
    """Wrap a shardwise loader for Lightning (see the module docs); use with
    :class:`TrainedPosition`."""
    return LightningLoader(inner)


__all__ = ["LightningLoader", "TrainedPosition", "loader"]
