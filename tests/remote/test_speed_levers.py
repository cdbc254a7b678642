"""Issue 21 item 2's levers, for correctness (their speed is ``shardwise bench remote``'s):
ranged reads of a batch's runs while its chunks are still arriving give the batches of a
local read (also through transient faults; wrong bytes are caught by the chunk's block
sums before a batch holds them, and a chunk an older build wrote without block sums is
read whole); the GIL-free client (obstore) is made per process, a forked DataLoader worker
making its own, with fsspec the fallback; the look-ahead's byte budget follows the pace."""

from __future__ import annotations

import math
import multiprocessing
from pathlib import Path

import numpy as np
import pytest
from tests.faults import Fault, FaultProxy
from tests.remote.conftest import BUCKET

import shardwise as sw
from shardwise.bench.proxy import LatencyProxy
from shardwise.errors import CorruptChunkError
from shardwise.format.checksum import (
    BLOCK_BYTES,
    block_checksums,
    decode_block_checksums,
    first_bad_block,
)
from shardwise.format.chunk import read_meta
from shardwise.remote import RemotePolicy, RemoteStore
from shardwise.remote.native import native_options
from shardwise.storage.prefetch import START_AHEAD, Pace, Prefetcher, in_flight_budget
from shardwise.storage.ranged import Arriving, BlockSums
from shardwise.world import World

SEQ_LEN = 32
PATIENT = RemotePolicy(connect_timeout=5, read_timeout=5, first_backoff=0.01,
                       max_backoff=0.2, deadline=30)


def _batches(cache: sw.Cache | Path, n: int, **kw: object) -> list[np.ndarray]:
    from shardwise.torch import loader

    ds = sw.TokenDataset(cache, seq_len=SEQ_LEN, seed=3, shuffle="window")
    dl = loader(ds, global_batch_size=4, micro_batch_size=4, world=World.single(), **kw)
    it = iter(dl)
    try:
        return [next(it)["input_ids"].numpy() for _ in range(n)]
    finally:
        it.close()


def _open(endpoint: str, url: str, tmp: Path, **kw: object) -> sw.Cache:
    store = RemoteStore(url, {"endpoint_url": endpoint}, policy=PATIENT)
    return sw.open_cache(store, local_dir=tmp / "node", **kw)


def _same(got: list[np.ndarray], want: list[np.ndarray]) -> None:
    assert len(got) == len(want)
    for a, b in zip(got, want, strict=True):
        np.testing.assert_array_equal(a, b)


def test_ranged_reads_while_chunks_arrive_give_the_local_batches(
        built: tuple[str, Path], s3_server: object, tmp_path: Path) -> None:
    """Behind 30 ms and 2 MB/s per connection, whole chunks arrive slowly: the first
    batches are read by ranged GETs through the GIL-free client (checked by the chunks'
    block sums), the rest from the local copy, and every batch is the local read's."""
    url, local = built
    want = _batches(local, 40)
    with LatencyProxy(s3_server.address, latency=0.03, bandwidth=2e6) as proxy:  # type: ignore[attr-defined]
        cache = _open(f"http://127.0.0.1:{proxy.port}", url, tmp_path)
        assert cache.store.remote.native  # type: ignore[attr-defined]
        got = _batches(cache, 40)
        stats = cache.prefetch_stats()
        cache.close()
    _same(got, want)
    assert stats["ranged_reads"] > 0 and stats["ranged_bytes"] > 0, stats


def test_ranged_reads_survive_transient_faults(built: tuple[str, Path],
                                               fault_proxy: FaultProxy,
                                               tmp_path: Path) -> None:
    """503 SlowDown on 10 % of requests and chunk GETs cut mid-body: the ranged reads
    and the downloads are retried under the one policy, and the batches are identical.
    The faults' proxy sits behind one adding 30 ms to every answer, so that the first
    batches find their chunks still arriving (without it tiny chunks can land before
    the first batch asks, and no run would be read by a ranged GET)."""
    url, local = built
    want = _batches(local, 30)
    fault_proxy.inject(Fault("slowdown", rate=0.1),
                       Fault("reset", match=r"^GET .*\.bin", rate=0.1),
                       Fault("short", match=r"^GET .*\.bin", rate=0.1))
    with LatencyProxy(("127.0.0.1", fault_proxy.port), latency=0.03) as slow:
        cache = _open(f"http://127.0.0.1:{slow.port}", url, tmp_path, local_bytes=1 << 20)
        got = _batches(cache, 30)
        stats = cache.prefetch_stats()
        cache.close()
    _same(got, want)
    assert stats["ranged_reads"] > 0, stats
    assert sum(fault_proxy.hits.values()) >= 1, fault_proxy.hits


def _sums_of(local: Path, stem: str) -> tuple[BlockSums, bytes]:
    """A built chunk's block sums (from its metadata, as a reader gets them) and .bin."""
    meta = read_meta(local / (stem + ".json"))
    sums = BlockSums.of(meta)
    assert sums is not None and sums.block == BLOCK_BYTES
    return sums, (local / (stem + ".bin")).read_bytes()


def test_a_built_chunk_carries_the_sums_of_its_blocks(built: tuple[str, Path]) -> None:
    _, local = built
    stems = sorted(p.with_suffix("").relative_to(local).as_posix()
                   for p in (local / "chunks").rglob("*.bin"))
    assert len(stems) > 3
    for stem in stems:
        sums, data = _sums_of(local, stem)
        assert sums.size == len(data) and len(sums.sums) == -(-len(data) // BLOCK_BYTES)
        assert first_bad_block(data, 0, sums.sums) == -1
        flipped = bytearray(data)
        flipped[len(data) // 2] ^= 1
        assert first_bad_block(bytes(flipped), 0, sums.sums) == len(data) // 2 // BLOCK_BYTES


def test_ranged_reads_cut_runs_out_of_checked_blocks(s3_env: dict[str, str],
                                                      s3_server: object) -> None:
    """Runs crossing block boundaries, sharing blocks and ending at the file's short last
    block, read from a real server: each the bytes the file holds, a few whole blocks
    asked for once; one flipped bit in a block is an error naming the block, not a
    batch."""
    store = RemoteStore(f"s3://{BUCKET}/blocks", policy=PATIENT)
    tokens = np.arange(1000, dtype=np.uint16)
    data = tokens.tobytes()  # 2,000 bytes in blocks of 64: the last one is 16 bytes
    store.put("c.bin", data)
    sums = {"c": BlockSums(len(data), 64, decode_block_checksums(block_checksums(data, 64)))}
    runs = [(5, 40), (30, 3), (100, 1), (990, 10), (0, 1)]  # tokens: offset, length
    arriving = Arriving()

    def read(runs: list[tuple[int, int]], sums: dict[str, BlockSums | None]) -> list[object]:
        fetched = arriving.fetch(store, [("c", 2 * o, 2 * (o + n)) for o, n in runs],
                                 {"c": len(data)}, 64)
        assert fetched.check(sums) == {"c"}
        return [fetched.tokens("c", 2 * o, 2 * (o + n), tokens.dtype) for o, n in runs]

    for (o, n), g in zip(runs, read(runs, sums), strict=True):
        np.testing.assert_array_equal(g, tokens[o:o + n])
    # blocks 0-1, 3 and the last two: spans merged where runs share or touch blocks
    assert arriving.read_bytes == 128 + 64 + 80
    wrong = bytearray(data)
    wrong[70] ^= 4  # block 1
    store.put("c.bin", bytes(wrong))
    with pytest.raises(CorruptChunkError, match=r"blocks/c\.bin: a ranged GET returned "
                                                r"bytes of block 1 \(bytes \[64, 128\)\)"):
        read([(5, 40)], sums)
    read([(100, 1)], sums)  # block 3: intact
    # sums of other blocks than those read, or none: not used (the file is read whole)
    fetched = arriving.fetch(store, [("c", 10, 20)], {"c": len(data)}, 64)
    assert fetched.check({"c": BlockSums(len(data), 32, sums["c"].sums)}) == set()
    assert fetched.check({}) == set()


def test_a_chunk_without_block_sums_is_read_whole_unless_not_verifying(
        s3_env: dict[str, str], s3_server: object, sample_corpus: Path, tokenizer_path: Path,
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A cache an older build wrote (its .bin entries without block sums): a verifying
    reader reads no run by ranged GETs (nothing could check them before use) but waits for
    the whole checked chunk; one opened with ``verify=False`` reads runs by ranged GETs.
    Both give the local read's batches."""
    import shardwise.format.chunk as chunk_format

    entry = chunk_format._file_entry  # noqa: SLF001
    monkeypatch.setattr(chunk_format, "_file_entry", lambda suffix, data: {
        k: v for k, v in entry(suffix, data).items() if not k.startswith("block_")})
    url, local = f"s3://{BUCKET}/older", tmp_path / "older"
    opts = {"tokenizer": tokenizer_path, "chunk_docs": 8, "append_eod": True,
            "progress": False, "workers": 1}
    sw.build([str(sample_corpus)], url, **opts)
    sw.build([str(sample_corpus)], local, **opts)
    assert "block_xxh3_64" not in read_meta(next((local / "chunks").rglob("*.json"))).files[
        ".bin"]
    want = _batches(local, 30)
    ranged = {}
    for verify in (True, False):
        with LatencyProxy(s3_server.address, latency=0.03, bandwidth=2e6) as proxy:  # type: ignore[attr-defined]
            cache = _open(f"http://127.0.0.1:{proxy.port}", url, tmp_path / str(verify),
                          verify=verify)
            _same(_batches(cache, 30), want)
            ranged[verify] = cache.prefetch_stats()["ranged_reads"]
            cache.close()
    assert ranged[True] == 0 and ranged[False] > 0, ranged


def test_waiting_beats_ranged_reads_when_the_chunks_land_within_two_round_trips() -> None:
    arriving = Arriving()
    arriving.rtt_s = 0.05
    assert arriving.worth([math.inf])  # downloading, nothing measured yet
    assert arriving.worth([0.02, 0.5])  # one lands late
    assert not arriving.worth([0.02, 0.09])


def _child_reads(store: RemoteStore, key: str, out: multiprocessing.Queue) -> None:
    import faulthandler

    faulthandler.dump_traceback_later(90, exit=True)  # a hang shows where, in the log
    n = len(store.read_range(key, 0, 100))
    gets = store._native.made  # noqa: SLF001 - this process's, if it made one
    made = gets is not None and gets._store is not None  # noqa: SLF001
    out.put((store.native, made, n))


SPAWNED = """
import os, pickle, sys
store, key = pickle.load(sys.stdin.buffer)
n = len(store.read_range(key, 0, 100))
print(store.native, store._native.made._store is not None, n)
"""


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_the_native_client_is_made_per_process(built: tuple[str, Path], method: str) -> None:
    """obstore's runtime does not survive a fork (a request in the child would wait for
    ever): a forked copy of a store its parent used reads through fsspec; a new process
    given the store (pickled, as a spawned worker is) makes its own obstore client.
    Either reads, and the parent's client is kept."""
    import pickle
    import subprocess
    import sys

    url, _ = built
    store = RemoteStore(url)
    key = next(k for k in store.list_keys() if k.endswith(".bin"))
    assert store.native and len(store.read_range(key, 0, 100)) == 100
    parent = store._native.get().store  # type: ignore[union-attr]  # noqa: SLF001
    if method == "fork":
        ctx = multiprocessing.get_context("fork")
        q: multiprocessing.Queue = ctx.Queue()
        p = ctx.Process(target=_child_reads, args=(store, key, q))
        p.start()
        native, made, n = q.get(timeout=120)
        p.join(60)
        assert p.exitcode == 0 and (native, made, n) == (False, False, 100)
    else:
        out = subprocess.run([sys.executable, "-c", SPAWNED], input=pickle.dumps((store, key)),
                             capture_output=True, timeout=120, check=True)
        assert out.stdout.decode().split() == ["True", "True", "100"], out
    assert store.native and store._native.get().store is parent  # type: ignore[union-attr]  # noqa: SLF001


def test_a_forked_dataloader_worker_reads_the_same_batches(
        built: tuple[str, Path], tmp_path: Path) -> None:
    """The parent's reads went through obstore; the worker, forked, through fsspec."""
    url, local = built
    want = _batches(local, 12)
    cache = sw.open_cache(url, local_dir=tmp_path / "node", local_bytes=1 << 20)
    assert cache.store.remote.native  # type: ignore[attr-defined]
    got = _batches(cache, 12, num_workers=1)
    cache.close()
    _same(got, want)


def test_fsspec_is_the_fallback(built: tuple[str, Path], tmp_path: Path,
                                monkeypatch: pytest.MonkeyPatch) -> None:
    """Another scheme, an option obstore has no equivalent of, a named profile, or
    ``client="fsspec"``: GETs through fsspec, and the batches are the same."""
    url, local = built
    assert native_options("memory://x/y", {}) is None
    assert native_options(url, {"requester_pays": True}) is None
    assert native_options(url, {"endpoint_url": "http://h:1"})["http"]  # type: ignore[index]
    monkeypatch.setenv("AWS_PROFILE", "someone")
    assert native_options(url, {}) is None
    monkeypatch.delenv("AWS_PROFILE")
    store = RemoteStore(url, client="fsspec")
    assert not store.native
    cache = sw.open_cache(store, local_dir=tmp_path / "node")
    _same(_batches(cache, 10), _batches(local, 10))
    cache.close()


def test_the_in_flight_budget_follows_the_pace() -> None:
    """``chunks_ahead × chunk`` (twice the read rate × fetch_s, plus a chunk) within the
    room local_bytes leaves beside the chunks the reader holds — not local_bytes / 2,
    which stays the floor."""
    mib = 1 << 20
    pace = Pace(clock=lambda: 0.0)
    assert in_flight_budget(8 << 30, 0, pace, 64 * mib) == 4 << 30  # half: START_AHEAD less
    assert START_AHEAD * 64 * mib < 4 << 30
    pace.fetched(0.69)  # 50 ms + 64 MB at 100 MB/s
    pace.read(0.1)      # the reader goes through a chunk in 0.1 s: 640 MB/s
    assert pace.chunks_ahead() == 15  # 2 × 6.9 + 1
    assert in_flight_budget(1 << 30, 0, pace, 64 * mib) == 15 * 64 * mib  # not 512 MiB
    assert in_flight_budget(1 << 30, 256 * mib, pace, 64 * mib) == 768 * mib  # the room
    assert in_flight_budget(1 << 30, 2 << 30, pace, 64 * mib) == 512 * mib  # half, at least
    held = [0]
    ahead = Prefetcher(1 << 30, held=lambda: held[0])
    ahead.pace = pace
    ahead._sizes = [64 * mib * 3, 3]  # noqa: SLF001 - three 64 MiB chunks handed over
    assert ahead.room() == 15 * 64 * mib  # more than local_bytes / 2 = 512 MiB
    held[0] = 384 * mib
    assert ahead.room() == 640 * mib
    assert Prefetcher(1 << 30).room() == 1 << 30  # no reader's holdings given: the budget


@pytest.mark.parametrize("size", [(16 << 20) + 3, 16 << 20, 40 << 20])
def test_a_file_of_many_blocks_downloads_in_groups_checked(built: tuple[str, Path],
                                                           tmp_path: Path, size: int) -> None:
    """A chunk file of several 8 MiB blocks: GROUP blocks asked for at once, written and
    hashed in order — also an exact multiple of the block (nothing asked past its end)
    — and one longer than its metadata says is refused."""
    import xxhash

    from shardwise.storage.download import get_checked

    url, _ = built
    store = RemoteStore(url)
    data = np.random.default_rng(size).integers(0, 255, size, dtype=np.uint8).tobytes()
    store.put(f"blocks/{size}.bin", data)
    spec = {"bytes": size, "xxh3_64": xxhash.xxh3_64(data).hexdigest()}
    get_checked(store, f"blocks/{size}.bin", spec, tmp_path / "got")
    assert (tmp_path / "got").read_bytes() == data
    short = {"bytes": size - 1, "xxh3_64": xxhash.xxh3_64(data[:-1]).hexdigest()}
    with pytest.raises(CorruptChunkError,
                       match=rf"{size}\.bin: {size}\+ bytes, the metadata says {size - 1}"):
        get_checked(store, f"blocks/{size}.bin", short, tmp_path / "got-short")
    store.remove([f"blocks/{size}.bin"])


def test_a_store_made_after_a_plain_fork_does_not_use_the_dead_runtime(
        built: tuple[str, Path]) -> None:
    """os.fork (no multiprocessing parent to see) of a process whose obstore runtime ran:
    a store made in the child, never used before, still reads through fsspec."""
    import os

    url, _ = built
    used = RemoteStore(url)
    key = next(k for k in used.list_keys() if k.endswith(".bin"))
    assert used.native and len(used.read_range(key, 0, 100)) == 100  # the runtime runs
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: answer through the pipe, never return into pytest
        code = 1
        try:
            fresh = RemoteStore(url)
            n = len(fresh.read_range(key, 0, 100))
            os.write(w, f"{fresh.native} {n}".encode())
            code = 0
        finally:
            os._exit(code)
    os.close(w)
    import select
    import signal

    if not select.select([r], [], [], 60)[0]:  # a request on the dead runtime never ends
        os.kill(pid, signal.SIGKILL)
    with os.fdopen(r) as f:
        answer = f.read()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0 and answer == "False 100", answer


def test_chunks_on_the_node_for_good_are_mapped_at_once_and_evicted_ones_fetched_again(
        built: tuple[str, Path], s3_env: dict[str, str], tmp_path: Path) -> None:
    """Every file of the cache fits in ``local_bytes``, so none is ever evicted: a chunk
    seen on the node is mapped again from its file directly (no download task, no stat
    per batch: a cache with more chunks than stay mapped maps several per batch). If one
    disappears after all (a process of the node opened with a smaller ``local_bytes``),
    it is downloaded again, and the batches stay the local read's."""
    url, local = built
    want = _batches(local, 40)
    cache = _open(s3_env["AWS_ENDPOINT_URL"], url, tmp_path)
    store = cache.store
    _same(_batches(cache, 40), want)
    store._maps.clear()  # noqa: SLF001  (as a reader whose maps were dropped)
    _same(_batches(cache, 40), want)
    assert store._all_fit() and store._here  # noqa: SLF001
    # downloads the reader started ahead may still run: a claim file in the glob vanished
    # under the unlink once (CI); wait for them, and take chunk files only (no claims)
    store.wait_for_prefetch()
    bins = sorted(p for p in (tmp_path / "node").rglob("chunks/*/*.bin")
                  if not p.name.startswith("."))
    assert len(bins) >= len(store._here)  # noqa: SLF001
    for path in bins:  # evicted behind this reader's back
        path.unlink()
    store._maps.clear()  # noqa: SLF001
    _same(_batches(cache, 40), want)
    cache.close()
    assert len(list((tmp_path / "node").rglob("chunks/*/*.bin"))) >= 1


def test_no_thread_of_obstore_runs_python_during_ranged_reads(
        built: tuple[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    """A thread Python did not start (obstore's Tokio threads) must never run Python code:
    one that lets go of the GIL in it (handing an async result to an asyncio loop, then
    writing to the loop's socket) can find the interpreter finalised when it takes the
    GIL back, and CPython's ``pthread_exit`` through its Rust frames aborts the process
    (SIGABRT at exit; ``bench remote-open``'s children, 2 in 6 runs under load). Many
    ranges at once, as a download asks them: the bytes are right, and every call into
    asyncio came from a thread Python started."""
    import asyncio
    import threading

    url, local = built
    store = RemoteStore(url)
    assert store.native
    key = next(k for k in store.list_keys() if k.endswith(".bin"))
    foreign: list[str] = []
    handed = asyncio.BaseEventLoop.call_soon_threadsafe

    def watched(loop: asyncio.BaseEventLoop, *args: object, **kw: object) -> object:
        if isinstance(threading.current_thread(), threading._DummyThread):  # noqa: SLF001
            foreign.append(threading.current_thread().name)
        return handed(loop, *args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(asyncio.BaseEventLoop, "call_soon_threadsafe", watched)
    want = (local / key).read_bytes()
    step = len(want) // 8
    ranges = [(key, a, a + step) for a in range(0, 8 * step, step)]
    got = store.get_ranges(ranges, checked=True)
    assert got == [want[a:b] for _, a, b in ranges]
    assert foreign == []


def test_every_store_of_a_process_reads_its_ranges_on_one_pool(
        built: tuple[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    """Ranged reads at once run on one pool per process, whatever the number of stores:
    one pool per store started up to 63 threads for each ``RemoteStore`` that read several
    ranges (a build makes one per probe of a source), 300-500 alive at once in a bucket
    build, each idle 5 s before it ends, and every fork of the process copied them."""
    from shardwise.concurrency import shutdown

    owners: set[int] = set()
    start = shutdown.start_thread

    def counted(owner: shutdown.Stoppable, target: object, name: str) -> object:
        if name == "shardwise-obstore":
            owners.add(id(owner))
        return start(owner, target, name)  # type: ignore[arg-type]

    monkeypatch.setattr(shutdown, "start_thread", counted)
    url, local = built
    key = next(k for k in RemoteStore(url).list_keys() if k.endswith(".bin"))
    want = (local / key).read_bytes()
    ranges = [(key, a, a + 64) for a in range(0, 8 * 64, 64)]
    for _ in range(3):
        store = RemoteStore(url)
        assert store.native
        assert store.get_ranges(ranges, checked=True) == [want[a:b] for _, a, b in ranges]
    assert len(owners) <= 1  # none where the pool's threads were already up


def test_a_forked_child_never_drops_the_obstore_client_of_its_parent(
        built: tuple[str, Path]) -> None:
    """Dropping an obstore client wakes its connections' tasks on its Tokio runtime, taking
    the scheduler's lock; in a forked child that runtime's threads are gone and one of them
    may have held the lock as the parent forked: a child whose garbage collection dropped
    such a client (during botocore's set-up, py-spy showed) waited for ever in Tokio's
    ``push_remote_task``. The child lets go of every reference to the store it inherited
    and collects: the client is still there (kept for good), and the child reads."""
    import gc
    import os
    import select
    import signal
    import weakref

    url, _ = built
    store = RemoteStore(url)
    key = next(k for k in store.list_keys() if k.endswith(".bin"))
    assert store.native and len(store.read_range(key, 0, 100)) == 100
    client = weakref.ref(store._native.get().store)  # type: ignore[union-attr]  # noqa: SLF001
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: answer through the pipe, never return into pytest
        code = 1
        try:
            n = len(store.read_range(key, 0, 100))  # fsspec's: the inherited client replaced
            del store
            gc.collect()
            os.write(w, f"{'kept' if client() is not None else 'dropped'} {n}".encode())
            code = 0
        finally:
            os._exit(code)
    os.close(w)
    if not select.select([r], [], [], 60)[0]:  # the drop waited for ever
        os.kill(pid, signal.SIGKILL)
    with os.fdopen(r) as f:
        answer = f.read()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0 and answer == "kept 100", answer
    assert client() is not None  # the parent's own is its to drop, as ever
