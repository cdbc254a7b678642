"""``shardwise bench read`` on tiny data: the report's shape, and that shardwise and
plain-numpy slicing give the same batches for the same windows.

Only structure is tested here; speed is what the bench itself reports."""

from __future__ import annotations

import contextlib
import importlib.util
import io
import sys
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest

from shardwise import TokenDataset, open_cache
from shardwise.bench.read_data import MEGATRON_INSTALL, chunked_copy, make_corpus
from shardwise.bench.read_report import format_report
from shardwise.cli import main as cli_main

TINY = ("--tokens", "200000", "--seq-len", "128", "--batches", "3", "--repeat", "1",
        "--rss-batches", "4", "--seed", "7", "--chunks", "5", "--json")
PATHS = ("numpy", "getitem", "getitems", "loader", "getitems_chunked", "loader_chunked",
         "getitems_chunked_trusted", "loader_chunked_trusted", "getitems_doc", "loader_doc")


def run_bench(*argv: object) -> tuple[int, dict[str, Any]]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = cli_main.main(["bench", "read", *map(str, argv)])
    return code, orjson.loads(out.getvalue())


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], Path]:
    """One run on 200k (and 800k) tokens, kept in a directory; Megatron made unimportable
    so the report is the same with or without it installed."""
    work = tmp_path_factory.mktemp("bench-read")
    with pytest.MonkeyPatch.context() as mp:
        for name in [m for m in sys.modules if m == "megatron" or m.startswith("megatron.")]:
            mp.setitem(sys.modules, name, None)
        mp.setitem(sys.modules, "megatron", None)
        code, report = run_bench(*TINY, "--dir", work)
    assert code == 0
    return report, work


def test_json_report_structure(tiny: tuple[dict[str, Any], Path]) -> None:
    report, work = tiny
    assert set(report) >= {"config", "data", "notes", "megatron", "identical", "throughput",
                           "seek", "startup", "rss", "rows", "targets", "verify_once",
                           "first_epoch"}
    once = report["verify_once"]
    assert once["ok"] and once["chunks"] == report["data"]["chunked"]["chunks"]
    assert once["bytes"] > 2 * 200_000 and once["mb_per_s"] > 0
    first = report["first_epoch"]
    assert first["hashed_chunks"] == once["chunks"] and first["examples"] > 0
    assert first["checks"] > 0 and first["trusted"] > 0
    cfg = report["config"]
    assert (cfg["tokens"], cfg["large_tokens"], cfg["seq_len"]) == (200_000, 800_000, 128)
    for name, tokens in (("small", 200_000), ("large", 800_000)):
        d = report["data"][name]
        assert d["tokens"] == tokens and d["documents"] > 10 and d["vocab"] == 50_000
        assert (work / f"tokens-{tokens}.bin").stat().st_size == 2 * tokens
    chunked = report["data"]["chunked"]
    cache = open_cache(chunked["path"])
    assert len(cache.chunks) == chunked["chunks"] and 4 <= chunked["chunks"] <= 6
    assert cache.num_tokens == 200_000
    assert set(report["throughput"]) == set(PATHS)  # no Megatron: it is not importable
    for path in PATHS:
        t = report["throughput"][path]
        assert t["examples"] == 3 * 8 and len(t["runs"]) == 1 and t["seconds"] > 0
        assert t["tokens_per_s"] == pytest.approx(t["examples_per_s"] * 128)
    meg = report["megatron"]
    assert meg["available"] is False and MEGATRON_INSTALL in meg["note"]
    assert any(MEGATRON_INSTALL in n for n in report["notes"])
    st = report["startup"]
    assert st["import"]["torch"] is False and st["first_small"]["torch"] is False
    for key in ("import", "import_numpy", "first_small", "first_large", "first_numpy_small",
                "first_numpy_large", "doc_cold_small", "doc_cached_small", "doc_cold_large",
                "doc_cached_large"):
        assert 0 < st[key]["seconds"] == min(st[key]["runs"])
    # the cold runs planned in directories they removed; the cached runs left their plan
    plans = {p.parent.name for p in work.glob("plans-*/*/*.npy")}
    assert plans == {"cached"}, plans
    seek = report["seek"]
    assert seek["consumed"] % 8 == 0 and seek["consumed"] > 3 * (200_000 // 128 - 1)
    assert seek["deep"] > 0 and seek["zero"] > 0
    for key in ("small", "large", "numpy_small", "numpy_large"):
        assert report["rss"][key]["peak_mb"] > 0
    for row in report["rows"]:
        assert set(row) == {"what", "value", "unit", "baseline_what", "baseline", "ratio"}
    assert [t["want"] for t in report["targets"]] == [5.0, 0.5, 0.05, 0.3, 0.01, 0.9, 0.7]
    megatron_target = report["targets"][0]
    assert megatron_target["got"] is None and megatron_target["ok"] is None
    assert all(isinstance(t["ok"], bool) for t in report["targets"][1:])


def test_shardwise_and_plain_numpy_batches_are_identical(
        tiny: tuple[dict[str, Any], Path]) -> None:
    report, work = tiny
    assert report["identical"] == {"getitem": True, "getitems": True, "loader": True,
                                   "getitems_chunked": True, "loader_chunked": True,
                                   "getitems_chunked_trusted": True,
                                   "loader_chunked_trusted": True, "getitems_doc": True,
                                   "loader_doc": True, "batches": 3, "all": True}
    # the same check, independently, on the data the bench kept
    prefix = work / "tokens-200000"
    ds = TokenDataset(open_cache(prefix), seq_len=128, seed=7)
    chunked = TokenDataset(open_cache(report["data"]["chunked"]["path"]), seq_len=128, seed=7)
    mm = np.memmap(f"{prefix}.bin", dtype=np.uint16, mode="r")
    for k in range(3):
        idx = list(range(8 * k, 8 * k + 8))
        rows = np.stack([mm[w * 128: w * 128 + 129] for w in ds.windows(idx)])
        for reader in (ds, chunked):
            batch = reader.__getitems__(idx)
            np.testing.assert_array_equal(batch["input_ids"], rows[:, :128])
            np.testing.assert_array_equal(batch["labels"], rows[:, 1:])


def test_human_report(tiny: tuple[dict[str, Any], Path]) -> None:
    text = format_report(tiny[0])
    assert "plain numpy memmap slicing" in text and "first example, 0.8M tokens" in text
    assert "identical to plain numpy (3 micro-batches): getitem yes" in text
    assert "loader, cache of 5 chunks" in text and "loader_chunked yes" in text
    assert "doc shuffle, cold plan, 0.2M" in text and "doc shuffle, cached plan, 0.8M" in text
    assert text.count("target ") == 7 and "not measured" in text
    assert "loader, 5 chunks, checks on" in text and "the same, verify=False" in text
    assert "first epoch, 5 chunks, checks on + hashing" in text
    assert "loader, doc shuffle" in text and "loader, window shuffle" in text
    assert "document shuffle >= 0.7x window path" in text


def test_data_is_reused(tiny: tuple[dict[str, Any], Path]) -> None:
    _, work = tiny
    again = make_corpus(work / "tokens-200000", 200_000, 7)
    assert again["reused"] is True and again["made_s"] == 0.0
    cache_dir = work / "tokens-200000.cache-5"
    stamp = (cache_dir / "ledger.json").stat().st_mtime_ns
    assert chunked_copy(work / "tokens-200000", 5) == (cache_dir, tiny[0]["data"]["chunked"][
        "chunks"])
    assert (cache_dir / "ledger.json").stat().st_mtime_ns == stamp  # not imported again


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("megatron") is None,
                    reason=f"megatron-core is not installed ({MEGATRON_INSTALL})")
def test_megatron_baseline(tiny: tuple[dict[str, Any], Path]) -> None:
    work = tiny[1]  # its corpora and caches, made once (this run adds Megatron's files)
    code, report = run_bench(*TINY, "--dir", work)
    assert code == 0
    assert report["megatron"]["available"] is True, report["megatron"]
    assert report["throughput"]["megatron"]["examples_per_s"] > 0
    assert report["targets"][0]["got"] > 0
    assert any(r["baseline_what"].startswith("Megatron") for r in report["rows"])
    st, rss = report["startup"], report["rss"]
    for name in ("small", "large"):
        for plan in ("cold", "cached"):
            assert st[f"megatron_{plan}_{name}"]["seconds"] > 0
        assert rss[f"megatron_{name}"]["peak_mb"] > 0
    # Megatron's index files: left by the cached runs only
    assert {p.parent.name for p in work.glob("megatron-index-*/*/*")} == {"cached"}
    compared = [r for r in report["rows"] if r["baseline_what"].startswith("Megatron")]
    assert len(compared) == 1 + 1 + 4 + 2 and all(r["ratio"] is not None for r in compared)


def test_bad_arguments(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main.main(["bench", "read", "--tokens", "100", "--seq-len", "128"]) == 2
    assert "--tokens 100" in capsys.readouterr().err
