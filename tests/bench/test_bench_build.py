"""``shardwise bench build`` on a tiny corpus: the report's shape and the identity check.

Only structure is tested here; speed is what the bench itself reports."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from shardwise.bench import text_corpus

SAMPLE = Path(__file__).resolve().parents[2] / "sample"


def test_json_report_on_a_tiny_corpus(cli, tmp_path: Path) -> None:
    code, out, err = cli("bench", "build", "--mb", "0.5", "--repeat", "1", "--workers", "2",
                         "--json", "--tmp-dir", tmp_path)
    assert code == 0, err
    report = orjson.loads(out)
    assert set(report) >= {"corpus", "tokenizer", "tokenizer_path", "machine", "repeat",
                           "batch", "tokenizer_parallel", "builds", "identical",
                           "distinct_caches", "tokens_match", "targets"}
    corpus = report["corpus"]
    assert corpus["text_bytes"] >= 500_000 and corpus["copies"] == 2
    assert corpus["documents"] > 516 and corpus["file_bytes"] > corpus["text_bytes"]
    tok = report["tokenizer"]
    assert tok["vocab_size"] == 4096 and tok["tokens"] > 0 and len(tok["runs"]) == 1
    assert tok["env"] == {"TOKENIZERS_PARALLELISM": "false", "RAYON_NUM_THREADS": "1"}
    assert tok["method"] in ("encode_batch", "encode_batch_fast")
    figures = {"seconds", "cpu_seconds", "runs", "tokens", "tokens_per_s", "mb_per_s"}
    assert set(tok) >= figures
    [par] = report["tokenizer_parallel"]  # the texts split over 2 processes at once
    assert set(par) >= figures | {"processes", "vs_one_thread"} and par["processes"] == 2
    assert par["tokens"] == tok["tokens"]
    assert [b["workers"] for b in report["builds"]] == [1, 2]
    for b in report["builds"]:
        assert set(b) >= figures | {"vs_one_worker", "vs_tokenizer", "efficiency",
                                    "vs_tokenizer_same_count"}
        assert b["tokens"] == tok["tokens"] and b["seconds"] == min(b["runs"]) > 0
    assert report["builds"][0]["vs_one_worker"] == 1.0
    assert report["identical"] is True and report["distinct_caches"] == 1
    assert report["tokens_match"] is True
    assert [t["want"] for t in report["targets"]] == [0.8, 1.6]
    assert report["machine"]["usable_cores"] >= 1
    assert isinstance(report["machine"]["busy"], bool)
    assert list(tmp_path.iterdir()) == []  # the corpus and caches are removed


def test_human_report(cli, tmp_path: Path) -> None:
    code, out, err = cli("bench", "build", "--mb", "0.2", "--repeat", "2", "--workers", "1",
                         "--tmp-dir", tmp_path)
    assert code == 0
    assert "tokenizer, 1 thread" in out and "build, 1 worker" in out
    assert "identical: yes (1 distinct cache(s) from 2 builds)" in out
    assert "round 2/2: tokenizer, 1 process" in err  # progress goes to stderr


def test_a_given_corpus_is_used(cli, tmp_path: Path) -> None:
    corpus = tmp_path / "mine.jsonl"
    corpus.write_bytes(b"".join(orjson.dumps({"text": f"document number {i} " * 20}) + b"\n"
                                for i in range(50)))
    code, out, err = cli("bench", "build", "--corpus", corpus, "--mb", "0.05", "--repeat", "1",
                         "--workers", "1", "--json", "--tmp-dir", tmp_path)
    assert code == 0, err
    report = orjson.loads(out)
    assert report["corpus"]["source"] == str(corpus) and report["identical"] is True


def test_without_the_repository_sample_it_asks_for_corpus(cli, monkeypatch: pytest.MonkeyPatch
                                                          ) -> None:
    monkeypatch.setattr(text_corpus, "sample_dir", lambda: None)
    code, out, err = cli("bench", "build", "--mb", "0.1", "--json")
    assert code == 2 and out == ""
    assert "bundled sample" in err and "--corpus FILE and --tokenizer FILE" in err


@pytest.mark.parametrize("flag, value", [("--mb", "0"), ("--workers", "0"), ("--repeat", "0")])
def test_bad_numbers_exit_2(cli, flag: str, value: str) -> None:
    code, _, err = cli("bench", "build", flag, value)
    assert code == 2 and f"{flag} must be" in err
