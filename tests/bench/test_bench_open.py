"""``shardwise bench open`` on a tiny synthesised cache: the report's shape, and that the
cache is left as it was found (the bench moves ``ledger.index`` away for the layout
without it, and back). Only structure is tested; speed is what the bench reports."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

import orjson

from shardwise.bench import open as bench_open
from shardwise.cli import main as cli_main
from shardwise.format.files import LocalFiles
from shardwise.format.ledger import read_view
from shardwise.format.ledger_index import INDEX_NAME


def test_bench_open_reports_every_probe_for_both_layouts(tmp_path: Path) -> None:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = cli_main.main(["bench", "open", "--chunks", "30", "--repeat", "1",
                              "--cache-dir", str(tmp_path), "--json"])
    report = orjson.loads(out.getvalue())
    assert code == 0
    figures = report["figures"]["30"]
    for layout in bench_open.LAYOUTS:
        for probe in bench_open.PROBES:
            got = figures[layout][probe]
            assert got["seconds"] > 0 and got["peak_mb"] > 10 and len(got["runs"]) == 1
    assert set(report["ratios"]["ledger_vs_index"]["30"]) == set(bench_open.PROBES)
    rss = report["targets"][-1]
    assert "peak RSS" in rss["what"] and rss["ok"]  # 30 tiny chunks: well below 300 MB
    assert report["caches"][0]["made"] is True
    cache = tmp_path / "synth-30"
    assert (cache / INDEX_NAME).is_file() and read_view(LocalFiles(cache))[1]
    assert "target peak RSS" in bench_open.format_report(report)
