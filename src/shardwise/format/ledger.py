"""The ledger: a cache's progress record, replaced atomically after every publication.

Per source, per segment (a newline-aligned byte range of a JSONL file, a row group of a
Parquet file, or a whole compressed file): its range, the chunks published (in order,
with documents and tokens, so planning never opens a chunk), the position reached, whether
it is finished, and skipped records by reason.

**Global chunk order** is round robin over sources: chunk ``c`` is chunk ``c // K`` of
source ``c % K`` while every source has that many; a source that runs out drops out and
the round robin continues over the rest. Mid-build only the prefix that can no longer
change is visible. Example: sources A (finished, chunks a0 a1 a2) and B (unfinished,
b0 published)::

    visible: a0 b0 a1     (the next is b1 or, if B ends now, a2: not yet known)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson

from shardwise.errors import ManifestError
from shardwise.format.checksum import bytes_checksum
from shardwise.format.files import Files
from shardwise.format.ledger_check import is_count, ledger_problems, where_in
from shardwise.format.ledger_index import INDEX_NAME, LedgerView

LEDGER_NAME = "ledger.json"
LEDGER_VERSION = 3
READABLE_VERSIONS = (1, 2, 3)
"""Version 1 had no ``empty`` count per chunk (read as 0) and no ``manifest_xxh3`` (its
manifest is not covered by a checksum); before version 3 there was no journal (``journal``
read as 0: no record follows the snapshot)."""
JOURNAL_DIR = "ledger.journal"
RECORD_VERSION = 1
_RACES = 8


@dataclass
class ChunkEntry:
    """A published chunk: its stem, documents, tokens, the xxh3-64 of its metadata file,
    and how many of its documents are empty (no token but an appended end-of-document)."""

    stem: str
    documents: int
    tokens: int
    meta_xxh3: str
    empty: int = 0

    def to_dict(self) -> dict[str, Any]:
        """As the ledger and its journal records write it (built by hand: ``asdict`` costs
        ~4 us per chunk)."""
        return {"documents": self.documents, "empty": self.empty,
                "meta_xxh3": self.meta_xxh3, "stem": self.stem, "tokens": self.tokens}


@dataclass
class Segment:
    """A unit of build work. ``start``/``stop`` are bytes (JSONL) or rows (Parquet);
    ``position`` is where the next unpublished record starts (same unit) and ``line`` its
    line (row) number counted from the segment start."""

    start: int
    stop: int
    position: int
    line: int = 0
    finished: bool = False
    chunks: list[ChunkEntry] = field(default_factory=list)
    errors: dict[str, int] = field(default_factory=dict)


@dataclass
class SourceProgress:
    segments: list[Segment]

    @property
    def finished(self) -> bool:
        return all(s.finished for s in self.segments)

    def known_chunks(self) -> list[ChunkEntry]:
        """Chunks whose place in this source's sequence is fixed: every chunk of the
        finished segments before the first unfinished one, plus that one's published."""
        out: list[ChunkEntry] = []
        for seg in self.segments:
            out.extend(seg.chunks)
            if not seg.finished:
                break
        return out

    def errors(self) -> dict[str, int]:
        total: dict[str, int] = {}
        for seg in self.segments:
            for k, v in seg.errors.items():
                total[k] = total.get(k, 0) + v
        return total

    def empty_documents(self) -> int:
        return sum(c.empty for seg in self.segments for c in seg.chunks)


@dataclass
class Ledger:
    """``manifest_xxh3``: the xxh3-64 of ``manifest.json``'s bytes, so an edited manifest
    (``eod_id``, ``vocab_size``) is caught; ``""`` in a version 1 ledger (not covered)."""

    sources: list[SourceProgress]
    version: int = LEDGER_VERSION
    manifest_xxh3: str = ""
    journal: int = 0
    """The last journal record folded into this ledger (:mod:`shardwise.format.journal`)."""

    @property
    def finished(self) -> bool:
        return all(s.finished for s in self.sources)

    def global_order(self) -> list[tuple[int, ChunkEntry]]:
        """The visible prefix of the global chunk order as (source, chunk) pairs."""
        known = [s.known_chunks() for s in self.sources]
        done = [s.finished for s in self.sources]
        out: list[tuple[int, ChunkEntry]] = []
        rnd = 0
        while True:
            progressed = False
            for s, chunks in enumerate(known):
                if rnd < len(chunks):
                    out.append((s, chunks[rnd]))
                    progressed = True
                elif not done[s]:
                    return out
            if not progressed:
                return out
            rnd += 1

    def errors(self) -> dict[str, int]:
        total: dict[str, int] = {}
        for src in self.sources:
            for k, v in src.errors().items():
                total[k] = total.get(k, 0) + v
        return dict(sorted(total.items()))

    def to_json(self) -> bytes:
        """Compact JSON, keys sorted (dicts built by hand: ``dataclasses.asdict`` costs
        ~4 us per chunk, 0.4 s per save of a 100,000-chunk ledger)."""
        sources = [{"segments": [
            {"chunks": [c.to_dict() for c in seg.chunks],
             "errors": seg.errors, "finished": seg.finished, "line": seg.line,
             "position": seg.position, "start": seg.start, "stop": seg.stop}
            for seg in src.segments]} for src in self.sources]
        return orjson.dumps({"journal": self.journal, "manifest_xxh3": self.manifest_xxh3,
                             "sources": sources, "version": LEDGER_VERSION},
                            option=orjson.OPT_SORT_KEYS)

    def check(self, where: str) -> None:
        """Refuse a ledger no reader may read by (:mod:`.ledger_check`): the first
        problem, as a :class:`ManifestError` naming ``where`` (``verify`` lists them all)."""
        for s, g, k, what in ledger_problems(self):
            raise ManifestError(f"{where}: {where_in(s, g, k)}: {what}; the ledger is "
                                "damaged or was edited: rebuild the cache, or run "
                                "'shardwise verify' on it for every problem")

    @classmethod
    def from_dict(cls, d: dict[str, Any], *, where: str = LEDGER_NAME,
                  check: bool = True) -> Ledger:
        """The ledger ``d`` holds; ``check`` False: without :meth:`check` (``verify``,
        which reports every problem itself)."""
        if not isinstance(d, dict):
            raise ManifestError(f"{where}: not a valid shardwise ledger (a JSON "
                                f"{type(d).__name__}, expected an object)")
        try:
            if d.get("version") not in READABLE_VERSIONS:
                raise ManifestError(f"{where}: ledger version {d.get('version')!r}, this "
                                    f"shardwise reads {list(READABLE_VERSIONS)}; upgrade "
                                    "shardwise or rebuild")
            sources = [SourceProgress([
                Segment(**{**seg, "chunks": [ChunkEntry(**c) for c in seg["chunks"]]})
                for seg in src["segments"]]) for src in d["sources"]]
            manifest_xxh3 = d.get("manifest_xxh3", "") if d["version"] >= 2 else ""
            if not isinstance(manifest_xxh3, str):
                raise TypeError(f"manifest_xxh3 is {manifest_xxh3!r}, expected a string")
            journal = d.get("journal", 0)
            if not is_count(journal):
                raise TypeError(f"journal is {journal!r}, expected a record number")
        except (KeyError, TypeError, AttributeError, ValueError) as e:
            raise ManifestError(f"{where}: not a valid shardwise ledger ({e})") from e
        ledger = cls(sources=sources, manifest_xxh3=manifest_xxh3, journal=journal,
                     version=d["version"])
        if check:
            ledger.check(where)
        return ledger

    def save(self, root: Files) -> None:
        """Replace ``ledger.json`` (the snapshot), then its index (``ledger.index``: the
        reader's view, tied to these bytes by their checksum), then delete the journal
        records it folds in."""
        data = self.to_json()
        root.write(LEDGER_NAME, data)
        root.write(INDEX_NAME, LedgerView.from_ledger(self).to_bytes(
            bytes_checksum(data)))
        folded = [record_name(n) for n in record_numbers(root) if n <= self.journal]
        if folded:
            root.remove(folded)

    @classmethod
    def load(cls, root: Files, *, check: bool = True) -> Ledger:
        """The ledger: the snapshot, with every journal record after it applied
        (``check``: see :meth:`from_dict`)."""
        for attempt in range(_RACES):
            ledger = cls.parse(read_ledger(root, fresh=attempt > 0),
                               where=root.name(LEDGER_NAME), check=check)
            try:
                apply_records(root, ledger, record_numbers(root), check=check)
            except JournalRaced:
                continue
            return ledger
        raise _unsettled(root)

    @classmethod
    def parse(cls, data: bytes, *, where: str = LEDGER_NAME, check: bool = True) -> Ledger:
        try:
            return cls.from_dict(orjson.loads(data), where=where, check=check)
        except orjson.JSONDecodeError as e:
            raise ManifestError(f"{where}: invalid JSON ({e})") from e


def read_ledger(root: Files, *, fresh: bool = False) -> bytes:
    """The bytes of ``root``'s ledger (``fresh``: not a copy a store keeps, e.g. after a
    race with a compaction); a missing one is a :class:`ManifestError`."""
    try:
        return root.read_fresh(LEDGER_NAME) if fresh else root.read(LEDGER_NAME)
    except FileNotFoundError:
        raise ManifestError(f"{root.location}: no {LEDGER_NAME}; the build has not started "
                            "or this is not a shardwise cache") from None


def read_view(root: Files) -> tuple[LedgerView, bool]:
    """What a reader needs of ``root``'s ledger, and whether it came from the index.

    The index is used when no journal record follows the snapshot and the index was made
    from the snapshot's current bytes; otherwise (records pending: a build is running; no
    index: a cache from before it; a stale or damaged one) the ledger is parsed and the
    records applied, which gives the same view, only slower."""
    for attempt in range(_RACES):
        data, numbers = read_ledger(root, fresh=attempt > 0), record_numbers(root)
        try:
            view, ledger = read_view_of(root, data, pending=bool(numbers))
            if ledger is None:
                return view, True
            apply_records(root, ledger, numbers)
        except JournalRaced:
            continue
        return LedgerView.from_ledger(ledger), False
    raise _unsettled(root)


def read_view_of(root: Files, data: bytes, *, pending: bool
                 ) -> tuple[LedgerView, Ledger | None]:
    """The view of snapshot bytes ``data``: from the index (and None) when nothing is
    ``pending`` in the journal and the index matches, else the parsed ledger (whose view
    is only its snapshot's until the caller applies the records)."""
    if not pending:
        try:
            index = root.read(INDEX_NAME)
        except FileNotFoundError:
            index = None
        if index is not None:
            try:
                view = LedgerView.from_bytes(index, ledger_xxh3=bytes_checksum(data),
                                             where=root.name(INDEX_NAME))
            except ManifestError:  # damaged: the ledger is the truth; verify reports it
                view = None
            if view is not None:  # None: made from other bytes (stale)
                return view, None
    ledger = Ledger.parse(data, where=root.name(LEDGER_NAME))
    return LedgerView.from_ledger(ledger), ledger


# -- the journal: records after the snapshot (format/journal.py writes and follows it) ----
class JournalRaced(Exception):
    """The journal changed under a reader (a compaction deleted records it listed)."""


def record_name(number: int) -> str:
    return f"{JOURNAL_DIR}/{number:08d}.json"


def record_numbers(root: Files) -> list[int]:
    """The numbers of the records in ``root``'s journal, sorted (one directory listing)."""
    numbers = []
    for name in root.list_dir(JOURNAL_DIR):
        stem, dot, ext = name.partition(".")
        if dot and ext == "json" and stem.isascii() and stem.isdigit():  # not '²'
            numbers.append(int(stem))
    return sorted(numbers)


def apply_records(root: Files, ledger: Ledger, numbers: list[int], *,
                  check: bool = True) -> None:
    """Apply the records numbered after ``ledger.journal``, which must follow it without a
    gap (else :class:`JournalRaced`: a compaction ran; read the snapshot again); then
    (``check``) :meth:`Ledger.check` the result, naming the journal."""
    todo = [n for n in numbers if n > ledger.journal]
    if todo != list(range(ledger.journal + 1, ledger.journal + 1 + len(todo))):
        raise JournalRaced
    names = [record_name(n) for n in todo]
    for name, data in zip(names, root.read_many(names), strict=True):
        if isinstance(data, FileNotFoundError):
            raise JournalRaced
        if isinstance(data, Exception):
            raise data
        apply_record(ledger, data, name=root.name(name))
    if check and names:
        ledger.check(f"{root.name(LEDGER_NAME)} + {root.name(JOURNAL_DIR)}")


def apply_record(ledger: Ledger, data: bytes, *, name: str) -> None:
    """Apply one record's bytes to ``ledger`` (format/SPEC.md, "The journal")."""
    try:
        record = orjson.loads(data)
        if record.get("version") != RECORD_VERSION:
            raise ManifestError(f"{name}: journal record version {record.get('version')!r}, "
                                f"this shardwise reads {RECORD_VERSION}; upgrade shardwise")
        for entry in record["segments"]:
            if not all(is_count(entry[k]) for k in ("source", "segment", "from")):
                raise ValueError(f"source {entry['source']!r} segment {entry['segment']!r} "
                                 f"from {entry['from']!r}: expected counts")
            seg = ledger.sources[entry["source"]].segments[entry["segment"]]
            since = entry["from"]
            if not isinstance(entry["chunks"], list):
                raise TypeError(f"chunks is {type(entry['chunks']).__name__}, expected a list")
            if since > len(seg.chunks):
                raise ValueError(f"source {entry['source']} segment {entry['segment']} "
                                 f"follows chunk {since}, the ledger has {len(seg.chunks)}")
            seg.chunks[since:] = [ChunkEntry(**c) for c in entry["chunks"]]
            seg.position, seg.line, seg.errors = entry["position"], entry["line"], entry["errors"]
            seg.finished, seg.stop = entry["finished"], entry["stop"]
        if record["record"] != ledger.journal + 1:
            raise ValueError(f"record number {record['record']!r}, its name says "
                             f"{ledger.journal + 1}")
        ledger.journal = record["record"]
    except (orjson.JSONDecodeError, KeyError, IndexError, TypeError, ValueError,
            AttributeError) as e:
        raise ManifestError(f"{name}: not a valid ledger journal record ({e}); rerun the "
                            "build (it resumes from the ledger)") from e


def _unsettled(root: Files) -> ManifestError:
    return ManifestError(f"{root.name(JOURNAL_DIR)}: the journal kept changing while it was "
                         f"read ({_RACES} tries); is more than one build writing this cache?")
