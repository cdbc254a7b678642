"""The ledger's journal: a build's progress saved as small records beside ``ledger.json``,
so a save costs what changed, not the whole ledger.

Why: a build saves its progress every 0.25 s so that readers see new chunks and a killed
build resumes close to where it stopped. Rewriting the whole ledger each time cost 0.16 s
per save at 100,000 chunks (more than half of such a build's time), and in a bucket a PUT
of the whole ledger each time. Now a save writes one **record** — the chunks published and
the segment progress since the last save — and the whole ledger (a **snapshot**) is written
only when the journal is compacted::

    ledger.json                         snapshot: records up to 41 folded in ("journal": 41)
    ledger.index                        the snapshot's reader view (format/ledger_index.py)
    ledger.journal/00000042.json        progress since record 41
    ledger.journal/00000043.json        progress since record 42

A record is written whole (temp name and rename locally, one PUT on an object store) after
the chunks it names are published, so a record that exists is complete. Whoever reads the
ledger (a reader, a resumed build, ``verify``) reads the snapshot, then the records after
its number, in order. Compaction writes a new snapshot, its index, and only then deletes
the records it folded in; a reader that raced it (a record it listed is gone, or numbers
skip) reads again. Compaction runs at the end of every build (a finished cache has no
journal, and opens from its index as before) and during a long one when the time since the
last compaction is many times what that one took (:class:`Journal`), so a reader opening a
cache mid-build reads a bounded number of records.

A reader following a growing cache (:class:`LedgerTail`) lists the journal and reads only
the records it has not seen; it reads the snapshot again only when that changed (a
compaction, the end of the build).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import orjson

from shardwise.errors import ManifestError
from shardwise.format.files import Files
from shardwise.format.ledger import (
    _RACES,
    JOURNAL_DIR,
    LEDGER_NAME,
    RECORD_VERSION,
    JournalRaced,
    Ledger,
    apply_records,
    read_ledger,
    read_view_of,
    record_name,
    record_numbers,
)
from shardwise.format.ledger_index import LedgerView

COMPACT_EVERY = 100.0
"""Compact when the time since the last compaction is this many times what it took: the
snapshots then cost at most 1/100 of a build's time, whatever its size (and a reader
opening mid-build reads at most about ``COMPACT_EVERY × snapshot time / 0.25 s`` records,
all at once)."""
COMPACT_MIN_SECONDS = 5.0


def _segment_record(ledger: Ledger, source: int, segment: int, since: int) -> dict[str, Any]:
    seg = ledger.sources[source].segments[segment]
    return {"source": source, "segment": segment, "from": since,
            "chunks": [c.to_dict() for c in seg.chunks[since:]],
            "errors": seg.errors, "finished": seg.finished, "line": seg.line,
            "position": seg.position, "stop": seg.stop}


class Journal:
    """The build's side: :meth:`save` writes a record of what changed since the last save
    (the segments marked with :meth:`touch`) and compacts when due; :meth:`compact` writes
    the snapshot and deletes the records it folds in. ``seconds`` sums the time both took,
    ``records`` and ``snapshots`` count them."""

    def __init__(self, root: Files, ledger: Ledger, *,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.root, self.ledger, self.clock = root, ledger, clock
        self.saved = {(s, g): len(seg.chunks) for s, src in enumerate(ledger.sources)
                      for g, seg in enumerate(src.segments)}
        self.touched: set[tuple[int, int]] = set()
        self.seconds = 0.0
        self.records = self.snapshots = 0
        self.compacted_at, self.compact_took = clock(), 0.0

    def touch(self, source: int, segment: int) -> None:
        self.touched.add((source, segment))

    def save(self) -> None:
        """One record of the touched segments (nothing if none); compacts when due."""
        if not self.touched:
            return
        started = self.clock()
        number = self.ledger.journal + 1
        segments = [_segment_record(self.ledger, s, g, self.saved[s, g])
                    for s, g in sorted(self.touched)]
        self.root.write(record_name(number), orjson.dumps(
            {"version": RECORD_VERSION, "record": number, "segments": segments},
            option=orjson.OPT_SORT_KEYS))
        self.ledger.journal = number
        self._saved_all()
        self.records += 1
        now = self.clock()
        self.seconds += now - started
        if now - self.compacted_at >= max(COMPACT_MIN_SECONDS,
                                          COMPACT_EVERY * self.compact_took):
            self.compact()

    def compact(self) -> None:
        """The whole ledger as the snapshot (every record folded in); the records go."""
        started = self.clock()
        self.ledger.save(self.root)
        if self.ledger.finished and self.ledger.journal:
            # no record can follow a finished ledger: number 0 again, so a finished cache's
            # ledger is the same bytes however often its build was stopped and resumed
            self.ledger.journal = 0
            self.ledger.save(self.root)
        self._saved_all()
        self.snapshots += 1
        now = self.clock()
        self.compacted_at, self.compact_took = now, now - started
        self.seconds += now - started

    def _saved_all(self) -> None:
        for s, g in self.touched:
            self.saved[s, g] = len(self.ledger.sources[s].segments[g].chunks)
        self.touched.clear()


class LedgerTail:
    """A reader's view of a ledger that may still grow: :meth:`read` returns the current
    view, reading only the records it has not seen, or None when nothing changed."""

    def __init__(self, root: Files) -> None:
        self.root = root
        self.ledger: Ledger | None = None  # parsed only once a journal is seen
        self.snapshot: tuple[Any, ...] | None = None
        self.at = 0  # the last record applied
        self.fresh = False  # bypass a store's copy of the snapshot (after a race)

    def stamp(self) -> tuple[Any, ...]:
        """Changes whenever the ledger does (a follower's sign of a live build)."""
        return (self.snapshot, self.at)

    def read(self) -> LedgerView | None:
        for _ in range(_RACES):
            try:
                return self._read()
            except JournalRaced:  # read the snapshot again, from the store itself
                self.ledger, self.snapshot, self.fresh = None, None, True
        raise ManifestError(f"{self.root.name(JOURNAL_DIR)}: the journal kept changing "
                            f"while it was read ({_RACES} tries)")

    def _read(self) -> LedgerView | None:
        numbers = record_numbers(self.root)
        snapshot = self.root.stamp(LEDGER_NAME)
        if self.snapshot is None or snapshot != self.snapshot:
            return self._read_snapshot(snapshot, numbers)
        new = [n for n in numbers if n > self.at]
        if not new:
            return None
        if self.ledger is None:  # opened from the index: parse the snapshot once
            self.ledger = Ledger.parse(read_ledger(self.root, fresh=self.fresh),
                                       where=self.root.name(LEDGER_NAME))
        apply_records(self.root, self.ledger, new)
        self.at = self.ledger.journal
        return LedgerView.from_ledger(self.ledger)

    def _read_snapshot(self, snapshot: tuple[Any, ...], numbers: list[int]) -> LedgerView:
        data = read_ledger(self.root, fresh=self.fresh)
        if self.root.stamp(LEDGER_NAME) != snapshot:
            raise JournalRaced
        view, ledger = read_view_of(self.root, data, pending=bool(numbers))
        if ledger is not None:
            apply_records(self.root, ledger, numbers)
            view = LedgerView.from_ledger(ledger)
            self.at = ledger.journal
        else:
            self.at = max(numbers, default=0)
        self.ledger, self.snapshot = ledger, snapshot
        return view


__all__ = ["COMPACT_EVERY", "Journal", "LedgerTail"]
