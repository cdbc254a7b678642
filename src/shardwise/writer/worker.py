"""One segment of one source → published chunks, reported message by message.

The worker cuts chunks by the :class:`ChunkPolicy` alone, starting from the position the
ledger recorded, so a resumed segment produces exactly the chunks an uninterrupted one
would; a repair task (``Task.rebuild``) starts where a damaged chunk started and stops
after republishing it, with the same stem and bytes. It publishes each chunk (temp files,
fsync, rename; to a bucket, uploads in the background while it makes the next chunk:
:mod:`~shardwise.writer.publishing`) *before* reporting it; the coordinator then names it
in the ledger.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import numpy as np

from shardwise.errors import ConfigError, InputError
from shardwise.format.chunk import ChunkFiles, SourceRange, chunk_stem, record_chunk, token_chunk
from shardwise.format.ledger import ChunkEntry, Segment
from shardwise.format.manifest import SourceInfo
from shardwise.sources.discovery import SourceFormat
from shardwise.sources.on_error import OnError
from shardwise.sources.records import DEFAULT_MAX_RECORD_BYTES, Located, iter_records, relocate
from shardwise.storage.opening import open_store
from shardwise.writer.config import ChunkPolicy
from shardwise.writer.processors import Processor
from shardwise.writer.publishing import Publisher

BATCH_RECORDS = 1024
BATCH_BYTES = 32 << 20
"""A batch of records goes to the processor after 1024 records or 32 MB of source,
whichever comes first: memory follows the text held, not the number of records."""


@dataclass(frozen=True)
class Job:
    """What every task of one build shares; sent to each worker process once."""

    root: str
    processor: Processor
    policy: ChunkPolicy
    on_error: OnError
    dtype: str
    vocab_size: int
    records: bool = False
    max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES
    storage_options: dict[str, Any] | None = None  # for a URL root; never written anywhere


@dataclass(frozen=True)
class Task:
    """A segment to (continue to) build. ``segment`` carries position, line, chunks, errors.

    ``rebuild`` > 0 makes it a repair: republish only the ``rebuild`` chunks that start at
    ``segment.position`` (numbered from ``len(segment.chunks)``), then end with
    :class:`ChunksRebuilt` instead of :class:`SegmentDone`. ``expect``: the ledger's
    ``meta_xxh3`` of those chunks, in order (a chunk an older build wrote, before
    ``skipped_lines`` or block sums existed, is republished as it was, so it hashes as it
    did)."""

    source: int
    info: SourceInfo
    seg_index: int
    segment: Segment
    rebuild: int = 0
    expect: tuple[str, ...] = ()


@dataclass(frozen=True)
class ChunkDone:
    source: int
    seg_index: int
    entry: ChunkEntry
    position: int
    line: int
    errors: dict[str, int]


@dataclass(frozen=True)
class SegmentDone:
    source: int
    seg_index: int
    position: int
    line: int
    errors: dict[str, int]


@dataclass(frozen=True)
class ChunksRebuilt:
    """A repair task's end: its chunks were republished (each reported by ChunkDone)."""

    source: int
    seg_index: int


TASK_END = (SegmentDone, ChunksRebuilt)  # the last message of every task


@dataclass(frozen=True)
class Progress:
    documents: int
    tokens: int
    bytes_read: int


@dataclass
class _Pending:
    """Documents of the chunk being filled."""

    docs: list[Any] = field(default_factory=list)
    lines: list[int] = field(default_factory=list)
    nbytes: int = 0
    tokens: int = 0
    empty: int = 0
    start: int = 0
    line_start: int = 0
    end: int = 0  # after the last document: where the chunk ends if it is cut lazily
    line_end: int = 0
    errors: dict[str, int] = field(default_factory=dict)  # skipped records up to ``end``


Emit = Callable[[object], None]


class SegmentBuilder:
    """Accumulates documents and publishes a chunk whenever the policy says it is full."""

    def __init__(self, job: Job, task: Task, emit: Emit) -> None:
        self.job = job
        self.t = task
        self.emit = emit
        self.publisher = Publisher(open_store(job.root, job.storage_options))
        self.itemsize = np.dtype(job.dtype).itemsize
        self.next_index = len(task.segment.chunks)
        self.limit = self.next_index + task.rebuild if task.rebuild else None
        self.errors = dict(task.segment.errors)
        self.pending = _Pending(start=task.segment.position, line_start=task.segment.line)
        self.last_end = task.segment.position
        self.last_line = task.segment.line
        # a document of this many tokens is empty: only the appended end-of-document
        self.empty_length = int(getattr(job.processor, "appended_tokens", 0))

    def _check_ids(self, ids: Any, line: int) -> None:
        if len(ids) and (int(np.max(ids)) >= self.job.vocab_size or int(np.min(ids)) < 0):
            raise ConfigError(f"{self.t.info.shown}: a token id in [{int(np.min(ids))}, "
                              f"{int(np.max(ids))}] at line {line + 1} of segment "
                              f"{self.t.seg_index} is outside the vocabulary of "
                              f"{self.job.vocab_size}")

    def add(self, doc: Any, end: int, line: int) -> None:
        """Add a document; a full chunk is published first, when this document has tokens.

        Cutting *before* the next document with tokens (not right after the document
        that filled the chunk) lets empty documents that follow join the chunk: a chunk
        without tokens has an empty ``.bin``, which Megatron-Core cannot map."""
        ids = doc["input_ids"] if isinstance(doc, dict) else doc
        n = len(ids)
        if isinstance(doc, dict):
            self._check_ids(ids, line)  # token chunks are checked once per chunk instead
        if n:
            self.publish_if_full()
        p = self.pending
        p.docs.append(doc)
        p.lines.append(line)
        p.tokens += n
        p.empty += n <= self.empty_length
        p.nbytes += n * self.itemsize
        p.end, p.line_end, p.errors = end, line + 1, dict(self.errors)

    def publish_if_full(self) -> None:
        """Publish the pending chunk if the policy says it is full. It ends after its last
        document, as if it had been cut right then (records skipped since belong to the
        next chunk), so a cache without empty documents is cut as it always was."""
        p = self.pending
        if self.job.policy.full(len(p.docs), p.nbytes):
            self.publish(p.end, p.line_end, p.errors)

    def count(self, err: InputError, located: Located) -> None:
        if self.job.on_error is OnError.RAISE:
            self.publish_if_full()  # the work before a bad record is kept
            self.publisher.flush()
            err = relocate(err, self.t.info, self.t.segment.start, located.line,
                           self.job.storage_options)
            raise err
        self.errors[err.reason] = self.errors.get(err.reason, 0) + 1

    @property
    def done(self) -> bool:
        """A repair task has republished all its chunks."""
        return self.limit is not None and self.next_index >= self.limit

    def publish(self, end: int, line: int, errors: dict[str, int] | None = None) -> None:
        """Publish the pending chunk as ending at ``end`` (line ``line``), with ``errors``
        (default: every record skipped so far) as the segment's count up to there."""
        p = self.pending
        if not p.docs or self.done:
            return
        t = self.t
        stem = chunk_stem(t.source, t.seg_index, self.next_index)
        unit = SourceFormat(t.info.format).unit
        fields = {"source": t.source, "source_path": t.info.shown, "segment": t.seg_index,
                  "index": self.next_index,
                  "range": SourceRange(unit, p.start, end, p.line_start, line)}
        skipped = _skipped_lines(p.lines, p.line_start, line)
        if skipped:
            fields["skipped_lines"] = skipped
        k = self.next_index - len(t.segment.chunks)
        # a repair republishes a chunk as an older build wrote it (format/SPEC.md); any
        # other difference is the coordinator's to name
        made = self._make_files(stem, fields, t.expect[k] if k < len(t.expect) else "")
        done = ChunkDone(t.source, t.seg_index,
                         ChunkEntry(stem, made.meta.documents, made.meta.tokens,
                                    made.meta_xxh3, p.empty),
                         end, line, dict(self.errors if errors is None else errors))
        # reported once its files are all in place (in the background on a bucket)
        self.publisher.publish(made, partial(self.emit, done))
        self.next_index += 1
        self.pending = _Pending(start=end, line_start=line)

    def _make_files(self, stem: str, fields: dict[str, Any], expect: str) -> ChunkFiles:
        """The pending chunk's files and metadata, not published yet (``expect``: a
        repair's checksum of the metadata, :func:`~shardwise.format.chunk.token_chunk`)."""
        p, job = self.pending, self.job
        if job.records:
            return record_chunk(stem, _records_table(p.docs), p.tokens, fields, expect)
        lengths = np.fromiter((len(d) for d in p.docs), dtype=np.int64, count=len(p.docs))
        ids = p.docs[0] if len(p.docs) == 1 else np.concatenate(p.docs)
        if ids.size and (int(ids.max()) >= job.vocab_size or int(ids.min()) < 0):
            for doc, line in zip(p.docs, p.lines, strict=True):  # name the record
                self._check_ids(doc, line)
        return token_chunk(stem, ids.astype(job.dtype, copy=False), lengths, fields, expect)


def _skipped_lines(lines: list[int], start: int, stop: int) -> list[int]:
    """The lines of ``[start, stop)`` that became no document (skipped records), in order;
    empty, in O(1), when every line did."""
    if len(lines) == stop - start:
        return []
    return np.setdiff1d(np.arange(start, stop, dtype=np.int64),
                        np.asarray(lines, dtype=np.int64)).tolist()


def _records_table(docs: list[dict[str, Any]]) -> Any:
    import pyarrow as pa

    rows = [{k: (v.tolist() if isinstance(v, np.ndarray) else v) for k, v in d.items()}
            for d in docs]
    table = pa.Table.from_pylist(rows)
    ids = table.column("input_ids").cast(pa.list_(pa.int32()))
    return table.set_column(table.schema.get_field_index("input_ids"), "input_ids", ids)


def run_task(job: Job, task: Task, emit: Emit) -> None:
    """Build one segment from its recorded position to its end."""
    builder = SegmentBuilder(job, task, emit)
    error: BaseException | None = None
    try:
        _add_records(builder)
        stop = task.segment.stop if task.segment.stop >= 0 else builder.last_end
        builder.publish(stop, builder.last_line)
        builder.publisher.flush()  # the last chunk's files in place, reported
    except BaseException as e:
        error = e
        raise
    finally:
        builder.publisher.close(error)
        builder.publisher.store.close()
    if task.rebuild:
        emit(ChunksRebuilt(task.source, task.seg_index))
        return
    emit(SegmentDone(task.source, task.seg_index, stop, builder.last_line,
                     dict(builder.errors)))


def _add_records(builder: SegmentBuilder) -> None:
    """Read, process and add every record, in batches of ``BATCH_RECORDS`` records or
    ``BATCH_BYTES`` of source; the records' texts are gone when this returns."""
    job, task = builder.job, builder.t
    batch: list[Located] = []
    batch_start = task.segment.position
    for located in iter_records(task.info, task.segment, task.segment.position,
                                task.segment.line, columns=job.processor.columns(),
                                max_record_bytes=job.max_record_bytes,
                                storage_options=job.storage_options):
        batch.append(located)
        if len(batch) >= BATCH_RECORDS or located.end - batch_start >= BATCH_BYTES:
            _flush(builder, batch)
            batch, batch_start = [], located.end
            if builder.done:
                break
    _flush(builder, batch)


def _flush(builder: SegmentBuilder, batch: list[Located]) -> None:
    """Process a batch of records and feed the builder, in order."""
    if not batch:
        return
    t = builder.t
    good = [loc.value for loc in batch if not isinstance(loc.value, InputError)]
    docs = iter(builder.job.processor.process(good) if good else [])  # type: ignore[arg-type]
    n_docs = n_tokens = 0
    started = builder.last_end
    for loc in batch:
        value = loc.value if isinstance(loc.value, InputError) else next(docs)
        if isinstance(value, InputError):
            if not value.path:  # from the processor: add where the record came from
                value = InputError(f"{t.info.shown}:{loc.line + 1}: {value}",
                                   path=t.info.shown, line=loc.line + 1, reason=value.reason)
            builder.count(value, loc)
        else:
            n_docs += 1
            n_tokens += len(value["input_ids"] if isinstance(value, dict) else value)
            builder.add(value, loc.end, loc.line)
        builder.last_end, builder.last_line = loc.end, loc.line + 1
    builder.emit(Progress(n_docs, n_tokens, builder.last_end - started))
