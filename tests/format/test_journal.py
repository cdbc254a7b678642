"""The ledger's journal (format/journal.py): a save writes what changed, compaction folds
it into the snapshot, readers see snapshot + records, a follower reads only what is new."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from shardwise.format import ledger as lg
from shardwise.format.files import LocalFiles
from shardwise.format.journal import Journal, LedgerTail
from shardwise.format.ledger import (
    JOURNAL_DIR,
    LEDGER_NAME,
    ChunkEntry,
    Ledger,
    Segment,
    SourceProgress,
    read_view,
    record_numbers,
)
from shardwise.format.ledger_index import LedgerView
from shardwise.remote.client import RemoteStore
from shardwise.storage.bucket import BucketStore


def _entry(s: int, k: int) -> ChunkEntry:
    return ChunkEntry(f"chunks/{s:05d}/{s:05d}-{k:05d}", 3, 30 + k % 7, f"{k:016x}")


def _ledger(chunks: int, sources: int = 2) -> Ledger:
    return Ledger([SourceProgress([Segment(0, 10**9, 0, chunks=[
        _entry(s, k) for k in range(chunks)])]) for s in range(sources)])


def _publish(ledger: Ledger, j: Journal, source: int, n: int = 1) -> None:
    seg = ledger.sources[source].segments[0]
    for _ in range(n):
        seg.chunks.append(_entry(source, len(seg.chunks)))
        seg.position += 1
    j.touch(source, 0)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def same(a: Ledger, b: Ledger) -> bool:
    return a.to_json() == b.to_json()


def test_a_save_writes_what_changed_not_the_ledger(tmp_path: Path) -> None:
    files = LocalFiles(tmp_path)
    ledger = _ledger(50_000)
    ledger.save(files)
    snapshot = (tmp_path / LEDGER_NAME).read_bytes()
    j = Journal(files, ledger, clock=Clock())
    _publish(ledger, j, 1, 2)
    j.save()
    [record] = (tmp_path / JOURNAL_DIR).iterdir()
    assert record.stat().st_size < 1000 < len(snapshot) // 1000  # O(change), not O(ledger)
    assert (tmp_path / LEDGER_NAME).read_bytes() == snapshot  # the snapshot is untouched
    assert same(Ledger.load(files), ledger)  # snapshot + record = the ledger
    view, from_index = read_view(files)
    assert not from_index and len(view.chunks) == len(LedgerView.from_ledger(ledger).chunks)
    j.save()  # nothing touched since: no record
    assert record_numbers(files) == [1]


def test_compaction_folds_the_records_and_a_finished_ledger_numbers_zero(
        tmp_path: Path) -> None:
    files = LocalFiles(tmp_path)
    ledger = _ledger(10)
    ledger.save(files)
    j = Journal(files, ledger, clock=Clock())
    for k in range(5):
        _publish(ledger, j, k % 2)
        j.save()
    assert record_numbers(files) == [1, 2, 3, 4, 5]
    j.compact()
    assert record_numbers(files) == [] and Ledger.load(files).journal == 5
    assert same(Ledger.load(files), ledger) and read_view(files)[1]  # index again
    _publish(ledger, j, 0)
    j.save()
    assert record_numbers(files) == [6]
    for src in ledger.sources:
        src.segments[0].finished = True
    j.touch(0, 0)
    j.compact()
    # the same bytes as a ledger that never had a journal: resumed builds stay identical
    assert Ledger.load(files).journal == 0 and record_numbers(files) == []
    fresh = Ledger.parse(ledger.to_json())
    assert (tmp_path / LEDGER_NAME).read_bytes() == fresh.to_json()


def test_snapshots_cost_at_most_a_hundredth_of_the_time(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """A snapshot that takes 2 s is written again only 200 s later, however many records."""
    files = LocalFiles(tmp_path)
    clock = Clock()
    ledger = _ledger(10)
    ledger.save(files)
    save = Ledger.save

    def slow_save(self: Ledger, root: Any) -> None:
        clock.now += 2.0
        save(self, root)

    monkeypatch.setattr(Ledger, "save", slow_save)
    j = Journal(files, ledger, clock=clock)
    j.compact()  # 2 s
    for _ in range(1000):  # a record every 0.25 s for 250 s
        clock.now += 0.25
        _publish(ledger, j, 0)
        j.save()
    assert j.snapshots == 2  # the first, then one after 200 s
    assert j.seconds == pytest.approx(4.0, abs=0.1)  # records take no time on this clock
    assert same(Ledger.load(files), ledger)


def test_a_reader_that_races_a_compaction_reads_again(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    files = LocalFiles(tmp_path)
    ledger = _ledger(4)
    ledger.save(files)
    j = Journal(files, ledger, clock=Clock())
    for _ in range(3):
        _publish(ledger, j, 1)
        j.save()
    real = files.read_many
    raced = []

    def compact_first(names: list[str]) -> list[Any]:
        if not raced:  # the build compacts between the reader's listing and its reads
            raced.append(names)
            j.compact()
        return real(names)

    monkeypatch.setattr(files, "read_many", compact_first)
    assert same(Ledger.load(files), ledger) and raced


def test_a_follower_reads_only_new_records(tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    files = LocalFiles(tmp_path)
    ledger = _ledger(20_000)
    ledger.save(files)
    tail = LedgerTail(files)
    assert tail.read() is not None
    reads: list[str] = []
    real_read = files.read  # every file read goes through it, records included
    monkeypatch.setattr(files, "read", lambda n: reads.append(n) or real_read(n))
    assert tail.read() is None and reads == []  # nothing new: nothing read
    j = Journal(files, ledger, clock=Clock())
    _publish(ledger, j, 0, 3)
    j.save()
    view = tail.read()
    # opened from the index, so the snapshot is parsed once, then only records
    assert view is not None and reads == [LEDGER_NAME, lg.record_name(1)]
    assert len(view.chunks) == len(LedgerView.from_ledger(ledger).chunks)
    reads.clear()
    _publish(ledger, j, 1, 5)
    j.save()
    assert tail.read() is not None and reads == [lg.record_name(2)]
    before = tail.stamp()
    reads.clear()
    j.compact()  # a new snapshot: read once, whole
    assert tail.read() is not None and LEDGER_NAME in reads and tail.stamp() != before


def test_the_journal_in_a_bucket() -> None:
    """The same records on an object store (fsspec's memory store): one listing, records
    read at once, deleted by the compaction."""
    store = BucketStore(RemoteStore("memory://journal-test/cache"))
    ledger = _ledger(3)
    ledger.save(store)
    j = Journal(store, ledger, clock=Clock())
    tail = LedgerTail(store)
    assert tail.read() is not None
    for k in range(4):
        _publish(ledger, j, k % 2)
        j.save()
    assert record_numbers(store) == [1, 2, 3, 4]
    assert same(Ledger.load(store), ledger)
    view = tail.read()
    assert view is not None and len(view.chunks) == len(LedgerView.from_ledger(ledger).chunks)
    j.compact()
    assert record_numbers(store) == [] and same(Ledger.load(store), ledger)
    assert tail.read() is not None and tail.read() is None
