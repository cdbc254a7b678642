"""Chunks: immutable, checksummed units of a cache, and their publication.

A token chunk is ``<stem>.bin`` + ``<stem>.idx`` (Megatron layout) + ``<stem>.json``
(metadata); a record chunk is ``<stem>.parquet`` + ``<stem>.json``. The metadata file
is renamed into place last, after the data files, so a chunk with metadata is complete;
the ledger names it only after that, and readers trust only the ledger. On an object
store (no rename) each file is one whole-object PUT: the data files (at once), then the
metadata. :class:`ChunkFiles` is a chunk made but not yet published (a build makes the
next chunk while one uploads).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import asdict, dataclass, field, replace
from enum import Enum
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import orjson

from shardwise.format.checksum import BLOCK_BYTES, block_checksums, bytes_checksum
from shardwise.format.files import Files, Payload
from shardwise.format.megatron import idx_bytes

IGNORE_INDEX = -100  # a label that takes no loss (record chunks' ``labels``; Hugging Face's)


class ChunkKind(str, Enum):
    TOKENS = "tokens"
    RECORDS = "records"


DATA_SUFFIXES = {ChunkKind.TOKENS: (".bin", ".idx"), ChunkKind.RECORDS: (".parquet",)}
META_SUFFIX = ".json"


def chunk_stem(source: int, segment: int, index: int) -> str:
    """The cache-relative stem of chunk ``index`` of ``segment`` of ``source``."""
    return f"chunks/{source:05d}/{segment:05d}-{index:05d}"


@dataclass(frozen=True)
class SourceRange:
    """Where in its source a chunk's documents came from.

    ``unit`` is ``byte`` (JSONL: ``start``/``stop`` are absolute byte offsets of the
    uncompressed stream) or ``row`` (Parquet). ``line_start``/``line_stop`` count lines
    (rows) from the start of the segment, 0-based, stop exclusive.
    """

    unit: str
    start: int
    stop: int
    line_start: int
    line_stop: int


@dataclass(frozen=True)
class ChunkMeta:
    """Everything known about a published chunk; written as ``<stem>.json``.

    ``skipped_lines``: the lines (rows) of ``range`` that became no document (records a
    build skipped under ``on_error='skip'``), counted like ``line_start``; ``None`` when
    there are none, so the ``.json`` of such a chunk is what it always was. It names each
    document's source line exactly (``shardwise trace``)."""

    stem: str
    kind: ChunkKind
    source: int
    source_path: str
    segment: int
    index: int
    documents: int
    tokens: int
    range: SourceRange
    files: dict[str, dict[str, Any]] = field(default_factory=dict)
    format_version: int = 1
    skipped_lines: list[int] | None = None

    def to_json(self) -> bytes:
        d = asdict(self)
        d["kind"] = self.kind.value
        if self.skipped_lines is None:  # optional: absent when every line is a document
            del d["skipped_lines"]
        return orjson.dumps(d, option=orjson.OPT_SORT_KEYS | orjson.OPT_INDENT_2)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ChunkMeta:
        """The metadata ``d`` holds, its fields' types checked (a cache is untrusted
        input: a ``"files": []`` must not reach a ``.get``); TypeError or ValueError."""
        d = dict(d)
        d["kind"] = ChunkKind(d["kind"])
        d["range"] = SourceRange(**d["range"])
        meta = cls(**d)
        meta.check()
        return meta

    def check(self) -> None:
        ints = (self.source, self.segment, self.index, self.documents, self.tokens,
                self.format_version, self.range.start, self.range.stop,
                self.range.line_start, self.range.line_stop)
        if not all(type(v) is int for v in ints) or min(ints[:5]) < 0:
            raise ValueError(f"counts and positions {ints}, expected integers (counts >= 0)")
        if not isinstance(self.stem, str) or not isinstance(self.source_path, str):
            raise TypeError(f"stem {self.stem!r:.60} and source_path, expected strings")
        if not isinstance(self.files, dict) or not all(
                isinstance(e, dict) and type(e.get("bytes")) is int and e["bytes"] >= 0
                and isinstance(e.get("xxh3_64"), str) for e in self.files.values()):
            raise TypeError(f"files is {self.files!r:.80}, expected an object of "
                            "{suffix: {bytes, xxh3_64}}")
        skipped = self.skipped_lines
        if skipped is not None and not (isinstance(skipped, list)
                                        and all(type(v) is int for v in skipped)):
            raise TypeError(f"skipped_lines is {skipped!r:.60}, expected a list of lines")


@dataclass(frozen=True)
class ChunkFiles:
    """A chunk made, not yet published: its metadata, the metadata's checksum (what the
    ledger records), and its files' bytes by suffix in publication order (the data
    files, then the metadata)."""

    stem: str
    meta: ChunkMeta
    meta_xxh3: str
    payloads: dict[str, Payload]

    def publish(self, root: Files) -> None:
        """:meth:`Files.publish`: temp name, fsync, rename locally; one whole-object PUT
        each on an object store; the metadata only once every data file is in place."""
        root.publish(self.stem, self.payloads)


def _file_entry(suffix: str, data: Payload) -> dict[str, Any]:
    """A data file's entry in the metadata: size and xxh3-64; a ``.bin``'s also the sums
    of its blocks (``block_bytes``, ``block_xxh3_64``: ranged reads are checked by them)."""
    entry: dict[str, Any] = {"bytes": len(data), "xxh3_64": bytes_checksum(data)}
    if suffix == ".bin":
        entry.update(block_bytes=BLOCK_BYTES, block_xxh3_64=block_checksums(data))
    return entry


def _as_it_was(meta: ChunkMeta) -> Iterator[ChunkMeta]:
    """``meta``, then how an older build wrote the same chunk: without the optional fields
    added since (``skipped_lines``, the ``.bin``'s block sums), one and both dropped."""
    no_blocks = {s: {k: v for k, v in e.items() if not k.startswith("block_")}
                 for s, e in meta.files.items()}
    yield meta
    yield replace(meta, files=no_blocks)
    if meta.skipped_lines is not None:
        yield replace(meta, skipped_lines=None)
        yield replace(meta, files=no_blocks, skipped_lines=None)


def _files(stem: str, payloads: dict[str, Payload], meta_fields: dict[str, Any],
           expect: str = "") -> ChunkFiles:
    """The chunk's files, its metadata last. ``expect``: the checksum the metadata must
    have (a repair's, from the ledger): a chunk an older build wrote is made as it was
    (format/SPEC.md, "Repair"); if no form has it, the current form is made and the
    coordinator names the difference."""
    files = {suffix: _file_entry(suffix, data) for suffix, data in payloads.items()}
    meta = ChunkMeta(stem=stem, files=files, **meta_fields)
    meta_bytes = meta.to_json()
    if expect and bytes_checksum(meta_bytes) != expect:
        for older in _as_it_was(meta):
            if bytes_checksum(older.to_json()) == expect:
                meta, meta_bytes = older, older.to_json()
                break
    return ChunkFiles(stem, meta, bytes_checksum(meta_bytes),
                      {**payloads, META_SUFFIX: meta_bytes})


def token_chunk(stem: str, tokens: npt.NDArray[np.generic],
                doc_lengths: npt.NDArray[np.int64], meta_fields: dict[str, Any],
                expect: str = "") -> ChunkFiles:
    """A Megatron ``.bin/.idx`` chunk's files (the ``.bin`` a view of ``tokens``: no copy;
    ``expect``: see :func:`_files`)."""
    payloads: dict[str, Payload] = {
        ".bin": np.ascontiguousarray(tokens).data.cast("B"),
        ".idx": idx_bytes(doc_lengths, tokens.dtype)}
    fields = dict(meta_fields, kind=ChunkKind.TOKENS, documents=len(doc_lengths),
                  tokens=int(np.sum(doc_lengths, dtype=np.int64)))
    return _files(stem, payloads, fields, expect)


def record_chunk(stem: str, table: Any, tokens: int, meta_fields: dict[str, Any],
                 expect: str = "") -> ChunkFiles:
    """A Parquet chunk's files (processed records: token ids plus other fields)."""
    fields = dict(meta_fields, kind=ChunkKind.RECORDS, documents=table.num_rows, tokens=tokens)
    return _files(stem, {".parquet": parquet_bytes(table)}, fields, expect)


def publish_token_chunk(root: Files, stem: str, tokens: npt.NDArray[np.generic],
                        doc_lengths: npt.NDArray[np.int64],
                        meta_fields: dict[str, Any]) -> tuple[ChunkMeta, str]:
    """Publish a Megatron ``.bin/.idx`` chunk; returns its metadata and the metadata's checksum."""
    made = token_chunk(stem, tokens, doc_lengths, meta_fields)
    made.publish(root)
    return made.meta, made.meta_xxh3


def parquet_bytes(table: Any) -> bytes:
    """Serialise an Arrow table to Parquet deterministically (zstd, no statistics drift)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, compression="zstd", write_statistics=False)
    return sink.getvalue().to_pybytes()


def publish_record_chunk(root: Files, stem: str, table: Any, tokens: int,
                         meta_fields: dict[str, Any]) -> tuple[ChunkMeta, str]:
    """Publish a Parquet chunk of processed records (token ids plus other fields)."""
    made = record_chunk(stem, table, tokens, meta_fields)
    made.publish(root)
    return made.meta, made.meta_xxh3


def read_meta(path: Path) -> ChunkMeta:
    return ChunkMeta.from_dict(orjson.loads(path.read_bytes()))
