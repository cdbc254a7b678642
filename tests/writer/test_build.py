"""The build: contents, determinism across worker counts, refusal of mismatched caches."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from tests.conftest import sample_texts
from tests.helpers_cache import assert_same_cache
from tokenizers import Tokenizer

import shardwise as sw
from shardwise.errors import CacheMismatchError, ConfigError
from shardwise.writer.api import build


def test_sample_tokens_match_the_tokenizer(tmp_path: Path, sample_corpus: Path,
                                           tokenizer_path: Path) -> None:
    summary = build([sample_corpus], tmp_path / "c", tokenizer=tokenizer_path, workers=1,
                    chunk_docs=100, append_eod=True, progress=False)
    tok = Tokenizer.from_file(str(tokenizer_path))
    eod = tok.token_to_id("<|endoftext|>")
    texts = sample_texts()
    cache = sw.open_cache(tmp_path / "c")
    assert cache.num_documents == len(texts) == summary.documents
    assert cache.dtype == np.uint16 and cache.eod_id == eod
    got = [cache.tokens(i) for i in range(len(cache.chunks))]
    lengths = np.concatenate([cache.doc_lengths(i) for i in range(len(cache.chunks))])
    stream = np.concatenate(got)
    expected = [tok.encode(t, add_special_tokens=False).ids + [eod] for t in texts]
    assert lengths.tolist() == [len(e) for e in expected]
    assert stream.tolist() == [i for e in expected for i in e]
    assert [c.documents for c in cache.chunks] == [100] * 5 + [16]


def test_one_and_two_workers_give_identical_bytes(tmp_path: Path, big_corpus: Path,
                                                  tokenizer_path: Path) -> None:
    args = dict(tokenizer=tokenizer_path, chunk_docs=64, segment_bytes=300_000, progress=False)
    build([big_corpus], tmp_path / "w1", workers=1, **args)
    build([big_corpus], tmp_path / "w2", workers=2, **args)
    assert_same_cache(tmp_path / "w1", tmp_path / "w2")
    ledger = json.loads((tmp_path / "w2" / "ledger.json").read_bytes())
    assert len(ledger["sources"][0]["segments"]) > 5  # the file really was split


def test_segments_cover_every_line_once(tmp_path: Path, big_corpus: Path,
                                        tokenizer_path: Path) -> None:
    build([big_corpus], tmp_path / "c", tokenizer=tokenizer_path, workers=2, chunk_docs=1000,
          segment_bytes=123_457, progress=False)
    cache = sw.open_cache(tmp_path / "c")
    n_lines = big_corpus.read_bytes().count(b"\n")
    assert cache.num_documents == n_lines


def test_global_chunk_order_is_round_robin_over_sources(tmp_path: Path,
                                                        tokenizer_path: Path) -> None:
    texts = sample_texts()
    from tests.conftest import write_jsonl

    a = write_jsonl(tmp_path / "a.jsonl", texts[:50])
    b = write_jsonl(tmp_path / "b.jsonl", texts[50:70])
    c = write_jsonl(tmp_path / "c.jsonl", texts[70:100])
    build([a, b, c], tmp_path / "cache", tokenizer=tokenizer_path, chunk_docs=10,
          workers=2, progress=False)
    cache = sw.open_cache(tmp_path / "cache")
    got = [(ch.source, ch.stem.rsplit("-", 1)[1]) for ch in cache.chunks]
    # A has 5 chunks, B 2, C 3: A0 B0 C0 A1 B1 C1 A2 C2 A3 A4
    assert [s for s, _ in got] == [0, 1, 2, 0, 1, 2, 0, 2, 0, 0]


def test_mixed_formats(tmp_path: Path, tokenizer_path: Path) -> None:
    import gzip

    import pyarrow as pa
    import pyarrow.parquet as pq
    import zstandard

    texts = sample_texts()[:90]
    lines = "".join(json.dumps({"text": t}) + "\n" for t in texts[:30]).encode()
    (tmp_path / "a.jsonl.gz").write_bytes(gzip.compress(lines))
    lines = "".join(json.dumps({"text": t}) + "\n" for t in texts[30:60]).encode()
    (tmp_path / "b.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(lines))
    pq.write_table(pa.table({"text": texts[60:]}), tmp_path / "c.parquet", row_group_size=7)
    build([str(tmp_path / "*")], tmp_path / "cache", tokenizer=tokenizer_path, chunk_docs=8,
          workers=2, progress=False)
    cache = sw.open_cache(tmp_path / "cache")
    tok = Tokenizer.from_file(str(tokenizer_path))
    by_source: dict[int, list[int]] = {}
    for i, ch in enumerate(cache.chunks):
        by_source.setdefault(ch.source, []).extend(cache.doc_lengths(i).tolist())
    assert by_source[0] == [len(tok.encode(t).ids) for t in texts[:30]]
    assert by_source[1] == [len(tok.encode(t).ids) for t in texts[30:60]]
    assert by_source[2] == [len(tok.encode(t).ids) for t in texts[60:]]


def test_function_processor_and_int32_dtype(tmp_path: Path, sample_corpus: Path) -> None:
    build([sample_corpus], tmp_path / "c", processor=_char_ids, vocab_size=100_000,
          chunk_docs=200, workers=2, progress=False)
    cache = sw.open_cache(tmp_path / "c")
    assert cache.dtype == np.int32
    first = sample_texts()[0]
    assert cache.tokens(0)[: len(first)].tolist() == [ord(ch) + 70_000 for ch in first]


def _char_ids(record: dict) -> list[int]:
    return [ord(ch) + 70_000 for ch in record["text"]]


def test_rebuild_with_other_arguments_is_refused(tmp_path: Path, sample_corpus: Path,
                                                 tokenizer_path: Path) -> None:
    out = tmp_path / "c"
    build([sample_corpus], out, tokenizer=tokenizer_path, chunk_docs=100, progress=False)
    with pytest.raises(CacheMismatchError, match=r"chunking\.max_docs: cache has 100, this "
                                                  r"build has 50"):
        build([sample_corpus], out, tokenizer=tokenizer_path, chunk_docs=50, progress=False)
    other_tok = tmp_path / "other.json"
    _train_tokenizer(other_tok)
    with pytest.raises(CacheMismatchError, match=r"tokenizer\.fingerprint"):
        build([sample_corpus], out, tokenizer=other_tok, chunk_docs=100, progress=False)
    # the same arguments again: nothing to do, same bytes
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    summary = build([sample_corpus], out, tokenizer=tokenizer_path, chunk_docs=100,
                    progress=False)
    assert summary.new_chunks == 0 and summary.resumed_chunks == 6
    assert before == {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    build([sample_corpus], out, tokenizer=tokenizer_path, chunk_docs=50, overwrite=True,
          progress=False)
    assert len(sw.open_cache(out).chunks) == 11


def _train_tokenizer(path: Path) -> None:
    from tokenizers import models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(sample_texts()[:100],
                            trainers.BpeTrainer(vocab_size=500, show_progress=False))
    tok.save(str(path))


def test_refuses_non_cache_directory_and_bad_options(tmp_path: Path, sample_corpus: Path,
                                                     tokenizer_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(ConfigError, match="is not a shardwise cache"):
        build([sample_corpus], tmp_path, tokenizer=tokenizer_path, progress=False)
    with pytest.raises(ConfigError, match="no such file"):
        build([tmp_path / "missing.jsonl"], tmp_path / "c", tokenizer=tokenizer_path)
    with pytest.raises(ConfigError, match="not both"):
        build([sample_corpus], tmp_path / "c", tokenizer=tokenizer_path, chunk_docs=3,
              chunk_mb=1)
    with pytest.raises(ConfigError, match="on_error must be one of"):
        build([sample_corpus], tmp_path / "c", tokenizer=tokenizer_path, on_error="ignore")


def _with_mask(record: dict) -> dict:
    ids = [ord(ch) % 250 for ch in record["text"][:64]]
    return {"input_ids": ids, "loss_mask": [i % 2 for i in range(len(ids))],
            "source_id": record["id"]}


def test_record_chunks_are_parquet_with_every_field(tmp_path: Path, sample_corpus: Path
                                                    ) -> None:
    import pyarrow.parquet as pq

    from shardwise.storage.verify import verify_cache

    summary = build([sample_corpus], tmp_path / "c", processor=_with_mask, vocab_size=256,
                    records=True, chunk_docs=200, workers=2, progress=False)
    cache = sw.open_cache(tmp_path / "c")
    assert summary.documents == 516 and cache.chunks[0].kind.value == "records"
    table = pq.read_table(cache.chunks[0].base.with_suffix(".parquet"))
    assert table.column_names == ["input_ids", "loss_mask", "source_id"]
    row = table.slice(0, 1).to_pylist()[0]
    assert row == _with_mask({"text": sample_texts()[0], "id": 0})
    assert verify_cache(tmp_path / "c").ok


def test_progress_bar_on_a_terminal_and_lines_otherwise() -> None:
    import io

    from shardwise.writer.progress import ProgressReporter

    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    tty = Tty()
    bar = ProgressReporter(4, stream=tty, enabled=True)
    bar.advance(1.0, documents=10, tokens=1000, nbytes=5000)
    bar.close()
    assert "1.0/4" in tty.getvalue()
    plain = io.StringIO()
    log = ProgressReporter(4, stream=plain, enabled=True, interval=0.0)
    log.advance(2.0, documents=10, tokens=1000, nbytes=5000)
    line = plain.getvalue()
    assert line.startswith("shardwise build:  50.0%") and "tok/s" in line and "eta" in line
    quiet = io.StringIO()
    ProgressReporter(4, stream=quiet, enabled=False).advance(1.0)
    assert quiet.getvalue() == ""


def _too_big(record: dict) -> list[int]:
    return [5, 300] if "CSV" in record["text"] else [5, 6]


def test_token_ids_outside_the_vocabulary_are_refused_naming_the_line(
        tmp_path: Path, sample_corpus: Path) -> None:
    first = next(i for i, t in enumerate(sample_texts()) if "CSV" in t)
    with pytest.raises(ConfigError, match=rf"\[5, 300\] at line {first + 1} .* vocabulary of "
                                          r"256"):
        build([sample_corpus], tmp_path / "c", processor=_too_big, vocab_size=256,
              chunk_docs=1000, workers=1, progress=False)
