"""Opening a cache on an object store costs O(1) requests per node, not per rank
(storage/heads.py): one process per node fetches the manifest, ledger and index, the
others read them from the node-local directory; a dead fetcher is replaced; a growing
ledger is re-read per node. Requests are counted at a proxy in front of the server."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from tests.faults import FaultProxy

import shardwise as sw
from shardwise.bench.remote_open import open_at_once
from shardwise.storage import heads as heads_module
from shardwise.storage.heads import HEAD_NAMES, LOCK_NAME


def _through(proxy: FaultProxy) -> dict[str, str]:
    return {"endpoint_url": proxy.endpoint}


def test_the_processes_of_a_node_fetch_the_head_files_once(
        built: tuple[str, Path], tmp_path: Path, fault_proxy: FaultProxy) -> None:
    """Requests counted at a proxy in front of the server (opening only: no chunk)."""
    url, local = built
    sw.open_cache(url, local_dir=tmp_path / "alone", storage_options=_through(fault_proxy))
    one = fault_proxy.requests
    # the ledger's journal listed (one LIST), then one GET each, all at once
    assert one == len(HEAD_NAMES) + 1
    nodes = [tmp_path / f"node{k}" for k in range(2)]
    got = open_at_once(url, [nodes[k % 2] for k in range(6)], _through(fault_proxy), 0,
                       tmp_path / "go")
    want = len(sw.open_cache(local).chunks)
    assert [g["chunks"] for g in got] == [want] * 6
    assert sum(g["fetched"] for g in got) == 2  # one fetcher per node
    assert fault_proxy.requests - one == 2 * one  # 6 processes, 2 nodes: 2 x one open


HOLD_CODE = """
import os, signal, sys
from shardwise.concurrency import flock
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o644)
assert flock.try_lock(fd)
print("held", flush=True)
signal.pause()
"""


def test_a_dead_fetcher_is_replaced(built: tuple[str, Path], tmp_path: Path) -> None:
    """A process that took the node's lock to fetch and died (here: stuck, then killed)
    holds nobody up: its lock dies with it, and a waiting opener fetches itself."""
    url, _ = built
    node = tmp_path / "node"
    first = sw.open_cache(url, local_dir=node)  # where this URL's snapshot lives
    heads_dir = first.store.heads.dir
    (heads_dir / heads_module.SNAPSHOT_NAME).unlink()  # nothing published
    fetcher = subprocess.Popen([sys.executable, "-c", HOLD_CODE, str(heads_dir / LOCK_NAME)],
                               stdout=subprocess.PIPE, text=True)
    try:
        assert fetcher.stdout is not None and fetcher.stdout.readline() == "held\n"
        timer = threading.Timer(1.0, fetcher.kill)
        timer.start()
        started = time.monotonic()
        cache = sw.open_cache(url, local_dir=node)  # waits for the fetcher, which dies
        waited = time.monotonic() - started
        timer.join()
    finally:
        fetcher.kill()
        fetcher.communicate(timeout=30)
    assert fetcher.returncode == -signal.SIGKILL and waited >= 0.9
    assert cache.store.heads.fetched == 1 and len(cache.chunks) == len(first.chunks)


def test_a_growing_ledger_is_read_once_per_node_per_interval(
        built: tuple[str, Path], tmp_path: Path, fault_proxy: FaultProxy,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Ranks that refresh an open cache (following a build) share the node's snapshot:
    at most one fetch per REFRESH_S per node, however many of them ask."""
    url, _ = built
    monkeypatch.setattr(heads_module, "REFRESH_S", 30.0)
    caches = [sw.open_cache(url, local_dir=tmp_path / "node",
                            storage_options=_through(fault_proxy)) for _ in range(4)]
    snapshot = caches[0].store.heads.dir / heads_module.SNAPSHOT_NAME
    assert sum(c.store.heads.fetched for c in caches) == 1  # the four opens: one fetch
    opened = fault_proxy.requests
    for rounds in range(3):
        for c in caches:
            c.finished = False  # as if the build were still running: refresh asks
            assert c.refresh() == 0
        if rounds < 2:  # the snapshot is made a minute old: the next refresh fetches
            old = snapshot.stat().st_mtime - 60
            os.utime(snapshot, (old, old))
    # 3 rounds of 4 ranks: fresh, then stale twice: two fetches of the three files
    assert fault_proxy.requests - opened == 2 * (len(HEAD_NAMES) + 1)  # LIST + 3 GETs
    assert sum(c.store.heads.fetched for c in caches) == 1 + 2


def test_the_way_to_the_first_batch_sets_up_no_fsspec_client(
        built: tuple[str, Path], tmp_path: Path, fault_proxy: FaultProxy) -> None:
    """Where obstore serves ``s3://``, opening (the journal's LIST, the head files' GETs)
    and the first batch's reads all go through it: fsspec's client, whose set-up cost a
    process 0.4-0.9 s on its first call (most of ``open_cache``), is never made. Failed
    before: the open's LIST and GETs went through fsspec."""
    url, local = built
    at = len(fault_proxy.seen)
    cache = sw.open_cache(url, local_dir=tmp_path, storage_options=_through(fault_proxy))
    opened = fault_proxy.seen[at:]
    got = sw.TokenDataset(cache, seq_len=16, seed=0).get_batch([0, 5, 9])
    want = sw.TokenDataset(sw.open_cache(local), seq_len=16, seed=0).get_batch([0, 5, 9])
    assert (got["input_ids"] == want["input_ids"]).all()
    remote = cache.store.remote
    assert remote.native and remote._fs.made is None
    bucket, key = url.removeprefix("s3://").split("/", 1)
    # one LIST (of the journal: the bucket, with the prefix in the query), one GET each
    assert sorted(p for _, p in opened) == sorted(
        [f"/{bucket}", *(f"/{bucket}/{key}/{n}" for n in HEAD_NAMES)]), opened
    cache.close()
