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
Rank ``r`` of ``R`` serves streams ``s % R == r``; inside a torch DataLoader, worker ``w``
of ``W`` serves ``s % (R·W) == r + w·R`` (``R·W`` must divide ``R*``) and the DataLoader's
per-example round robin over workers restores the rank's order. With a finite number of
epochs the DataLoader moves on when a worker ends, so that exact interleaving holds only
until the first worker ends (every example still comes exactly once).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import xxhash

from shardwise.checkpoint import LoaderState, Resumable, as_count
from shardwise.errors import ConfigError, StateError
from shardwise.read.guard import refuse_framework_sharding
from shardwise.read.records.pipeline import FINISHED, PAD_KEY, Pipeline, is_pad, make_pad
from shardwise.read.records.pool import Processor, Reject
from shardwise.read.records.ranges import RangeKind, plan_ranges, resolve_files
from shardwise.read.records.streams import ORDER_VERSION, StreamOrder, StreamPosition
from shardwise.sources.on_error import OnError
from shardwise.world import World


@dataclass(frozen=True)
class RecordStreamConfig:
    """The options of a :class:`RecordStream` (see its docstring)."""

    seed: int = 0
    streams: int = 8
    range_bytes: int = 64 << 20
    shuffle_buffer: int = 1024
    shuffle: bool = True
    epochs: int | None = None
    num_workers: int = 0
    text_mode: bool = False
    on_error: OnError = OnError.RAISE
    task_size: int = 256

    def __post_init__(self) -> None:
        for name, low in (("seed", 0), ("streams", 1), ("range_bytes", 1),
                          ("shuffle_buffer", 0), ("num_workers", 0), ("task_size", 1)):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < low:
                raise ConfigError(f"{name} must be an integer >= {low}, got {v!r}")
        if self.epochs is not None and (isinstance(self.epochs, bool) or
                                        not isinstance(self.epochs, int) or self.epochs < 1):
            raise ConfigError(f"epochs must be None (forever) or an integer >= 1, got "
                              f"{self.epochs!r}")
        object.__setattr__(self, "on_error", OnError.parse(self.on_error))


class RecordStream(Resumable):
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

    State keys: ``kind``, ``version``, ``fingerprint``, ``consumed``, ``config``,
    ``extra`` (``order_version``; ``streams``: per stream ``epoch``, ``stop_epoch``,
    ``range``, ``pos``, ``line``, ``draws``, ``buffer``, ``consumed``, ``errors``,
    ``done``). A rank's state holds its own streams: :func:`merge_states` combines the
    ranks' states into one that restores any world size, and
    ``state_dict(all_ranks=True)`` (a collective over torch.distributed) returns that
    merged state on every rank.
    """

    state_kind = "record_stream"

    def __init__(self, sources: Any, *, map_fn: Callable[[Any], Any] | None = None,
                 seed: int = 0, world: World | None = None, streams: int = 8,
                 range_bytes: int = 64 << 20, shuffle_buffer: int = 1024,
                 shuffle: bool = True, epochs: int | None = None, num_workers: int = 0,
                 text_mode: bool = False, on_error: str | OnError = OnError.RAISE) -> None:
        self.config = RecordStreamConfig(
            seed=seed, streams=streams, range_bytes=range_bytes, shuffle_buffer=shuffle_buffer,
            shuffle=shuffle, epochs=epochs, num_workers=num_workers, text_mode=text_mode,
            on_error=on_error)  # type: ignore[arg-type]
        self.world = World.resolve(world, reader="RecordStream")
        self.map_fn = map_fn
        self.world.streams(streams)  # refuses a world that cannot split them
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
        self._pipe: Pipeline | None = None
        self._pipe_key: tuple[int, int] | None = None
        _register_with_torch()

    # -- iteration ---------------------------------------------------------------------

    def __iter__(self) -> Iterator[Any]:
        """This consumer's examples, continuing from the current position."""
        refuse_framework_sharding("RecordStream")
        pipe = self._pipeline()
        while True:
            if self._pipe is not pipe:  # the position was reset (load_state_dict, shuffle)
                pipe = self._pipeline()
            x = pipe.next()
            if x is FINISHED:
                return
            yield x

    def get_next_batch(self, n: int) -> list[Any]:
        """The next ``n`` examples; in finite mode the last batch is padded to ``n`` and
        then the batches are empty."""
        n = as_count(n, "n", error=ConfigError)
        pipe = self._pipeline()
        out: list[Any] = []
        while len(out) < n:
            x = pipe.next()
            if x is FINISHED:
                return out + [make_pad() for _ in range(n - len(out))] if out else []
            out.append(x)
        return out

    def eval_batches(self, n: int, all_done: Callable[[bool], bool] | None = None
                     ) -> Iterator[list[Any]]:
        """Batches of ``n`` until *every* rank has run out, padded, so that all ranks take
        the same number of steps. ``all_done(local_done)`` is True when every rank is
        done; by default an all-reduce over torch.distributed (world size 1: local)."""
        reduce = all_done or _default_all_done(self.world)
        while True:
            batch = self.get_next_batch(n)
            if reduce(not batch):
                return
            yield batch or [make_pad() for _ in range(n)]

    def shuffle(self, epoch: int) -> None:
        """Restart every stream at the start of ``epoch`` (its own reproducible order)."""
        self._reset(self._fresh_positions(as_count(epoch, "epoch", error=ConfigError)))

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
        if self._pipe is not None and self._pipe_key and self._pipe_key[0] == os.getpid():
            self._pipe.close()
        self._pipe = self._pipe_key = None

    def __enter__(self) -> RecordStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_pipe"] = state["_pipe_key"] = None
        return state

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
        if not all_ranks or self.world.size == 1 or _torch_worker() is not None:
            return local
        return _gather_states(self.world, local)

    def _position(self) -> tuple[int, dict[str, Any]]:
        streams = {str(s): p.to_dict() for s, p in sorted(self._positions.items())}
        return (sum(p.consumed for p in self._positions.values()),
                {"order_version": ORDER_VERSION, "streams": streams})

    def _seek(self, st: LoaderState) -> None:
        """Continue exactly where the state stopped (its streams must cover this rank's)."""
        if st.extra.get("order_version") != ORDER_VERSION:
            raise StateError(f"order_version: state has {st.extra.get('order_version')!r}, "
                             f"this reader has {ORDER_VERSION}")
        saved = st.extra.get("streams")
        if not isinstance(saved, dict):
            raise StateError("extra.streams: expected a dict of stream -> position")
        local = self.local_streams
        missing = [s for s in local if str(s) not in saved]
        if missing:
            raise StateError(f"extra.streams: the state holds streams "
                             f"{sorted(int(k) for k in saved)}, this reader serves {local} "
                             f"(missing {missing}); combine every rank's state with "
                             "shardwise.read.records.stream.merge_states")
        positions = {s: StreamPosition.from_dict(saved[str(s)], f"extra.streams.{s}",
                                                 self.plan.n) for s in local}
        self._reset(positions)

    def state_config(self) -> dict[str, Any]:
        c, plan = self.config, self.plan
        names = xxhash.xxh3_64()
        for f in plan.files:
            names.update(f"{os.path.basename(f.path)}\0{f.size}\0{f.format}\n".encode())
        return {"order_version": ORDER_VERSION, "seed": c.seed, "streams": c.streams,
                "shuffle": c.shuffle, "shuffle_buffer": self.order.capacity,
                "range_step": plan.step, "epochs": c.epochs, "n_files": len(plan.files),
                "n_ranges": plan.n, "total_bytes": sum(f.size for f in plan.files),
                "files": names.hexdigest()}

    # -- internals ---------------------------------------------------------------------

    def _fresh_positions(self, epoch: int) -> dict[int, StreamPosition]:
        stop = None if self.config.epochs is None else epoch + self.config.epochs
        return {s: StreamPosition(epoch=epoch, stop_epoch=stop)
                for s in self.world.streams(self.config.streams)}

    def _reset(self, positions: dict[int, StreamPosition]) -> None:
        self.close()
        self._positions = positions

    def _pipeline(self) -> Pipeline:
        worker = _torch_worker()
        key = (os.getpid(), -1 if worker is None else worker[0])
        if self._pipe is not None and self._pipe_key == key:
            return self._pipe
        if self._pipe_key is not None and self._pipe_key[0] == os.getpid():
            self.close()
        workers = self.config.num_workers
        positions = self._positions
        if worker is not None:  # a DataLoader worker: its share of this rank's streams
            mine = set(self.world.streams(self.config.streams, worker=worker))
            positions = {s: p for s, p in positions.items() if s in mine}
            workers = 0  # a DataLoader worker is daemonic: it cannot have children
        c = self.config
        processor = Processor(self.map_fn, c.text_mode, tuple(f.path for f in self.plan.files))
        self._pipe = Pipeline(self.order, positions, processor, workers=workers,
                              raise_errors=c.on_error is OnError.RAISE, task_size=c.task_size)
        self._pipe_key = key
        return self._pipe


def _torch_worker() -> tuple[int, int] | None:
    """``(id, num_workers)`` inside a torch DataLoader worker; torch is never imported
    here, only looked up if the program already imported it."""
    data = sys.modules.get("torch.utils.data")
    info = data.get_worker_info() if data is not None else None
    return None if info is None else (int(info.id), int(info.num_workers))


def _register_with_torch() -> None:
    """Make ``DataLoader(record_stream, batch_size=None)`` treat it as an iterable dataset
    (a virtual subclass of ``IterableDataset``), if the program has imported torch."""
    data = sys.modules.get("torch.utils.data")
    base = getattr(data, "IterableDataset", None)
    if base is not None and not issubclass(RecordStream, base):
        base.register(RecordStream)


def _default_all_done(world: World) -> Callable[[bool], bool]:
    if world.size == 1:
        return lambda done: done
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized():
        raise ConfigError("eval_batches over several ranks needs all_done=... (a function "
                          "that is True when every rank is done) or torch.distributed")
    import torch

    device = "cuda" if dist.get_backend() == "nccl" else "cpu"

    def all_done(done: bool) -> bool:
        flag = torch.tensor([int(done)], device=device)
        dist.all_reduce(flag, op=dist.ReduceOp.MIN)
        return bool(flag.item())

    return all_done


def _gather_states(world: World, local: dict[str, Any]) -> dict[str, Any]:
    """Every rank's ``local`` state over torch.distributed, merged. Each rank validates
    the same gathered list, so a mismatch raises on all of them (none is left waiting)."""
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized():
        raise ConfigError(f"state_dict(all_ranks=True) with world size {world.size} gathers "
                          "the ranks' states over torch.distributed, which is not "
                          "initialised: call torch.distributed.init_process_group first, or "
                          "save each rank's state_dict() and combine them with "
                          "shardwise.read.records.stream.merge_states")
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, (world.rank, world.size, local))
    if len(gathered) != world.size:
        raise ConfigError(f"state_dict(all_ranks=True): this reader's World has size "
                          f"{world.size}, torch.distributed has {len(gathered)} ranks; "
                          "save each data-parallel rank's state_dict() and combine them "
                          "with shardwise.read.records.stream.merge_states")
    ranks = sorted(int(r) for r, _, _ in gathered)
    if ranks != list(range(world.size)) or any(n != world.size for _, n, _ in gathered):
        raise ConfigError(f"state_dict(all_ranks=True): the processes' Worlds are "
                          f"{[(r, n) for r, n, _ in gathered]} (rank, size), expected ranks "
                          f"0..{world.size - 1} of {world.size} once each")
    return merge_states([st for _, _, st in gathered])


def merge_states(states: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One state holding every stream of several consumers' states (e.g. all ranks'),
    which restores any world size; the states must come from the same data and config."""
    if not states:
        raise StateError("merge_states needs at least one state")
    parsed = [LoaderState.from_dict(s) for s in states]
    first = parsed[0]
    streams: dict[str, Any] = {}
    for i, st in enumerate(parsed):
        st.check_matches(first.kind, first.fingerprint, first.config)
        for k, v in dict(st.extra.get("streams", {})).items():
            if k in streams and streams[k] != v:
                raise StateError(f"states 0..{i} disagree on stream {k}: save every rank's "
                                 "state at the same step")
            streams[k] = v
    consumed = sum(int(v.get("consumed", 0)) for v in streams.values())
    extra = dict(first.extra, streams=dict(sorted(streams.items(), key=lambda kv: int(kv[0]))))
    return LoaderState(fingerprint=first.fingerprint, consumed=consumed, config=first.config,
                       extra=extra, kind=first.kind).to_dict()


__all__ = ["OnError", "PAD_KEY", "RecordStream", "RecordStreamConfig", "Reject", "is_pad",
           "make_pad", "merge_states"]
