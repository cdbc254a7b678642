"""``shardwise build``: the summary, the cache it makes, and the exit codes of bad usage."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import orjson
import pytest

import shardwise as sw

SAMPLE = Path(__file__).resolve().parents[2] / "sample"
DOCS = 516  # records in sample/corpus.jsonl


def build_args(out: Path, *extra: object) -> list[object]:
    return ["build", SAMPLE / "corpus.jsonl", "--out", out, "--tokenizer",
            SAMPLE / "tokenizer.json", "--workers", 2, "--no-progress", *extra]


def test_build_prints_a_json_summary_and_makes_the_cache(cli, tmp_path: Path) -> None:
    out = tmp_path / "cache"
    code, stdout, stderr = cli(*build_args(out, "--chunk-docs", 100, "--append-eod", "--json"))
    assert code == 0, stderr
    summary = orjson.loads(stdout)
    assert set(summary) == {"root", "sources", "chunks", "documents", "tokens", "bytes_read",
                            "seconds", "errors", "resumed_chunks", "new_chunks",
                            "checked_chunks", "check_depth", "check_seconds", "rebuilt_chunks",
                            "empty_documents", "notes", "ledger_seconds", "ledger_records",
                            "ledger_snapshots"}
    assert summary["empty_documents"] == 0 and summary["notes"] == []
    assert summary["ledger_snapshots"] >= 1 and summary["ledger_seconds"] > 0
    assert summary["root"] == str(out)
    assert (summary["sources"], summary["chunks"], summary["documents"]) == (1, 6, DOCS)
    assert summary["errors"] == {} and summary["new_chunks"] == 6
    assert summary["resumed_chunks"] == 0
    assert summary["bytes_read"] == (SAMPLE / "corpus.jsonl").stat().st_size
    cache = sw.open_cache(out)
    assert cache.num_documents == DOCS and cache.num_tokens == summary["tokens"]
    assert [c.documents for c in cache.chunks] == [100] * 5 + [16]
    assert cache.eod_id is not None
    for i in range(len(cache.chunks)):  # --append-eod: every document ends with the EOD id
        last = np.cumsum(cache.doc_lengths(i)) - 1
        assert (cache.tokens(i)[last] == cache.eod_id).all()


def test_human_summary_and_a_rerun_resumes_with_nothing_to_do(cli, tmp_path: Path) -> None:
    out = tmp_path / "cache"
    code, stdout, _ = cli(*build_args(out, "--chunk-docs", 200))
    assert code == 0 and stdout.startswith(f"built {out}: 1 sources, 3 chunks, 516 documents")
    code, stdout, _ = cli(*build_args(out, "--chunk-docs", 200, "--json"))
    summary = orjson.loads(stdout)
    assert code == 0 and (summary["new_chunks"], summary["resumed_chunks"]) == (0, 3)
    assert summary["documents"] == DOCS


def test_help_exits_0(cli) -> None:
    code, out, _ = cli("build", "--help")
    assert code == 0
    assert "--chunk-docs" in out


def test_a_missing_tokenizer_file_exits_2_naming_it(cli, tmp_path: Path) -> None:
    missing = tmp_path / "nope.json"
    code, stdout, stderr = cli("build", SAMPLE / "corpus.jsonl", "--out", tmp_path / "c",
                               "--tokenizer", missing, "--no-progress")
    assert code == 2 and stdout == ""
    assert stderr.startswith("shardwise build: error: ")
    assert f"tokenizer file {missing} does not exist" in stderr


def test_a_rerun_with_other_chunking_exits_2_naming_the_field(cli, tmp_path: Path) -> None:
    out = tmp_path / "cache"
    assert cli(*build_args(out, "--chunk-docs", 100))[0] == 0
    code, stdout, stderr = cli(*build_args(out, "--chunk-docs", 50))
    assert code == 2 and stdout == ""
    assert "chunking.max_docs: cache has 100, this build has 50" in stderr
    assert "--overwrite" in stderr
    assert sw.open_cache(out).num_documents == DOCS  # the cache is untouched


def test_verify_advises_a_rerun_and_the_rerun_repairs(cli, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "cache"
    assert cli(*build_args(out, "--chunk-docs", 100))[0] == 0
    damaged = out / "chunks/00000/00000-00002.bin"
    data = bytearray(damaged.read_bytes())
    data[100] ^= 1
    damaged.write_bytes(bytes(data))
    code, stdout, _ = cli("verify", out)
    assert code == 1 and "rerun the same build command: it checks every chunk and rebuilds " \
        "the 1 damaged chunk, byte-identical (or restore it from a copy)" in stdout
    code, stdout, _ = cli(*build_args(out, "--chunk-docs", 100))
    assert code == 0
    assert "  rebuilt 1 damaged chunk: chunks/00000/00000-00002 (.bin: xxh3_64 " in stdout
    assert cli("verify", out)[0] == 0
    code, stdout, _ = cli(*build_args(out, "--chunk-docs", 100, "--no-verify"))
    assert code == 0 and "(sizes only)" in stdout
