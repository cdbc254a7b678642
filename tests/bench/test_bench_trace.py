"""``shardwise bench trace`` on a small synthesised cache: the report's shape, and the
synthesised cache is a valid cache (``verify`` passes) whose lines trace names as its
segments and ``skipped_lines`` say. Speed is what the bench itself reports."""

from __future__ import annotations

from pathlib import Path

import orjson

from shardwise.bench.trace import SKIP_EVERY, synth_cache
from shardwise.read.config import ReadConfig
from shardwise.read.trace import Tracer
from shardwise.storage.verify import verify_cache


def test_json_report(cli, tmp_path: Path) -> None:
    _, out, err = cli("bench", "trace", "--documents", 20_000, "--chunk-docs", 500,
                      "--sources", 4, "--global-batch", 16, "--micro-batch", 2, "--world", 2,
                      "--repeat", 2, "--json", "--tmp-dir", tmp_path)
    report = orjson.loads(out)
    assert report["documents"] == 20_000 and report["chunks"] == 40, err
    assert set(report["median"]) == {"setup_ms", "first_ms", "trace_ms", "read_ms", "pieces"}
    assert report["median"]["pieces"] >= 16 and report["trace_vs_read"] > 0


def test_the_synthesised_cache_is_valid_and_traced(tmp_path: Path) -> None:
    root = synth_cache(tmp_path / "c", 3_000, 300, 2)
    assert verify_cache(root).ok
    cfg = ReadConfig.from_dict({"cache": str(root), "seq_len": 64, "global_batch_size": 4,
                                "micro_batch_size": 4, "world_size": 1, "shuffle": "none"})
    tracer = Tracer(cfg)
    docs = tracer._docs[0]
    for c in (0, 1, SKIP_EVERY):  # chunk c is segment c of source 0 (5 chunks a source)
        if c >= 5:
            c, source = c - 5, 1
        else:
            source = 0
        stem = f"chunks/{source:05d}/{c:05d}-00000"
        chunk = [i for i, info in enumerate(docs.cache.chunks) if info.stem == stem][0]
        skipped = c + 5 * source == 0 or (c + 5 * source) % SKIP_EVERY == 0
        lines_before = c * 300 + sum(1 for g in range(c) if (g + 5 * source) % SKIP_EVERY == 0)
        for k in (0, 2, 3, 299):
            want = lines_before + k + (1 if skipped and k >= 3 else 0) + 1
            assert docs.where(chunk, k).line == want
