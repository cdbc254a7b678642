"""An object store far away: the latency proxy, and a remote cache read through it with the
adaptive look-ahead (bounded local copy, same batches as a local read)."""

from __future__ import annotations

import http.client
import time
from pathlib import Path

import numpy as np
import pytest

import shardwise as sw
from shardwise.bench.proxy import LatencyProxy, start_proxy
from shardwise.concurrency import flock
from shardwise.errors import ConfigError
from shardwise.format.confined import LOCK, open_under
from shardwise.storage import chunk_fetch
from shardwise.storage.download import LOCK_NAME
from shardwise.world import World

SEQ_LEN = 32
LATENCY = 0.03


def _upstream(s3_env: dict[str, str]) -> tuple[str, int]:
    host, port = s3_env["AWS_ENDPOINT_URL"].removeprefix("http://").rsplit(":", 1)
    return host, int(port)


def _request_delays(port: int, n: int) -> list[float]:
    """Seconds from sending each of ``n`` requests (one connection) to its answer's
    first byte."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    delays = []
    for _ in range(n):
        started = time.perf_counter()
        conn.request("GET", "/healthz")  # unsigned: the one request S3 answers anonymously
        resp = conn.getresponse()
        delays.append(time.perf_counter() - started)
        resp.read()
        assert resp.status == 200
    conn.close()
    return delays


def test_the_proxy_answers_every_request_at_least_its_latency_late(
        s3_env: dict[str, str]) -> None:
    with LatencyProxy(_upstream(s3_env), latency=LATENCY) as proxy:
        delays = _request_delays(proxy.port, 5)
    assert min(delays) >= LATENCY, delays
    # the same in a process of its own (what the bench starts), with another latency
    with start_proxy(_upstream(s3_env), latency=2 * LATENCY) as port:
        delays = _request_delays(port, 3)
    assert min(delays) >= 2 * LATENCY, delays
    with pytest.raises(ConfigError, match="latency"):
        LatencyProxy(_upstream(s3_env), latency=-1)


def test_a_read_through_the_proxy_keeps_the_local_copy_within_local_bytes(
        built: tuple[str, Path], s3_env: dict[str, str], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A cache many times its local_bytes, read in a window shuffle (a new chunk almost
    every example) by the loader's adaptive look-ahead through a server 30 ms away: every
    batch equals a local read, the downloads ran ahead, and the local directory (partial
    downloads included, measured each time one completes) never held more than
    local_bytes."""
    from shardwise.torch import loader

    url, local = built
    ref = sw.open_cache(local)
    bins = [ref.chunks[c].tokens * ref.dtype.itemsize for c in range(len(ref.chunks))]
    bound = 4 * max(bins)
    assert sum(bins) > 4 * bound, "the cache must be much larger than its local copy"
    peaks: list[int] = []
    real = chunk_fetch.get_checked

    def measured(store, key, spec, tmp, **kw):  # type: ignore[no-untyped-def]
        real(store, key, spec, tmp, **kw)
        root = tmp.parent.parent
        # a snapshot: no claim or eviction meanwhile
        with flock.exclusive(lambda: open_under(root, LOCK_NAME, LOCK)):
            peaks.append(sum(p.stat().st_size for p in root.rglob("*")
                             if p.is_file() and not p.name.startswith((".lock", ".claim"))))

    monkeypatch.setattr(chunk_fetch, "get_checked", measured)
    with LatencyProxy(_upstream(s3_env), latency=LATENCY) as proxy:
        cache = sw.open_cache(url, local_dir=tmp_path / "node", local_bytes=bound,
                              storage_options={"endpoint_url": f"http://127.0.0.1:{proxy.port}"})
        ds = sw.TokenDataset(cache, seq_len=SEQ_LEN, seed=11)
        dl = loader(ds, global_batch_size=4, micro_batch_size=4, world=World.single())
        assert dl.describe()["batches_ahead"] == 4  # a remote cache's default: made ahead
        got = []
        for b, _ in zip(dl, range(30), strict=False):
            got.append(b["input_ids"].numpy())
            time.sleep(0.005)  # training: the batches are made ahead, paced by this loop
        stats = cache.prefetch_stats()
        cache.close()
    want = sw.TokenDataset(ref, seq_len=SEQ_LEN, seed=11)
    for k, rows in enumerate(got):
        np.testing.assert_array_equal(rows, want.get_batch(list(range(4 * k, 4 * k + 4)))
                                      ["input_ids"])
    assert cache.store.downloads is not None
    assert len(peaks) > 20 and max(peaks) <= bound, (max(peaks), bound)
    assert cache.store.downloads.evicted > 0, "the bound was never reached; the test is too weak"
    assert stats["fetch_s"] is not None and stats["fetch_s"] >= LATENCY / 2  # measured, real
    assert stats["reader_paced_by_caller"]  # the batches made ahead: the caller's pace
    assert cache.store.downloads.evicted_pinned == 0  # nothing downloaded ahead was thrown away
