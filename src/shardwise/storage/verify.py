"""Check every byte a cache promises, and name each damaged file by its path.

Readers trust the ledger and check only what is cheap (sizes, headers); ``verify`` is the
expensive, exhaustive pass an operator runs after a copy, a crash or a bad disk. It checks
**every** chunk the ledger names (not only the visible prefix) and collects **all**
problems instead of stopping at the first, so one run tells you everything to rebuild::

    BAD cache/chunks/00000/00000-00001.bin: xxh3_64 3f2a…, the metadata says 9c01…
    BAD cache/ledger.json: source 1 segment 0 chunk 0 names '../evil', not a relative path…

Files the ledger does not name (chunks published by a build killed before it updated the
ledger, ``.tmp-*`` leftovers) are *notes*, not problems: readers never see them and the
next build removes or replaces them. Data files are hashed in blocks (constant memory).

One chunk is checked by :func:`check_chunk` (:func:`check_remote_chunk` on an object
store), to a :class:`CheckDepth`: a rerun of the build uses it to find the chunks to
rebuild (``CHECKSUMS``), ``verify`` to find every problem (``STRUCTURE``).

A cache on an object store (:func:`verify_remote`, or ``verify_cache("s3://…")``) gets the
same checks, one chunk at a time downloaded into a temporary directory (constant disk),
and every finding names the object by its URL.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable, Collection, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext, suppress
from dataclasses import dataclass, field, replace
from enum import Enum
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import orjson

from shardwise.errors import CorruptChunkError, ManifestError
from shardwise.format.atomic import TMP_PREFIX
from shardwise.format.checksum import bytes_checksum, file_checksum
from shardwise.format.chunk import DATA_SUFFIXES, META_SUFFIX, ChunkKind, ChunkMeta, chunk_stem
from shardwise.format.ledger import LEDGER_NAME, ChunkEntry, Ledger, Segment
from shardwise.format.manifest import MANIFEST_NAME, Manifest
from shardwise.format.megatron import (
    MegatronIndex,
    check_index,
    dtype_code,
    first_bad_id,
    open_bin,
    read_idx,
)
from shardwise.format.paths import safe_join
from shardwise.storage.remote import RemoteStore, is_url

CHUNK_FORMAT_VERSION = 1  # ChunkMeta.format_version this module understands
_T = TypeVar("_T")


@dataclass(frozen=True, order=True)
class Problem:
    """One finding: the file it is about and what is wrong with it."""

    path: str
    what: str


@dataclass
class VerifyReport:
    """What :func:`verify_cache` found. ``notes`` (orphans, temp files) never fail it."""

    root: str
    problems: list[Problem] = field(default_factory=list)
    notes: list[Problem] = field(default_factory=list)
    chunks_checked: int = 0
    bytes_checked: int = 0

    @property
    def ok(self) -> bool:
        return not self.problems

    def bad(self, path: Path | str, what: str) -> None:
        self.problems.append(Problem(str(path), what))

    def to_dict(self) -> dict[str, Any]:
        return {"root": self.root, "ok": self.ok, "chunks_checked": self.chunks_checked,
                "bytes_checked": self.bytes_checked,
                "problems": [vars(p) for p in self.problems],
                "notes": [vars(p) for p in self.notes]}


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


def verify_cache(root: str | Path, *, storage_options: dict[str, Any] | None = None,
                 _fetch: Callable[[ChunkExpect], AbstractContextManager[None]] | None = None
                 ) -> VerifyReport:
    """Check a shardwise cache directory (or URL) exhaustively; never raises on damage."""
    if is_url(root):
        return verify_remote(str(root), storage_options=storage_options)
    root = Path(root)
    report = VerifyReport(str(root))
    manifest = _load(Manifest.load, root, MANIFEST_NAME, report)
    kind, dtype = _manifest_kind(root, manifest, report)
    ledger = _load(Ledger.load, root, LEDGER_NAME, report)
    if ledger is not None:
        if manifest is not None and len(manifest.sources) != len(ledger.sources):
            report.bad(root / LEDGER_NAME, f"{len(ledger.sources)} sources, the manifest "
                       f"lists {len(manifest.sources)}")
        trusted = _check_manifest_checksum(root, ledger, report)
        vocab = manifest.tokenizer.vocab_size if manifest is not None and trusted else None
        expects = list(_check_ledger(root, ledger, kind, dtype, report))
        for exp in expects:
            with _fetch(exp) if _fetch is not None else nullcontext():
                chunk = check_chunk(replace(exp, vocab_size=vocab))
            report.problems += chunk.problems
            report.bytes_checked += chunk.bytes_checked
            report.chunks_checked += 1
        _note_strays(root, {e.entry.stem for e in expects}, report)
    report.problems.sort()
    return report


def verify_remote(url: str, *, storage_options: dict[str, Any] | None = None
                  ) -> VerifyReport:
    """:func:`verify_cache` for a cache on an object store: each chunk's objects are
    downloaded into a temporary directory, checked, and deleted before the next chunk."""
    store = RemoteStore(url, storage_options)
    with tempfile.TemporaryDirectory(prefix="shardwise-verify-") as tmp:
        local = Path(tmp)
        for name in (MANIFEST_NAME, LEDGER_NAME):
            _download(store, name, local)

        @contextmanager
        def fetch(exp: ChunkExpect) -> Iterator[None]:
            suffixes = (META_SUFFIX, *DATA_SUFFIXES[exp.kind or ChunkKind.TOKENS])
            for suffix in suffixes:
                _download(store, exp.entry.stem + suffix, local)
            try:
                yield
            finally:
                shutil.rmtree(local / "chunks", ignore_errors=True)

        inner = verify_cache(local, _fetch=fetch)
    head = str(local)

    def named(p: Problem) -> Problem:
        path = store.url + p.path[len(head):] if p.path.startswith(head) else p.path
        return Problem(path, p.what)

    report = VerifyReport(store.url, problems=sorted(named(p) for p in inner.problems),
                          notes=[named(n) for n in inner.notes],
                          chunks_checked=inner.chunks_checked,
                          bytes_checked=inner.bytes_checked)
    named_stems: set[str] = set()
    with suppress(ManifestError):
        named_stems = {e.stem for src in Ledger.load(store).sources
                       for seg in src.segments for e in seg.chunks}
    for key in store.list_keys():
        stem = key.rsplit(".", 1)[0]
        if key.startswith("chunks/") and stem not in named_stems:
            report.notes.append(Problem(store.url_of(key), "orphan: not named by the ledger "
                                        "(left by an interrupted build; readers ignore it)"))
    return report


def _download(store: RemoteStore, key: str, local: Path) -> None:
    """Copy object ``key`` to ``local/key``; a missing object is left missing (and then
    reported as missing by the local checks)."""
    dest = safe_join(local, key, where=store.url)
    dest.parent.mkdir(parents=True, exist_ok=True)
    try:
        store.fs.get_file(store.key(key), str(dest))
    except FileNotFoundError:
        dest.unlink(missing_ok=True)


def verify_megatron(prefix: str | Path) -> VerifyReport:
    """Check a Megatron ``prefix.bin`` + ``prefix.idx`` pair: header, structure, sizes.

    Megatron files carry no checksums, so flipped token bits cannot be detected here.
    """
    prefix = Path(prefix)
    report = VerifyReport(str(prefix))
    idx_path, bin_path = _with(prefix, ".idx"), _with(prefix, ".bin")
    for p in (idx_path, bin_path):
        if not p.is_file():
            report.bad(p, "missing")
    if report.ok:
        _check_idx(idx_path, bin_path, report)
        report.chunks_checked = 1
        report.bytes_checked = idx_path.stat().st_size + bin_path.stat().st_size
    return report


def _with(base: Path, suffix: str) -> Path:
    return base.with_name(base.name + suffix)


def _load(load: Callable[[Path], _T], root: Path, name: str, report: VerifyReport
          ) -> _T | None:
    """``Manifest.load`` or ``Ledger.load``; a failure is a problem of that file."""
    try:
        return load(root)
    except ManifestError as e:
        report.bad(root / name, _strip(str(e), root / name))
        return None


def _manifest_kind(root: Path, manifest: Manifest | None, report: VerifyReport
                   ) -> tuple[ChunkKind | None, np.dtype | None]:
    """The chunk kind and token dtype every chunk must have (None: unknown)."""
    if manifest is None:
        return None, None
    path = root / MANIFEST_NAME
    kind = dtype = None
    try:
        kind = ChunkKind(manifest.chunk_kind)
    except ValueError:
        report.bad(path, f"chunk_kind {manifest.chunk_kind!r}, expected one of "
                   f"{[k.value for k in ChunkKind]}")
    try:
        dtype = np.dtype(manifest.dtype)
        dtype_code(dtype)
    except (TypeError, ValueError) as e:
        report.bad(path, f"dtype {manifest.dtype!r} is not a Megatron token dtype ({e})")
        dtype = None
    return kind, dtype


def _check_ledger(root: Path, ledger: Ledger, kind: ChunkKind | None,
                  dtype: np.dtype | None, report: VerifyReport) -> Iterator[ChunkExpect]:
    """Ledger-level consistency; yields the chunks whose files can be checked."""
    where = root / LEDGER_NAME
    seen: dict[str, str] = {}
    for s, src in enumerate(ledger.sources):
        for g, seg in enumerate(src.segments):
            at = f"source {s} segment {g}"
            if _mistyped(seg, ("start", "stop", "position", "line"), int, report, where, at):
                continue
            previous = src.segments[g - 1] if g else None
            for what in _segment_problems(seg, previous):
                report.bad(where, f"{at}: {what}")
            for k, entry in enumerate(seg.chunks):
                here = f"{at} chunk {k}"
                if (_mistyped(entry, ("documents", "tokens"), int, report, where, here)
                        or _mistyped(entry, ("stem", "meta_xxh3"), str, report, where, here)):
                    continue
                if entry.stem in seen:
                    report.bad(where, f"{here}: stem {entry.stem!r} already named by "
                               f"{seen[entry.stem]}")
                    continue
                seen[entry.stem] = here
                if entry.stem != chunk_stem(s, g, k):
                    report.bad(where, f"{here}: stem {entry.stem!r}, expected "
                               f"{chunk_stem(s, g, k)!r}")
                if entry.documents < 0 or entry.tokens < 0:
                    report.bad(where, f"{here}: negative documents or tokens")
                try:
                    safe_join(root, entry.stem, where=str(where))
                except ManifestError:
                    report.bad(where, f"{here} names {entry.stem!r}, not a relative path "
                               "inside the cache")
                    continue
                yield ChunkExpect(root, s, entry, kind, dtype, segment=g, index=k)


def _mistyped(obj: object, names: tuple[str, ...], kind: type, report: VerifyReport,
              where: Path, at: str) -> bool:
    """Report fields of the wrong JSON type (the ledger loader does not check types)."""
    bad = [n for n in names if not isinstance(getattr(obj, n), kind)
           or isinstance(getattr(obj, n), bool)]
    for n in bad:
        report.bad(where, f"{at}: {n} is {getattr(obj, n)!r}, expected {kind.__name__}")
    return bool(bad)


def _segment_problems(seg: Segment, previous: Segment | None) -> list[str]:
    """``start <= position <= stop``; ``stop`` is -1 while a compressed source's end is
    unknown; a finished segment has reached its stop; segments tile their source."""
    out = []
    if seg.start < 0 or seg.position < seg.start:
        out.append(f"position {seg.position} before start {seg.start}")
    if seg.stop >= 0 and seg.position > seg.stop:
        out.append(f"position {seg.position} beyond stop {seg.stop}")
    if seg.finished and seg.position != seg.stop:
        out.append(f"finished, but position {seg.position} != stop {seg.stop}")
    if previous is not None and previous.stop >= 0 and seg.start != previous.stop:
        out.append(f"starts at {seg.start}, the previous segment stops at {previous.stop}")
    return out


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
            _download(store, exp.entry.stem + suffix, local)
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
            report.bad(path, _strip(str(e), path))
            ok = False
    return ok


def _check_manifest_checksum(root: Path, ledger: Ledger, report: VerifyReport) -> bool:
    """The manifest's bytes against the ledger's ``manifest_xxh3`` (absent: a note).
    False if they differ (its vocabulary is then not used to judge the chunks)."""
    path = root / MANIFEST_NAME
    if not ledger.manifest_xxh3:
        report.notes.append(Problem(str(root / LEDGER_NAME), "no manifest checksum (a "
                                    "ledger older than version 2): edits to manifest.json "
                                    "cannot be detected"))
        return True
    try:
        got = bytes_checksum(path.read_bytes())
    except OSError:  # a missing manifest is reported by its loader
        return False
    if got != ledger.manifest_xxh3:
        report.bad(path, f"xxh3_64 {got}, the ledger says {ledger.manifest_xxh3}: "
                   "edited or damaged after the build")
        return False
    return True


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
    digest = file_checksum(path)  # 8 MiB blocks: constant memory
    report.bytes_checked += size
    if digest != info.get("xxh3_64"):
        report.bad(path, f"xxh3_64 {digest}, the metadata says {info.get('xxh3_64')}")
        return False
    return True


def _check_token_chunk(exp: ChunkExpect, intact: set[str], report: VerifyReport) -> None:
    idx_path, bin_path = _with(exp.base, ".idx"), _with(exp.base, ".bin")
    if not (idx_path.is_file() and bin_path.is_file()):
        return
    index = _check_idx(idx_path, bin_path, report, bin_intact=".bin" in intact)
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


def _check_idx(idx_path: Path, bin_path: Path, report: VerifyReport, *,
               bin_intact: bool = False) -> MegatronIndex | None:
    """Header and structure (``read_idx`` + ``check_index``), blamed on the right file:
    a size disagreement is the ``.bin``'s fault unless its checksum proved it intact.

    Returns the index unless the index itself is bad, so that a ``.bin`` of the wrong
    size still lets the index's counts be checked against the ledger."""
    try:
        index = read_idx(idx_path)
    except (CorruptChunkError, OSError, ValueError) as e:
        report.bad(idx_path, _strip(str(e), idx_path))
        return None
    try:
        check_index(index, bin_path)
    except CorruptChunkError as e:
        about_bin = str(e).startswith(f"{bin_path}:")
        if about_bin and not bin_intact:
            if not any(p.path == str(bin_path) for p in report.problems):  # not yet reported
                report.bad(bin_path, _strip(str(e), bin_path))
            return index
        what = _strip(str(e), bin_path if about_bin else idx_path)
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


def _note_strays(root: Path, stems: set[str], report: VerifyReport) -> None:
    """Temp files anywhere, and chunk files the ledger does not name."""
    for p in sorted(root.rglob(f"{TMP_PREFIX}*")):
        report.notes.append(Problem(str(p), "temporary file of an interrupted write; "
                                    "the next build removes it"))
    chunks = root / "chunks"
    if not chunks.is_dir():
        return
    for p in sorted(chunks.rglob("*")):
        if not p.is_file() or p.name.startswith(TMP_PREFIX):
            continue
        rel = p.relative_to(root).as_posix()
        stem = rel[: -len(p.suffix)] if p.suffix else rel
        if stem not in stems:
            report.notes.append(Problem(str(p), "orphan: not named by the ledger (left by "
                                        "an interrupted build; readers ignore it)"))


def _strip(message: str, path: Path) -> str:
    """An error message without its leading ``<path>: `` (the report shows the path) and
    without advice to run verify (this is verify)."""
    head = f"{path}: "
    message = message[len(head):] if message.startswith(head) else message
    return message.split("; run 'shardwise verify", 1)[0]
