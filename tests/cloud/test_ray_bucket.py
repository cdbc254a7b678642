"""Ray without a shared filesystem (issue 23 item 2): a Ray cluster of two nodes that this
module starts (``ray.cluster_utils.Cluster``), sources and cache only in a bucket on a
real S3 server (SeaweedFS). Ray tasks read the sources from the bucket and publish chunks
to it; the driver alone writes the ledger. A bucket-to-bucket build equals a local one; a
killed driver resumes; a killed worker node still ends byte-identical."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import ray
from tests.cloud.compare import assert_same_files, bucket_files, relocated
from tests.cloud.conftest import BUCKET, ledger_chunks, raw_in_bucket

import shardwise as sw
from shardwise.writer.ray_executor import RayExecutor

RAW = f"s3://{BUCKET}/ray-raw"
SOURCES = [f"{RAW}/*.jsonl", f"{RAW}/*.jsonl.zst", f"{RAW}/*.parquet"]
OPTS: dict[str, Any] = dict(chunk_docs=8, segment_bytes=64_000, append_eod=True,
                            progress=False, workers=2)
NODE = dict(num_cpus=1, object_store_memory=80 << 20)


@pytest.fixture(scope="module")
def cluster(s3: dict[str, str]) -> Iterator[Any]:
    """A head and a worker node, 1 CPU each, started once; they inherit the S3 server's
    environment (credentials, endpoint) as a cloud cluster's nodes would have theirs."""
    from ray.cluster_utils import Cluster

    c = Cluster(initialize_head=True, head_node_args=dict(NODE, include_dashboard=False))
    c.add_node(**NODE)
    ray.init(address=c.address)
    try:
        c.wait_for_nodes()
        yield c
    finally:
        ray.shutdown()
        c.shutdown()


@pytest.fixture(scope="module")
def raw(s3: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return raw_in_bucket(tmp_path_factory.mktemp("ray-raw") / "raw", RAW, copies=2)


@pytest.fixture(scope="module")
def reference(raw: dict[str, Path], tokenizer_path: Path,
              tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    """The local copies built locally (local executor, local directory), as the bucket
    build must be: the same bytes, the objects' URLs where the copies' paths are."""
    out = tmp_path_factory.mktemp("ray-ref") / "cache"
    d = raw["a.jsonl"].parent
    sw.build([p.replace(RAW, str(d)) for p in SOURCES], out, tokenizer=tokenizer_path,
             **OPTS)
    return relocated(out, {str(p): f"{RAW}/{n}" for n, p in raw.items()})


def test_bucket_to_bucket_on_two_nodes_equals_a_local_build(
        cluster: Any, raw: dict[str, Path], reference: dict[str, bytes],
        tokenizer_path: Path) -> None:
    assert len([n for n in ray.nodes() if n["Alive"]]) == 2
    out = f"s3://{BUCKET}/ray-cache"
    with RayExecutor(2, address=cluster.address) as ex:
        summary = sw.build(SOURCES, out, tokenizer=tokenizer_path, executor=ex, **OPTS)
    assert ex.task_cpu_seconds > 0 and summary.chunks > 50
    assert_same_files(bucket_files(out), reference)


def test_a_killed_driver_resumes(cluster: Any, raw: dict[str, Path],
                                 reference: dict[str, bytes], tokenizer_path: Path) -> None:
    out = f"s3://{BUCKET}/ray-driver-killed"
    code = ("import shardwise as sw; "
            f"sw.build({SOURCES!r}, {out!r}, tokenizer={str(tokenizer_path)!r}, "
            f"executor='ray', address={cluster.address!r}, **{OPTS!r})")
    proc = subprocess.Popen([sys.executable, "-c", code], stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 300  # a loaded machine starts Ray and the build slowly
    while ledger_chunks(out) < 10 and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    published = ledger_chunks(out)
    total = len([k for k in reference if k.endswith(".bin")])
    assert 10 <= published < total, "the kill did not land mid-build"
    summary = sw.build(SOURCES, out, tokenizer=tokenizer_path, executor="ray",
                       address=cluster.address, **OPTS)
    assert summary.resumed_chunks >= published and summary.chunks == total
    assert_same_files(bucket_files(out), reference)


def test_a_killed_worker_node_still_ends_byte_identical(
        cluster: Any, raw: dict[str, Path], reference: dict[str, bytes],
        tokenizer_path: Path) -> None:
    """Runs last: it takes the worker node away (and puts a new one in its place)."""
    import threading

    out = f"s3://{BUCKET}/ray-node-killed"
    victim = cluster.list_all_nodes()[1]
    killed: list[int] = []

    def kill_mid_build() -> None:
        deadline = time.monotonic() + 300  # a loaded machine starts Ray and the build slowly
        while ledger_chunks(out) < 10 and time.monotonic() < deadline:
            time.sleep(0.01)
        killed.append(ledger_chunks(out))
        cluster.remove_node(victim, allow_graceful=False)

    killer = threading.Thread(target=kill_mid_build)
    killer.start()
    try:
        summary = sw.build(SOURCES, out, tokenizer=tokenizer_path, executor="ray",
                           address=cluster.address, **OPTS)
    finally:
        killer.join()
        cluster.add_node(**NODE)
    total = len([k for k in reference if k.endswith(".bin")])
    assert 10 <= killed[0] < total, "the node was not killed mid-build"
    assert summary.chunks == total and summary.new_chunks == total
    assert_same_files(bucket_files(out), reference)
