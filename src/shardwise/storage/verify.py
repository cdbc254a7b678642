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

One chunk is checked by :func:`~shardwise.storage.chunk_check.check_chunk`, the check a
rerun of the build also uses to find the chunks to rebuild.

A cache on an object store (:func:`verify_remote`, or ``verify_cache("s3://…")``) gets the
same checks, one chunk at a time downloaded into a temporary directory (constant disk),
and every finding names the object by its URL.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from shardwise.errors import ManifestError
from shardwise.format.atomic import TMP_PREFIX
from shardwise.format.checksum import bytes_checksum
from shardwise.format.chunk import DATA_SUFFIXES, META_SUFFIX, ChunkKind, chunk_stem
from shardwise.format.files import Files, LocalFiles
from shardwise.format.ledger import LEDGER_NAME, Ledger, Segment
from shardwise.format.ledger_check import ledger_problems, where_in
from shardwise.format.ledger_index import INDEX_NAME, LedgerView
from shardwise.format.manifest import MANIFEST_NAME, Manifest
from shardwise.format.megatron import dtype_code
from shardwise.remote.client import RemoteStore, is_url
from shardwise.storage.bucket import BucketStore
from shardwise.storage.chunk_check import (
    ChunkExpect,
    check_chunk,
    check_idx_pair,
    download_object,
)
from shardwise.storage.verify_report import Problem, VerifyReport, strip_advice
from shardwise.storage.verify_report import with_suffix as _with

_T = TypeVar("_T")


def verify_cache(root: str | Path, *, storage_options: dict[str, Any] | None = None
                 ) -> VerifyReport:
    """Check a shardwise cache directory (or URL) exhaustively; never raises on damage."""
    if is_url(root):
        return verify_remote(str(root), storage_options=storage_options)
    root = Path(root)
    return _verify(LocalFiles(root), root, lambda _: nullcontext())


def verify_remote(url: str, *, storage_options: dict[str, Any] | None = None
                  ) -> VerifyReport:
    """:func:`verify_cache` for a cache on an object store: the same checks, its head
    files (manifest, ledger, journal, index) read through the store, each chunk's objects
    downloaded into a temporary directory, checked, and deleted before the next chunk;
    every finding names its object by URL."""
    store = RemoteStore(url, storage_options)
    with tempfile.TemporaryDirectory(prefix="shardwise-verify-") as tmp:
        local = Path(tmp)

        @contextmanager
        def fetch(exp: ChunkExpect) -> Iterator[None]:
            suffixes = (META_SUFFIX, *DATA_SUFFIXES[exp.kind or ChunkKind.TOKENS])
            for suffix in suffixes:
                download_object(store, exp.entry.stem + suffix, local)
            try:
                yield
            finally:
                shutil.rmtree(local / "chunks", ignore_errors=True)

        inner = _verify(BucketStore(store), local, fetch)
    head = str(local)

    def named(p: Problem) -> Problem:
        path = store.url + p.path[len(head):] if p.path.startswith(head) else p.path
        return Problem(path, p.what)

    inner.problems = sorted(named(p) for p in inner.problems)
    inner.notes = [named(n) for n in inner.notes]
    return inner


def _verify(files: Files, chunks: Path,
            fetch: Callable[[ChunkExpect], AbstractContextManager[None]]) -> VerifyReport:
    """The one verify of a cache, local or remote: its head files through ``files``, its
    chunks checked under ``chunks`` (the cache directory, or where ``fetch(exp)`` puts a
    remote chunk's objects for the time of its check)."""
    report = VerifyReport(files.location)
    manifest = load_or_report(Manifest.load, files, MANIFEST_NAME, report)
    kind, dtype = manifest_kind(files, manifest, report)
    ledger = load_or_report(partial(Ledger.load, check=False), files, LEDGER_NAME, report)
    if ledger is not None:
        if manifest is not None and len(manifest.sources) != len(ledger.sources):
            report.bad(files.name(LEDGER_NAME), f"{len(ledger.sources)} sources, the "
                       f"manifest lists {len(manifest.sources)}")
        trusted = check_manifest_checksum(files, ledger.manifest_xxh3, report)
        vocab = manifest.tokenizer.vocab_size if manifest is not None and trusted else None
        expects = list(_check_ledger(files, chunks, ledger, kind, dtype, report))
        for exp in expects:
            with fetch(exp):
                chunk = check_chunk(replace(exp, vocab_size=vocab))
            report.problems += chunk.problems
            report.bytes_checked += chunk.bytes_checked
            report.chunks_checked += 1
        sound = next(ledger_problems(ledger), None) is None  # else no view to compare
        check_index(files, report, ledger if sound else None)
        _note_strays(files, {e.entry.stem for e in expects}, report)
    report.problems.sort()
    return report


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
        check_idx_pair(idx_path, bin_path, report)
        report.chunks_checked = 1
        report.bytes_checked = idx_path.stat().st_size + bin_path.stat().st_size
    return report


def load_or_report(load: Callable[[Files], _T], files: Files, name: str,
                   report: VerifyReport) -> _T | None:
    """``Manifest.load`` or ``Ledger.load`` of ``files``; a failure is a problem of that
    file."""
    try:
        return load(files)
    except ManifestError as e:
        path = files.name(name)
        report.bad(path, strip_advice(str(e), path))  # a URL: no Path
        return None


def manifest_kind(files: Files, manifest: Manifest | None, report: VerifyReport
                   ) -> tuple[ChunkKind | None, np.dtype | None]:
    """The chunk kind and token dtype every chunk must have (None: unknown)."""
    if manifest is None:
        return None, None
    path = files.name(MANIFEST_NAME)
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


def _check_ledger(files: Files, chunks: Path, ledger: Ledger, kind: ChunkKind | None,
                  dtype: np.dtype | None, report: VerifyReport) -> Iterator[ChunkExpect]:
    """Ledger-level consistency: every problem a loader refuses
    (:func:`~shardwise.format.ledger_check.ledger_problems`), then the segments' positions
    and each stem's expected name; yields the chunks whose files can be checked."""
    where = files.name(LEDGER_NAME)
    bad: set[tuple[int, int, int]] = set()
    for s, g, k, what in ledger_problems(ledger):
        report.bad(where, f"{where_in(s, g, k)}: {what}")
        bad.add((s, g, k))
    for s, src in enumerate(ledger.sources):
        for g, seg in enumerate(src.segments):
            if (s, g, -1) in bad:
                continue
            previous = src.segments[g - 1] if g else None
            if previous is not None and (s, g - 1, -1) in bad:
                previous = None
            for what in _segment_problems(seg, previous):
                report.bad(where, f"{where_in(s, g, -1)}: {what}")
            for k, entry in enumerate(seg.chunks):
                if (s, g, k) in bad:
                    continue
                if entry.stem != chunk_stem(s, g, k):
                    report.bad(where, f"{where_in(s, g, k)}: stem {entry.stem!r}, expected "
                               f"{chunk_stem(s, g, k)!r}")
                yield ChunkExpect(chunks, s, entry, kind, dtype, segment=g, index=k)


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


def check_index(files: Files, report: VerifyReport, ledger: Ledger | None = None
                ) -> LedgerView | None:
    """``ledger.index`` against ``ledger.json``. Missing or stale: a note (readers then
    parse the ledger); damaged, or (``ledger`` given) disagreeing with the ledger whose
    bytes it names: a problem. Returns its view when readers would use it."""
    path, rerun = files.name(INDEX_NAME), "a rerun of the build rewrites it"
    try:
        data, ledger_bytes = files.read(INDEX_NAME), files.read(LEDGER_NAME)
    except FileNotFoundError:
        report.notes.append(Problem(path, "missing (a cache written before ledger.index "
                                    "existed): readers parse ledger.json on open, slowly for "
                                    f"many chunks; {rerun}"))
        return None
    try:
        view = LedgerView.from_bytes(data, ledger_xxh3=bytes_checksum(ledger_bytes),
                                     where=path)
    except ManifestError as e:
        report.bad(path, f"{strip_advice(str(e), path)}; readers ignore it and parse "
                   f"ledger.json; {rerun}")
        return None
    if view is None:
        report.notes.append(Problem(path, "older than ledger.json (a build stopped "
                                    "between writing the two): readers ignore it and parse "
                                    f"ledger.json; {rerun}"))
        return None
    if ledger is not None:
        for what in view.differences(LedgerView.from_ledger(ledger)):
            report.bad(path, f"{what}; {rerun}")
    return view


def check_manifest_checksum(files: Files, xxh3: str, report: VerifyReport) -> bool:
    """The manifest's bytes against the ledger's ``manifest_xxh3`` (``xxh3``; absent: a
    note). False if they differ (its vocabulary is then not used to judge the chunks)."""
    path = files.name(MANIFEST_NAME)
    if not xxh3:
        report.notes.append(Problem(files.name(LEDGER_NAME), "no manifest checksum (a "
                                    "ledger older than version 2): edits to manifest.json "
                                    "cannot be detected"))
        return True
    try:
        got = bytes_checksum(files.read(MANIFEST_NAME))
    except FileNotFoundError:  # a missing manifest is reported by its loader
        return False
    if got != xxh3:
        report.bad(path, f"xxh3_64 {got}, the ledger says {xxh3}: "
                   "edited or damaged after the build")
        return False
    return True


def _note_strays(files: Files, stems: set[str], report: VerifyReport) -> None:
    """Temp files anywhere, and chunk files the ledger does not name (one listing)."""
    listed = files.keys()
    for key in listed:
        name = key.rsplit("/", 1)[-1]
        if name.startswith(TMP_PREFIX):
            report.notes.append(Problem(files.name(key), "temporary file of an interrupted "
                                        "write; the next build removes it"))
        elif key.startswith("chunks/") and key.rsplit(".", 1)[0] not in stems:
            report.notes.append(Problem(files.name(key), "orphan: not named by the ledger "
                                        "(left by an interrupted build; readers ignore it)"))
