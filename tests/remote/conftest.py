"""The session's S3 server (SeaweedFS) with this directory's bucket, and a cache built to
it and to a local directory."""

from __future__ import annotations

from pathlib import Path

import pytest

import shardwise as sw
from shardwise.bench.seaweed import S3Server

BUCKET = "sw-test"


@pytest.fixture(scope="session")
def s3_env(s3_server: S3Server) -> dict[str, str]:
    """The environment a client needs (also set in os.environ), with ``BUCKET`` made."""
    s3_server.make_bucket(BUCKET)
    return s3_server.env


@pytest.fixture(scope="session")
def built(s3_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory,
          sample_corpus: Path, tokenizer_path: Path) -> tuple[str, Path]:
    """The sample corpus built to s3://sw-test/cache and to a local directory."""
    url = f"s3://{BUCKET}/cache"
    local = tmp_path_factory.mktemp("remote-local") / "cache"
    opts = {"tokenizer": tokenizer_path, "chunk_docs": 8, "append_eod": True,
            "progress": False, "workers": 2}
    sw.build([str(sample_corpus)], url, **opts)
    sw.build([str(sample_corpus)], local, **opts)
    return url, local
