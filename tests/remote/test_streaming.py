"""Issue 30's remote reads, for correctness (their speed is ``shardwise bench remote``'s):
a coming batch's ranged GETs start when the loader hands its runs over and the batch
uses them; a download running past its expected end is not mistaken for one about to
land; a corpus larger than ``local_bytes`` streams through, fetched ahead in order of
need and evicted after use, with the local read's bytes."""

from __future__ import annotations

import collections
import math
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from tests.faults import FaultProxy

import shardwise as sw
from shardwise.bench.moto import upload
from shardwise.bench.proxy import LatencyProxy
from shardwise.concurrency.readahead import ReadAhead
from shardwise.remote import RemotePolicy, RemoteStore
from shardwise.storage.download import CLAIM_PREFIX, _start_time
from shardwise.storage.prefetch import SMALL_BATCH, Prefetcher
from shardwise.storage.ranged import DEPTH, Arriving, BlockSums, EarlyReads
from shardwise.world import World

SEQ_LEN = 32
PATIENT = RemotePolicy(connect_timeout=5, read_timeout=5, first_backoff=0.01,
                       max_backoff=0.2, deadline=30)


def _batches(cache: sw.Cache | Path, shuffle: str, n: int | None = None) -> list[np.ndarray]:
    from shardwise.torch import loader

    ds = sw.TokenDataset(cache, seq_len=SEQ_LEN, seed=3, shuffle=shuffle)
    dl = loader(ds, global_batch_size=4, micro_batch_size=4, world=World.single())
    it = iter(dl)  # endless (epoch after epoch): n batches, or one epoch's
    try:
        return [b["input_ids"].numpy() for _, b in zip(range(n or len(ds) // 4), it,
                                                        strict=False)]
    finally:
        it.close()


def _same(got: list[np.ndarray], want: list[np.ndarray]) -> None:
    assert len(got) == len(want)
    for a, b in zip(got, want, strict=True):
        np.testing.assert_array_equal(a, b)


def test_coming_batches_are_read_early_and_used(built: tuple[str, Path], s3_server: object,
                                                tmp_path: Path) -> None:
    """Behind 30 ms and 2 MB/s per connection the chunks arrive slowly: the loader's
    look-ahead hands over the runs of coming batches, their ranged GETs start then, and
    the batches read those bytes (checked by the block sums) — the local read's batches."""
    url, local = built
    want = _batches(local, "window", 30)
    with LatencyProxy(s3_server.address, latency=0.03, bandwidth=2e6) as proxy:  # type: ignore[attr-defined]
        store = RemoteStore(url, {"endpoint_url": f"http://127.0.0.1:{proxy.port}"},
                            policy=PATIENT)
        cache = sw.open_cache(store, local_dir=tmp_path / "node")
        got = _batches(cache, "window", 30)
        stats = cache.prefetch_stats()
        cache.close()
    _same(got, want)
    assert stats["early_reads"] > 1 and stats["early_used"] >= 1, stats  # type: ignore[operator]
    assert stats["ranged_reads"] > 0, stats


class _WithStats:
    """A collate that also returns, from the DataLoader worker it runs in, that process's
    id and its cache's read statistics."""

    def __init__(self, cache: sw.Cache) -> None:
        self.cache = cache

    def __call__(self, rows: Any) -> tuple[Any, dict[str, object], int]:
        from shardwise.torch import collate

        return collate(rows), dict(self.cache.prefetch_stats()), os.getpid()


def test_dataloader_workers_read_their_own_coming_batches_early(
        built: tuple[str, Path], s3_server: object, tmp_path: Path) -> None:
    """A DataLoader worker cannot see its coming batches (the index stream is walked in
    the loader's process) nor the caller's pace (it reads back to back while its queue
    fills): each batch sent to it carries both, the worker starts its coming batches'
    ranged GETs, and its batches use them — the local read's bytes. The loader's process
    downloads the chunks and reads nothing early (nobody would use those bytes). Every
    chunk's download is held by a live claim (another process's, as far as the readers
    know) until the batches are read, so that none lands first whatever the machine's
    load. Failed before: a worker never read early (0 started), the loader's process did."""
    from shardwise.torch import loader

    url, local = built
    want = _batches(local, "window", 24)
    got, worker_stats, read_by = [], {}, collections.Counter()
    with LatencyProxy(s3_server.address, latency=0.03, bandwidth=2e6) as proxy:  # type: ignore[attr-defined]
        store = RemoteStore(url, {"endpoint_url": f"http://127.0.0.1:{proxy.port}"},
                            policy=PATIENT)
        cache = sw.open_cache(store, local_dir=tmp_path / "node")
        view, node = cache.store.view, cache.store.downloads.dir  # type: ignore[attr-defined]
        finals = [node / (view.chunks[c].stem + ".bin") for c in range(len(view.chunks))]
        claims = [f.with_name(CLAIM_PREFIX + f.name) for f in finals]
        for claim in claims:  # a live owner: the downloads wait while it stands
            claim.parent.mkdir(parents=True, exist_ok=True)
            claim.write_text(f"{os.getpid()} {_start_time(os.getpid())} {1 << 20}")
        ds = sw.TokenDataset(cache, seq_len=SEQ_LEN, seed=3, shuffle="window")
        dl = loader(ds, global_batch_size=4, micro_batch_size=4, world=World.single(),
                    num_workers=2, collate_fn=_WithStats(cache))
        it = iter(dl)
        try:
            for _, (batch, stats, pid) in zip(range(24), it, strict=False):
                got.append(batch["input_ids"].numpy())
                worker_stats[pid] = stats
                read_by[pid] += 1
                time.sleep(0.01)  # a training step: the pace the workers read ahead by
        finally:
            for claim in claims:
                claim.unlink(missing_ok=True)
        it.close()
        here = cache.prefetch_stats()
        cache.close()
    _same(got, want)
    assert len(worker_stats) == 2, worker_stats
    for pid, stats in worker_stats.items():  # more reads started than batches asked for
        assert stats["early_reads"] > read_by[pid] and stats["reader_paced_by_caller"], stats  # type: ignore[operator]
        assert stats["early_used"] >= read_by[pid] // 2, (read_by[pid], stats)  # type: ignore[operator]
    assert here["early_reads"] == 0 and here["ranged_reads"] == 0, here


def test_a_loader_with_workers_imports_their_fsspec_filesystem_before_they_fork(
        built: tuple[str, Path], s3_env: dict[str, str], tmp_path: Path) -> None:
    """A forked worker reads through fsspec (obstore's runtime does not survive fork); a
    process that read only through obstore had not imported s3fs, so each worker imported
    it on its first batch (0.3–0.7 s, both at once). Made in a fresh interpreter, so that
    nothing else imported it; failed before: not imported."""
    url, _ = built
    code = (
        "import sys, shardwise as sw\n"
        "from shardwise.torch import loader\n"
        f"cache = sw.open_cache({url!r}, local_dir={str(tmp_path / 'node')!r})\n"
        "ds = sw.TokenDataset(cache, seq_len=32, shuffle='none')\n"
        "before = 's3fs' in sys.modules\n"
        "loader(ds, global_batch_size=4, micro_batch_size=4, world=sw.World.single(),\n"
        "       num_workers=2)\n"
        "print(before, 's3fs' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], env={**os.environ, **s3_env},
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "True"], out.stdout


def test_workers_read_a_remote_map_style_dataset_without_a_prefetch(
        built: tuple[str, Path], s3_env: dict[str, str], tmp_path: Path) -> None:
    """Any map-style dataset over a bucket cache works with workers: one with no
    ``prefetch`` (here the cache's documents) gets no look-ahead rather than an error."""
    from shardwise.read.compose.records import CacheRecords
    from shardwise.torch import loader

    url, local = built
    cache = sw.open_cache(url, local_dir=tmp_path / "node")
    docs = CacheRecords(cache)
    dl = loader(docs, global_batch_size=2, micro_batch_size=2, world=World.single(),
                num_workers=2, collate_fn=list, epochs=1)
    got = [d for batch in dl for d in batch]
    want = CacheRecords(local)
    assert len(got) == len(want) - len(want) % 2
    assert [str(d) for d in got] == [str(want[i]) for i in range(len(got))]
    cache.close()


def test_each_worker_is_sent_its_own_coming_batches_and_the_callers_pace() -> None:
    """torch deals batch k to worker k % workers: a worker's first batch carries its next
    ``ahead`` batches, each later one the one that is new, and the pace is the caller's
    times the workers (each serves one batch in turn)."""
    from shardwise.read.ahead import CallerPace, for_workers, noting_pace
    from shardwise.read.guard import Placed

    pace = CallerPace()
    sent = list(for_workers((Placed([i, i + 100]) for i in range(10)), 2, pace, ahead=3))
    assert [list(b) for b in sent] == [[i, i + 100] for i in range(10)]
    coming = [[c[0] for c in b.ahead.coming] for b in sent]
    assert coming == [[2, 4, 6], [3, 5, 7], [8], [9]] + [[]] * 6
    assert sent[0].ahead.coming[0] == (2, 102) and sent[0].ahead.pace_s is None
    for _ in noting_pace(iter(range(3)), pace.note):  # the caller trains 20 ms a batch
        time.sleep(0.02)
    assert pace.own_s is not None and 0.02 <= pace.own_s < 0.2
    later = list(for_workers((Placed([i]) for i in range(3)), 2, pace, ahead=1))
    assert later[0].ahead.pace_s == pytest.approx(2 * pace.own_s)
    assert [b for b in for_workers(iter([[1], [2]]), 2, pace)] == [[1], [2]]  # not placed
    paced_only = list(for_workers((Placed([i]) for i in range(4)), 2, pace, ahead=0))
    assert [b.ahead.coming for b in paced_only] == [()] * 4  # look_ahead=0: no reads ahead
    assert paced_only[0].ahead.pace_s == pytest.approx(2 * pace.own_s)


def test_early_reads_are_taken_in_order_and_skipped_ones_dropped() -> None:
    early = EarlyReads()
    try:
        for k in (b"a", b"b", b"c"):
            early.start(k, lambda k=k: k)  # type: ignore[misc]
        early.start(b"b", lambda: b"twice")  # already started: not again
        assert early.started == 3 and early.wants_more()  # 3 ahead of the 4 asked
        first = early.take(b"b")  # a reader that skipped a: a is dropped with it
        assert first is not None and first.result() == b"b"
        assert early.take(b"a") is None and early.take(b"c") is not None
        assert early.used == 2
    finally:
        early.close()


def test_early_reads_run_depth_ahead_and_the_rest_wait_their_turn() -> None:
    """A look-ahead that hands over many batches (downloads wanting more chunks than a
    small cache has) started a ranged read for each at once: 1,019 before a first batch
    on the bench, 315 MB. Now :meth:`EarlyReads.depth` run; the others start in order as
    the reader takes batches, and those it skips never start."""
    early, gate = EarlyReads(), threading.Event()
    try:
        for k in range(20):
            early.start(bytes([k]), lambda k=k: (gate.wait(10), k)[1])  # type: ignore[misc]
        assert early.started == DEPTH and not early.wants_more()
        gate.set()
        first = early.take(bytes([0]))
        assert first is not None and first.result() == 0
        assert early.started == DEPTH + 1  # the next queued one started
        tenth = early.take(bytes([10]))  # 1-9 dropped; 5-9 never started
        assert tenth is not None and tenth.result() == 10 and early.used == 2
        assert early.take(bytes([9])) is None
    finally:
        gate.set()
        early.close()


def test_early_reads_follow_the_readers_own_pace_not_the_gaps_between_its_batches() -> None:
    """How far ahead coming batches are read follows the reader's own time per batch (its
    waits excluded). The gaps between its batches hold its waits: a first batch's 0.2 s
    wait read as a slow reader, kept the depth at 2–3 for ten batches, and each then
    waited 10–45 ms in a 20 ms step (bench remote)."""
    early = EarlyReads()
    try:
        assert early.depth() == DEPTH and early.due_s() is None  # nothing measured
        early.start(b"a", lambda: b"a")
        first = early.take(b"a", own_s=0.02)
        assert first is not None and first.result() == b"a"
        early.rtt_s, early.slow_s = 0.06, None  # a far store's round trip
        assert early.depth() == 7 and early.due_s() == pytest.approx(0.02)  # 2 x 3 + 1
        time.sleep(0.3)  # a long wait between batches: not the reader's pace
        assert early.take(b"b") is None  # none started for it
        assert early.depth() == 7 and early.due_s() == pytest.approx(0.02)
    finally:
        early.close()


def test_a_chunk_another_process_downloads_is_read_by_ranged_gets(
        built: tuple[str, Path], s3_env: dict[str, str], tmp_path: Path) -> None:
    """A DataLoader worker reads chunks its loader's process downloads into the node's
    copy (or has not started yet), never handed over in the worker: a batch there waited
    for the whole chunk (a worker's first batch 1.5–2 s on the bench). It is read by
    ranged GETs, checked by the block sums, and the chunk handed over to this process's
    downloads. Failed before: the read waited as long as the other's claim stood."""
    url, local = built
    cache = sw.open_cache(RemoteStore(url, policy=PATIENT), local_dir=tmp_path / "node")
    store = cache.store
    final = store.downloads.dir / (store.view.chunks[0].stem + ".bin")  # type: ignore[attr-defined]
    final.parent.mkdir(parents=True, exist_ok=True)
    claim = final.with_name(CLAIM_PREFIX + final.name)
    claim.write_text(f"{os.getpid()} {_start_time(os.getpid())} {1 << 20}")  # a live owner
    ds = sw.TokenDataset(cache, seq_len=SEQ_LEN, shuffle="none")
    want = sw.TokenDataset(local, seq_len=SEQ_LEN, shuffle="none")
    reading = ReadAhead.call(ds.get_batch, [0, 1, 2], name="test-read")
    try:
        got = _within(reading, 30)
        assert claim.exists() and not final.exists()  # read while the claim stood
        assert cache.prefetch_stats()["ahead"] == 1  # the chunk, handed over here
    finally:
        claim.unlink(missing_ok=True)  # the "other process" gives up: this one downloads
        reading.close(None)
    np.testing.assert_array_equal(got["input_ids"], want.get_batch([0, 1, 2])["input_ids"])
    assert cache.prefetch_stats()["ranged_reads"] > 0  # type: ignore[operator]
    cache.close()


def _within(reading: ReadAhead[Any], seconds: float) -> Any:
    """The read's result, or a failure naming the wait (never a hang)."""
    deadline = time.monotonic() + seconds
    while not reading.queue and reading.error is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert reading.queue or reading.error is not None, f"the read waited over {seconds} s"
    return reading.get()


def test_a_reader_faster_than_ranged_reads_waits_for_the_downloads() -> None:
    """Ranged reads bring at most MAX_DEPTH batches a round trip: a reader reading flat
    out waits either way, and its ranged reads (64 KiB blocks a window) only slowed the
    downloads that end the wait; one with a training step between batches is served."""
    now = [0.0]
    arriving = Arriving(clock=lambda: now[0])
    assert arriving.serves()  # nothing measured: the first batches read by ranged GETs
    arriving.least_rtt_s = 0.08

    def batches(own_s: float) -> bool:
        for _ in range(10):
            arriving.asked()
            now[0] += 0.05  # waited for its bytes: not the reader's own time
            arriving.handed()
            now[0] += own_s
        arriving.asked()
        return arriving.serves()

    assert not batches(0.0002)  # flat out: 0.2 ms of its own a batch
    assert batches(0.02)  # a 20 ms step: 8 batches ahead cover 160 ms
    assert arriving.own_s == pytest.approx(0.02, rel=0.05)


def test_batches_made_ahead_are_paced_by_the_caller_not_the_thread() -> None:
    """With batches made ahead on a thread, the thread asks again as soon as its queue
    has room, back to back while it is behind: that read as a reader flat out, and every
    batch waited for whole chunks (a 2 s wait in a 20 ms step, in the bench). The caller's
    own time, measured where it trains (``paced``), is the pace."""
    now = [0.0]
    arriving = Arriving(clock=lambda: now[0])
    arriving.least_rtt_s = 0.08
    arriving.paced(None)  # the loader's made-ahead thread starts
    for _ in range(10):
        arriving.asked()  # the thread: 50 ms of ranged GETs, then at once the next
        now[0] += 0.05
        arriving.handed()
        arriving.paced(0.02)  # the caller: 20 ms of training between its batches
    arriving.asked()
    assert arriving.serves() and arriving.own_s == pytest.approx(0.02)
    unpaced = Arriving(clock=lambda: now[0])
    unpaced.least_rtt_s = 0.08
    for _ in range(10):  # the same thread without the caller's pace: "flat out"
        unpaced.asked()
        now[0] += 0.05
        unpaced.handed()
    unpaced.asked()
    assert not unpaced.serves()


def test_a_download_past_its_expected_end_is_away_not_landing() -> None:
    """The first of several downloads at once sets ``fetch_s``; one still running past
    its start plus that was read as 'ends now' (eta 0) and a batch waited seconds for
    it. It is away (infinite), so the batch is read by ranged GETs."""
    now = [0.0]
    ahead = Prefetcher(1 << 30, clock=lambda: now[0])
    release = threading.Event()
    try:
        ahead.add("slow", 100, lambda until: (release.wait(10), Path("x"))[1])
        ahead.pace.fetched(0.5)
        now[0] = 0.2
        assert ahead.eta("slow") == pytest.approx(0.3)
        now[0] = 2.0  # overdue
        assert ahead.eta("slow") == math.inf
        assert Arriving().worth([ahead.eta("slow")])  # type: ignore[list-item]
        assert ahead.eta("never handed over") == math.inf  # e.g. a DataLoader worker's
    finally:
        release.set()
        ahead.close()


def test_a_corpus_larger_than_local_bytes_streams_through(built: tuple[str, Path],
                                                          s3_env: dict[str, str],
                                                          tmp_path: Path) -> None:
    """``local_bytes`` holds a few of the cache's chunks: a whole epoch in stored order
    (chunks needed one after another) downloads them ahead in order of need, evicts the
    ones read, never holds more than ``local_bytes``, and gives the local read's bytes."""
    url, local = built
    want = _batches(local, "none")
    bins = sorted(local.rglob("chunks/*/*.bin"))
    biggest = max(p.stat().st_size for p in bins)
    total = sum(p.stat().st_size + p.with_suffix(".idx").stat().st_size for p in bins)
    room = 4 * biggest + (64 << 10)
    assert room < total / 2  # the corpus does not fit
    store = RemoteStore(url, policy=PATIENT)
    cache = sw.open_cache(store, local_dir=tmp_path / "node", local_bytes=room)
    got = _batches(cache, "none")
    downloads = cache.store.downloads  # type: ignore[attr-defined]
    cache.close()
    _same(got, want)
    assert downloads.evicted > 0 and downloads.used_bytes() <= room
    assert sum(downloads.downloaded.values()) >= len(bins)


def test_block_sums_of_a_small_cache_bring_every_chunks_metadata_at_once(
        s3_env: dict[str, str], sample_corpus: Path, tokenizer_path: Path, tmp_path: Path,
        fault_proxy: FaultProxy) -> None:
    """The first batches' early reads each want the block sums of their chunks: in a small
    cache the first fetch brings every chunk's metadata (one GET each, one round trip), so
    the next early reads wait for no second round trip behind it. Counted at a proxy.
    Failed before: only the asked chunk's metadata came, the others in later fetches."""
    url, local = "s3://sw-test/few-chunks", tmp_path / "local"
    sw.build([str(sample_corpus)], local, tokenizer=tokenizer_path, chunk_docs=64,
             progress=False, workers=1)
    upload(local, url, {})  # the order a build publishes in
    cache = sw.open_cache(url, local_dir=tmp_path / "node", storage_options={
        "endpoint_url": fault_proxy.endpoint})
    store = cache.store
    n = len(store.view.chunks)
    assert 2 <= n <= SMALL_BATCH
    at = len(fault_proxy.seen)
    first = store._block_sums([0])
    metas = sorted(p.removeprefix("/sw-test/few-chunks/") for _, p in fault_proxy.seen[at:])
    assert metas == sorted(store.view.chunks[c].stem + ".json" for c in range(n))
    at = len(fault_proxy.seen)
    rest = store._block_sums(list(range(1, n)))
    assert fault_proxy.seen[at:] == []  # held already: no request
    want = sw.open_cache(local)  # the same sums as a local read's metadata gives
    for c, sums in {**first, **rest}.items():
        assert np.array_equal(sums.sums, BlockSums.of(want.store.meta(c)).sums)  # type: ignore[union-attr]
    cache.close()
    RemoteStore(url).remove(RemoteStore(url).list_keys())
