"""``shardwise bench plan`` on tiny data: the synthesised ``.idx`` is a valid Megatron
index, the report carries every figure with its ratio, and the plan it timed is the plan
the library builds. Speed is what the bench itself reports."""

from __future__ import annotations

import argparse
import contextlib
import io
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from shardwise import TokenDataset, open_cache
from shardwise.bench import plan as bench_plan
from shardwise.cli import main as cli_main
from shardwise.format.megatron import check_index, read_idx
from shardwise.plan import build_doc_shuffle_index

TINY = ("--docs", "3000", "--median-doc", "40", "--seq-len", "64", "--repeat", "1",
        "--micro-batch", "4", "--read-batches", "3", "--seed", "5", "--json")


def run_bench(*argv: object) -> tuple[int, dict[str, Any]]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = cli_main.main(["bench", "plan", *map(str, argv)])
    return code, orjson.loads(out.getvalue())


def test_synthesised_idx_is_a_megatron_index_with_a_sparse_bin(tmp_path: Path) -> None:
    prefix = tmp_path / "d"
    meta = bench_plan.synthesise(prefix, 5000, 30, 1)
    idx = read_idx(tmp_path / "d.idx")
    check_index(idx, tmp_path / "d.bin")  # lengths, pointers, document indices, .bin size
    assert idx.num_documents == 5000 and idx.num_tokens == meta["tokens"]
    assert (tmp_path / "d.bin").stat().st_blocks * 512 < (tmp_path / "d.bin").stat().st_size
    assert bench_plan.synthesise(prefix, 5000, 30, 1)["made_s"] == 0.0  # reused


def test_report_has_every_figure_and_its_ratio(tmp_path: Path) -> None:
    code, rep = run_bench(*TINY, "--dir", tmp_path)
    assert code == 0
    r = rep["sizes"]["3000"]
    build = r["build"]
    assert build["shardwise"]["seconds"] > 0 and build["shardwise"]["growth_mb"] >= 0
    assert rep["megatron"]  # megatron-core is installed here: the baseline ran
    assert build["megatron"]["examples"] == build["shardwise"]["examples"]
    for key in ("build_time_vs_megatron", "build_memory_vs_megatron"):
        assert build[key] > 0
    assert r["first_example"]["seconds"] > 0 and r["reader"]["batches"] == 3
    assert r["reader"]["heap_growth"] > 0
    assert set(rep["targets"]) == {"build_time_vs_megatron", "build_memory_vs_megatron",
                                   "first_example_cached_s", "reader_heap_growth"}
    text = bench_plan.format_report(rep)
    assert "3,000 documents" in text and "time ratio" in text and "reader heap" in text
    # the plan the bench timed is the library's: same order as an in-memory build
    ds = TokenDataset(open_cache(tmp_path / "docs-3000"), seq_len=64, seed=5,
                      shuffle="document", plan_dir=tmp_path / "check")
    lengths = read_idx(tmp_path / "docs-3000.idx").sequence_lengths
    want = build_doc_shuffle_index(lengths, seed=5, epoch=0, seq_len=64, drop_last=True)
    assert np.array_equal(ds.order.plan(0).doc_order, want.doc_order)


def test_parser_defaults_are_10m_and_100m_documents() -> None:
    p = argparse.ArgumentParser()
    bench_plan.add_subparser(p.add_subparsers())
    args = p.parse_args(["plan"])
    assert args.docs == "10000000,100000000" and not args.json
