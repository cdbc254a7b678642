"""The sequential, resumable view of one rank's producer directory: ``ds.stream()``.

Why its own module: :class:`~shardwise.read.external.producer_dir.ProducerDirDataset` is
map-style (its position lives in the sampler that walks it); this view holds its own
position (chunk, record) so it plugs into
:class:`~shardwise.read.records.consumer.SequentialConsumer` and the torch loader.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from shardwise.checkpoint import LoaderState, Resumable
from shardwise.errors import StateError
from shardwise.read.external.producer_dir.producer import EndOfData
from shardwise.read.guard import GuardedReader, refuse_framework_sharding

if TYPE_CHECKING:
    from shardwise.read.external.producer_dir.dataset import ProducerDirDataset


class ProducerDirStream(GuardedReader, Resumable):
    """This rank's records in order, one pass, from a saved position; iterable.

    It ends after the last declared chunk (``num_chunks`` may be declared late, in
    ``_EXPECTED``, to mark the end); without a declaration it waits for the next chunk
    until ``timeout``. The done marker of a chunk is written when its last record is
    handed out. One reader per rank: under DataLoader workers each worker would read the
    whole stream — use ``num_workers=0`` or :class:`SequentialConsumer`.

    State keys (``LoaderState``): ``consumed`` (records handed out), ``extra.chunk`` (the
    global index of the chunk of the next record) and ``extra.record`` (its index in the
    chunk). Saved by one rank, it resumes that rank of the same world size only.
    """

    state_kind = "producer_dir"

    def __init__(self, ds: ProducerDirDataset) -> None:
        self.ds = ds
        self.next_chunk = ds.world.rank
        self.next_record = 0
        self.consumed = 0

    def __iter__(self) -> Iterator[Any]:
        refuse_framework_sharding("a ProducerDirDataset stream")
        ds, step = self.ds, self.ds.world.size
        while True:
            c, start = self.next_chunk, self.next_record
            try:
                records = ds.chunk(c).records
            except EndOfData:
                return
            for r in range(start, len(records)):
                last = r + 1 == len(records)
                self.next_chunk, self.next_record = (c + step, 0) if last else (c, r + 1)
                self.consumed += 1
                if last:
                    ds.finish(c)
                yield records[r]
            if start >= len(records):  # an empty chunk, or resumed at a chunk's end
                ds.finish(c)
                self.next_chunk, self.next_record = c + step, 0
            del records  # not alive while the next chunk loads

    def state_config(self) -> dict[str, Any]:
        return self.ds.state_config()

    def _position(self) -> tuple[int, dict[str, Any]]:
        return self.consumed, {"chunk": self.next_chunk, "record": self.next_record}

    def _seek(self, st: LoaderState) -> None:
        chunk, record = st.extra_counts("chunk", "record")
        w = self.ds.world
        if chunk % w.size != w.rank:
            raise StateError(f"state position chunk={chunk!r} record={record!r} is not a "
                             f"position of rank {w.rank} of {w.size}")
        n = self.ds.declared().num_chunks
        end = None if n is None else n + (w.rank - n) % w.size  # after this rank's last
        if end is not None and (chunk, record) > (end, 0):
            raise StateError(f"state position chunk={chunk} record={record} is past the end "
                             f"of this rank's chunks ({n} declared: it ends at chunk {end}); "
                             "the state belongs to another producer directory or run")
        self.next_chunk, self.next_record, self.consumed = chunk, record, st.consumed


__all__ = ["ProducerDirStream"]
