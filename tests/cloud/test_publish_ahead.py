"""A build into a bucket uploads a chunk while it makes the next one
(writer/publishing.py), through the fault proxy in front of the session's S3 server
(SeaweedFS):

* while a chunk's ``.bin`` PUT is held at the proxy, the build goes on reading its
  source (the proxy sees the next ranged GET and only then lets the PUT through), and the
  cache still equals a local build byte for byte;
* a chunk's PUT that keeps failing ends the build with a RemoteError naming its URL; the
  ledger names only chunks with all their files, never that chunk; the same build run
  again uploads none of the chunks it names and ends byte-identical to a local one.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from tests.cloud.compare import assert_same_files, bucket_files, relocated
from tests.cloud.conftest import BUCKET, upload, write_raw
from tests.conftest import sample_texts
from tests.faults import Fault, FaultProxy

import shardwise as sw
from shardwise.errors import RemoteError
from shardwise.format.ledger import Ledger
from shardwise.remote.client import RemoteStore
from shardwise.remote.policy import POLICY_ENV
from shardwise.storage.bucket import BucketStore

MIB = 1 << 20
# the held PUT waits for the build to read on: a try is given far longer than that takes
PATIENT = "connect_timeout=5,read_timeout=15,first_backoff=0.01,max_backoff=0.2,deadline=30"
# a PUT answered 503 every time gives up after 3 quick tries; every other request keeps
# patient timeouts (a loaded machine is not a fault: its first S3 request can take 5 s)
FEW_TRIES = ("connect_timeout=5,read_timeout=15,first_backoff=0.01,max_backoff=0.1,"
             "deadline=60,attempts=3")


def _big_source(path: Path, size: int) -> tuple[Path, int]:
    """JSONL of the sample's texts repeated to ``size`` bytes; the number of documents in
    its first 2.5 MiB (a chunk of that many ends there, the next one past 4 MiB)."""
    texts, lines, total, first = sample_texts(), [], 0, 0
    while total < size:
        line = json.dumps({"text": f"[{len(lines)}] {texts[len(lines) % len(texts)]}"}) + "\n"
        lines.append(line)
        total += len(line.encode())
        first = first or (len(lines) if total >= 2.5 * MIB else 0)
    path.write_text("".join(lines), "utf-8")
    return path, first


def test_a_chunk_uploads_while_the_build_reads_on(
        s3: dict[str, str], fault_proxy: FaultProxy, tokenizer_path: Path, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """One segment of 8.5 MiB read by 4 MiB ranged GETs (the next one asked for once one
    is consumed), chunks of ~2.5 MiB of text: the first chunk's ``.bin`` PUT is held until
    the proxy sees another GET of the source, which the build asks for only past 4 MiB,
    i.e. while making the second chunk. Published before reading on, the build would wait
    for the PUT; the proxy would let it through only after its time, the client would
    have tried it again by then, and the build would make no request meanwhile."""
    src, per_chunk = _big_source(tmp_path / "big.jsonl", 8 * MIB + MIB // 2)
    upload({"big.jsonl": src}, f"s3://{BUCKET}/ahead-raw")
    opts: dict[str, Any] = dict(chunk_docs=per_chunk, segment_bytes=64 * MIB, workers=1,
                                append_eod=True, progress=False)
    sw.build([str(src)], tmp_path / "local", tokenizer=tokenizer_path, **opts)
    monkeypatch.setenv(POLICY_ENV, PATIENT)
    fault_proxy.inject(Fault("hold", match=r"^PUT .*/chunks/00000/00000-00000\.bin",
                             until=r"^GET .*/ahead-raw/big\.jsonl", times=1))
    url = f"s3://{BUCKET}/ahead-cache"
    summary = sw.build([f"s3://{BUCKET}/ahead-raw/big.jsonl"], url, tokenizer=tokenizer_path,
                       storage_options={"endpoint_url": fault_proxy.endpoint}, **opts)
    assert summary.chunks >= 3
    assert fault_proxy.hits["hold"] == 1 and fault_proxy.hits["released"] == 1
    puts = [p for m, p in fault_proxy.seen if m == "PUT" and p.endswith("00000-00000.bin")]
    assert len(puts) == 1  # released by the build's next GET, not tried again
    assert_same_files(bucket_files(url), relocated(
        tmp_path / "local", {str(src): f"s3://{BUCKET}/ahead-raw/big.jsonl"}))


def test_a_failed_put_is_the_builds_error_and_its_chunk_never_in_the_ledger(
        s3: dict[str, str], fault_proxy: FaultProxy, tokenizer_path: Path, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    raw = f"s3://{BUCKET}/failed-put-raw"
    files = write_raw(tmp_path / "raw", copies=1)
    upload({"a.jsonl": files["a.jsonl"]}, raw)
    opts: dict[str, Any] = dict(chunk_docs=16, segment_bytes=64_000, workers=2,
                                append_eod=True, progress=False)
    sw.build([str(files["a.jsonl"])], tmp_path / "local", tokenizer=tokenizer_path, **opts)
    url = f"s3://{BUCKET}/failed-put-cache"
    monkeypatch.setenv(POLICY_ENV, FEW_TRIES)
    # the third chunk of the first segment: every try of its .idx answered 503 SlowDown
    fault_proxy.inject(Fault("slowdown", match=r"^PUT .*/chunks/00000/00000-00002\.idx"))
    with pytest.raises(RemoteError, match=r"chunks/00000/00000-00002\.idx"):
        sw.build([f"{raw}/a.jsonl"], url, tokenizer=tokenizer_path,
                 storage_options={"endpoint_url": fault_proxy.endpoint}, **opts)
    assert fault_proxy.hits["slowdown"] == 3  # tried again within the policy, then given up
    store = BucketStore(RemoteStore(url))
    named = [c.stem for src in Ledger.load(store).sources for seg in src.segments
             for c in seg.chunks]
    there = set(store.keys())
    assert "chunks/00000/00000-00002" not in named  # never the one whose upload failed
    assert "chunks/00000/00000-00002.json" not in there  # (its metadata never sent)
    assert all(f"{stem}{suffix}" in there for stem in named
               for suffix in (".bin", ".idx", ".json"))
    # Which chunks before it the ledger names depends on time: its records are saved at
    # most every 0.25 s, and not after a RemoteError (writer/api.py's _finish), so the
    # last ones reported are made again. Those it names are kept: the resume puts none.
    fault_proxy.clear()
    monkeypatch.delenv(POLICY_ENV)
    before = len(fault_proxy.seen)
    sw.build([f"{raw}/a.jsonl"], url, tokenizer=tokenizer_path,  # resumes
             storage_options={"endpoint_url": fault_proxy.endpoint}, **opts)
    put = {path.split("/failed-put-cache/")[-1] for m, path in fault_proxy.seen[before:]
           if m == "PUT"}
    assert "chunks/00000/00000-00002.idx" in put
    assert not {f"{stem}{suffix}" for stem in named for suffix in (".bin", ".idx", ".json")
                } & put
    assert_same_files(bucket_files(url), relocated(
        tmp_path / "local", {str(files["a.jsonl"]): f"{raw}/a.jsonl"}))
