"""``shardwise bench read --peer litdata``: end to end on a tiny corpus, with LitData and
with it missing (a clear message and exit 2, no traceback)."""

from __future__ import annotations

import contextlib
import io
import sys
import warnings
from pathlib import Path

import numpy as np
import orjson
import pytest

import shardwise as sw
from shardwise.bench import litdata_peer
from shardwise.bench.read_data import chunked_copy, make_corpus
from shardwise.cli import main as cli_main

TINY = ("--tokens", "60000", "--seq-len", "64", "--batches", "3", "--repeat", "1",
        "--chunks", "3", "--micro-batch", "4")


def bench(*argv: object) -> tuple[int, str]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = cli_main.main(["bench", "read", "--peer", "litdata", *map(str, argv)])
    return code, out.getvalue()


def test_peer_lines_with_litdata_and_workers(tmp_path: Path) -> None:
    code, out = bench(*TINY, "--workers", 1, "--dir", tmp_path, "--json")
    assert code == 0
    rep = orjson.loads(out)
    assert set(rep["lines"]) == {"null", "shardwise loader", "shardwise loader compact",
                                 "shardwise __getitems__", "LitData"}
    for line in rep["lines"].values():
        assert line["examples_per_s"] > 0 and line["first_batch_s"] > 0


def test_litdata_reads_the_same_tokens(tmp_path: Path) -> None:
    make_corpus(tmp_path / "t", 30_000, 3)
    cache = sw.open_cache(chunked_copy(tmp_path / "t", 3)[0])
    info = litdata_peer.write_tokens(litdata_peer.cache_chunks(cache), tmp_path / "lit")
    assert info["tokens"] == cache.num_tokens and info["chunks"] == len(cache.chunks)
    ds = litdata_peer.dataset(tmp_path / "lit", seq_len=63, seed=1, shuffle=False)
    with warnings.catch_warnings():  # LitData's own read of a read-only map warns
        warnings.simplefilter("ignore", UserWarning)
        first = np.asarray(ds[0])
    assert first.dtype == np.uint16 and len(ds) == sum(
        len(cache.tokens(c)) // 64 for c in range(len(cache.chunks)))
    np.testing.assert_array_equal(first, cache.tokens(0)[:64])


def test_missing_litdata_is_a_message(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    for name in [m for m in sys.modules if m == "litdata" or m.startswith("litdata.")]:
        monkeypatch.setitem(sys.modules, name, None)
    monkeypatch.setitem(sys.modules, "litdata", None)
    code, out = bench(*TINY, "--dir", tmp_path)
    assert code == 2 and out == ""
    err = capsys.readouterr().err
    assert "pip install --no-deps litdata" in err and "Traceback" not in err
