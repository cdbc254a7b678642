"""StreamDataset memory: RSS stays flat over a run that streams many times the chunk
cache's size; the cache stays within its byte bound (plus the blocks in use)."""

from __future__ import annotations

import gc
import os
from itertools import islice
from pathlib import Path

import numpy as np
import pytest

import shardwise as sw
from shardwise.format.chunk import SourceRange, chunk_stem, publish_token_chunk
from shardwise.format.files import LocalFiles
from shardwise.format.ledger import ChunkEntry, Ledger, Segment, SourceProgress
from shardwise.format.manifest import Manifest, SourceInfo, TokenizerInfo
from shardwise.read.stream.dataset import StreamDataset

CHUNKS, TOKENS = 192, 64 * 1024          # 192 chunks of 128 KiB (uint16): 24 MiB
CACHE_BYTES = 1 << 20                    # 1 MiB of chunk cache


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.fixture(scope="module")
def big_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One source, one segment, CHUNKS chunks of TOKENS random tokens (8 documents each)."""
    root = tmp_path_factory.mktemp("mem") / "cache"
    root.mkdir()
    rng = np.random.default_rng(0)
    entries = []
    for k in range(CHUNKS):
        stem = chunk_stem(0, 0, k)
        fields = {"source": 0, "source_path": "big.jsonl", "segment": 0, "index": k,
                  "range": SourceRange("row", 8 * k, 8 * k + 8, 8 * k, 8 * k + 8)}
        toks = rng.integers(0, 50_000, TOKENS, dtype=np.uint16)
        meta, digest = publish_token_chunk(LocalFiles(root), stem, toks,
                                           np.full(8, TOKENS // 8), fields)
        entries.append(ChunkEntry(stem, meta.documents, meta.tokens, digest))
    Ledger([SourceProgress([Segment(0, 8 * CHUNKS, 8 * CHUNKS, 8 * CHUNKS, True, entries)])]
           ).save(LocalFiles(root))
    Manifest(tokenizer=TokenizerInfo("test", 50_000, None), dtype="uint16", chunk_kind="tokens",
             processor={"kind": "test"}, chunking={}, sources=[SourceInfo(
                 "big.jsonl", 0, "fp", "jsonl")], created_by="test").save(LocalFiles(root))
    return root


@pytest.mark.skipif(not Path("/proc/self/statm").exists(), reason="reads /proc (Linux)")
def test_rss_is_flat_over_ten_times_the_cache(big_cache: Path) -> None:
    ds = StreamDataset(big_cache, seq_len=1024, streams=4, world=sw.World(0, 1),
                       block_chunks=2, batch_size=128, chunk_cache_bytes=CACHE_BYTES,
                       prefetch_chunks=2)
    per_batch = 128 * 1024 * 2                          # token bytes served per batch
    batches = 2 * CHUNKS * TOKENS * 2 // per_batch      # two epochs: 48 MiB, 48x the cache
    it = iter(ds)
    warm = list(islice(it, 16))
    del warm
    gc.collect()
    start = rss_bytes()
    peak = start
    for _ in islice(it, batches - 16):
        peak = max(peak, rss_bytes())
    stats = ds.chunk_cache.stats()
    ds.close()
    assert sum(ds.opened.values()) >= 2 * CHUNKS - 8, "two epochs were read from disk"
    assert stats["misses"] * TOKENS * 2 >= 10 * CACHE_BYTES
    # 4 streams' current blocks (4 x 256 KiB) plus one block ahead
    assert stats["peak_bytes"] <= CACHE_BYTES + 2 * TOKENS * 2
    assert peak - start < 16 << 20, f"RSS grew by {(peak - start) >> 20} MiB"


def test_chunk_cache_evicts_unpinned_least_recent_first() -> None:
    from shardwise.read.stream.chunk_cache import ChunkCache

    reads: list[int] = []

    def load(c: int) -> np.ndarray:
        reads.append(c)
        return np.zeros(256, dtype=np.uint8)  # 256 bytes each

    cc = ChunkCache(3 * 256)
    for c in (0, 1, 2):
        cc.acquire(c, lambda c=c: load(c))
    cc.release(0)
    for c in (3, 4):                        # over the bound: only chunk 0 is evictable
        cc.acquire(c, lambda c=c: load(c))
    assert 0 not in cc and all(c in cc for c in (1, 2, 3, 4))
    assert cc.stats()["bytes"] == 4 * 256 == cc.stats()["pinned_bytes"]
    for c in (1, 2, 3, 4):
        cc.release(c)
    assert cc.stats()["bytes"] == 3 * 256 and 1 not in cc    # least recent went first
    cc.acquire(2, lambda: load(2))                           # a hit: not read again
    assert reads == [0, 1, 2, 3, 4]
    cc.clear()
    cc.release(2)                           # a late release after clear() is harmless
    assert cc.stats()["bytes"] == 0
