"""The session's S3 server (SeaweedFS, tests/conftest.py's ``s3_server``) with this
directory's bucket, and the raw corpora of the cloud-build tests: local copies beside the
same files in a bucket."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest
from tests.conftest import sample_texts

import shardwise as sw
from shardwise.bench.seaweed import S3Server

BUCKET = "sw-cloud"


@pytest.fixture(scope="session")
def s3(s3_server: S3Server) -> dict[str, str]:
    """The server's credentials and endpoint (in ``os.environ`` for the session), with
    ``BUCKET`` made."""
    s3_server.make_bucket(BUCKET)
    return s3_server.env


def s3fs_client():  # type: ignore[no-untyped-def]
    import fsspec

    return fsspec.filesystem("s3", skip_instance_cache=True)


def write_raw(d: Path, copies: int = 2) -> dict[str, Path]:
    """JSONL (several segments at 64 kB), .jsonl.zst, .jsonl.gz and a Parquet file of
    three row groups, plus a stray file no build reads."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    import zstandard

    texts = [f"[{k}] {t}" for k in range(copies) for t in sample_texts()]
    lines = "".join(json.dumps({"id": i, "text": t}) + "\n" for i, t in enumerate(texts))
    d.mkdir(parents=True, exist_ok=True)
    (d / "a.jsonl").write_text(lines, "utf-8")
    (d / "b.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(
        "".join(json.dumps({"text": t[::-1]}) + "\n" for t in texts[:300]).encode()))
    (d / "c.jsonl.gz").write_bytes(gzip.compress(
        "".join(json.dumps({"text": t.upper()}) + "\n" for t in texts[:200]).encode()))
    pq.write_table(pa.table({"id": list(range(250)), "text": [t[:400] for t in texts[:250]]}),
                   d / "d.parquet", row_group_size=100)
    (d / "notes.txt").write_text("not a source\n")
    return {p.name: p for p in sorted(d.iterdir())}


def upload(files: dict[str, Path], url: str) -> None:
    fs = s3fs_client()
    for name, p in files.items():
        fs.pipe_file(f"{url.removeprefix('s3://')}/{name}", p.read_bytes())


def raw_in_bucket(d: Path, url: str, copies: int = 2) -> dict[str, Path]:
    """:func:`write_raw` into ``d`` (the local copies), the same files uploaded to ``url``."""
    files = write_raw(d, copies=copies)
    upload(files, url)
    return files


def build_local_copies(raw: dict[str, Path], patterns: list[str], out: Path,
                       **options: Any) -> Path:
    """The local copies built by the same globs into ``out``: a bucket build's reference."""
    d = raw["a.jsonl"].parent
    sw.build([str(d / p) for p in patterns], out, **options)
    return out


def ledger_chunks(url: str) -> int:
    """Chunks the ledger names now: its snapshot and the journal records after it."""
    from shardwise.errors import ManifestError
    from shardwise.format.ledger import Ledger
    from shardwise.remote.client import RemoteStore
    from shardwise.storage.bucket import BucketStore

    try:
        ledger = Ledger.load(BucketStore(RemoteStore(url)))
    except ManifestError:
        return -1
    return sum(len(seg.chunks) for src in ledger.sources for seg in src.segments)
