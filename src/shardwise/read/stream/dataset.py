"""Stream placement: ``R*`` streams, each packing its own chunks; rank ``r`` reads only its
streams' chunks, also while the cache is still being built.

Stream ``s`` owns the global chunks ``c % R* == s`` in ledger order, cut into blocks of
``block_chunks``. Inside a block the chunks are read in a seeded order (seed, epoch,
stream), their documents packed into windows of ``seq_len + 1`` tokens (consecutive windows
share one token) and the windows served in a seeded order (``shuffle=``: another registered
window order, e.g. ``"none"``): reads stay sequential within a block. The stored tokens of
example ``i`` are ``locate([i])`` (:mod:`shardwise.read.orders.stream`: the reader copies
those runs, ``trace`` names them). Example (``R* = 4``, ``block_chunks = 2``,
``seq_len = 4``)::

    stream 1 owns   1 5 9 13 17            (c % 4 == 1, ledger order)
    blocks          [1 5]  [9 13]  [17]    the last block may be short
    read order      [5 1]  [9 13]  [17]    seeded shuffle inside each block
    pack block 0    docs of 5, docs of 1 → 13 tokens t0 … t12
    windows         w0=[t0‥t4] w1=[t4‥t8] w2=[t8‥t12]
    served          w2 w0 w1               seeded shuffle inside the block

**Windows never cross a block boundary**: a block is served only once it is final (all its
chunks published, or the build finished), and a window reaching into block ``b + 1`` would
make block ``b`` wait for it and hold both in memory. A block's tail that does not fill a
window is dropped (``drop_last=True``: under ``seq_len`` tokens per block) or padded and
masked (``drop_last=False``)::

    block 0 (13 tokens)  t0 … t12   w0=[t0‥t4] w1=[t4‥t8] w2=[t8‥t12]       exact fit
    block 1 (11 tokens)  u0 … u10   w0=[u0‥u4] w1=[u4‥u8], tail u8 u9 u10:  dropped, or
                                    w2=[u8 u9 u10 · ·] with loss_mask 1 1 0 0
    block 2 starts its own windows at its first token

**Global order.** Example ``i`` is example ``i // R*`` of stream ``i % R*``. Rank ``r`` of
``R`` serves global ``j·R + r`` as its ``j``-th example, so interleaving the ranks' outputs
gives the global order for any ``R`` (Levanter's rule,
:class:`~shardwise.world.StreamShare`). When ``R`` divides ``R*`` rank ``r`` reads only the
streams ``s % R == r``::

    R* = 4, R = 2     global i   0 1 2 3 4 5 6 7 …     stream i % 4, example i // 4
    rank 0 (streams 0 2)   i = 0 2 4 6 …     rank 1 (streams 1 3)   i = 1 3 5 7 …

Any other ``R`` shares streams between ranks: ``R = 8`` gives ranks 0 and 4 stream 0
(examples 0 2 4 … and 1 3 5 …); ``R = 3`` makes every rank read every stream and take one
example in three of each. Such a rank reads every block of its streams to serve a share of
their windows: locality is lost by design, order and resume are not.

**Epochs.** ``epochs=None``: every stream cycles on its own, each epoch with a new chunk and
window shuffle; streams of different lengths simply start their next epoch at different
times. ``epochs=E``: each stream serves ``E`` epochs, then *padding examples* (all zeros,
``loss_mask`` 0) up to ``E × (windows of the longest stream)``, so every stream and every
rank yields the same count; real data is never repeated or dropped for alignment.

**Follow mode** (``follow=True``) reads a cache a build is still writing, in the same order
as once it has finished: a block is served once final. Until then the prefetch thread polls
the ledger with backoff (10 ms doubling up to ``poll_interval``) and raises
:class:`~shardwise.errors.ProducerTimeoutError` after ``timeout`` seconds without a new
chunk; a finished build ends (``epochs=E``) or cycles the stream. A path that is not a cache
yet is waited for the same way::

    visible (build running)  0 1 2 3 4 5 6 7 8 9 10 11 12
    stream 1, block_chunks=2 [1 5] final → served   [9 ·] waits for chunk 13 (or the end)

**Skip ranges** (``skip=``): half-open ranges of global positions left out, whole steps of
``batch_size × R``, with the global placement's rules: every other example is served
exactly as without them, ``consumed`` stays a position of the unskipped order (it jumps a
range), the list is part of the state's config, and a resume may add or change ranges from
the saved position on (:mod:`~shardwise.read.stream.skipping`). The read-ahead stops before
a range and restarts at its end.

**State** (``state_dict()``; keys ``kind``, ``version``, ``fingerprint``, ``consumed``,
``config``, ``extra``): ``consumed`` counts the examples of the global order *received* by
all ranks together (``start + received × R``, plus the skipped ranges jumped: the same on
every rank); ``extra`` holds ``stream_examples``, each stream's position ``k_s =
ceil((consumed - s) / R*)``. Epochs are not stored: a stream's epoch is ``k_s // N_s`` (its
windows per epoch, from the ledger), and storing it would make two ranks' states differ
while one has seen the build finish and the other not. The fingerprint covers the config
and the cache's identity, not its chunk count (which grows). Resuming under any ``R`` seeks
from chunk token counts (the block by a search in the blocks' window counts): the block
holding the position is read, none before it. Rank ``r`` resumes at its first example ``>=
consumed``; when ``consumed`` is not a multiple of ``R`` the ranks' first steps still cover
exactly the next ``R`` examples of the global order.

**PyTorch.** ``DataLoader(ds, batch_size=None)`` (``num_workers=0``; ``pin_memory`` works).
The dataset registers itself as a virtual ``torch.utils.data.IterableDataset`` when it is
created after torch was imported (torch itself is never imported here). Use the dataset's
own ``batch_size=`` for micro-batches: one stacked dict per item, built in one call.
DataLoader *worker processes* are refused: the prefetch thread already overlaps reading with
training, and a worker would iterate a copy whose position ``state_dict()`` could not see —
a checkpoint would silently restart.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from shardwise.checkpoint import (
    SKIP_KEY,
    LoaderState,
    Resumable,
    as_count,
    check_not_past_end,
)
from shardwise.concurrency.local import ProcessLocal
from shardwise.concurrency.poll import check_wait_args
from shardwise.errors import ConfigError, StateError
from shardwise.plan.permutation import PERMUTATION_VERSION
from shardwise.plan.skips import advance
from shardwise.plan.stream import dropped_stream_tokens
from shardwise.read.drops import Drop, describe_drops
from shardwise.read.examples import NEXT_TOKEN, Output
from shardwise.read.guard import (
    GuardedReader,
    refuse_framework_sharding,
    register_with_torch,
)
from shardwise.read.orders import Runs
from shardwise.read.orders.stream import StreamConfig, StreamOrder
from shardwise.read.sampler import normalise_skip, skip_drop
from shardwise.read.stream.chunk_cache import ChunkCache
from shardwise.read.stream.run import (
    Example,
    Here,
    Run,
    first_example,
    refuse_worker_process,
    shaped_examples,
)
from shardwise.read.stream.schedule import check_stream_cache, open_when_ready
from shardwise.read.stream.skipping import rank_ranges, run_span
from shardwise.storage.cache import Cache
from shardwise.storage.opening import open_cache, reader_cache
from shardwise.world import World

STREAM_ORDER_VERSION = 1
SKIP_STEP = "batch_size × world size"  # a skip range's unit, named in its errors


class StreamDataset(GuardedReader, Resumable):
    """This rank's examples under stream placement; iterable (see the module docs).

    >>> ds = StreamDataset("cache/", seq_len=2048, streams=8, seed=1234,  # doctest: +SKIP
    ...                    world=World(0, 2), follow=True)
    >>> for example in ds: ...                                           # doctest: +SKIP

    Its order is a :class:`StreamConfig`: pass its fields as keyword arguments (``seq_len``,
    ``streams``, ``seed``, ``block_chunks``, ``drop_last``, ``epochs``) or ``config=`` one.
    ``world=None`` means ``World.detect()``. Every ``iter()`` continues from the current
    position (and stops an earlier iterator). ``batch_size``: yield stacked micro-batches of
    this rank's next examples (the last may be short in a single pass). Memory: the chunk
    cache holds at most ``chunk_cache_bytes``, or the current block of each served stream
    plus the next one if that is more; ``prefetch_chunks`` bounds the chunks read ahead
    (whole blocks; the next block is always read ahead). ``stats()`` reports the seconds
    waited on the producer and on the prefetch thread, and the chunk cache's figures.
    ``verify``: each chunk's checksum and ids are checked as it is read, before use
    (default: as the cache was opened, which is on; ``False`` for a trusted cache).
    ``skip``: ranges ``(start, stop)`` of global positions to leave out, whole steps of
    ``batch_size × world size`` (see the module docs; a read config's ``skip`` gives them in
    global steps). ``bind(world)``: serve another world, before the first read. ``shuffle``:
    the order of each block's windows (default ``"window"``, seeded). ``output``: the
    examples' form (:class:`~shardwise.read.examples.Output`); a compact single example
    always carries ``loss_mask``, so rows collate.
    """

    state_kind = "stream"
    label_convention = NEXT_TOKEN  # labels are next-token targets: read/examples.py
    config_class = StreamConfig  # what it is built from: its arguments, state and fingerprint

    def __init__(self, cache: Cache | str | os.PathLike[str],
                 config: StreamConfig | None = None, *, world: World | None = None,
                 follow: bool = False, batch_size: int | None = None,
                 poll_interval: float = 0.5, timeout: float = 600.0, prefetch_chunks: int = 2,
                 chunk_cache_bytes: int = 256 << 20, verify: bool | None = None,
                 skip: Iterable[Sequence[int]] | None = None, output: Output | None = None,
                 **options: Any) -> None:
        self.config = self.config_class.of(config, options)
        self.output = Output.of(output)
        self.world = World.resolve(world, reader="StreamDataset")
        self.share = self.world.stream_share(self.config.streams)
        self.streams = self.share.streams
        check_wait_args(timeout, poll_interval)
        if batch_size is not None:
            batch_size = as_count(batch_size, "batch_size", minimum=1, error=ConfigError)
        prefetch_chunks = as_count(prefetch_chunks, "prefetch_chunks", error=ConfigError)
        self.skip = normalise_skip(skip, (batch_size or 1) * self.world.size,
                                   step_name=SKIP_STEP)
        self.follow, self.poll_interval, self.timeout = follow, poll_interval, timeout
        self.batch_size, self.prefetch_chunks = batch_size, prefetch_chunks
        if isinstance(cache, Cache):  # a growing cache is refreshed on the prefetch
            # thread, so it gets a private view rather than sharing the caller's object
            cache = reader_cache(cache, verify)
            self.cache = (open_cache(cache.root, verify=cache.verify)
                          if follow and not cache.finished else cache)
        else:
            self.cache = (open_when_ready(Path(cache), poll_interval, timeout,
                                          verify=verify is not False) if follow
                          else reader_cache(cache, verify))
        check_stream_cache(self.cache, self.config, self.follow)
        self._here = ProcessLocal(partial(Here, chunk_cache_bytes), name="stream run")
        self._start, self._received = 0, 0
        self._waited = {"producer_wait_s": 0.0, "consumer_wait_s": 0.0}
        self.order = StreamOrder(self.config, self.cache)
        register_with_torch(StreamDataset)  # an IterableDataset, if torch is imported

    def __repr__(self) -> str:
        c = self.config
        return (f"StreamDataset({self.cache!r}, seq_len={c.seq_len}, streams={c.streams}, "
                f"seed={c.seed}, rank={self.world.rank}/{self.world.size}, "
                f"epochs={c.epochs}, follow={self.follow}, {describe_drops(self.drops())})")

    def drops(self) -> list[Drop]:
        """Tokens of every stream's blocks that no window holds (windows never cross a
        block), per epoch — the same count each epoch. While a build runs, of the final
        blocks so far."""
        c, cum, done = self.config, self.cache.cum_tokens, self.cache.finished
        lost = dropped_stream_tokens(cum, c.streams, c.block_chunks, c.seq_len, c.drop_last,
                                     full_blocks_only=not done)
        out = [Drop(lost, "tokens per epoch", f"the tails of stream blocks of {c.block_chunks}"
                    f" chunks (windows never cross a block; drop_last=True)"
                    f"{'' if done else ', so far'}", of=int(cum[-1]))] if lost else []
        if self.skip:
            out.append(skip_drop(self.skip, self._end(), self._end()))
        return out

    @property
    def opened(self) -> Counter[int]:
        """How often each chunk (global index) was read into memory."""
        return self.chunk_cache.loads

    def _end(self) -> int | None:
        """Examples of the global order in a finite run (``epochs=E`` of a finished cache:
        every stream padded to the longest, :meth:`StreamOrder.pad_to`); ``None`` when
        endless or still growing."""
        per_stream = self.order.pad_to()
        return None if per_stream is None else self.config.streams * per_stream

    def bind(self, world: World) -> None:
        """Serve ``world`` from now on (as ``RecordStream.bind``: a reader made before the
        data-parallel layout is known). Allowed until the first read after the reader was
        made or ``load_state_dict()``-ed: the position (a global one) continues under the
        new world; binding the same world again is a no-op."""
        bound = self.world.rebind(world, reader="StreamDataset",
                                  started=self._here.get().run is not None or self._received > 0)
        if bound is None:
            return
        skip = normalise_skip(self.skip, (self.batch_size or 1) * bound.size,
                              step_name=SKIP_STEP)
        self.world, self.share, self.skip = bound, bound.stream_share(self.config.streams), skip
        self.streams = self.share.streams

    def locate(self, indices: Sequence[int] | np.ndarray) -> Runs:
        """The runs of stored tokens behind examples ``indices`` of the global order (any
        rank's; :mod:`shardwise.read.orders.stream`): what the reader copies and ``trace``
        names."""
        return self.order.locate(indices)

    # -- identity and state ------------------------------------------------------------------
    def state_config(self) -> dict[str, Any]:
        """The plain fields a checkpoint must match (not the chunk count: it grows)."""
        out = {**self.config.state(), "cache": self.cache.fingerprint,
               "order_version": STREAM_ORDER_VERSION,
               "permutation_version": PERMUTATION_VERSION}
        if self.skip:  # compared by the skip rule on resume (checkpoint.SKIP_KEY); absent
            out[SKIP_KEY] = [list(r) for r in self.skip]  # when empty: prints stay the same
        return out

    @property
    def consumed(self) -> int:
        """Examples of the global order received by all ranks together (a position: the
        skipped ranges passed count too)."""
        return advance(self.skip, self._start, self._received * self.world.size, 1)

    def _position(self) -> tuple[int, dict[str, Any]]:
        c = self.consumed
        return c, {"stream_examples": [first_example(c, s, self.config.streams)
                                       for s in range(self.config.streams)]}

    def _seek(self, st: LoaderState) -> None:
        """Continue from a saved position (any world size)."""
        c = self.config
        check_not_past_end(st.consumed, self._end(), "examples", f"{c.epochs} epochs of "
                           f"{c.streams} streams, each padded to the longest")
        want = [first_example(st.consumed, s, c.streams) for s in range(c.streams)]
        got = st.extra.get("stream_examples", want)
        if not isinstance(got, list):
            raise StateError(f"stream_examples must be a list of {c.streams} counts, got "
                             f"{got!r}")
        got = [as_count(k, f"stream_examples[{s}]") for s, k in enumerate(got)]
        if got != want:
            raise StateError(f"stream_examples {got} do not match consumed={st.consumed} "
                             f"(expected {want}); the state was edited or damaged")
        self._stop_run()
        self._start, self._received = st.consumed, 0

    # -- lifecycle ------------------------------------------------------------------------
    def close(self) -> None:
        """Stop the prefetch thread and drop every loaded chunk."""
        self._stop_run()
        self.chunk_cache.clear()

    def __enter__(self) -> StreamDataset:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def chunk_cache(self) -> ChunkCache:
        return self._here.get().chunk_cache

    def _stop_run(self, run: Run | None = None) -> None:
        """Close ``run`` (by default the current one, forgotten) and count its waits, once."""
        if run is None:
            here = self._here.get()
            run, here.run = here.run, None
        if run is not None and run.close():
            for k, v in run.waited().items():
                self._waited[k] += v

    def stats(self) -> dict[str, Any]:
        waited = dict(self._waited)
        if (run := self._here.get().run) is not None:
            for k, v in run.waited().items():
                waited[k] += v
        return {**waited, "chunk_cache": self.chunk_cache.stats(),
                "chunks_read": sum(self.opened.values())}

    # -- iteration ------------------------------------------------------------------------
    def __iter__(self) -> Iterator[Example]:
        refuse_worker_process()
        refuse_framework_sharding("StreamDataset")
        self._stop_run()
        w = self.world
        return self._examples(self._start_run(first_example(self.consumed, w.rank, w.size)))

    def _start_run(self, j: int) -> Run:
        """A read-ahead serving this rank's examples from ``j`` (or the end of a skipped
        range holding it) up to the start of the next skipped range."""
        j, until = run_span(rank_ranges(self.skip, self.world.size), j)
        run = self._here.get().run = Run(self.order, self.chunk_cache, self.share, j_start=j,
                              until=until, poll_interval=self.poll_interval,
                              timeout=self.timeout, ahead_chunks=self.prefetch_chunks,
                              name=f"shardwise-stream-rank{self.world.rank}")
        return run

    def _examples(self, run: Run) -> Iterator[Example]:
        L, m = self.config.seq_len, len(self.streams)
        size = self.batch_size or 1
        current, firsts, step, until = run.current, run.firsts, self.share.step, run.until
        j = run.j_start
        try:
            while True:
                if run.closed:
                    raise RuntimeError("this stream iterator was stopped by close() or "
                                       "load_state_dict(); call iter() again")
                rows = np.zeros((size, L + 1), dtype=np.int64)
                valid = np.zeros(size, dtype=np.int64)
                n = 0
                while n < size:
                    if j == until:  # a skipped range: read on from its end
                        self._stop_run(run)
                        run = self._start_run(j)
                        current, until, j = run.current, run.until, run.j_start
                        continue
                    u, t = divmod(j, m)
                    k = firsts[t] + u * step
                    item = current[t]
                    if item is None or k >= item.stop:
                        if item is not None:
                            run.release(item)
                        item = current[t] = run.next(t, k)
                        if item is None:
                            break
                    valid[n] = item.fill(rows[n], k - item.start, L)
                    n += 1
                    j += 1
                if n == 0:
                    return
                batch = self._shaped(rows[:n], valid[:n], L)
                self._received += n
                yield batch if self.batch_size else {key: v[0] for key, v in batch.items()}
                if n < size:
                    return
        finally:
            if (here := self._here.get()).run is run:
                here.run = None
            self._stop_run(run)

    def _shaped(self, rows: npt.NDArray[np.int64], valid: npt.NDArray[np.int64], L: int
                ) -> Example:
        keep = () if self.batch_size else ("loss_mask",)  # single examples: fixed keys
        return shaped_examples(rows, valid, L, self.output, self.cache.dtype, keep)

__all__ = ["STREAM_ORDER_VERSION", "StreamDataset"]
