"""A rerun of the same build repairs a damaged cache: exactly the damaged chunks are
rebuilt, and the cache ends byte-identical to a clean build."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import orjson
import pytest
from tests.helpers_cache import assert_same_cache, cache_files

from shardwise.errors import CacheError, ManifestError
from shardwise.format.files import LocalFiles
from shardwise.format.ledger import Ledger
from shardwise.storage.verify import verify_cache
from shardwise.writer.api import build

ARGS: dict[str, Any] = dict(chunk_docs=16, segment_bytes=100_000, workers=2, progress=False)
STEM = "chunks/00000/{}"


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory, sample_corpus: Path,
              tokenizer_path: Path) -> Path:
    """A clean build of the sample: 4 segments of 10, 8, 9 and 7 chunks."""
    out = tmp_path_factory.mktemp("repair-ref") / "cache"
    build([sample_corpus], out, tokenizer=tokenizer_path, **ARGS)
    return out


def _copy(reference: Path, tmp_path: Path) -> Path:
    out = tmp_path / "cache"
    shutil.copytree(reference, out)
    return out


def _flip(path: Path, at: int) -> None:
    data = bytearray(path.read_bytes())
    data[at] ^= 0x40
    path.write_bytes(bytes(data))


def _inodes(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)): p.stat().st_ino for p in root.rglob("chunks/*/*")}


def test_a_rerun_rebuilds_exactly_the_damaged_chunks(tmp_path: Path, sample_corpus: Path,
                                                    tokenizer_path: Path, reference: Path
                                                    ) -> None:
    out = _copy(reference, tmp_path)
    c = out / "chunks/00000"
    _flip(c / "00000-00000.bin", 3)            # the first chunk of the first segment
    _flip(c / "00000-00004.idx", 40)           # a sequence length
    _flip(c / "00001-00003.json", 30)          # two metadata files in a row: the start
    _flip(c / "00001-00004.json", 30)          # of the second comes from neither
    (c / "00002-00008.bin").write_bytes((c / "00002-00008.bin").read_bytes()[:-1])
    for suffix in (".bin", ".idx", ".json"):   # the last chunk of the last segment, gone
        (c / f"00003-00006{suffix}").unlink()
    damaged = {STEM.format(s) for s in ("00000-00000", "00000-00004", "00001-00003",
                                        "00001-00004", "00002-00008", "00003-00006")}
    report = verify_cache(out)
    assert {p.path.rsplit(".", 1)[0] for p in report.problems} == {str(out / d)
                                                                  for d in damaged}
    before = _inodes(out)

    summary = build([sample_corpus], out, tokenizer=tokenizer_path, **ARGS)

    assert set(summary.rebuilt_chunks) == damaged
    assert summary.rebuilt_chunks[STEM.format("00000-00000")].startswith(".bin: xxh3_64 ")
    assert summary.rebuilt_chunks[STEM.format("00003-00006")] == ".json: missing (named by " \
        "the ledger)"
    assert (summary.checked_chunks, summary.check_depth) == (34, "checksums")
    assert (summary.new_chunks, summary.resumed_chunks) == (0, 28)
    assert f"rebuilt 6 damaged chunks: {STEM.format('00000-00000')} (.bin: xxh3_64" in str(
        summary)
    assert_same_cache(reference, out)
    assert verify_cache(out).ok
    after = _inodes(out)  # every file of an intact chunk is the same file as before
    assert {n for n in before if before[n] != after[n]} == {
        n for n in before if n.rsplit(".", 1)[0] in damaged}

    again = build([sample_corpus], out, tokenizer=tokenizer_path, **ARGS)
    assert again.rebuilt_chunks == {} and "34 chunks of an earlier run" in str(again)
    assert _inodes(out) == after


def test_a_damaged_chunk_of_an_unfinished_segment_is_rebuilt_while_the_build_resumes(
        tmp_path: Path, sample_corpus: Path, tokenizer_path: Path, reference: Path) -> None:
    """As a build killed mid-segment leaves it: segment 2 has 4 of its 9 chunks."""
    out = _copy(reference, tmp_path)
    ledger = orjson.loads((out / "ledger.json").read_bytes())
    seg = ledger["sources"][0]["segments"][2]
    for entry in seg["chunks"][4:]:
        for suffix in (".bin", ".idx", ".json"):
            (out / f"{entry['stem']}{suffix}").unlink()
    rng = orjson.loads((out / f"{seg['chunks'][3]['stem']}.json").read_bytes())["range"]
    seg.update(chunks=seg["chunks"][:4], finished=False, position=rng["stop"],
               line=rng["line_stop"], errors={})
    (out / "ledger.json").write_bytes(orjson.dumps(ledger, option=orjson.OPT_SORT_KEYS))
    _flip(out / "chunks/00000/00002-00002.bin", 7)
    _flip(out / "chunks/00000/00000-00009.bin", 7)

    summary = build([sample_corpus], out, tokenizer=tokenizer_path, **ARGS)

    assert set(summary.rebuilt_chunks) == {STEM.format("00002-00002"),
                                           STEM.format("00000-00009")}
    assert summary.new_chunks == 5
    assert_same_cache(reference, out)


def test_record_chunks_parquet_are_rebuilt(tmp_path: Path, sample_corpus: Path) -> None:
    args = dict(processor=_ids, vocab_size=256, records=True, chunk_docs=100, workers=2,
                progress=False)
    ref = tmp_path / "ref"
    build([sample_corpus], ref, **args)
    out = tmp_path / "out"
    shutil.copytree(ref, out)
    _flip(out / "chunks/00000/00000-00002.parquet", 200)
    summary = build([sample_corpus], out, **args)
    assert list(summary.rebuilt_chunks) == [STEM.format("00000-00002")]
    assert_same_cache(ref, out)


def _ids(record: dict[str, Any]) -> dict[str, Any]:
    ids = list(record["text"].encode()[:50])
    return {"input_ids": ids, "loss_mask": [1] * len(ids)}


def test_without_verify_only_sizes_are_checked(tmp_path: Path, sample_corpus: Path,
                                               tokenizer_path: Path, reference: Path) -> None:
    """``verify=False`` (``--no-verify``): a truncated file is found, a flipped bit is not."""
    out = _copy(reference, tmp_path)
    truncated, flipped = out / "chunks/00000/00001-00001.idx", out / "chunks/00000/00001-00002.bin"
    truncated.write_bytes(truncated.read_bytes()[:-8])
    _flip(flipped, 5)
    summary = build([sample_corpus], out, tokenizer=tokenizer_path, verify=False, **ARGS)
    assert list(summary.rebuilt_chunks) == [STEM.format("00001-00001")]
    assert summary.check_depth == "sizes" and "sizes only" in str(summary)
    assert [p.path for p in verify_cache(out).problems] == [str(flipped)]


def test_a_ledger_naming_other_stems_is_refused_not_repaired(
        tmp_path: Path, sample_corpus: Path, tokenizer_path: Path, reference: Path) -> None:
    out = _copy(reference, tmp_path)
    ledger = orjson.loads((out / "ledger.json").read_bytes())
    ledger["sources"][0]["segments"][1]["chunks"][0]["stem"] = "chunks/00000/00009-00000"
    # the ledger and its index, as a build saves them
    Ledger.from_dict(ledger).save(LocalFiles(out))
    files = cache_files(out)
    with pytest.raises(ManifestError, match="ledger.json: source 0 segment 1 chunk 0 .* "
                                            "a rerun cannot repair it"):
        build([sample_corpus], out, tokenizer=tokenizer_path, **ARGS)
    assert cache_files(out) == files


def test_a_source_changed_where_its_fingerprint_does_not_look_is_refused(
        tmp_path: Path, big_corpus: Path, tokenizer_path: Path) -> None:
    """The manifest fingerprints a source by three 1 MiB samples; a change between them
    is caught when the chunk made again does not hash to what the ledger recorded."""
    source = tmp_path / "corpus.jsonl"
    data = bytearray(big_corpus.read_bytes())
    source.write_bytes(data)
    out = tmp_path / "cache"
    build([source], out, tokenizer=tokenizer_path, chunk_docs=64, workers=2, progress=False)
    at = data.index(b" the ", (1 << 20) + (100 << 10)) + 1  # not in any sample
    assert len(data) // 2 - (1 << 19) > at + 10
    data[at:at + 3] = b"THE"
    source.write_bytes(data)
    chunk = next(p for p in sorted(out.glob("chunks/00000/*.json"))
                 if orjson.loads(p.read_bytes())["range"]["start"] <= at
                 < orjson.loads(p.read_bytes())["range"]["stop"])
    chunk.with_suffix(".bin").unlink()
    with pytest.raises(CacheError, match=f"{chunk.with_suffix('')}: made again with "
                                         r"different bytes \(.*meta_xxh3 .*\): the source "
                                         f"{source} changed since this cache was built"):
        build([source], out, tokenizer=tokenizer_path, chunk_docs=64, workers=2,
              progress=False)


@pytest.mark.parametrize("lacks", [("skipped_lines",), ("block sums",),
                                   ("skipped_lines", "block sums")])
def test_a_chunk_an_older_build_wrote_is_rebuilt_as_it_was(
        tmp_path: Path, tokenizer_path: Path, lacks: tuple[str, ...]) -> None:
    """Chunk metadata gained ``skipped_lines`` and then a ``.bin``'s block sums; a cache
    built before either (the field absent although records were skipped, or the ``.bin``
    without sums) must still repair to its own bytes, not stop as if the source had
    changed."""
    from dataclasses import replace

    from shardwise.format.checksum import bytes_checksum
    from shardwise.format.chunk import read_meta
    from shardwise.format.ledger import Ledger

    corpus = tmp_path / "bad.jsonl"
    lines = [orjson.dumps({"text": f"document {i} " * 5}).decode() if i % 7 else "{not json"
             for i in range(80)]
    corpus.write_text("\n".join(lines) + "\n")
    args: dict[str, Any] = dict(chunk_docs=8, workers=1, progress=False, on_error="skip")
    out = tmp_path / "cache"
    build([corpus], out, tokenizer=tokenizer_path, **args)
    ledger = Ledger.load(LocalFiles(out))
    old: dict[str, bytes] = {}  # rewrite every chunk as an earlier build wrote it
    for seg in ledger.sources[0].segments:
        for k, entry in enumerate(seg.chunks):
            path = out / (entry.stem + ".json")
            meta = read_meta(path)
            if meta.skipped_lines and "skipped_lines" in lacks:
                meta = replace(meta, skipped_lines=None)
            if "block sums" in lacks:
                assert "block_xxh3_64" in meta.files[".bin"]
                meta = replace(meta, files={s: {k: v for k, v in e.items()
                                                if not k.startswith("block_")}
                                            for s, e in meta.files.items()})
            if meta.to_json() != path.read_bytes():
                old[entry.stem] = meta.to_json()
                path.write_bytes(old[entry.stem])
                seg.chunks[k] = replace(entry, meta_xxh3=bytes_checksum(old[entry.stem]))
    ledger.save(LocalFiles(out))
    assert old and verify_cache(out).ok
    stem = sorted(old)[0]
    _flip(out / (stem + ".bin"), 2)

    summary = build([corpus], out, tokenizer=tokenizer_path, **args)

    assert set(summary.rebuilt_chunks) == {stem}
    assert (out / (stem + ".json")).read_bytes() == old[stem]
    assert verify_cache(out).ok
