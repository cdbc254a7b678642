"""Bad input is named (raise) or counted (skip), never swallowed."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import orjson
import pytest
import zstandard
from tests.conftest import sample_texts

import shardwise as sw
from shardwise.errors import InputError
from shardwise.writer.api import build

GOOD = [json.dumps({"text": t}).encode() for t in sample_texts()[:40]]

# (reason, bad line, 1-based line number it is placed at)
CASES = [
    ("invalid_json", b'{"text": "unterminated', 25),
    ("missing_field", b'{"body": "no text here"}', 25),
    ("not_string", b'{"text": 42}', 25),
    ("undecodable", b'{"text": "caf\xe9 latin-1"}', 25),
    ("empty_line", b"", 25),
    ("not_object", b'["a", "list"]', 25),
]  # an empty text is not bad input: see test_empty_documents.py


def _corpus(path: Path, bad: bytes, at: int) -> Path:
    lines = GOOD[: at - 1] + [bad] + GOOD[at - 1:]
    path.write_bytes(b"\n".join(lines) + b"\n")
    return path


@pytest.mark.parametrize(("reason", "bad", "at"), CASES)
def test_raise_names_file_line_and_reason(tmp_path: Path, tokenizer_path: Path, reason: str,
                                          bad: bytes, at: int) -> None:
    src = _corpus(tmp_path / "bad.jsonl", bad, at)
    out = tmp_path / "cache"
    with pytest.raises(InputError) as info:
        build([src], out, tokenizer=tokenizer_path, chunk_docs=10, workers=1, progress=False)
    err = info.value
    assert (err.reason, err.line, err.path) == (reason, at, str(src.resolve()))
    assert f"{src.resolve()}:{at}" in str(err)
    # chunks before the bad line are published; nothing of the failing chunk is
    ledger = orjson.loads((out / "ledger.json").read_bytes())
    seg = ledger["sources"][0]["segments"][0]
    assert [c["documents"] for c in seg["chunks"]] == [10, 10]
    assert not seg["finished"]


@pytest.mark.parametrize(("reason", "bad", "at"), CASES)
def test_skip_counts_and_keeps_the_rest(tmp_path: Path, tokenizer_path: Path, reason: str,
                                        bad: bytes, at: int) -> None:
    src = _corpus(tmp_path / "bad.jsonl", bad, at)
    summary = build([src], tmp_path / "cache", tokenizer=tokenizer_path, chunk_docs=10,
                    on_error="skip", workers=1, progress=False)
    assert summary.errors == {reason: 1}
    assert summary.documents == len(GOOD)
    cache = sw.open_cache(tmp_path / "cache")
    assert cache.errors == {reason: 1} and cache.num_documents == len(GOOD)


def test_error_line_is_absolute_in_a_split_file(tmp_path: Path, tokenizer_path: Path) -> None:
    lines = [json.dumps({"text": t}).encode() for t in sample_texts()] * 2
    lines[700] = b"{broken"
    src = tmp_path / "big.jsonl"
    src.write_bytes(b"\n".join(lines) + b"\n")
    with pytest.raises(InputError, match=r"big.jsonl:701: invalid JSON") as info:
        build([src], tmp_path / "c", tokenizer=tokenizer_path, chunk_docs=50, workers=2,
              segment_bytes=100_000, progress=False)
    assert info.value.line == 701


@pytest.mark.parametrize("suffix", [".jsonl.gz", ".jsonl.zst"])
def test_truncated_compressed_file(tmp_path: Path, tokenizer_path: Path, suffix: str) -> None:
    # several distinct zstd blocks: a cut keeps the blocks before it
    lines = [json.dumps({"text": t}).encode() for t in sample_texts()]
    payload = b"\n".join(lines) + b"\n"
    blob = gzip.compress(payload) if suffix.endswith("gz") else (
        zstandard.ZstdCompressor().compress(payload))
    src = tmp_path / f"cut{suffix}"
    src.write_bytes(blob[: len(blob) // 2])
    with pytest.raises(InputError, match="truncated") as info:
        build([src], tmp_path / "a", tokenizer=tokenizer_path, chunk_docs=10, progress=False)
    assert info.value.reason == "truncated_file" and info.value.path == str(src.resolve())
    summary = build([src], tmp_path / "b", tokenizer=tokenizer_path, chunk_docs=10,
                    on_error="skip", progress=False)
    assert summary.errors == {"truncated_file": 1}
    assert 0 < summary.documents < len(lines)


def test_huge_record(tmp_path: Path, tokenizer_path: Path) -> None:
    limit = max(len(g) for g in GOOD) + 1
    src = _corpus(tmp_path / "huge.jsonl", json.dumps({"text": "x" * limit}).encode(), 3)
    with pytest.raises(InputError, match=f"exceeds max_record_bytes={limit}"):
        build([src], tmp_path / "a", tokenizer=tokenizer_path, max_record_bytes=limit,
              progress=False)
    summary = build([src], tmp_path / "b", tokenizer=tokenizer_path, max_record_bytes=limit,
                    on_error="skip", progress=False)
    assert summary.errors == {"too_large": 1}


def test_rerun_with_skip_continues_a_failed_build(tmp_path: Path, tokenizer_path: Path
                                                  ) -> None:
    """One bad line must not cost a day-long build: rerun with skip continues from the ledger."""
    src = _corpus(tmp_path / "bad.jsonl", b"{oops", 25)
    out = tmp_path / "cache"
    with pytest.raises(InputError):
        build([src], out, tokenizer=tokenizer_path, chunk_docs=10, progress=False)
    summary = build([src], out, tokenizer=tokenizer_path, chunk_docs=10, on_error="skip",
                    progress=False)
    assert summary.resumed_chunks == 2 and summary.errors == {"invalid_json": 1}
    fresh = build([src], tmp_path / "fresh", tokenizer=tokenizer_path, chunk_docs=10,
                  on_error="skip", progress=False)
    assert (out / "ledger.json").read_bytes() == (tmp_path / "fresh" / "ledger.json").read_bytes()
    assert fresh.documents == summary.documents


def test_processor_errors_name_the_record(tmp_path: Path) -> None:
    src = _corpus(tmp_path / "f.jsonl", json.dumps({"text": "boom"}).encode(), 5)
    with pytest.raises(InputError, match=r"f.jsonl:5: processor raised ValueError: boom"):
        build([src], tmp_path / "a", processor=_explode, vocab_size=300, progress=False)
    summary = build([src], tmp_path / "b", processor=_explode, vocab_size=300,
                    on_error="skip", progress=False)
    assert summary.errors == {"processor_error": 1}


def _explode(record: dict) -> list[int]:
    if record["text"] == "boom":
        raise ValueError("boom")
    return list(record["text"].encode()[:50])
