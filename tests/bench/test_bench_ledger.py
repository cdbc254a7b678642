"""``shardwise bench ledger`` on a tiny build: the report's shape, and that the baseline is
the old behaviour (a snapshot every save) while the journal writes records instead.

Only structure is tested here; the share of time is what the bench itself reports."""

from __future__ import annotations

import orjson


def test_json_report_on_a_tiny_build(cli, tmp_path) -> None:
    code, out, err = cli("bench", "ledger", "--chunks", "400", "--workers", "1", "--json",
                         "--tmp-dir", tmp_path)
    assert code == 0, err
    report = orjson.loads(out)
    local = report["local"]
    journal, whole = local["journal"], local["whole_ledger"]
    assert journal["chunks"] == whole["chunks"] == 400
    for r in (journal, whole):
        assert 0 < r["ledger_seconds"] < r["seconds"] and 0 < r["share"] < 1
    # the baseline rewrites the whole ledger at every save; the journal only at the end
    # (and when due: not in a build this short)
    assert whole["snapshots"] >= whole["records"] >= 1
    assert journal["snapshots"] <= 2 and journal["records"] >= 1
    assert local["share_ratio"] == journal["share"] / whole["share"]
    assert "bucket" not in report


def test_human_report(cli, tmp_path) -> None:
    code, out, err = cli("bench", "ledger", "--chunks", "50", "--workers", "1",
                         "--tmp-dir", tmp_path)
    assert code == 0, err
    assert "journal / whole-ledger share" in out and "whole_ledger" in out
