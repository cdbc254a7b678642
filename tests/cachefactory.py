"""Write small, valid shardwise caches directly with the format functions.

Tests of readers, ``verify``, ``convert`` and ``inspect`` need caches whose exact content
they know, without running a build (tokenizers, executors). :func:`make_cache` writes
the same files a build would: chunks published with ``publish_token_chunk`` /
``publish_record_chunk``, a ``Ledger`` naming them, a ``Manifest``.

Import it from a test with::

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/
    from cachefactory import make_cache, sample_docs
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from shardwise.format.chunk import (
    ChunkKind,
    SourceRange,
    chunk_stem,
    publish_record_chunk,
    publish_token_chunk,
)
from shardwise.format.files import LocalFiles
from shardwise.format.ledger import ChunkEntry, Ledger, Segment, SourceProgress
from shardwise.format.manifest import Manifest, SourceInfo, TokenizerInfo, manifest_checksum

Docs = Sequence[Sequence[int]]


def sample_docs(n: int, *, seed: int = 0, vocab_size: int = 1000, max_len: int = 300
                ) -> list[list[int]]:
    """``n`` documents of random ids; lengths spread over several powers of two."""
    rng = np.random.default_rng(seed)
    lengths = np.minimum(rng.geometric(1 / 40, size=n), max_len)
    return [rng.integers(0, vocab_size, size=int(k)).tolist() for k in lengths]


def make_cache(root: Path, sources: Sequence[Docs], *, chunk_docs: int = 3,
               segment_docs: int | None = None, kind: str = "tokens",
               dtype: str = "uint16", vocab_size: int = 1000, eod_id: int | None = None,
               unfinished_last: bool = False) -> Path:
    """A cache in ``root`` holding ``sources`` (one list of documents per source).

    Each source is cut into segments of ``segment_docs`` documents (default: one segment)
    and each segment into chunks of ``chunk_docs``. Positions count rows (``unit='row'``).
    ``unfinished_last`` leaves the last segment of the last source mid-way: its last
    chunk is not published and the segment is not finished (a build in progress).
    """
    root.mkdir(parents=True, exist_ok=True)
    progress = []
    for s, docs in enumerate(sources):
        per_seg = segment_docs or max(len(docs), 1)
        starts = list(range(0, max(len(docs), 1), per_seg))
        segments = [_segment(root, s, g, docs, a, min(a + per_seg, len(docs)), chunk_docs,
                             kind, dtype) for g, a in enumerate(starts)]
        progress.append(SourceProgress(segments))
    if unfinished_last and progress and progress[-1].segments[-1].chunks:
        seg = progress[-1].segments[-1]
        dropped = seg.chunks.pop()
        seg.finished = False
        seg.position = seg.stop - dropped.documents
        seg.line = seg.position - seg.start
    _manifest(sources, kind, dtype, vocab_size, eod_id).save(LocalFiles(root))
    Ledger(progress, manifest_xxh3=manifest_checksum(LocalFiles(root))).save(LocalFiles(root))
    return root


def _segment(root: Path, s: int, g: int, docs: Docs, start: int, stop: int,
             chunk_docs: int, kind: str, dtype: str) -> Segment:
    entries = []
    for k, a in enumerate(range(start, stop, chunk_docs)):
        b = min(a + chunk_docs, stop)
        fields = {"source": s, "source_path": f"source-{s}.jsonl", "segment": g, "index": k,
                  "range": SourceRange("row", a, b, a - start, b - start)}
        stem = chunk_stem(s, g, k)
        part = [list(d) for d in docs[a:b]]
        if kind == ChunkKind.TOKENS.value:
            flat = np.array([t for d in part for t in d], dtype=dtype)
            lengths = np.array([len(d) for d in part], dtype=np.int64)
            meta, digest = publish_token_chunk(LocalFiles(root), stem, flat, lengths, fields)
        else:
            meta, digest = publish_record_chunk(LocalFiles(root), stem, _table(part),
                                                sum(len(d) for d in part), fields)
        entries.append(ChunkEntry(stem, meta.documents, meta.tokens, digest))
    return Segment(start=start, stop=stop, position=stop, line=stop - start, finished=True,
                   chunks=entries)


def _table(docs: list[list[int]]) -> object:
    import pyarrow as pa

    ids = pa.array(docs, type=pa.list_(pa.int32()))
    masks = pa.array([[1] * len(d) for d in docs], type=pa.list_(pa.int8()))
    return pa.table({"input_ids": ids, "loss_mask": masks})


def _manifest(sources: Sequence[Docs], kind: str, dtype: str, vocab_size: int,
              eod_id: int | None) -> Manifest:
    infos = [SourceInfo(path=f"source-{s}.jsonl", size=sum(len(d) for d in docs),
                        fingerprint=f"fp{s}", format="jsonl") for s, docs in enumerate(sources)]
    return Manifest(tokenizer=TokenizerInfo("test-tokenizer", vocab_size, eod_id), dtype=dtype,
                    chunk_kind=kind, processor={"kind": "test"},
                    chunking={"max_docs": None, "max_bytes": None, "segment_bytes": None},
                    sources=infos, created_by="tests/cachefactory.py")
