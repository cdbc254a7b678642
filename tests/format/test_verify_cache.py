"""``verify_cache`` finds every damaged chunk file and names it by path."""

from __future__ import annotations

import sys
from pathlib import Path

import orjson
import pytest

from shardwise.storage.verify import verify_cache, verify_megatron
from shardwise.writer.convert import to_megatron

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from cachefactory import make_cache, sample_docs  # noqa: E402

STEM = "chunks/00000/00000-00001"


@pytest.fixture
def tokens_cache(tmp_path: Path) -> Path:
    docs = sample_docs(24, seed=11)
    return make_cache(tmp_path / "tok", [docs[:14], docs[14:]], chunk_docs=3, segment_docs=7)


@pytest.fixture
def records_cache(tmp_path: Path) -> Path:
    return make_cache(tmp_path / "rec", [sample_docs(12, seed=12)], chunk_docs=4,
                      kind="records")


def flip(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset % len(data)] ^= 0x01
    path.write_bytes(bytes(data))


def truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[:-3])


def bad_paths(root: Path) -> set[str]:
    report = verify_cache(root)
    assert not report.ok
    return {p.path for p in report.problems}


def test_a_clean_cache_passes(tokens_cache: Path, records_cache: Path) -> None:
    for root, chunks in ((tokens_cache, 10), (records_cache, 3)):
        report = verify_cache(root)
        assert report.ok, report.problems
        assert report.chunks_checked == chunks and report.bytes_checked > 0
        assert report.notes == []


@pytest.mark.parametrize("suffix", [".bin", ".idx", ".json"])
@pytest.mark.parametrize("damage", [truncate, lambda p: flip(p, 0), lambda p: flip(p, -1),
                                    lambda p: flip(p, 40)])
def test_damaged_token_chunk_files_are_named(tokens_cache: Path, suffix: str, damage) -> None:
    path = tokens_cache / f"{STEM}{suffix}"
    damage(path)
    assert bad_paths(tokens_cache) == {str(path)}


@pytest.mark.parametrize("damage", [truncate, lambda p: flip(p, 0), lambda p: flip(p, 100),
                                    lambda p: flip(p, -1)])
@pytest.mark.parametrize("suffix", [".parquet", ".json"])
def test_damaged_record_chunk_files_are_named(records_cache: Path, suffix: str,
                                              damage) -> None:
    path = records_cache / f"{STEM}{suffix}"
    damage(path)
    assert bad_paths(records_cache) == {str(path)}


@pytest.mark.parametrize("suffix", [".bin", ".idx", ".json"])
def test_a_deleted_chunk_file_is_named(tokens_cache: Path, suffix: str) -> None:
    path = tokens_cache / f"{STEM}{suffix}"
    path.unlink()
    report = verify_cache(tokens_cache)
    assert [p.path for p in report.problems] == [str(path)]
    assert "missing" in report.problems[0].what


def test_every_damaged_chunk_is_reported(tokens_cache: Path) -> None:
    damaged = [tokens_cache / "chunks/00000/00000-00000.bin",
               tokens_cache / "chunks/00000/00001-00002.idx",
               tokens_cache / "chunks/00001/00000-00002.json",
               tokens_cache / "chunks/00001/00001-00000.bin"]
    for i, path in enumerate(damaged):
        flip(path, 7 * i + 30) if i % 2 else truncate(path)
    assert bad_paths(tokens_cache) == {str(p) for p in damaged}
    assert verify_cache(tokens_cache).chunks_checked == 10


def _edit_ledger(root: Path, edit) -> None:
    ledger = orjson.loads((root / "ledger.json").read_bytes())
    edit(ledger)
    (root / "ledger.json").write_bytes(orjson.dumps(ledger))


def test_a_ledger_naming_a_path_outside_the_cache_is_rejected(tokens_cache: Path) -> None:
    def evil(ledger: dict) -> None:
        ledger["sources"][0]["segments"][0]["chunks"][1]["stem"] = "../evil"
    _edit_ledger(tokens_cache, evil)
    report = verify_cache(tokens_cache)
    assert {p.path for p in report.problems} == {str(tokens_cache / "ledger.json")}
    assert any("'../evil'" in p.what and "inside the cache" in p.what
               for p in report.problems)
    assert not (tokens_cache.parent / "evil.json").exists()


def test_ledger_inconsistencies_are_reported(tokens_cache: Path) -> None:
    def break_it(ledger: dict) -> None:
        segs = ledger["sources"][0]["segments"]
        segs[0]["position"] = segs[0]["stop"] - 1      # finished but short of its stop
        segs[1]["chunks"][0]["stem"] = segs[0]["chunks"][0]["stem"]  # duplicate stem
    _edit_ledger(tokens_cache, break_it)
    whats = [p.what for p in verify_cache(tokens_cache).problems]
    assert any("finished, but position" in w for w in whats)
    assert any("already named by" in w for w in whats)


def test_a_mistyped_or_gapped_ledger_is_reported_not_raised(tokens_cache: Path) -> None:
    def break_it(ledger: dict) -> None:
        ledger["sources"][0]["segments"][0]["chunks"][0]["documents"] = "3"
        ledger["sources"][1]["segments"][1]["start"] += 1  # a gap between segments
        ledger["sources"][1]["segments"][1]["position"] += 1
        ledger["sources"][1]["segments"][1]["chunks"][0]["stem"] = 17
    _edit_ledger(tokens_cache, break_it)
    report = verify_cache(tokens_cache)
    whats = [p.what for p in report.problems]
    assert {p.path for p in report.problems} == {str(tokens_cache / "ledger.json")}
    assert "source 0 segment 0 chunk 0: documents is '3', expected int" in whats
    assert "source 1 segment 1 chunk 0: stem is 17, expected str" in whats
    assert any("starts at 8, the previous segment stops at 7" in w for w in whats)
    assert report.chunks_checked == 8


@pytest.mark.parametrize(("manifest", "ledger"), [
    (b"{not json", b'{"version": 99, "sources": []}'),
    (b'["abc"]', b"[]"),                       # valid JSON of the wrong shape
    (b'{"format_version": 1}', b'{"version": 1, "sources": [{"segments": [7]}]}'),
])
def test_unreadable_manifest_and_ledger_are_named(tokens_cache: Path, manifest: bytes,
                                                  ledger: bytes) -> None:
    (tokens_cache / "manifest.json").write_bytes(manifest)
    (tokens_cache / "ledger.json").write_bytes(ledger)
    assert bad_paths(tokens_cache) == {str(tokens_cache / "manifest.json"),
                                       str(tokens_cache / "ledger.json")}


def test_orphans_and_temp_files_are_notes_not_failures(tmp_path: Path) -> None:
    docs = sample_docs(12, seed=3)
    root = make_cache(tmp_path / "c", [docs[:5], docs[5:]], chunk_docs=2, unfinished_last=True)
    (root / "chunks/00000/.tmp-00000-00009.bin.1.ab").write_bytes(b"partial")
    report = verify_cache(root)
    assert report.ok
    notes = {Path(n.path).name: n.what for n in report.notes}
    assert "orphan" in notes["00000-00003.bin"]  # the chunk the ledger never recorded
    assert "temporary" in notes[".tmp-00000-00009.bin.1.ab"]


def test_verify_megatron_checks_header_structure_and_size(tokens_cache: Path,
                                                          tmp_path: Path) -> None:
    prefix = tmp_path / "m" / "corpus"
    to_megatron(tokens_cache, prefix)
    assert verify_megatron(prefix).ok
    truncate(Path(f"{prefix}.bin"))
    assert [p.path for p in verify_megatron(prefix).problems] == [f"{prefix}.bin"]
    flip(Path(f"{prefix}.idx"), 0)
    assert "bad magic" in verify_megatron(prefix).problems[0].what
    Path(f"{prefix}.idx").unlink()
    assert [p.path for p in verify_megatron(prefix).problems] == [f"{prefix}.idx"]


@pytest.mark.parametrize(("kind", "suffix"), [("tokens", ".bin"), ("tokens", ".idx"),
                                              ("tokens", ".json"), ("records", ".parquet"),
                                              ("records", ".json")])
def test_a_flip_of_any_single_byte_is_found_and_blamed_on_its_file(
        tmp_path: Path, kind: str, suffix: str) -> None:
    root = make_cache(tmp_path / "c", [sample_docs(3, seed=1, max_len=20)], chunk_docs=3,
                      kind=kind)
    path = root / f"chunks/00000/00000-00000{suffix}"
    original = path.read_bytes()
    for offset in range(len(original)):
        flip(path, offset)
        assert bad_paths(root) == {str(path)}, offset
        path.write_bytes(original)
    assert verify_cache(root).ok


def test_refresh_keeps_the_kind_of_record_chunks(tmp_path: Path) -> None:
    """Regression (format/cache.py, found while writing verify): ``Cache.refresh`` labelled
    newly visible chunks of a records cache as token chunks."""
    import shutil

    import shardwise

    docs = sample_docs(12, seed=5)
    root = make_cache(tmp_path / "r", [docs[:6], docs[6:]], chunk_docs=2, kind="records",
                      unfinished_last=True)
    cache = shardwise.open_cache(root)
    shutil.rmtree(root)
    make_cache(root, [docs[:6], docs[6:]], chunk_docs=2, kind="records")
    assert cache.refresh() == 1
    assert {c.kind.value for c in cache.chunks} == {"records"}


def test_block_sums_that_are_not_the_bins_are_named(tokens_cache: Path) -> None:
    """A .json (consistent with the ledger) whose .bin block sums are not the .bin's
    blocks': every ranged read of the chunk would be refused, so verify names it."""
    import base64

    from shardwise.format.checksum import bytes_checksum

    path = tokens_cache / f"{STEM}.json"
    meta = orjson.loads(path.read_bytes())
    sums = bytearray(base64.b64decode(meta["files"][".bin"]["block_xxh3_64"]))
    sums[0] ^= 1
    meta["files"][".bin"]["block_xxh3_64"] = base64.b64encode(bytes(sums)).decode()
    data = orjson.dumps(meta, option=orjson.OPT_SORT_KEYS | orjson.OPT_INDENT_2)
    path.write_bytes(data)

    def rehash(ledger: dict) -> None:
        for seg in ledger["sources"][0]["segments"]:
            for c in seg["chunks"]:
                if c["stem"] == STEM:
                    c["meta_xxh3"] = bytes_checksum(data)
    _edit_ledger(tokens_cache, rehash)
    report = verify_cache(tokens_cache)
    assert [(p.path, "block sums" in p.what) for p in report.problems] == [
        (str(tokens_cache / f"{STEM}.bin"), True)], report.problems
