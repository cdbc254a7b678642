"""A moto S3 server per session, and a cache built to it and to a local directory."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.remote.s3server import moto_s3

import shardwise as sw

BUCKET = "sw-test"


@pytest.fixture(scope="session")
def s3_env() -> Iterator[dict[str, str]]:
    with moto_s3(BUCKET) as env:
        yield env


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
