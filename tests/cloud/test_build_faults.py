"""Faults while building (issue 23 item 3), bucket to bucket through the fault proxy in
front of the session's S3 server (SeaweedFS): 503 SlowDown answers and bodies cut
mid-way leave the cache byte-identical to a build from local copies; a store that stops
answering mid-build ends the build with a RemoteError naming a URL within the policy's
bound (set by ``SHARDWISE_REMOTE_POLICY``), the error raised in a worker process reaching
the driver, and no process left behind."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
from tests.cloud.compare import assert_same_files, bucket_files, relocated
from tests.cloud.conftest import BUCKET, build_local_copies, raw_in_bucket
from tests.faults import Fault, FaultProxy

import shardwise as sw
from shardwise.errors import RemoteError
from shardwise.remote.policy import POLICY_ENV, RemotePolicy

RAW = f"s3://{BUCKET}/faults-raw"
PATTERNS = ["*.jsonl", "*.jsonl.zst", "*.parquet"]
OPTS: dict[str, Any] = dict(chunk_docs=16, segment_bytes=64_000, append_eod=True,
                            progress=False, workers=2)
# a silent store is given up after 11 s here (the default: 92-106 s); a loaded 2-core
# machine still answers every request well within 3 s
FAST = "connect_timeout=2,read_timeout=3,first_backoff=0.01,max_backoff=0.1,deadline=4"
# the faults that must leave the bytes identical get room for a loaded machine
PATIENT = "connect_timeout=5,read_timeout=5,first_backoff=0.01,max_backoff=0.2,deadline=30"
SLACK = 5.0  # seconds of scheduling on a busy 2-core machine on top of the bound


@pytest.fixture(scope="module")
def raw(s3: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return raw_in_bucket(tmp_path_factory.mktemp("raw") / "raw", RAW, copies=1)


@pytest.fixture(scope="module")
def local_build(raw: dict[str, Path], tokenizer_path: Path,
                tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_local_copies(raw, PATTERNS, tmp_path_factory.mktemp("ref") / "cache",
                              tokenizer=tokenizer_path, **OPTS)


def _build(proxy: FaultProxy, out: str, tokenizer: Path) -> sw.BuildSummary:
    return sw.build([f"{RAW}/{p}" for p in PATTERNS], out, tokenizer=tokenizer,
                    storage_options={"endpoint_url": proxy.endpoint}, **OPTS)


def test_503_and_bodies_cut_mid_way_leave_the_cache_byte_identical(
        raw: dict[str, Path], local_build: Path, tokenizer_path: Path,
        fault_proxy: FaultProxy, monkeypatch: pytest.MonkeyPatch) -> None:
    """10 % of requests answered 503 SlowDown, 10 % of the sources' ranged GETs cut
    mid-body (a TCP reset, or a short body and a clean close): every one retried."""
    monkeypatch.setenv(POLICY_ENV, PATIENT)
    fault_proxy.inject(Fault("slowdown", rate=0.1),
                       Fault("reset", match=r"^GET .*/faults-raw/", rate=0.05),
                       Fault("short", match=r"^GET .*/faults-raw/", rate=0.05))
    out = f"s3://{BUCKET}/faults-cache"
    _build(fault_proxy, out, tokenizer_path)
    hits = dict(fault_proxy.hits)
    fault_proxy.clear()
    assert hits.get("slowdown", 0) >= 3, hits
    assert hits.get("reset", 0) + hits.get("short", 0) >= 2, hits
    paths = {str(p): f"{RAW}/{name}" for name, p in raw.items()}
    assert_same_files(bucket_files(out), relocated(local_build, paths))


def _stall_after_first_chunk(proxy: FaultProxy, stalled: list[float],
                             stop: threading.Event) -> None:
    """The store stops answering every request once a chunk was published."""
    while not stop.is_set():
        if any(m == "PUT" and "/chunks/" in p for m, p in list(proxy.seen)):
            proxy.inject(Fault("stall"))
            stalled.append(time.monotonic())
            return
        time.sleep(0.002)


def _children() -> set[int]:
    import psutil

    return {p.pid for p in psutil.Process().children(recursive=True)}


def test_a_store_that_stops_answering_ends_the_build_with_a_named_error(
        raw: dict[str, Path], tokenizer_path: Path, fault_proxy: FaultProxy,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Two worker processes and the driver all talk to the store; it stops answering
    after the first chunk: the build raises RemoteError naming an object under the
    sources or the cache within the bound — the first such error (a worker's reaches the
    driver), not one of a last save that waited out the bound again — never a hang; no
    worker is left."""
    monkeypatch.setenv(POLICY_ENV, FAST)
    bound = RemotePolicy.from_env().bound()
    before = _children()
    stalled: list[float] = []
    stop = threading.Event()
    watcher = threading.Thread(target=_stall_after_first_chunk,
                               args=(fault_proxy, stalled, stop), daemon=True)
    watcher.start()
    out = f"s3://{BUCKET}/faults-stalled"
    try:
        with pytest.raises(RemoteError) as e:
            _build(fault_proxy, out, tokenizer_path)
        ended = time.monotonic()
    finally:
        stop.set()
        watcher.join()
    assert stalled, f"the store never stopped answering: the build ended first: {e.value}"
    took = ended - stalled[0]
    assert took <= bound + SLACK, (took, bound)
    assert e.value.url.startswith(f"s3://{BUCKET}/faults-"), e.value.url
    assert e.value.url in str(e.value) and "Timeout" in str(e.value), str(e.value)
    assert not isinstance(e.value.__context__, RemoteError), "not the first error raised"
    assert fault_proxy.hits["stall"] >= 1
    assert _children() <= before, "a build worker outlived the build"
