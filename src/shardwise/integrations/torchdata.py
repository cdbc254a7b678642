"""torchdata's ``StatefulDataLoader`` over shardwise's batch sampler, resuming exactly.

``StatefulDataLoader`` checkpoints a batch sampler through its iterator's
``state_dict()`` / ``load_state_dict()`` (torchdata's ``Stateful`` protocol); without
them it fast-forwards by drawing and discarding batches. :func:`batch_sampler` returns a
sampler whose iterators carry shardwise's position (a
:class:`~shardwise.checkpoint.LoaderState`: examples of the global order received, the
config fingerprint), so a restore seeks in O(1) and refuses a state of other data::

    from torchdata.stateful_dataloader import StatefulDataLoader
    from shardwise.torch import collate
    from shardwise.torchdata import batch_sampler

    bs = batch_sampler(ds, global_batch_size=64, micro_batch_size=8)   # this rank's share
    dl = StatefulDataLoader(ds, batch_sampler=bs, num_workers=2, collate_fn=collate)
    state = dl.state_dict(); ...; dl.load_state_dict(state)            # workers 0 or 2

torchdata snapshots the sampler iterator when it hands out each batch's indices
(``snapshot_every_n_steps=1``, the default), so the saved position is the batches the
caller *received*, not what the workers prefetched. The position is global (the same on
every rank); restoring into another world size works when it is a whole number of the
new ``micro_batch_size × world size``. ``skip_steps`` leaves global steps out as
:func:`shardwise.torch.loader`'s does (the same state rule on resume). Compact batches
between the workers and the step: make the reader with
``output=shardwise.Output(dtype="stored", compact=True)`` (the workers read it in that
form) and call ``shardwise.torch.expand(batch)`` on the device.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from shardwise.checkpoint import Configured, LoaderState, Resumable
from shardwise.errors import StateError
from shardwise.integrations.guards import refuse_bare_lightning
from shardwise.read.epochs import refuse_epoch_view
from shardwise.read.guard import refuse_framework_sharding
from shardwise.read.loader import plan_sampler, sampler_state_config
from shardwise.read.placement import Placement
from shardwise.read.sampler import BatchSampler
from shardwise.world import World


class _Pass:
    """One pass of a :class:`StatefulBatchSampler`: yields index lists and counts them;
    its state is the sampler's at this pass's position (torchdata's iterator protocol)."""

    def __init__(self, owner: StatefulBatchSampler) -> None:
        self.owner = owner
        self.sampler, self.taken = owner.sampler, 0
        self._it = iter(owner.sampler)

    def __iter__(self) -> _Pass:
        return self

    def __next__(self) -> list[int]:
        if not self.taken:  # at the first batch: Lightning masks errors raised by iter()
            refuse_bare_lightning("a StatefulDataLoader over a shardwise batch sampler")
        batch = next(self._it)
        self.taken += 1
        return batch

    @property
    def consumed(self) -> int:
        return self.sampler.advance(self.taken)  # skipped ranges make the position jump

    def state_dict(self) -> dict[str, Any]:
        return self.owner.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.owner.load_state_dict(state)
        self.__init__(self.owner)  # type: ignore[misc]


class StatefulBatchSampler(Resumable):
    """shardwise's :class:`~shardwise.read.sampler.BatchSampler` with torchdata's
    ``Stateful`` protocol on itself (the position of the next ``iter()``) and on each
    iterator (the position of that pass). State keys: ``kind``, ``version``,
    ``fingerprint``, ``consumed``, ``config``, ``extra`` (the dataset's seek hints)."""

    state_kind = "torchdata_batch_sampler"

    def __init__(self, dataset: Any, sampler: BatchSampler) -> None:
        self.dataset, self.sampler = dataset, sampler
        self._last: _Pass | None = None

    def __iter__(self) -> Iterator[list[int]]:
        refuse_framework_sharding("a shardwise batch sampler")
        refuse_epoch_view(self.dataset, "a shardwise batch sampler")
        if self._last is not None:  # a new pass continues where the last one stopped
            self.sampler = dataclasses.replace(self.sampler, consumed=self._last.consumed)
        self._last = _Pass(self)
        return self._last

    def __len__(self) -> int:
        return len(self.sampler)

    def state_config(self) -> dict[str, Any]:
        return sampler_state_config(self.dataset, self.sampler)

    def _position(self) -> tuple[int, dict[str, Any]]:
        consumed = self.sampler.consumed if self._last is None else self._last.consumed
        hints = (self.dataset.seek_hints(consumed) if isinstance(self.dataset, Configured)
                 else {})
        return consumed, hints

    def _seek(self, st: LoaderState) -> None:
        step = self.sampler.step_examples
        if st.consumed % step:
            raise StateError(f"the state is at {st.consumed} examples, not a multiple of "
                             f"micro_batch_size × world size = {step}; resume with a layout "
                             "that divides it")
        self.sampler.check_in_run(st.consumed)
        if isinstance(self.dataset, Configured):
            self.dataset.apply_seek_hints(st.consumed, st.extra)
        self.sampler = dataclasses.replace(self.sampler, consumed=st.consumed)
        self._last = None


def batch_sampler(dataset: Any, *, global_batch_size: int, micro_batch_size: int,
                  world: World | None = None, sampler: str = "single", seed: int = 0,
                  data_sharding: bool = True, total_samples: int | None = None,
                  consumed: int = 0,
                  skip_steps: Iterable[Sequence[int]] | None = None) -> StatefulBatchSampler:
    """This rank's micro-batches of ``dataset`` for a ``StatefulDataLoader`` (arguments as
    :func:`shardwise.torch.loader`'s)."""
    placed = Placement.of(None, global_batch_size=global_batch_size,
                          micro_batch_size=micro_batch_size, sampler=sampler, seed=seed,
                          data_sharding=data_sharding, total_samples=total_samples,
                          skip_steps=skip_steps)
    return StatefulBatchSampler(dataset, plan_sampler(
        dataset, placed, world=world, consumed=consumed,
        what="shardwise.torchdata.batch_sampler",
        iterable_fix="torchdata's StatefulDataLoader(reader, batch_size=micro_batch_size)"))


__all__ = ["StatefulBatchSampler", "batch_sampler"]
