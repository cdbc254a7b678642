"""Caches on object storage, against a real S3-compatible server (SeaweedFS on 127.0.0.1)."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from pathlib import Path

import fsspec
import numpy as np
import pytest
from tests.helpers_cache import cache_files
from tests.remote.conftest import BUCKET

import shardwise as sw
from shardwise.errors import CorruptChunkError
from shardwise.storage.bucket import BucketStore
from shardwise.storage.download import CLAIM_PREFIX, DownloadDir, _start_time
from shardwise.storage.verify import verify_cache
from shardwise.world import World

SEQ_LEN = 32


def _s3() -> fsspec.AbstractFileSystem:
    return fsspec.filesystem("s3", skip_instance_cache=True)


def _dir_bytes(d: Path) -> int:
    """The files' bytes now; a file a download in flight renames or removes meanwhile (its
    temporary file, its claim) is not there."""
    total = 0
    for p in d.rglob("*"):
        if ".shardwise-plans" not in p.parts and p.name != ".lock":
            with contextlib.suppress(FileNotFoundError):
                total += p.stat().st_size if p.is_file() else 0
    return total


def _copy_prefix(src: str, dst: str) -> None:
    fs = _s3()
    for key in fs.find(src.removeprefix("s3://")):
        fs.pipe_file(dst.removeprefix("s3://") + key[len(src) - 5:], fs.cat_file(key))


def _rows(url_or_dir: str | Path, rank: int, size: int, tmp: Path, steps: int,
          state: dict | None = None, **open_kw: object) -> tuple[np.ndarray, dict]:
    from shardwise.torch import loader

    cache = sw.open_cache(url_or_dir, **open_kw) if open_kw else url_or_dir
    ds = sw.TokenDataset(cache, seq_len=SEQ_LEN, seed=7, plan_dir=tmp / "plans")
    dl = loader(ds, global_batch_size=8, micro_batch_size=2,
                world=World(rank, size))
    if state is not None:
        dl.load_state_dict(state)
    it = iter(dl)
    rows = np.concatenate([next(it)["input_ids"].numpy() for _ in range(steps)])
    it.close()
    return rows, dl.state_dict()


def test_build_to_s3_equals_a_local_build_byte_for_byte(built: tuple[str, Path]) -> None:
    url, local = built
    fs = _s3()
    prefix = url.removeprefix("s3://") + "/"
    remote = {k[len(prefix):]: fs.cat_file(k) for k in fs.find(prefix)}
    assert remote == cache_files(local)
    assert not any("aws" in v.decode("latin-1").lower() or b"testing" in v
                   for k, v in remote.items() if k.endswith(".json"))  # no credentials


def test_two_ranks_read_the_same_global_batches_as_local_and_resume(
        built: tuple[str, Path], tmp_path: Path) -> None:
    url, local = built
    steps = 6
    want = [_rows(local, r, 2, tmp_path, steps)[0] for r in range(2)]
    got, states = [], []
    for r in range(2):
        rows, st = _rows(url, r, 2, tmp_path, steps, local_dir=tmp_path / "node",
                         local_bytes=64 << 20)
        got.append(rows)
        states.append(st)
    for r in range(2):
        np.testing.assert_array_equal(got[r], want[r])
    assert states[0] == states[1]
    # resume from the state on fresh ranks (and a fresh local directory)
    tail_local = [_rows(local, r, 2, tmp_path, 3, state=states[0])[0] for r in range(2)]
    for r in range(2):
        tail, _ = _rows(url, r, 2, tmp_path, 3, state=states[1], local_dir=tmp_path / "n2",
                        local_bytes=64 << 20)
        np.testing.assert_array_equal(tail, tail_local[r])
    # the continuation differs from the head: resume did not restart from zero
    assert not np.array_equal(tail_local[0], want[0][: len(tail_local[0])])


def test_local_directory_never_exceeds_its_bound(built: tuple[str, Path],
                                                 tmp_path: Path) -> None:
    url, local = built
    ref = sw.open_cache(local)
    sizes = [(ref.chunks[c].base.with_name(ref.chunks[c].base.name + ".bin")).stat().st_size
             for c in range(len(ref.chunks))]
    bound = 3 * max(sizes) + 4096
    cache = sw.open_cache(url, local_dir=tmp_path / "node", local_bytes=bound)
    ds = sw.TokenDataset(cache, seq_len=SEQ_LEN, seed=3, plan_dir=tmp_path / "plans")
    lds = sw.TokenDataset(ref, seq_len=SEQ_LEN, seed=3, plan_dir=tmp_path / "plans")
    assert cache.store.downloads is not None
    peak = 0
    for start in range(0, min(len(ds), 160), 8):
        idx = list(range(start, min(start + 8, len(ds))))
        np.testing.assert_array_equal(ds.__getitems__(idx)["input_ids"],
                                      lds.__getitems__(idx)["input_ids"])
        peak = max(peak, _dir_bytes(cache.store.downloads.dir))
        assert peak <= bound
    assert cache.store.downloads.evicted > 0, "the bound was never reached; the test is too weak"
    cache.wait_for_prefetch()  # chunks read by ranged GETs download in the background
    assert not list(cache.store.downloads.dir.rglob(f"{CLAIM_PREFIX}*"))
    cache.close()


def test_prefetch_downloads_in_the_background(built: tuple[str, Path], tmp_path: Path) -> None:
    url, _ = built
    cache = sw.open_cache(url, local_dir=tmp_path / "node", local_bytes=64 << 20)
    cache.prefetch([0, 1, 2])
    assert cache.store.downloads is not None
    cache.tokens(2)  # waits for the prefetched download, no second download
    cache.close()
    assert {k for k in cache.store.downloads.downloaded if k.endswith(".bin")} == {
        cache.chunks[c].stem + ".bin" for c in (0, 1, 2)}
    assert all(v == 1 for v in cache.store.downloads.downloaded.values())


def test_loader_downloads_the_chunks_of_coming_micro_batches(built: tuple[str, Path],
                                                            tmp_path: Path) -> None:
    """After the first micro-batch, exactly the chunks of micro-batches 0..look_ahead are
    downloaded (the later ones in the background), and the batches equal a local read.
    (With batches made ahead, the look-ahead counts from the last batch made.)"""
    from shardwise.torch import loader

    url, local = built
    ahead, m = 3, 2
    cache = sw.open_cache(url, local_dir=tmp_path / "node", local_bytes=64 << 20)
    ds = sw.TokenDataset(cache, seq_len=SEQ_LEN, seed=5)
    dl = loader(ds, global_batch_size=4, micro_batch_size=m, world=World(1, 2),
                look_ahead=ahead, batches_ahead=0)  # no batch made ahead of the caller
    it = iter(dl)
    first = next(it)["input_ids"].numpy()
    cache.wait_for_prefetch()
    ref = sw.TokenDataset(sw.open_cache(local), seq_len=SEQ_LEN, seed=5)
    want = set()
    for k in range(ahead + 1):  # rank 1's micro-batches: examples 4k + 2, 4k + 3
        for w in ref.windows([4 * k + 2, 4 * k + 3]).tolist():
            lo = np.searchsorted(ref.cache.cum_tokens, w * SEQ_LEN, side="right") - 1
            hi = np.searchsorted(ref.cache.cum_tokens, w * SEQ_LEN + SEQ_LEN, side="right") - 1
            want |= {cache.chunks[c].stem + ".bin" for c in range(lo, hi + 1)}
    assert cache.store.downloads is not None
    got = {k for k in cache.store.downloads.downloaded if k.endswith(".bin")}
    assert got == want and len(want) > 2
    assert set(cache.store.downloads.downloaded.values()) == {1}
    np.testing.assert_array_equal(first, ref.__getitems__([2, 3])["input_ids"])
    rest = np.concatenate([next(it)["input_ids"].numpy() for _ in range(4)])
    np.testing.assert_array_equal(rest, np.concatenate(
        [ref.__getitems__([4 * k + 2, 4 * k + 3])["input_ids"] for k in range(1, 5)]))
    with pytest.raises(sw.ConfigError, match="look_ahead"):
        loader(ds, global_batch_size=4, micro_batch_size=m, world=World(1, 2), look_ahead=-1)
    it.close()
    cache.close()


@pytest.mark.filterwarnings("ignore:.*fork.*:DeprecationWarning")  # Python >= 3.12
def test_loader_workers_read_a_remote_cache(built: tuple[str, Path], tmp_path: Path) -> None:
    """DataLoader workers (forked after the loader has downloaded and started downloading
    ahead) read the same batches as a local read, across a restarted iteration."""
    from shardwise.torch import loader

    url, local = built
    ref = sw.TokenDataset(sw.open_cache(local), seq_len=SEQ_LEN, seed=9)
    cache = sw.open_cache(url, local_dir=tmp_path / "node", local_bytes=64 << 20)
    ds = sw.TokenDataset(cache, seq_len=SEQ_LEN, seed=9)
    ds.__getitems__([0, 1])  # the parent has used its filesystem and mapped a chunk
    dl = loader(ds, global_batch_size=4, micro_batch_size=2, world=World(0, 2),
                num_workers=2)
    got = []
    for _ in range(2):  # each iter() forks new workers while downloads may be pending
        it = iter(dl)
        got += [next(it)["input_ids"].numpy() for _ in range(5)]
        del it
    cache.close()
    want = [ref.__getitems__([4 * k, 4 * k + 1])["input_ids"] for k in range(10)]
    assert all(np.array_equal(g, w) for g, w in zip(got, want, strict=True))


def _read_chunk_in_child(cache: sw.Cache, c: int, out: Path) -> None:
    out.write_bytes(np.asarray(cache.tokens(c)).tobytes())


@pytest.mark.filterwarnings("ignore:.*fork.*:DeprecationWarning")  # Python >= 3.12
def test_a_forked_child_never_waits_on_the_parents_download_threads(
        built: tuple[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """DataLoader workers fork while the loader's downloads are under way: the child
    inherits the pending futures but not the threads that would finish them. It must
    fetch (or find on disk) the chunk itself, not wait forever."""
    import multiprocessing
    import threading

    url, local = built
    cache = sw.open_cache(url, local_dir=tmp_path / "node", local_bytes=64 << 20)
    release = threading.Event()
    real_fetch = BucketStore._fetch

    def slow_fetch(self: BucketStore, info: object, suffix: str,
                   until: float | None = None) -> Path:
        release.wait(30)  # held until the child has forked
        return real_fetch(self, info, suffix, until)  # type: ignore[arg-type]

    monkeypatch.setattr(BucketStore, "_fetch", slow_fetch)
    cache.prefetch([4])
    monkeypatch.setattr(BucketStore, "_fetch", real_fetch)
    child = multiprocessing.get_context("fork").Process(
        target=_read_chunk_in_child, args=(cache, 4, tmp_path / "child.bin"))
    child.start()
    child.join(20)
    release.set()
    if child.is_alive():
        child.kill()
        child.join()
    cache.close()
    assert child.exitcode == 0, "the forked child hung on a future of its parent"
    want = np.asarray(sw.open_cache(local).tokens(4)).tobytes()
    assert (tmp_path / "child.bin").read_bytes() == want


@pytest.fixture()
def damaged(built: tuple[str, Path]) -> tuple[str, str, str]:
    """A copy of the cache with one .bin object's bits flipped and one .idx deleted."""
    url, _ = built
    bad = f"s3://{BUCKET}/damaged-{os.getpid()}-{os.urandom(3).hex()}"
    _copy_prefix(url, bad)
    cache = sw.open_cache(url, local_dir="/nonexistent-never-used", local_bytes=1)
    flipped = cache.chunks[3].stem + ".bin"
    deleted = cache.chunks[5].stem + ".idx"
    fs = _s3()
    data = bytearray(fs.cat_file(f"{bad[5:]}/{flipped}"))
    data[10] ^= 0xFF
    fs.pipe_file(f"{bad[5:]}/{flipped}", bytes(data))
    fs.rm(f"{bad[5:]}/{deleted}")
    return bad, flipped, deleted


def test_verify_names_every_damaged_object_by_key(damaged: tuple[str, str, str]) -> None:
    bad, flipped, deleted = damaged
    report = verify_cache(bad)
    assert not report.ok
    named = {p.path for p in report.problems}
    assert named == {f"{bad}/{flipped}", f"{bad}/{deleted}"}, report.problems
    assert report.chunks_checked > 10
    out = subprocess.run([sys.executable, "-m", "shardwise.cli.main", "verify", bad],
                         capture_output=True, text=True, env=os.environ.copy())
    assert out.returncode == 1, out.stderr
    assert f"BAD {bad}/{flipped}: xxh3_64" in out.stdout
    assert f"BAD {bad}/{deleted}: missing" in out.stdout


def _objects(url: str) -> dict[str, bytes]:
    fs = _s3()
    prefix = url.removeprefix("s3://") + "/"
    return {k[len(prefix):]: fs.cat_file(k) for k in fs.find(prefix)}


def test_a_rerun_of_the_build_repairs_the_damaged_objects(
        damaged: tuple[str, str, str], built: tuple[str, Path], sample_corpus: Path,
        tokenizer_path: Path) -> None:
    bad, flipped, deleted = damaged
    url, _ = built
    summary = sw.build([str(sample_corpus)], bad, tokenizer=tokenizer_path, chunk_docs=8,
                       append_eod=True, progress=False, workers=2)
    assert set(summary.rebuilt_chunks) == {flipped[:-4], deleted[:-4]}
    assert summary.rebuilt_chunks[flipped[:-4]].startswith(".bin: xxh3_64 ")
    assert summary.rebuilt_chunks[deleted[:-4]] == ".idx: missing (named by the ledger)"
    assert summary.check_depth == "checksums" and summary.new_chunks == 0
    assert _objects(bad) == _objects(url)
    assert verify_cache(bad).ok


def test_overwrite_of_a_prefix_holding_other_objects_deletes_nothing(
        built: tuple[str, Path], sample_corpus: Path, tokenizer_path: Path) -> None:
    url, _ = built
    other = f"s3://{BUCKET}/foreign-{os.getpid()}-{os.urandom(3).hex()}"
    _copy_prefix(url, other)
    _s3().pipe_file(f"{other[5:]}/notes/readme.txt", b"mine")
    before = _objects(other)
    with pytest.raises(sw.ConfigError, match=r"holds 1 other entries \(notes/readme.txt\); "
                                             "nothing was deleted"):
        sw.build([str(sample_corpus)], other, tokenizer=tokenizer_path, chunk_docs=50,
                 progress=False, workers=2, overwrite=True)
    assert _objects(other) == before


def test_reader_names_a_damaged_or_missing_object(damaged: tuple[str, str, str],
                                                  tmp_path: Path) -> None:
    bad, flipped, deleted = damaged
    cache = sw.open_cache(bad, local_dir=tmp_path / "node", local_bytes=64 << 20)
    with pytest.raises(CorruptChunkError, match=f"{bad}/{flipped}: xxh3_64"):
        cache.tokens(3)
    with pytest.raises(CorruptChunkError, match=f"{bad}/{deleted}: named by the ledger"):
        cache.index(5)
    assert cache.store.downloads is not None
    assert not (cache.store.downloads.dir / flipped).exists()  # never published locally
    np.testing.assert_array_equal(cache.tokens(2)[:5], cache.tokens(2)[:5])


def test_a_crashed_downloader_never_blocks_others(tmp_path: Path) -> None:
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    d = DownloadDir(tmp_path, 100, timeout=5)
    key = "chunks/00000/00000-00000.bin"
    (tmp_path / "chunks/00000").mkdir(parents=True)
    claim = tmp_path / "chunks/00000" / f"{CLAIM_PREFIX}00000-00000.bin"
    claim.write_text(f"{dead.pid} 0 10")
    partial = tmp_path / "chunks/00000" / f".tmp-00000-00000.bin.{dead.pid}.abcd"
    partial.write_bytes(b"half")
    path = d.fetch(key, 10, lambda tmp: tmp.write_bytes(b"0123456789"))
    assert path.read_bytes() == b"0123456789"
    assert not claim.exists() and not partial.exists()
    assert d.downloaded[key] == 1
    # a claim naming a live pid with another start time: a reused pid, stale too
    reused = tmp_path / "chunks/00000" / f"{CLAIM_PREFIX}00000-00002.bin"
    reused.write_text(f"{os.getpid()} 1 10")
    d.fetch("chunks/00000/00000-00002.bin", 10, lambda tmp: tmp.write_bytes(b"y" * 10))
    # a live owner's claim (this process) is waited for, then times out loudly
    other = "chunks/00000/00000-00001.bin"
    live = tmp_path / "chunks/00000" / f"{CLAIM_PREFIX}00000-00001.bin"
    live.write_text(f"{os.getpid()} {_start_time(os.getpid())} 10")
    d.timeout = 0.2
    with pytest.raises(sw.CacheError, match="waited"):
        d.fetch(other, 10, lambda tmp: tmp.write_bytes(b"x" * 10))
    live.unlink()


def test_stream_placement_reads_its_chunks_through_the_bounded_download_dir(
        built: tuple[str, Path], tmp_path: Path) -> None:
    url, local = built
    bound = 64 << 10
    remote = sw.open_cache(url, local_dir=tmp_path / "node", local_bytes=bound)
    rows = []
    for cache in (remote, sw.open_cache(local)):
        with sw.StreamDataset(cache, seq_len=32, streams=4, seed=3,
                              world=sw.World(1, 2), epochs=1) as st:
            rows.append(np.stack([ex["input_ids"] for ex in st]))
    assert rows[0].shape == rows[1].shape and (rows[0] == rows[1]).all()
    assert remote.store.downloads is not None and len(remote.store.downloads.downloaded) > 0
    assert _dir_bytes(next((tmp_path / "node").iterdir())) <= bound
    # rank 1 of 2 serves streams 1 and 3: it fetched only chunks c % 4 in {1, 3}
    stems = [c.stem for c in remote.chunks]
    assert {stems.index(s) % 4 for s in remote.opened} <= {1, 3}


def test_inspect_a_remote_cache(built: tuple[str, Path], tmp_path: Path,
                                capsys: pytest.CaptureFixture[str],
                                monkeypatch: pytest.MonkeyPatch) -> None:
    from shardwise.cli.main import main

    url, _ = built
    # the node's copy of the head files is keyed by the URL under the user's cache dir,
    # which other test sessions on this machine (their own servers, the same URL) share
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert main(["inspect", url]) == 0
    out = capsys.readouterr().out
    assert url in out and "516 documents" in out


def test_a_chunk_and_its_metadata_come_in_one_round_trip(built: tuple[str, Path],
                                                         tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch
                                                         ) -> None:
    """A .bin whose metadata this process has not read yet is asked for together with it
    (one request batch, no request of its own), and equals the local chunk."""
    from shardwise.remote.client import RemoteStore

    url, local = built
    calls: list[list[str]] = []
    real_ranges, real_range = RemoteStore.get_ranges, RemoteStore.read_range

    def ranges(self: RemoteStore, asked: list[tuple[str, int, int]], **kw: bool) -> list:
        calls.append([k for k, _, _ in asked])
        return real_ranges(self, asked, **kw)

    def one_range(self: RemoteStore, key: str, start: int, stop: int) -> bytes:
        calls.append([key])
        return real_range(self, key, start, stop)

    monkeypatch.setattr(RemoteStore, "get_ranges", ranges)
    monkeypatch.setattr(RemoteStore, "read_range", one_range)
    cache = sw.open_cache(url, local_dir=tmp_path / "node", local_bytes=64 << 20)
    assert calls == [["manifest.json", "ledger.json", "ledger.index"]]  # one batch too
    calls.clear()
    stem = cache.chunks[2].stem
    got = np.asarray(cache.tokens(2)).copy()
    assert calls == [[f"{stem}.json", f"{stem}.bin"]]
    np.testing.assert_array_equal(got, sw.open_cache(local).tokens(2))
    assert cache.meta(2).files[".bin"]["bytes"] == got.nbytes  # kept: not asked again
    assert len(calls) == 1
    cache.close()


def test_reader_names_damaged_or_missing_metadata(built: tuple[str, Path],
                                                  tmp_path: Path) -> None:
    """The metadata that comes with a chunk's first block is checked against the ledger
    before the block is trusted; a missing one is named, never read as empty."""
    url, _ = built
    bad = f"s3://{BUCKET}/badmeta-{os.getpid()}-{os.urandom(3).hex()}"
    _copy_prefix(url, bad)
    cache = sw.open_cache(bad, local_dir=tmp_path / "node", local_bytes=64 << 20)
    flipped, deleted = cache.chunks[1].stem + ".json", cache.chunks[4].stem + ".json"
    fs = _s3()
    fs.pipe_file(f"{bad[5:]}/{flipped}", fs.cat_file(f"{bad[5:]}/{flipped}") + b" ")
    fs.rm(f"{bad[5:]}/{deleted}")
    with pytest.raises(CorruptChunkError, match=f"{bad}/{flipped}: xxh3_64 .*the ledger"):
        cache.tokens(1)
    with pytest.raises(CorruptChunkError, match=f"{bad}/{deleted}: named by the ledger"):
        cache.tokens(4)
    assert cache.store.downloads is not None
    assert not list(cache.store.downloads.dir.rglob("*.bin"))  # nothing published locally
    cache.close()


def test_gather_from_a_bucket_equals_gather_from_a_directory(built: tuple[str, Path],
                                                              tmp_path: Path) -> None:
    url, local = built
    here = sw.open_cache(local)
    there = sw.open_cache(url, local_dir=tmp_path / "dl")
    rng = np.random.default_rng(4)
    tokens = here.chunks.columns.tokens
    chunk = rng.integers(0, len(tokens), 50)
    offset = rng.integers(0, tokens[chunk])
    runs = (chunk, offset, rng.integers(0, tokens[chunk] - offset + 1))
    # chunks never handed over: their runs by ranged GETs, the chunks downloading meanwhile
    np.testing.assert_array_equal(there.gather(runs), here.gather(runs))
    assert there.prefetch_stats()["ranged_reads"] > 0  # type: ignore[operator]
    there.store._prefetcher().wait()  # type: ignore[attr-defined]
    np.testing.assert_array_equal(there.gather(runs), here.gather(runs))  # from the maps
    assert set(there.opened) == set(here.opened)
