"""A reader following a growing cache in a bucket reads only what is new (issue 23 item
4), on a real S3 server (SeaweedFS): every request the follower makes is seen by the
proxy in front of the server, so the test counts them — one listing of the journal and one
HEAD of the snapshot per look, then a GET of each new record alone; the 20,000-chunk
snapshot is fetched again only once a compaction replaced it."""

from __future__ import annotations

from tests.cloud.conftest import BUCKET
from tests.faults import FaultProxy

from shardwise.format.journal import Journal, LedgerTail
from shardwise.format.ledger import ChunkEntry, Ledger, Segment, SourceProgress, record_name
from shardwise.format.ledger_index import LedgerView
from shardwise.remote.client import RemoteStore
from shardwise.storage.bucket import BucketStore

URL = f"s3://{BUCKET}/ledger-tail"


def _entry(s: int, k: int) -> ChunkEntry:
    return ChunkEntry(f"chunks/{s:05d}/{s:05d}-{k:05d}", 3, 30 + k % 7, f"{k:016x}")


def _publish(ledger: Ledger, journal: Journal, source: int, n: int) -> None:
    seg = ledger.sources[source].segments[0]
    for _ in range(n):
        seg.chunks.append(_entry(source, len(seg.chunks)))
        seg.position += 1
    journal.touch(source, 0)
    journal.save()


def _gets(proxy: FaultProxy, since: int) -> list[str]:
    """The objects the follower fetched (GETs of one object) after request ``since``."""
    prefix = f"/{BUCKET}/ledger-tail/"
    return [p.removeprefix(prefix) for m, p in proxy.seen[since:]
            if m == "GET" and p.startswith(prefix) and not p.endswith("/")]


def test_a_follower_reads_only_the_new_records(s3: dict[str, str],
                                               fault_proxy: FaultProxy) -> None:
    writer = BucketStore(RemoteStore(URL))
    ledger = Ledger([SourceProgress([Segment(0, 10**9, 0, chunks=[
        _entry(s, k) for k in range(10_000)])]) for s in range(2)])
    ledger.save(writer)
    # the journal's clock stands still: a compaction is due by time (5 s since the last),
    # which a loaded machine reached mid-test, and the follower then rightly fetched the
    # new snapshot where the test counts one record; here compacting is the test's call
    journal = Journal(writer, ledger, clock=lambda: 0.0)
    follower = BucketStore(RemoteStore(URL, {"endpoint_url": fault_proxy.endpoint}))
    tail = LedgerTail(follower)
    assert tail.read() is not None  # the snapshot, once
    at = len(fault_proxy.seen)
    assert tail.read() is None and _gets(fault_proxy, at) == []  # nothing new: no GET
    assert len(fault_proxy.seen) - at <= 3, fault_proxy.seen[at:]  # listing, HEAD
    _publish(ledger, journal, 0, 3)
    at = len(fault_proxy.seen)
    view = tail.read()
    assert view is not None and len(view.chunks) == len(LedgerView.from_ledger(ledger).chunks)
    # opened from the index: the snapshot parsed once now that records follow it
    assert _gets(fault_proxy, at) == ["ledger.json", record_name(1)]
    for n, source in ((2, 1), (3, 0)):
        _publish(ledger, journal, source, 5)
        at = len(fault_proxy.seen)
        view = tail.read()
        # one listing, one HEAD, one GET: the new record alone
        assert _gets(fault_proxy, at) == [record_name(n)], fault_proxy.seen[at:]
        assert len(fault_proxy.seen) - at == 3, fault_proxy.seen[at:]
        want = LedgerView.from_ledger(ledger).chunks
        assert view is not None and list(view.chunks.stem) == list(want.stem)
    journal.compact()  # a new snapshot: read again, whole
    at = len(fault_proxy.seen)
    assert tail.read() is not None and "ledger.json" in _gets(fault_proxy, at)
    RemoteStore(URL).remove(RemoteStore(URL).list_keys())

