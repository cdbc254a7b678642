"""Is one chunk intact? The one per-chunk check of ``verify``, of the readers' background
verification (:mod:`shardwise.storage.integrity`) and of a build deciding what to
rebuild (:mod:`shardwise.writer.repair`), to a :class:`CheckDepth`.

A chunk's files must resolve inside the cache; its ``.json`` must have the checksum the
ledger recorded and agree with the ledger (only then are the data files judged against
it: a damaged ``.json`` must not get intact data files blamed); each data file must have
the size (and xxh3) the metadata records; a token chunk's ``.idx`` must agree with its
``.bin`` and the ledger, a record chunk's Parquet must decode. Data files are hashed in
blocks (constant memory). A chunk on an object store (:func:`check_remote_chunk`) is
downloaded into a temporary directory first, and its findings name it by URL.
"""

from __future__ import annotations

import tempfile
from collections.abc import Collection
from dataclasses import dataclass, replace
from enum import Enum
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from shardwise.errors import CorruptChunkError, ManifestError
from shardwise.format.checksum import bytes_checksum, file_checksum, file_checksums
from shardwise.format.chunk import DATA_SUFFIXES, META_SUFFIX, ChunkKind, ChunkMeta
from shardwise.format.ledger import ChunkEntry
from shardwise.format.megatron import MegatronIndex, check_index, first_bad_id, open_bin, read_idx
from shardwise.format.paths import safe_join
from shardwise.remote.client import RemoteStore
from shardwise.storage.verify_report import Problem, VerifyReport, strip_advice
from shardwise.storage.verify_report import with_suffix as _with

CHUNK_FORMAT_VERSION = 1  # ChunkMeta.format_version this module understands


class CheckDepth(int, Enum):
    """How much of a chunk :func:`check_chunk` reads, each level including the ones before.

    ``SIZES`` reads only the small ``.json`` (its xxh3 against the ledger) and ``stat``s
    the data files (missing, truncated or grown). ``CHECKSUMS`` also hashes every data file
    (xxh3, streamed): it proves the bytes are the ones published, which is what a rerun of
    the build needs before keeping a chunk. ``STRUCTURE`` also parses the ``.idx`` against
    the ``.bin`` and decodes Parquet, which ``verify`` does.
    """

    SIZES = 1
    CHECKSUMS = 2
    STRUCTURE = 3


@dataclass(frozen=True)
class ChunkExpect:
    """What the manifest and the ledger say one chunk must be. ``segment`` / ``index``
    None: not compared (a reader knows a chunk by its ledger entry, not its position);
    ``kind`` / ``dtype`` None: unknown (a damaged manifest); ``vocab_size``: token ids
    must be below it (None: not checked)."""

    root: Path
    source: int
    entry: ChunkEntry
    kind: ChunkKind | None
    dtype: np.dtype | None
    segment: int | None = None
    index: int | None = None
    vocab_size: int | None = None  # token ids must be below it (None: not checked)

    @property
    def base(self) -> Path:
        return self.root / self.entry.stem



def check_chunk(exp: ChunkExpect, *, depth: CheckDepth = CheckDepth.STRUCTURE,
                suffixes: Collection[str] | None = None) -> VerifyReport:
    """Is one chunk intact, to ``depth``? Its files resolve inside the cache; its metadata
    has the ledger's checksum and agrees with it (data files are judged against it only
    if so: a damaged ``.json`` must not get intact data files blamed); each data file has
    the size (and, from ``CHECKSUMS``, the xxh3_64) the metadata records; at
    ``STRUCTURE``, a token chunk's ``.idx`` agrees with its ``.bin`` and the ledger and
    (with ``vocab_size``) its ids lie below the vocabulary, a record chunk's Parquet
    decodes. The one per-chunk check of ``verify``, of the readers' background
    verification and of a build deciding what to rebuild.

    ``suffixes``: hash only these data files (a reader that used only a chunk's ``.idx``
    must not read its whole ``.bin``); the others are still checked for presence and
    size. Returns this chunk's findings, each naming its file (``.ok``: intact). Constant
    memory: data files are hashed in blocks."""
    report = VerifyReport(str(exp.root))
    if not _inside(exp, report):
        return report
    meta, trusted = _check_meta(exp, report)
    kind = exp.kind or (meta.kind if meta is not None else None)
    if kind is None:
        return report
    files = meta.files if meta is not None and trusted else {}
    intact = {suffix for suffix in DATA_SUFFIXES[kind]
              if _check_file(_with(exp.base, suffix), files.get(suffix), report,
                             hash_it=depth >= CheckDepth.CHECKSUMS
                             and (suffixes is None or suffix in suffixes))}
    if depth < CheckDepth.STRUCTURE:
        return report
    if kind is ChunkKind.TOKENS:
        _check_token_chunk(exp, intact, report)
    else:
        _check_record_chunk(exp, report)
    return report


def check_remote_chunk(store: RemoteStore, exp: ChunkExpect, *,
                       depth: CheckDepth = CheckDepth.STRUCTURE) -> VerifyReport:
    """:func:`check_chunk` for a chunk on an object store (``exp.root`` is ignored): its
    objects are downloaded into a temporary directory, deleted on return; findings name
    them by URL."""
    with tempfile.TemporaryDirectory(prefix="shardwise-check-") as tmp:
        local = Path(tmp)
        for suffix in (META_SUFFIX, *DATA_SUFFIXES[exp.kind or ChunkKind.TOKENS]):
            download_object(store, exp.entry.stem + suffix, local)
        found = check_chunk(replace(exp, root=local), depth=depth)
    head = str(local)
    found.root = store.url
    found.problems = [Problem(store.url + p.path[len(head):] if p.path.startswith(head)
                              else p.path, p.what) for p in found.problems]
    return found


def _inside(exp: ChunkExpect, report: VerifyReport) -> bool:
    """Every file of the chunk resolves inside the cache (a symlink out is refused)."""
    kinds = [exp.kind] if exp.kind is not None else list(ChunkKind)
    suffixes = dict.fromkeys([META_SUFFIX, *(s for k in kinds for s in DATA_SUFFIXES[k])])
    ok = True
    for suffix in suffixes:
        path = _with(exp.base, suffix)
        try:
            safe_join(exp.root, exp.entry.stem + suffix, where=str(path))
        except ManifestError as e:
            report.bad(path, strip_advice(str(e), path))
            ok = False
    return ok



def download_object(store: RemoteStore, key: str, local: Path) -> None:
    """Copy object ``key`` to ``local/key``; a missing object is left missing (and then
    reported as missing by the local checks)."""
    dest = safe_join(local, key, where=store.url)
    dest.parent.mkdir(parents=True, exist_ok=True)
    try:
        store.download(key, dest)
    except FileNotFoundError:
        dest.unlink(missing_ok=True)



def _check_meta(exp: ChunkExpect, report: VerifyReport) -> tuple[ChunkMeta | None, bool]:
    """The ``.json``: present, the checksum the ledger recorded, parses, agrees.

    Returns the metadata (if it parses) and whether its checksum matched."""
    path = _with(exp.base, META_SUFFIX)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        report.bad(path, "missing (named by the ledger)")
        return None, False
    except OSError as e:
        report.bad(path, f"unreadable ({e})")
        return None, False
    report.bytes_checked += len(data)
    trusted = bytes_checksum(data) == exp.entry.meta_xxh3
    if not trusted:
        report.bad(path, f"xxh3_64 {bytes_checksum(data)}, the ledger says "
                   f"{exp.entry.meta_xxh3}")
    try:
        meta = ChunkMeta.from_dict(orjson.loads(data))
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError) as e:
        report.bad(path, f"not valid chunk metadata ({type(e).__name__}: {e})")
        return None, False
    for what in _meta_disagreements(meta, exp):
        report.bad(path, what)
    return meta, trusted


def _meta_disagreements(meta: ChunkMeta, exp: ChunkExpect) -> list[str]:
    got = (meta.stem, meta.source, meta.segment, meta.index, meta.documents, meta.tokens)
    want = (exp.entry.stem, exp.source, exp.segment, exp.index, exp.entry.documents,
            exp.entry.tokens)
    names = ("stem", "source", "segment", "index", "documents", "tokens")
    out = [f"{n} {g!r}, the ledger says {w!r}"
           for n, g, w in zip(names, got, want, strict=True) if w is not None and g != w]
    if meta.format_version != CHUNK_FORMAT_VERSION:
        out.append(f"format_version {meta.format_version!r}, this shardwise reads "
                   f"{CHUNK_FORMAT_VERSION}")
    if exp.kind is not None and meta.kind is not exp.kind:
        out.append(f"kind {meta.kind.value!r}, the manifest says {exp.kind.value!r}")
    if sorted(meta.files) != sorted(DATA_SUFFIXES[meta.kind]):
        out.append(f"lists files {sorted(meta.files)}, a {meta.kind.value} chunk has "
                   f"{sorted(DATA_SUFFIXES[meta.kind])}")
    return out


def _check_file(path: Path, info: dict[str, Any] | None, report: VerifyReport, *,
                hash_it: bool = True) -> bool:
    """Exists; size and xxh3_64 equal what the metadata recorded. True if proven intact
    (``info`` None or ``hash_it`` False: not hashed, nothing is proven)."""
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        report.bad(path, "missing (named by the ledger)")
        return False
    if info is None:
        return False
    if size != info.get("bytes"):
        report.bad(path, f"size {size} bytes, the metadata says {info.get('bytes')}")
        return False
    if not hash_it:
        return False
    block = info.get("block_bytes") if "block_xxh3_64" in info else None
    if block is not None and not (isinstance(block, int) and block > 0):
        report.bad(path, f"block_bytes {block!r} in its metadata, expected a positive int")
        return False
    # 8 MiB pieces: constant memory; the block sums, if any, in the same read
    digest, sums = file_checksums(path, block) if block else (file_checksum(path), None)
    report.bytes_checked += size
    if digest != info.get("xxh3_64"):
        report.bad(path, f"xxh3_64 {digest}, the metadata says {info.get('xxh3_64')}")
        return False
    if sums is not None and sums != info["block_xxh3_64"]:
        report.bad(path, "intact (its xxh3_64 holds), but the block sums its metadata "
                   "records are not its blocks': a reader refuses ranged reads of it; a "
                   "shardwise bug, please report it")
    return True


def _check_token_chunk(exp: ChunkExpect, intact: set[str], report: VerifyReport) -> None:
    idx_path, bin_path = _with(exp.base, ".idx"), _with(exp.base, ".bin")
    if not (idx_path.is_file() and bin_path.is_file()):
        return
    index = check_idx_pair(idx_path, bin_path, report, bin_intact=".bin" in intact)
    if index is None:
        return
    if exp.dtype is not None and index.dtype != exp.dtype:
        report.bad(idx_path, f"dtype {index.dtype}, the manifest says {exp.dtype}")
    _check_counts(idx_path, index.num_sequences, index.num_tokens, exp, report)
    if exp.vocab_size is not None and ".bin" in intact:
        _check_ids(bin_path, index.dtype, exp.vocab_size, report)


def _check_ids(bin_path: Path, dtype: np.dtype, vocab_size: int, report: VerifyReport
               ) -> None:
    """Every token id of an intact ``.bin`` below the manifest's vocabulary (intact bytes
    can still disagree with the manifest: a cache made by another tool)."""
    tokens = open_bin(bin_path, dtype)
    k = first_bad_id(tokens, vocab_size)
    if k >= 0:
        report.bad(bin_path, f"token id {int(tokens[k])} at token {k}, outside the "
                   f"vocabulary of {vocab_size} ids (the manifest's vocab_size)")


def check_idx_pair(idx_path: Path, bin_path: Path, report: VerifyReport, *,
               bin_intact: bool = False) -> MegatronIndex | None:
    """Header and structure (``read_idx`` + ``check_index``), blamed on the right file:
    a size disagreement is the ``.bin``'s fault unless its checksum proved it intact.

    Returns the index unless the index itself is bad, so that a ``.bin`` of the wrong
    size still lets the index's counts be checked against the ledger."""
    try:
        index = read_idx(idx_path)
    except (CorruptChunkError, OSError, ValueError) as e:
        report.bad(idx_path, strip_advice(str(e), idx_path))
        return None
    try:
        check_index(index, bin_path)
    except CorruptChunkError as e:
        about_bin = str(e).startswith(f"{bin_path}:")
        if about_bin and not bin_intact:
            if not any(p.path == str(bin_path) for p in report.problems):  # not yet reported
                report.bad(bin_path, strip_advice(str(e), bin_path))
            return index
        what = strip_advice(str(e), bin_path if about_bin else idx_path)
        report.bad(idx_path, f"disagrees with the intact {bin_path.name}: {what}"
                   if about_bin else what)
        return None
    return index


def _check_counts(path: Path, documents: int, tokens: int | None, exp: ChunkExpect,
                  report: VerifyReport) -> None:
    """A chunk's own counts must equal the ledger's (``tokens`` None: not countable)."""
    if documents != exp.entry.documents:
        report.bad(path, f"holds {documents} documents, the ledger says {exp.entry.documents}")
    if tokens is not None and tokens != exp.entry.tokens:
        report.bad(path, f"holds {tokens} tokens, the ledger says {exp.entry.tokens}")


def _check_record_chunk(exp: ChunkExpect, report: VerifyReport) -> None:
    """Parquet: the footer parses, every row group decodes, rows == documents, and the
    ``input_ids`` lengths (if the column exists) sum to the ledger's tokens."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    path = _with(exp.base, ".parquet")
    if not path.is_file():
        return
    try:
        pf = pq.ParquetFile(path)
        has_ids = "input_ids" in pf.schema_arrow.names
        tokens = 0
        for g in range(pf.metadata.num_row_groups):  # one row group in memory at a time
            table = pf.read_row_group(g)
            if has_ids:
                tokens += int(pc.sum(pc.list_value_length(table.column("input_ids"))).as_py()
                              or 0)
        rows = pf.metadata.num_rows
    except (OSError, pa.ArrowException, ValueError) as e:
        report.bad(path, f"unreadable Parquet ({e})")
        return
    _check_counts(path, rows, tokens if has_ids else None, exp, report)
