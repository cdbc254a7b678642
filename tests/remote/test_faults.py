"""The store's faults (issue 21 item 4), on a real S3 server (SeaweedFS) behind the fault
proxy: every fault mode either leaves the bytes identical or raises a named error; a store
that stops answering raises RemoteError naming the URL within the policy's bound — in the
main process, in a DataLoader worker and in the download threads; transient faults leave
the batches identical; the build's writers survive them too."""

from __future__ import annotations

import contextlib
import itertools
import time
import traceback
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from tests.faults import Fault, FaultProxy
from tests.remote.conftest import BUCKET

import shardwise as sw
from shardwise.bench.levers import switch_off
from shardwise.bench.proxy import LatencyProxy
from shardwise.errors import CorruptChunkError, RemoteError
from shardwise.remote import RemotePolicy, RemoteStore
from shardwise.world import World

SEQ_LEN = 32
# a silent store is given up after 1 + 1 + 2 s (tests); the default is 90 s
FAST = RemotePolicy(connect_timeout=1, read_timeout=1, attempts=8, first_backoff=0.01,
                    max_backoff=0.1, deadline=2)
# the faults that must leave the bytes identical are read with room for a loaded machine
PATIENT = RemotePolicy(connect_timeout=5, read_timeout=5, first_backoff=0.01,
                       max_backoff=0.2, deadline=30)
SLACK = 3.0  # seconds of scheduling on a busy 2-core machine on top of the bound
BIN_GET = r"^GET /sw-test/cache/chunks/.*\.bin"


def _store(proxy: FaultProxy, url: str, policy: RemotePolicy = FAST) -> RemoteStore:
    return RemoteStore(url, {"endpoint_url": proxy.endpoint}, policy=policy)


@contextlib.contextmanager
def _loader_iter(cache: sw.Cache | Path, **kw: object) -> Iterator[Iterator[dict]]:
    """The torch loader's batches over ``cache``, closed (workers joined) on leaving."""
    from shardwise.torch import loader

    ds = sw.TokenDataset(cache, seq_len=SEQ_LEN, seed=3)
    dl = loader(ds, global_batch_size=4, micro_batch_size=4, world=World.single(), **kw)
    it = iter(dl)
    try:
        yield it
    finally:
        close = getattr(it, "close", None)
        if close is not None:
            close()


def _batches(cache: sw.Cache | Path, n: int, **kw: object) -> list[np.ndarray]:
    with _loader_iter(cache, **kw) as it:
        return [next(it)["input_ids"].numpy() for _ in range(n)]


def _open(proxy: FaultProxy, url: str, tmp: Path, policy: RemotePolicy = FAST,
          **kw: object) -> sw.Cache:
    return sw.open_cache(_store(proxy, url, policy), local_dir=tmp / "node", **kw)


@pytest.mark.parametrize("mode", ["slowdown", "reset", "short"])
def test_a_retried_fault_returns_identical_bytes(
        built: tuple[str, Path], fault_proxy: FaultProxy, mode: str) -> None:
    url, local = built
    store = _store(fault_proxy, url, PATIENT)
    key = "manifest.json"
    want = (local / key).read_bytes()
    fault_proxy.inject(Fault(mode, match=r"^GET .*manifest\.json", times=3))
    assert store.get(key) == want  # the whole object
    fault_proxy.inject(Fault(mode, match=r"^GET .*manifest\.json", times=3))
    assert store.read_range(key, 5, 105) == want[5:105]  # a ranged GET
    fault_proxy.inject(Fault(mode, match=r"^GET .*manifest\.json", times=3))
    assert store.get_many([key, "ledger.json"]) == {
        key: want, "ledger.json": (local / "ledger.json").read_bytes()}
    assert fault_proxy.hits[mode] == 3


def test_flipped_bytes_are_caught_by_a_checksum(built: tuple[str, Path],
                                                fault_proxy: FaultProxy,
                                                tmp_path: Path) -> None:
    """A whole-object GET is checked by the client (botocore's checksum: retried, then
    identical); a chunk's bytes by the cache's checksums before any batch holds them: a
    whole download by the chunk's xxh3, a batch's ranged GETs by its block sums. Either is
    a CorruptChunkError naming the object's URL, and no batch comes out."""
    url, local = built
    store = _store(fault_proxy, url, PATIENT)  # retried: its bytes must come out identical
    fault_proxy.inject(Fault("flip", match=r"^GET .*manifest\.json", times=1))
    assert store.get("manifest.json") == (local / "manifest.json").read_bytes()
    assert fault_proxy.hits["flip"] == 1
    fault_proxy.inject(Fault("flip", match=BIN_GET))
    # 30 ms and 2 MB/s in front: the first batches find their chunks still arriving and
    # read their runs by ranged GETs (which handed 4 batches of flipped bytes out before
    # the chunk's own check raised, when ranged bytes were checked on landing)
    with LatencyProxy(("127.0.0.1", fault_proxy.port), latency=0.03, bandwidth=2e6) as slow:
        store = RemoteStore(url, {"endpoint_url": f"http://127.0.0.1:{slow.port}"},
                            policy=PATIENT)
        cache = sw.open_cache(store, local_dir=tmp_path / "node", local_bytes=64 << 20)
        from shardwise.torch import loader

        dl = loader(sw.TokenDataset(cache, seq_len=SEQ_LEN, seed=3, shuffle="window"),
                    global_batch_size=4, micro_batch_size=4, world=World.single())
        handed: list[object] = []
        with pytest.raises(CorruptChunkError, match=r"s3://sw-test/cache/chunks/.*\.bin: "
                                                    r"(xxh3|a ranged GET returned bytes of "
                                                    r"block)"):
            for batch in itertools.islice(dl, 500):
                handed.append(batch)
        cache.close()
    assert not handed
    assert fault_proxy.hits["flip"] >= 1


def _stalled_read(proxy: FaultProxy, cache: sw.Cache,
                  **kw: object) -> tuple[float, str, RemoteError]:
    """The store stops answering, then a read: its RemoteError, and the seconds from the
    first request the store left unanswered to the error reaching the reader's caller —
    not from the read's start, nor to the loader's close: a DataLoader worker's start and
    join (on a loaded machine 15 s and 5 s) are not the store's doing."""
    proxy.inject(Fault("stall"))
    with _loader_iter(cache, **kw) as it:
        with pytest.raises(RemoteError) as e:
            for _ in range(20):
                next(it)
        took = time.monotonic() - proxy.first_hit["stall"]
    return took, str(e.value), e.value


def test_a_stalled_store_raises_remote_error_within_the_bound_at_open(
        built: tuple[str, Path], fault_proxy: FaultProxy, tmp_path: Path) -> None:
    url, _ = built
    fault_proxy.inject(Fault("stall"))
    started = time.monotonic()
    with pytest.raises(RemoteError, match=f"{url}/ledger") as e:
        _open(fault_proxy, url, tmp_path)
    assert time.monotonic() - started <= FAST.bound() + SLACK
    # fsspec's words "ReadTimeoutError", obstore's "(Timeout)" (the open's LIST and GETs
    # go through obstore where it is installed)
    assert e.value.url.startswith(url) and "Timeout" in str(e.value), str(e.value)


@pytest.mark.parametrize("ranged", [False, True])
def test_a_stalled_store_raises_remote_error_in_the_main_process_and_download_threads(
        built: tuple[str, Path], fault_proxy: FaultProxy, tmp_path: Path,
        ranged: bool) -> None:
    """Opened, then the store stops answering: the reader (its look-ahead downloads run
    in threads; with ``ranged``, a batch's ranged GETs on the reader's thread, through
    the GIL-free client) raises RemoteError naming a chunk's URL, within the bound."""
    url, _ = built
    cache = _open(fault_proxy, url, tmp_path, local_bytes=1 << 20)
    switch_off(cache.store, frozenset() if ranged else frozenset({"ranged"}))  # type: ignore[arg-type]
    took, message, error = _stalled_read(fault_proxy, cache)  # adaptive look-ahead
    cache.close()
    assert took <= FAST.bound() + SLACK, took
    assert f"{url}/chunks/" in message, message
    frames = traceback.extract_tb(error.__traceback__)
    # ranged: the batch's chunk metadata (their block sums) or ranged GETs, on the reader's
    # thread; else a download thread
    where = ("gather", "bucket_ranged.py") if ranged else ("_run", "threads.py")
    assert any(f.name == where[0] and f.filename.endswith(where[1]) for f in frames), \
        f"the error was not raised by {where}"
    assert fault_proxy.hits["stall"] >= 1


def test_a_stalled_store_raises_remote_error_in_a_dataloader_worker(
        built: tuple[str, Path], fault_proxy: FaultProxy, tmp_path: Path) -> None:
    url, _ = built
    cache = _open(fault_proxy, url, tmp_path, local_bytes=1 << 20)
    took, message, _ = _stalled_read(fault_proxy, cache, num_workers=1)
    cache.close()
    assert took <= FAST.bound() + SLACK, took
    assert f"{url}/chunks/" in message and "DataLoader worker" in message, message


def test_transient_faults_leave_the_batches_identical(
        built: tuple[str, Path], fault_proxy: FaultProxy, tmp_path: Path) -> None:
    """8 % of requests answered 503 SlowDown and 5 % of chunk downloads cut mid-body
    (reset or short), a bounded local copy (many downloads): the batches of a local
    read, and the faults did happen."""
    url, local = built
    want = _batches(local, 30)
    fault_proxy.inject(Fault("slowdown", rate=0.08), Fault("reset", match=BIN_GET, rate=0.05),
                       Fault("short", match=BIN_GET, rate=0.05))
    cache = _open(fault_proxy, url, tmp_path, PATIENT, local_bytes=1 << 20)
    got = _batches(cache, 30)
    cache.close()
    for a, b in zip(got, want, strict=True):
        np.testing.assert_array_equal(a, b)
    assert fault_proxy.hits["slowdown"] >= 1, (fault_proxy.requests, fault_proxy.hits)
    assert fault_proxy.hits["reset"] + fault_proxy.hits["short"] >= 1, fault_proxy.hits


def test_a_build_survives_transient_faults_on_its_writes(
        built: tuple[str, Path], fault_proxy: FaultProxy, sample_corpus: Path,
        tokenizer_path: Path) -> None:
    """The build's writers go through the same policy: 10 % of PUTs answered 503 and some
    requests cut, and the cache on the store equals the local build byte for byte."""
    from tests.helpers_cache import cache_files

    _, local = built
    url = f"s3://{BUCKET}/faulty-build"
    fault_proxy.inject(Fault("slowdown", match="^PUT", rate=0.1),
                       Fault("reset", match="^GET", rate=0.1))
    sw.build([str(sample_corpus)], url, tokenizer=tokenizer_path, chunk_docs=8,
             append_eod=True, progress=False, workers=2,
             storage_options={"endpoint_url": fault_proxy.endpoint})
    assert fault_proxy.hits["slowdown"] >= 1
    fault_proxy.clear()
    store = RemoteStore(url)
    assert {k: store.get(k) for k in store.list_keys()} == cache_files(local)
