"""The look-ahead of a remote cache, sized from measured latency (storage/prefetch.py), and
the pins that keep downloads ahead from being evicted (storage/download.py). No network:
a fake clock and fake downloads."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest

from shardwise.storage.download import DownloadDir
from shardwise.storage.prefetch import (
    MAX_THREADS,
    MIN_AHEAD,
    PIN_SECONDS,
    START_AHEAD,
    Pace,
    Prefetcher,
)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _paced(fetch_s: float, read_s: float, chunks: int = 20) -> Pace:
    """A reader that spends ``read_s`` on each chunk, downloads taking ``fetch_s``."""
    clock = Clock()
    pace = Pace(clock)
    for _ in range(chunks):
        pace.fetched(fetch_s)
        clock.now += read_s
        pace.taken(clock.now)
    return pace


def test_the_look_ahead_grows_with_latency() -> None:
    assert Pace(Clock()).chunks_ahead() == START_AHEAD  # nothing measured yet
    latencies = [0.006, 0.01, 0.02, 0.05, 0.1, 0.2]
    ahead = [_paced(f, read_s=0.02).chunks_ahead() for f in latencies]
    threads = [_paced(f, read_s=0.02).threads() for f in latencies]
    assert ahead == sorted(ahead) and ahead[0] == MIN_AHEAD and ahead[-1] >= 20
    assert threads == sorted(threads) and threads[-1] == MAX_THREADS
    # enough in flight to hide the latency: chunks read during one download, with margin
    for f in latencies:
        assert _paced(f, 0.02).chunks_ahead() >= 2 * f / 0.02
    # and with the reading pace: a faster reader needs more ahead at the same latency
    assert _paced(0.05, 0.002).chunks_ahead() > _paced(0.05, 0.01).chunks_ahead()


def test_time_the_reader_waits_for_a_download_is_not_reading_time() -> None:
    """A reader stalled on downloads must not look slow (the look-ahead would shrink just
    when it is too short)."""
    clock = Clock()
    pace = Pace(clock)
    for _ in range(10):
        pace.fetched(0.1)
        clock.now += 0.01  # reading
        asked = clock.now
        clock.now += 0.5  # waiting for the download
        pace.taken(asked)
    assert pace.read_s == pytest.approx(0.01)
    assert pace.chunks_ahead() == 21


def _fake_fetch(d: DownloadDir, key: str, size: int) -> Any:
    def download(tmp: Path) -> None:
        tmp.write_bytes(b"x" * size)

    return lambda until: d.fetch(key, size, download, until)


def test_downloads_ahead_stay_within_the_budget_and_are_taken_once(tmp_path: Path) -> None:
    d = DownloadDir(tmp_path, max_bytes=1000)
    ahead = Prefetcher(budget=300)
    assert ahead.add("a", 100, _fake_fetch(d, "a", 100))
    assert ahead.add("b", 100, _fake_fetch(d, "b", 100))
    assert ahead.add("a", 100, _fake_fetch(d, "a", 100))  # already ahead: not twice
    assert ahead.add("c", 100, _fake_fetch(d, "c", 100))
    assert not ahead.wants_more()  # the budget is full
    assert not ahead.add("d", 100, _fake_fetch(d, "d", 100))  # left for the reader
    ahead.wait()
    assert d.downloaded == {"a": 1, "b": 1, "c": 1}
    assert ahead.take("a", _fake_fetch(d, "a", 100)) == tmp_path / "a"
    assert ahead.take("d", _fake_fetch(d, "d", 100)) == tmp_path / "d"  # on demand
    assert d.downloaded == {"a": 1, "b": 1, "c": 1, "d": 1}
    assert ahead.stats()["ahead"] == 2 and ahead.ahead_bytes == 200
    ahead.close()


def test_a_cache_of_fewer_chunks_than_the_pace_asks_for_wants_no_more_once_all_are_ahead(
        tmp_path: Path) -> None:
    """START_AHEAD chunks are asked for before anything is measured; a cache of fewer
    than that wanted more for ever, and its look-ahead handed over a thousand batches
    (each with its ranged reads) before the first was read: 9.9 s to a first batch."""
    d = DownloadDir(tmp_path, max_bytes=1 << 20)
    ahead = Prefetcher(budget=1 << 20)
    try:
        for key in ("a", "b", "c"):
            ahead.add(key, 100, _fake_fetch(d, key, 100))
        assert ahead.pace.chunks_ahead() == START_AHEAD > 3
        assert ahead.wants_more()  # as far as it knows, more chunks could come
        assert not ahead.wants_more(3)  # the cache's 3 chunks are all ahead
        assert ahead.wants_more(4)
    finally:
        ahead.close()


def test_chunks_handed_over_beyond_the_budget_start_in_order_as_room_frees(
        tmp_path: Path) -> None:
    """A chunk refused for lack of room is queued, not forgotten: the loader hands each
    chunk over once, well before it is read, so a forgotten one would make the reader
    wait a whole round trip for it."""
    d = DownloadDir(tmp_path, max_bytes=1000)
    ahead = Prefetcher(budget=200)
    for key in ("a", "b", "c", "d"):
        ahead.add(key, 100, _fake_fetch(d, key, 100))
    assert not ahead.wants_more()  # chunks are queued: the loader need not hand over more
    ahead.wait()
    assert d.downloaded == {"a": 1, "b": 1}
    ahead.take("a", _fake_fetch(d, "a", 100))  # room for one: c starts, not d
    ahead.wait()
    assert d.downloaded == {"a": 1, "b": 1, "c": 1}
    ahead.take("d", _fake_fetch(d, "d", 100))  # needed before its turn: fetched now, once
    ahead.take("b", _fake_fetch(d, "b", 100))
    ahead.take("c", _fake_fetch(d, "c", 100))
    ahead.wait()
    assert d.downloaded == {"a": 1, "b": 1, "c": 1, "d": 1}
    assert ahead.stats()["ahead"] == 0 and ahead.wants_more()
    ahead.close()


def test_a_chunk_downloaded_ahead_is_never_evicted_before_it_is_read(tmp_path: Path) -> None:
    """Room for a download ahead comes only from files that were read; the reader's own
    download may take a pinned file only when nothing else can go."""
    d = DownloadDir(tmp_path, max_bytes=300)
    ahead = Prefetcher(budget=300)
    old = d.fetch("old", 100, lambda tmp: tmp.write_bytes(b"o" * 100))  # read a while ago
    os.utime(old, (time.time() - 60, time.time() - 60))
    for key in ("a", "b"):
        ahead.add(key, 100, _fake_fetch(d, key, 100))
    ahead.wait()
    assert old.exists()  # 300 bytes: full
    pinned = [p.stat().st_mtime for p in (tmp_path / "a", tmp_path / "b")]
    assert min(pinned) > time.time() + PIN_SECONDS / 2  # pinned in the future
    # a third download ahead makes room from the file that was read, never from a or b
    ahead.add("c", 100, _fake_fetch(d, "c", 100))
    ahead.wait()
    assert not old.exists() and (tmp_path / "a").exists() and (tmp_path / "b").exists()
    assert d.evicted_pinned == 0
    # the reader takes a: unpinned (touched to now), and now the first to go
    ahead.take("a", _fake_fetch(d, "a", 100))
    assert (tmp_path / "a").stat().st_mtime <= time.time()
    d.fetch("e", 100, lambda tmp: tmp.write_bytes(b"e" * 100))  # the reader's own download
    assert not (tmp_path / "a").exists() and (tmp_path / "b").exists()
    assert d.evicted_pinned == 0
    ahead.close()


def test_the_readers_own_download_may_take_a_pinned_file_as_a_last_resort(
        tmp_path: Path) -> None:
    """Other processes of the node pinned every byte: the reader does not wait forever."""
    d = DownloadDir(tmp_path, max_bytes=200, timeout=5, poll_interval=0.01)
    later = time.time() + PIN_SECONDS
    for key in ("a", "b"):
        d.fetch(key, 100, lambda tmp: tmp.write_bytes(b"p" * 100), until=later)
    d.fetch("now", 100, lambda tmp: tmp.write_bytes(b"n" * 100))
    assert d.evicted_pinned == 1 and (tmp_path / "now").exists()
    assert d.used_bytes() <= 200


def test_downloads_ahead_that_the_reader_passed_by_are_forgotten(tmp_path: Path) -> None:
    """An iteration stopped and restarted elsewhere leaves downloads nobody will read: once
    older than a few windows they leave the budget (and are unpinned)."""
    clock = Clock()
    d = DownloadDir(tmp_path, max_bytes=1000)
    ahead = Prefetcher(budget=200, clock=clock)
    for _ in range(5):  # a measured pace: 0.01 s per chunk, 0.05 s per download
        ahead.pace.fetched(0.05)
        clock.now += 0.01
        ahead.pace.taken(clock.now)
    ahead.add("a", 100, _fake_fetch(d, "a", 100))
    ahead.add("b", 100, _fake_fetch(d, "b", 100))
    ahead.wait()
    assert not ahead.add("c", 100, _fake_fetch(d, "c", 100))  # full
    clock.now += 100 * ahead.pace.window_s()
    assert ahead.add("c", 100, _fake_fetch(d, "c", 100))  # a and b were passed by
    ahead.wait()
    assert list(ahead._ahead) == ["c"]
    assert (tmp_path / "a").stat().st_mtime <= time.time()  # unpinned
    ahead.close()


def test_the_metadata_of_the_downloads_ahead_comes_in_one_round_trip(tmp_path: Path) -> None:
    calls: list[list[str]] = []

    def get_many(keys: list[str]) -> dict[str, bytes | Exception]:
        calls.append(keys)
        return {k: FileNotFoundError(k) if k == "gone.json" else k.encode() for k in keys}

    d = DownloadDir(tmp_path, max_bytes=1000)
    ahead = Prefetcher(budget=1000)
    for key in ("a", "b", "c", "gone"):
        ahead.add(key, 10, _fake_fetch(d, key, 10), needs=f"{key}.json")
    ahead.wait()
    assert ahead.small("b.json", get_many) == b"b.json"
    assert calls == [["b.json", "a.json", "c.json", "gone.json"]]  # asked first, then the rest
    assert ahead.small("a.json", get_many) == b"a.json"
    assert ahead.small("c.json", get_many) == b"c.json"
    with pytest.raises(FileNotFoundError):
        ahead.small("gone.json", get_many)
    assert len(calls) == 1
    assert ahead.small("other.json", get_many) == b"other.json"  # not ahead: on its own
    assert calls[-1] == ["other.json"]
    ahead.close()


def test_the_same_chunks_handed_over_again_are_recognised_once() -> None:
    """Consecutive batches of one block hand over the same chunks: recognised, so the
    reader's thread does not look at each again; a different list is not."""
    ahead = Prefetcher(budget=100)
    assert not ahead.same_as_last([3, 4])
    assert ahead.same_as_last([3, 4])
    assert not ahead.same_as_last([4, 5])
    assert not ahead.same_as_last([3, 4])


def test_a_download_finishing_while_another_process_looks_is_not_downloaded_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Another process of the node finishes its download (file renamed into place, then its
    claim dropped — outside the node's lock) in the very moment this process first looks:
    this process must find the file, not download it a second time (CI's two-node run once
    counted a chunk downloaded twice on one node; this is the race that can do that)."""
    from shardwise.storage.download import CLAIM_PREFIX, _start_time

    d = DownloadDir(tmp_path, max_bytes=1000, timeout=5, poll_interval=0.01)
    key = "chunks/00000/00000-00007.bin"
    final = tmp_path / key
    final.parent.mkdir(parents=True)
    claim = final.with_name(CLAIM_PREFIX + final.name)
    claim.write_text(f"{os.getpid()} {_start_time(os.getpid())} 10")  # the other's, live
    staged = final.with_name(".tmp-staged")
    staged.write_bytes(b"0123456789")
    real_exists = Path.exists

    def other_finishes_when_first_looked_at(self: Path, **kw: Any) -> bool:
        seen = real_exists(self, **kw)
        if self in (final, claim) and real_exists(staged):
            os.replace(staged, final)  # the other download ends: file in place, claim gone
            claim.unlink()
        return seen

    monkeypatch.setattr(Path, "exists", other_finishes_when_first_looked_at)
    path = d.fetch(key, 10, lambda tmp: tmp.write_bytes(b"x" * 10))
    assert path.read_bytes() == b"0123456789"
    assert d.downloaded[key] == 0 and d.waits == 1
