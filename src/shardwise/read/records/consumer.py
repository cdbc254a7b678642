"""A sequential consumer for RL-style loops: ``get_next_batch(n)`` over any resumable
iterable reader, with a seeded per-epoch shuffle, a background prefetch buffer and a state
that records what the *caller* received.

The reader needs only :class:`ResumableSource`: ``__iter__``, ``state_dict()`` and
``load_state_dict()``, where ``state_dict()`` called right after the iterator returned an
example describes the position just after it (so a fresh ``iter()`` after
``load_state_dict`` continues from there), and returns a fresh JSON-able dict. An optional
``set_epoch(epoch)`` lets the reader change its own order per epoch (a stream's block
shuffle). :class:`~shardwise.read.external.producer_dir.ProducerDirStream` and
``StreamDataset`` are such readers. Pass the reader, or a factory ``() -> reader`` (called
for every pass, so an abandoned prefetch thread never shares a reader with a new one).

Shuffle: consecutive blocks of ``shuffle_block`` examples are each permuted by a keyed
:class:`~shardwise.plan.permutation.Permutation` of ``(seed, block number, epoch)``.
The order depends on the data, ``seed``, ``shuffle_block`` and the epoch only — never on
``consumers``, ``batch_size`` or ``prefetch``. Example, ``shuffle_block = 4``::

    reader      a b c d | e f g h | i j
    epoch 0     c a d b | f h e g | j i        (block 0 keyed by (seed, 0, epoch 0), …)

(``shuffle_window=`` is the deprecated name of ``shuffle_block=``: in shardwise a window
is ``seq_len`` tokens.)

Resume: the state holds the reader's state at the start of the current block and how
many examples of that block the caller has received; restoring reads that one block
again (at most ``shuffle_block`` examples, never anything before it) and continues
exactly. With ``shuffle_block <= 1`` nothing is re-read.

State keys (``LoaderState``): ``consumed`` (examples received, all epochs) and
``extra``: ``epoch``, ``window`` (number of the current shuffle block in the epoch; the
key keeps its first name so saved states load), ``offset`` (examples of it received),
``source`` (the reader's state at the block's start, or ``None`` at the start of the
epoch).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from itertools import islice
from typing import Any, Protocol, runtime_checkable

from shardwise.checkpoint import LoaderState, Resumable, as_count
from shardwise.concurrency.readahead import ReadAhead
from shardwise.errors import ConfigError, StateError
from shardwise.plan.permutation import PERMUTATION_VERSION, Permutation, derive_seed
from shardwise.read.deprecated import renamed, renamed_method
from shardwise.read.guard import GuardedReader
from shardwise.read.records.pipeline import pad_batch

ORDER_VERSION = 1
DEFAULT_BATCH = 32


@runtime_checkable
class ResumableSource(Protocol):
    """An iterable reader with a JSON-able position (see the module docstring)."""

    def __iter__(self) -> Iterator[Any]: ...
    def state_dict(self) -> dict[str, Any]: ...
    def load_state_dict(self, state: dict[str, Any]) -> None: ...


@dataclass(frozen=True)
class ConsumerOrder:
    """What defines the order (fingerprinted): not ``consumers``, ``batch_size``,
    ``prefetch`` or ``cycle``, so a state restores under any of those."""

    seed: int = 0
    shuffle_block: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "seed", _check(self.seed, "seed", 0))
        object.__setattr__(self, "shuffle_block", _check(self.shuffle_block,
                                                         "shuffle_block", 0))

    def to_dict(self) -> dict[str, Any]:
        # "shuffle_window": the first name of shuffle_block, kept so fingerprints match
        return {"seed": self.seed, "shuffle_window": self.shuffle_block,
                "order_version": ORDER_VERSION, "permutation_version": PERMUTATION_VERSION}


@dataclass(frozen=True)
class Position:
    """What the caller has received: shuffle block ``block`` of ``epoch`` starts at reader
    state ``source`` (``None``: the epoch's start) and ``offset`` of its examples are
    taken."""

    epoch: int
    block: int = 0
    offset: int = 0
    source: dict[str, Any] | None = None


_END = object()


class SequentialConsumer(GuardedReader, Resumable):
    """Batches of examples in a seeded order, prefetched, exactly resumable.

    ``prefetch`` (examples held ahead) defaults to ``2 × consumers × batch_size``: two
    steps of ``consumers`` data-parallel workers each taking ``batch_size``. At the end of
    a pass ``get_next_batch`` returns what is left (then ``[]``), unless ``cycle`` rolls
    into the next epoch.

    >>> with SequentialConsumer(ds.stream(), batch_size=32, consumers=8,     # doctest: +SKIP
    ...                         shuffle_block=4096, seed=1) as c:
    ...     prompts = c.get_next_batch(32); state = c.state_dict()
    """

    state_kind = "sequential_consumer"

    def __init__(self, source: ResumableSource | Callable[[], ResumableSource], *,
                 batch_size: int | None = None, consumers: int = 1,
                 prefetch: int | None = None, seed: int = 0, shuffle_block: int = 0,
                 cycle: bool = False, shuffle_window: int | None = None) -> None:
        shuffle_block = renamed("shuffle_window", shuffle_window, "shuffle_block",
                                shuffle_block, "SequentialConsumer", default=0)
        self.order = ConsumerOrder(seed, shuffle_block)
        self.batch_size = None if batch_size is None else _check(batch_size, "batch_size", 1)
        self.consumers = _check(consumers, "consumers", 1)
        self.prefetch = (2 * self.consumers * (self.batch_size or DEFAULT_BATCH)
                         if prefetch is None
                         else _check(prefetch, "prefetch", 1))
        self.seed, self.shuffle_block = self.order.seed, self.order.shuffle_block
        self.cycle = cycle
        if isinstance(source, ResumableSource) and not isinstance(source, type):
            self._factory: Callable[[], ResumableSource] | None = None
            self._source: ResumableSource | None = source
            self._origin: dict[str, Any] | None = source.state_dict()
        elif callable(source):
            self._factory, self._source, self._origin = source, None, None
        else:
            raise ConfigError(f"source must have __iter__, state_dict and load_state_dict, "
                              f"or be a factory returning such a reader; got "
                              f"{type(source).__name__}")
        self._pos = Position(epoch=0)
        self.consumed = 0
        self._ahead: ReadAhead[tuple[Any, Position]] | None = None
        self._done: BaseException | object | None = None  # _END or the reader's error
        self._epoch_aware: bool | None = None

    # -- identity -------------------------------------------------------------------------
    def state_config(self) -> dict[str, Any]:
        return self.order.to_dict()

    @property
    def epoch(self) -> int:
        return self._pos.epoch

    # -- the caller's side ----------------------------------------------------------------
    def get_next_batch(self, n: int | None = None, *, pad: bool = False) -> list[Any]:
        """The next ``n`` examples (default ``batch_size``). At the end of a pass the last
        batch is what is left (``pad=True``: filled up to ``n`` with pad examples,
        :func:`~shardwise.read.records.pipeline.is_pad`), then ``[]`` — as
        :meth:`RecordStream.get_next_batch`."""
        n = _check(n if n is not None else self.batch_size or DEFAULT_BATCH, "n", 1)
        out: list[Any] = []
        while len(out) < n and self._done is None:
            try:
                got = self._read_ahead().get(None)
            except Exception as e:  # the reader's error: raised once this batch is out
                got, self._done = None, e
            if got is None:
                self._done = self._done or _END
                self._join()
                break
            item, pos = got
            out.append(item)
            self._pos = pos
            self.consumed += 1
        if isinstance(self._done, BaseException) and not out:
            raise self._done
        return pad_batch(out, n) if pad and self._done is _END else out  # not before an error

    def __iter__(self) -> Iterator[list[Any]]:
        """Batches of ``batch_size`` until the end of the pass (forever with ``cycle``)."""
        while batch := self.get_next_batch():
            yield batch

    def set_epoch(self, epoch: int) -> None:
        """Start pass ``epoch`` from its beginning, in that epoch's order (reproducible);
        the reader's own ``set_epoch`` is called with it."""
        _check(epoch, "epoch", 0)
        if self.shuffle_block <= 1 and not self._has_set_epoch():
            raise ConfigError("set_epoch(epoch) would not change the order: pass "
                              "shuffle_block > 1, or a reader with set_epoch()")
        self._restart(Position(epoch=epoch))

    shuffle = renamed_method("shuffle", "set_epoch")

    def _position(self) -> tuple[int, dict[str, Any]]:
        p = self._pos
        return self.consumed, {"epoch": p.epoch, "window": p.block, "offset": p.offset,
                               "source": p.source}

    def _seek(self, st: LoaderState) -> None:
        """Continue exactly after the last example the saved consumer returned."""
        if "source" not in st.extra:
            st.extra_counts("source")  # names the missing key
        epoch, window, offset = st.extra_counts("epoch", "window", "offset")
        e = st.extra
        if offset >= max(1, self.shuffle_block):
            raise StateError(f"extra.offset={offset} is past the end of a shuffle block of "
                             f"{self.shuffle_block} examples; the state was edited or saved "
                             "with another shuffle_block")
        self._restart(Position(epoch, window, offset, e["source"]))
        self.consumed = st.consumed

    def close(self) -> None:
        self._join()

    def __enter__(self) -> SequentialConsumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the prefetch thread --------------------------------------------------------------
    def _has_set_epoch(self) -> bool:
        if self._epoch_aware is None:
            probe = self._source if self._source is not None else self._new_reader()
            self._epoch_aware = callable(getattr(probe, "set_epoch", None))
        return self._epoch_aware

    def _new_reader(self) -> ResumableSource:
        src = self._factory() if self._factory is not None else self._source
        if not isinstance(src, ResumableSource):
            raise ConfigError(f"the factory returned a {type(src).__name__}, which lacks "
                              "__iter__, state_dict or load_state_dict")
        return src

    def _restart(self, pos: Position) -> None:
        self._join()
        self._pos, self._done = pos, None

    def _join(self) -> None:
        """Stop the prefetch thread and drop what it read ahead."""
        if self._ahead is not None:
            self._ahead.close()
            self._ahead = None

    def _read_ahead(self) -> ReadAhead[tuple[Any, Position]]:
        if self._ahead is None:
            self._ahead = ReadAhead(self._from_here, name="shardwise-consumer",
                                    depth=self.prefetch)
        return self._ahead

    def _from_here(self) -> Iterator[tuple[Any, Position]]:
        """On the read-ahead thread (a forked child's own thread starts here too): the
        examples after the last one this consumer returned."""
        return self._examples(self._pos)

    def _reader(self, epoch: int, start: dict[str, Any] | None) -> ResumableSource:
        src = self._new_reader()
        if start is None and self._origin is not None:
            src.load_state_dict(self._origin)
        set_epoch = getattr(src, "set_epoch", None)
        if callable(set_epoch):
            set_epoch(epoch)
        if start is not None:
            src.load_state_dict(start)
        return src

    def _examples(self, pos: Position) -> Iterator[tuple[Any, Position]]:
        """``(example, position after it)`` from ``pos`` on, epoch after epoch if cycling."""
        while True:
            yield from self._pass(pos)
            if not self.cycle:
                return
            pos = Position(epoch=pos.epoch + 1)

    def _pass(self, pos: Position) -> Iterator[tuple[Any, Position]]:
        src = self._reader(pos.epoch, pos.source)
        start = src.state_dict() if pos.source is None else pos.source
        it = iter(src)
        size, b, skip = max(1, self.shuffle_block), pos.block, pos.offset
        while block := list(islice(it, size)):
            after = src.state_dict()
            order = self._order(len(block), pos.epoch, b)
            for j in range(skip, len(block)):
                nxt = (Position(pos.epoch, b + 1, 0, after) if j + 1 == len(block)
                       else Position(pos.epoch, b, j + 1, start))
                yield block[order[j]], nxt
            start, b, skip = after, b + 1, 0

    def _order(self, n: int, epoch: int, block: int) -> list[int]:
        if self.shuffle_block <= 1 or n < 2:
            return list(range(n))
        key = derive_seed(self.seed, "consumer", block)
        return [int(i) for i in Permutation(n, key, epoch)(list(range(n)))]


def _check(value: Any, name: str, low: int) -> int:
    return as_count(value, name, minimum=low, error=ConfigError)
