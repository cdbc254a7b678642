"""Caches for the multi-process tests, built once per session."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import shardwise as sw


# -- caches ------------------------------------------------------------------------------------
@pytest.fixture(scope="session")
def small_chunk_cache(tmp_path_factory: pytest.TempPathFactory, sample_corpus: Path,
                      tokenizer_path: Path) -> Path:
    """The sample corpus in many small chunks (8 documents each, ~65 chunks)."""
    out = tmp_path_factory.mktemp("dist") / "cache"
    sw.build([str(sample_corpus)], out, tokenizer=tokenizer_path, chunk_docs=8,
             append_eod=True, progress=False, workers=2)
    return out


@pytest.fixture(scope="session")
def reordered_cache(tmp_path_factory: pytest.TempPathFactory, sample_corpus: Path,
                    tokenizer_path: Path) -> Path:
    """The same documents in reverse order: as many tokens, other data."""
    d = tmp_path_factory.mktemp("dist-other")
    lines = sample_corpus.read_text(encoding="utf-8").splitlines(keepends=True)
    src = d / "corpus.jsonl"
    src.write_text("".join(reversed(lines)), encoding="utf-8")
    sw.build([str(src)], d / "cache", tokenizer=tokenizer_path, chunk_docs=8,
             append_eod=True, progress=False, workers=2)
    return d / "cache"


@pytest.fixture(scope="session")
def big_token_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """~16 MB of uint16 tokens (8 Mi tokens) in 64 chunks, written directly."""
    from tests.cachefactory import make_cache

    rng = np.random.default_rng(7)
    docs = [rng.integers(0, 1000, size=4096).tolist() for _ in range(2048)]
    return make_cache(tmp_path_factory.mktemp("dist-big") / "cache", [docs], chunk_docs=32)
