"""``shardwise bench build --bucket``: the same builds with corpus and cache in a bucket
(a real S3 server), beside the disk builds, with the ratio (issue 23 item 5)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
from tests.cloud.conftest import BUCKET, s3fs_client


def test_bucket_builds_beside_the_disk_builds(s3: dict[str, str], cli: Any,
                                              tmp_path: Path) -> None:
    url = f"s3://{BUCKET}/bench"
    # chunks of 50 kB: several per task, so the bucket builds upload while they tokenize
    code, out, _ = cli("bench", "build", "--mb", "0.2", "--repeat", "2", "--workers", "1",
                       "--chunk-mb", "0.05", "--bucket", url, "--tmp-dir", tmp_path, "--json")
    assert code == 0
    report = orjson.loads(out)
    assert report["chunk_mb"] == 0.05
    (b,) = report["bucket_builds"]
    assert b["workers"] == 1 and b["vs_local"] > 0 and b["tokens"] == report["builds"][0][
        "tokens"]
    # round by round: each bucket build over the disk build of its round, the median
    local = report["builds"][0]
    assert b["vs_local_rounds"] == [d / x for x, d in zip(b["runs"], local["runs"],
                                                          strict=True)]
    lo, hi = b["vs_local_range"]
    assert len(b["vs_local_rounds"]) == 2 and lo <= b["vs_local_median"] <= hi
    assert b["vs_local_cpu_median"] > 0
    assert report["identical"]  # the bucket build's token files are the disk build's
    assert any(t["what"].startswith("bucket to bucket") for t in report["targets"])
    left = [k for k in s3fs_client().find(f"{BUCKET}/bench") if k.startswith(f"{BUCKET}/bench/")]
    assert left == []  # corpus and caches removed
    s3fs_client().pipe_file(f"{BUCKET}/full/x", b"x")
    code, _, err = cli("bench", "build", "--mb", "0.2", "--repeat", "1", "--workers", "1",
                       "--bucket", f"s3://{BUCKET}/full", "--tmp-dir", tmp_path)
    assert code == 2 and "not empty" in err
