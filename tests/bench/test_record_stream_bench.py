"""``shardwise bench records`` on a tiny corpus: the report's shape (speed is what the bench
itself reports)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from shardwise.bench import records as bench_records


def _parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    bench_records.add_subparser(parser.add_subparsers(dest="bench"))
    return parser.parse_args(["records", *argv])


def test_json_report_on_a_tiny_corpus(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                      ) -> None:
    args = _parse("--gb", "0.002", "--records", "300", "--workers", "1", "--no-hf", "--json",
                  "--tmp-dir", str(tmp_path))
    assert bench_records.run(args) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["corpus"]["bytes"] >= 2_000_000 and report["hf"] is None
    assert [s["workers"] for s in report["shardwise"]] == [0, 1]
    for s in report["shardwise"]:
        assert s["records_per_s"] > 0 and 0 < s["start_s"] <= s["first_s"] and s["rss_mb"] > 0
    assert [t["what"].split()[0] for t in report["targets"]] == ["first", "RSS"]
    assert not list(tmp_path.iterdir())  # the corpus is removed


def test_human_report_names_the_missing_baseline(tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    args = _parse("--gb", "0.001", "--records", "100", "--workers", "0", "--no-hf",
                  "--tmp-dir", str(tmp_path))
    assert bench_records.run(args) == 0
    out = capsys.readouterr().out
    assert "RecordStream, 0 workers" in out and "HF datasets: skipped (--no-hf)" in out
