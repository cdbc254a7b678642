"""Records straight from JSONL / Parquet / Arrow files: no build step, O(1) start-up,
a deterministic shuffled global order, exact resume.

The sources are cut into ranges without reading them (:mod:`.record_ranges`): byte ranges
of uncompressed JSONL (aligned to lines by their reader), Parquet row groups, whole
compressed or Arrow files. The order is stream placement (:mod:`.record_streams`):
``R*`` streams, each reading its ranges of the epoch through its own seeded shuffle
buffer; example ``i`` of the global order is example ``i // R*`` of stream ``i % R*``.

Worked example (``streams=4``, ``seed=0``, 10 ranges; epoch 0 permutes them to
``π = 1 3 8 5 2 4 7 6 0 9`` and the ``k``-th of that order goes to stream ``k % 4``)::

    stream 0: ranges 1 2 0    stream 1: 3 4 9    stream 2: 8 7    stream 3: 5 6
    global i   = 0  1  2  3  4  5  6  7 ...  from streams 0 1 2 3 0 1 2 3 ...
    World(0, 2) serves streams 0, 2: i = 0 2 4 6 ...   World(1, 2): streams 1, 3
    World(0, 2) in a DataLoader with 2 workers: worker 0 serves stream 0, worker 1
    stream 2; the DataLoader's round robin over its workers gives back i = 0 2 4 6 ...

``DataLoader(record_stream, batch_size=None, num_workers=W)`` works when the program
imported torch before making the RecordStream (it then registers itself as a virtual
``IterableDataset``; ``import shardwise.torch`` does too).
Rank ``r`` of ``R`` serves global examples ``i ≡ r (mod R)``
(:class:`~shardwise.world.StreamShare`). When ``R`` divides ``R*`` it reads only the
streams ``s % R == r``; otherwise the ranks sharing a stream group (``s ≡ r (mod gcd(R,
R*))``) each read and process all of its records and keep every ``R / gcd``-th example
of the group's order (locality, and the work of ``map_fn``, is shared by design; the
order is not). Inside a torch DataLoader, worker ``w`` of ``W`` serves ``i ≡ r + w·R
(mod R·W)`` and the DataLoader's per-example round robin over workers restores the
rank's order. With a finite number of
epochs the DataLoader moves on when a worker ends, so that exact interleaving holds only
until the first worker ends (every example still comes exactly once).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

import xxhash

from shardwise.checkpoint import LoaderState, Resumable, as_count
from shardwise.concurrency.local import ProcessLocal
from shardwise.errors import ConfigError, StateError
from shardwise.read.deprecated import renamed_method
from shardwise.read.guard import (
    GuardedReader,
    refuse_framework_sharding,
    register_with_torch,
    torch_worker,
)
from shardwise.read.records.pipeline import (
    FINISHED,
    Pipeline,
    make_pad,
    pad_batch,
)
from shardwise.read.records.pool import Processor
from shardwise.read.records.ranges import RangeKind, plan_ranges, resolve_files
from shardwise.read.records.ranks import (
    default_all_done,
    gather_states,
    take_shared,
)
from shardwise.read.records.streams import (
    ORDER_VERSION,
    UNALIGNED_ORDER_VERSION,
    StreamOrder,
    StreamPosition,
)
from shardwise.sources.on_error import OnError
from shardwise.world import StreamShare, World


@dataclass(frozen=True)
class RecordStreamConfig:
    """The options of a :class:`RecordStream` (see its docstring)."""

    seed: int = 0
    streams: int = 8
    range_bytes: int = 64 << 20
    shuffle_buffer: int = 1024
    shuffle: bool = True
    epochs: int | None = None
    align_epochs: bool = True
    num_workers: int = 0
    text_mode: bool = False
    on_error: OnError = OnError.RAISE
    task_size: int = 256

    def __post_init__(self) -> None:
        for name, low in (("seed", 0), ("streams", 1), ("range_bytes", 1),
                          ("shuffle_buffer", 0), ("num_workers", 0), ("task_size", 1)):
            object.__setattr__(self, name, as_count(getattr(self, name), name, minimum=low,
                                                    error=ConfigError))
        if self.epochs is not None:  # None: forever
            object.__setattr__(self, "epochs", as_count(self.epochs, "epochs", minimum=1,
                                                        error=ConfigError))
        if not isinstance(self.align_epochs, bool):
            raise ConfigError(f"align_epochs must be True or False, got {self.align_epochs!r}")
        object.__setattr__(self, "on_error", OnError.parse(self.on_error))


class RecordStream(GuardedReader, Resumable):
    """Records of ``sources``, processed by ``map_fn``, in a deterministic global order.

    >>> rs = RecordStream(["prompts/*.jsonl"], map_fn=fn, seed=1234,  # doctest: +SKIP
    ...                   world=World(rank=0, size=2))
    >>> batch = rs.get_next_batch(32); state = rs.state_dict()      # doctest: +SKIP

    ``sources``: paths, directories, globs (JSONL, ``.jsonl.gz``, ``.jsonl.zst``,
    Parquet), ``.arrow`` files, or a ``datasets.Dataset`` (read through its Arrow cache
    files). ``map_fn(record)`` returns the example, None (dropped as ``rejected``) or
    ``Reject(reason)``; it runs in ``num_workers`` processes (0: in this process).
    ``streams`` is ``R*``; ``epochs=None`` reads forever, ``epochs=1`` is one pass padded
    with ``{"__pad__": True}`` examples. ``text_mode``: records are the lines as ``str``.
    ``on_error="skip"`` counts bad records (and ``map_fn`` exceptions, as ``map_error``)
    by reason in :attr:`errors` instead of raising an ``InputError`` naming file and line.
    ``task_size``: records read and processed per task ahead of the consumer.
    ``align_epochs`` (default): a consumer's streams cross epochs together, so its epoch is
    every record of its streams once (order version 2); the order then depends on how the
    streams are split among consumers once a stream runs out in an epoch. ``False``: each
    stream's epochs are its own (order version 1): the global order never depends on the
    world size or DataLoader workers, but an epoch boundary repeats some records before
    others were read.

    State keys: ``kind``, ``version``, ``fingerprint``, ``consumed``, ``config``,
    ``extra`` (``order_version``; ``streams``: per stream ``epoch``, ``stop_epoch``,
    ``range``, ``pos``, ``line``, ``draws``, ``buffer``, ``consumed``, ``epoch_consumed``,
    ``errors``, ``done``). A rank's state holds its own streams: :func:`merge_states` combines the
    ranks' states into one that restores any world size, and
    ``state_dict(all_ranks=True)`` (a collective over torch.distributed) returns that
    merged state on every rank.
    """

    state_kind = "record_stream"

    def __init__(self, sources: Any, *, map_fn: Callable[[Any], Any] | None = None,
                 seed: int = 0, world: World | None = None, streams: int = 8,
                 range_bytes: int = 64 << 20, shuffle_buffer: int = 1024,
                 shuffle: bool = True, epochs: int | None = None, align_epochs: bool = True,
                 num_workers: int = 0,
                 text_mode: bool = False, on_error: str | OnError = OnError.RAISE,
                 task_size: int = 256) -> None:
        self.config = RecordStreamConfig(
            seed=seed, streams=streams, range_bytes=range_bytes, shuffle_buffer=shuffle_buffer,
            shuffle=shuffle, epochs=epochs, align_epochs=align_epochs,
            num_workers=num_workers, text_mode=text_mode,
            on_error=on_error, task_size=task_size)  # type: ignore[arg-type]
        self.world = World.resolve(world, reader="RecordStream")
        self.map_fn = map_fn
        files = resolve_files(sources)
        if text_mode and any(f.kind not in (RangeKind.LINES, RangeKind.STREAM) for f in files):
            raise ConfigError("text_mode reads lines: every source must be JSONL/text, not "
                              "Parquet or Arrow")
        self.plan = plan_ranges(files, range_bytes=range_bytes, n_streams=streams)
        if epochs is None and self.plan.n < streams:
            raise ConfigError(f"the sources make only {self.plan.n} ranges for {streams} "
                              "streams, so some streams would never get a record; use "
                              f"streams <= {max(1, self.plan.n)} or a smaller range_bytes")
        self.order = StreamOrder(self.plan, streams, seed, shuffle, shuffle_buffer)
        self._positions = self._fresh_positions(0)
        self._origin: int | dict[str, Any] = 0  # the epoch started, or the state loaded
        # this process's pipeline (.local): a DataLoader worker, forked or given a pickled
        # copy, makes its own for its share; the parent's worker processes stay its own
        self._pipe: ProcessLocal[Pipeline] = ProcessLocal(self._new_pipeline, name="records")
        self._share: StreamShare = self.world.stream_share(streams)
        self._pipe_share = self._share  # the share of the current pipeline (or worker)
        register_with_torch(RecordStream)

    def bind(self, world: World) -> None:
        """Serve ``world`` from now on: for a reader made before the data-parallel layout
        is known (slime's ``set_train_parallel_config``). Allowed until the first read
        after the reader was made, ``set_epoch()``-ed or ``load_state_dict()``-ed (the
        position restarts under the new world from that epoch or that state); binding
        the same world again is a no-op."""
        bound = self.world.rebind(world, reader="RecordStream", started=self._pipe.made is not None)
        if bound is None:
            return
        self.world, self._share = bound, bound.stream_share(self.config.streams)
        if isinstance(self._origin, dict):
            self.load_state_dict(self._origin)
        else:
            self._positions = self._fresh_positions(self._origin)

    # -- iteration ---------------------------------------------------------------------

    def __iter__(self) -> Iterator[Any]:
        """This consumer's examples, continuing from the current position."""
        refuse_framework_sharding("RecordStream")
        pipe = self._pipeline()
        take = self._taker(pipe)
        while True:
            if self._pipe.made is not pipe:  # the position was reset (load_state_dict, set_epoch)
                pipe = self._pipeline()
                take = self._taker(pipe)
            x = take()
            if x is FINISHED:
                return
            yield x

    def get_next_batch(self, n: int, *, pad: bool = False) -> list[Any]:
        """The next ``n`` examples. At the end of a finite run the last batch is what is
        left (``pad=True``: filled up to ``n`` with pad examples, :func:`is_pad`), then the
        batches are empty — as :meth:`SequentialConsumer.get_next_batch`."""
        n = as_count(n, "n", minimum=1, error=ConfigError)
        take = self._taker(self._pipeline())
        out: list[Any] = []
        while len(out) < n:
            x = take()
            if x is FINISHED:
                return pad_batch(out, n) if pad else out
            out.append(x)
        return out

    def eval_batches(self, n: int, all_done: Callable[[bool], bool] | None = None
                     ) -> Iterator[list[Any]]:
        """Batches of ``n`` until *every* rank has run out, padded, so that all ranks take
        the same number of steps. ``all_done(local_done)`` is True when every rank is
        done; by default an all-reduce over torch.distributed (world size 1: local)."""
        reduce = all_done or default_all_done(self.world)
        while True:
            batch = self.get_next_batch(n, pad=True)
            if reduce(not batch):
                return
            yield batch or [make_pad() for _ in range(n)]

    def set_epoch(self, epoch: int) -> None:
        """Restart every stream at the start of ``epoch`` (its own reproducible order);
        torch's name for it (``DistributedSampler.set_epoch``), as every reader here."""
        epoch = as_count(epoch, "epoch", error=ConfigError)
        self._reset(self._fresh_positions(epoch))
        self._origin = epoch

    shuffle = renamed_method("shuffle", "set_epoch")

    def set_read_ahead(self, task_size: int) -> None:
        """Records each stream reads and processes ahead, per task (``task_size``; it never
        changes the order). Takes effect from the next read after a reset, or now if
        nothing was read yet."""
        self.config = replace(self.config, task_size=task_size)

    @property
    def epoch(self) -> int:
        """The epoch being served: the latest epoch of an example received (the start
        epoch before any)."""
        return max(p.epoch for p in self._positions.values())

    @property
    def epoch_consumed(self) -> int:
        """Examples of this consumer's streams received in :attr:`epoch`."""
        e = self.epoch
        return sum(p.epoch_consumed for p in self._positions.values() if p.epoch == e)

    @property
    def local_streams(self) -> list[int]:
        return sorted(self._positions)

    @property
    def errors(self) -> dict[str, int]:
        """Records skipped so far by this consumer's streams, by reason."""
        total: dict[str, int] = {}
        for p in self._positions.values():
            for k, v in p.errors.items():
                total[k] = total.get(k, 0) + v
        return dict(sorted(total.items()))

    def close(self) -> None:
        """Stop the processing workers (they also die with this process)."""
        self._pipe.close()

    def __enter__(self) -> RecordStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- state -------------------------------------------------------------------------

    def state_dict(self, *, all_ranks: bool = False) -> dict[str, Any]:
        """This consumer's position as plain JSON (what it has received, not prefetched).

        ``all_ranks=True``: every rank's streams, merged (:func:`merge_states`), so each
        rank returns the same state and any one of them restores any world size. It is a
        collective (``all_gather_object`` over torch.distributed): every rank must call it
        at the same step. It is opt-in because a collective hidden in ``state_dict()``
        deadlocks a job where only rank 0 saves. World size 1 and DataLoader workers
        (whose state is only their share anyway) get the local state.
        """
        local = super().state_dict()
        if not all_ranks or self.world.size == 1 or torch_worker() is not None:
            return local
        return gather_states(self.world, local)

    def _position(self) -> tuple[int, dict[str, Any]]:
        streams = {str(s): p.to_dict() for s, p in sorted(self._positions.items())}
        return (sum(p.consumed for p in self._positions.values()),
                {"order_version": self.order_version, "streams": streams})

    def _seek(self, st: LoaderState) -> None:
        """Continue exactly where the state stopped (its streams must cover this rank's)."""
        if st.extra.get("order_version") != self.order_version:
            raise StateError(f"order_version: state has {st.extra.get('order_version')!r}, "
                             f"this reader has {self.order_version}")
        saved = st.extra.get("streams")
        if not isinstance(saved, dict):
            raise StateError("extra.streams: expected a dict of stream -> position")
        local = sorted(self.world.streams(self.config.streams))
        missing = [s for s in local if str(s) not in saved]
        if missing:
            raise StateError(f"extra.streams: the state holds streams "
                             f"{sorted(saved)}, this reader serves {local} "
                             f"(missing {missing}); combine every rank's state with "
                             "shardwise.read.records.stream.merge_states")
        positions = {s: StreamPosition.from_dict(saved[str(s)], f"extra.streams.{s}",
                                                 self.plan.n) for s in local}
        self._reset(positions)
        self._origin = st.to_dict()

    def state_config(self) -> dict[str, Any]:
        c, plan = self.config, self.plan
        names = xxhash.xxh3_64()
        for f in plan.files:
            names.update(f"{os.path.basename(f.path)}\0{f.size}\0{f.format}\n".encode())
        return {"order_version": self.order_version, "seed": c.seed, "streams": c.streams,
                "shuffle": c.shuffle, "shuffle_buffer": self.order.capacity,
                "range_step": plan.step, "epochs": c.epochs, "n_files": len(plan.files),
                "n_ranges": plan.n, "total_bytes": sum(f.size for f in plan.files),
                "files": names.hexdigest()}

    @property
    def order_version(self) -> int:
        """2: a consumer's streams cross epochs together; 1 (``align_epochs=False``): each
        stream's epochs are its own (:mod:`.pipeline`)."""
        return ORDER_VERSION if self.config.align_epochs else UNALIGNED_ORDER_VERSION

    # -- internals ---------------------------------------------------------------------

    def _taker(self, pipe: Pipeline) -> Callable[[], Any]:
        """``pipe.next`` itself when ``R`` divides ``R*`` (the fast path), else
        :func:`~shardwise.read.records.ranks.take_shared` on it."""
        return (pipe.next if self._pipe_share.step == 1
                else partial(take_shared, pipe, self._pipe_share))

    def _fresh_positions(self, epoch: int) -> dict[int, StreamPosition]:
        stop = None if self.config.epochs is None else epoch + self.config.epochs
        return {s: StreamPosition(epoch=epoch, stop_epoch=stop)
                for s in self.world.streams(self.config.streams)}

    def _reset(self, positions: dict[int, StreamPosition]) -> None:
        self.close()
        self._positions = positions

    def _pipeline(self) -> Pipeline:
        return self._pipe.get()

    def _new_pipeline(self) -> Pipeline:
        """The pipeline of this process (in a DataLoader worker: of its share)."""
        worker = torch_worker()
        workers = self.config.num_workers
        positions = self._positions
        self._pipe_share = self._share
        if worker is not None:  # a DataLoader worker: its share of this rank's streams
            self._pipe_share = self.world.stream_share(self.config.streams, worker=worker)
            mine = set(self._pipe_share.streams)
            positions = {s: p for s, p in positions.items() if s in mine}
            workers = 0  # a DataLoader worker is daemonic: it cannot have children
        c = self.config
        processor = Processor(self.map_fn, c.text_mode, tuple(f.path for f in self.plan.files))
        return Pipeline(self.order, positions, processor, workers=workers,
                        raise_errors=c.on_error is OnError.RAISE, task_size=c.task_size,
                        align=c.align_epochs)


__all__ = ["RecordStream", "RecordStreamConfig"]
