"""The manifest is covered by a checksum (in the ledger), chunk files never resolve
outside the cache, and open_cache / verify say so by path."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest
from tests.cachefactory import make_cache, sample_docs

import shardwise as sw
from shardwise.errors import ManifestError
from shardwise.format.ledger import LEDGER_NAME
from shardwise.format.ledger_index import INDEX_NAME
from shardwise.format.manifest import MANIFEST_NAME
from shardwise.storage.verify import verify_cache

STEM = "chunks/00000/00000-00001"


@pytest.fixture
def cache_dir(tmp_path: Path) -> Path:
    return make_cache(tmp_path / "cache", [sample_docs(20, seed=3)], chunk_docs=5,
                      vocab_size=1000, eod_id=0)


def edit_json(path: Path, edit) -> None:  # type: ignore[no-untyped-def]
    d = orjson.loads(path.read_bytes())
    edit(d)
    path.write_bytes(orjson.dumps(d, option=orjson.OPT_SORT_KEYS | orjson.OPT_INDENT_2))


@pytest.mark.parametrize("field", ["eod_id", "vocab_size"])
def test_an_edited_manifest_is_caught_by_verify_and_open_cache(cache_dir: Path,
                                                               field: str) -> None:
    edit_json(cache_dir / MANIFEST_NAME, lambda d: d["tokenizer"].update({field: 7}))
    report = verify_cache(cache_dir)
    assert [p.path for p in report.problems] == [str(cache_dir / MANIFEST_NAME)]
    assert "xxh3_64" in report.problems[0].what
    with pytest.raises(ManifestError, match=rf"{MANIFEST_NAME}: xxh3_64 .*the ledger says"):
        sw.open_cache(cache_dir)


def test_a_clean_cache_has_its_manifest_checksum(cache_dir: Path) -> None:
    ledger = orjson.loads((cache_dir / LEDGER_NAME).read_bytes())
    assert ledger["version"] == 3 and len(ledger["manifest_xxh3"]) == 16
    report = verify_cache(cache_dir)
    assert report.ok and report.notes == []


def test_a_version_1_ledger_without_the_checksum_still_opens(cache_dir: Path) -> None:
    def downgrade(d: dict) -> None:  # type: ignore[type-arg]
        d["version"] = 1
        del d["manifest_xxh3"]

    edit_json(cache_dir / LEDGER_NAME, downgrade)
    (cache_dir / INDEX_NAME).unlink()  # a cache of that time had no ledger index either
    cache = sw.open_cache(cache_dir)
    assert len(cache.chunks) == 4
    report = verify_cache(cache_dir)
    assert report.ok
    assert [n.path for n in report.notes] == [str(cache_dir / LEDGER_NAME),
                                              str(cache_dir / INDEX_NAME)]
    assert "no manifest checksum" in report.notes[0].what
    assert "missing" in report.notes[1].what


@pytest.mark.parametrize("suffix", [".bin", ".idx", ".json"])
def test_verify_refuses_a_chunk_file_symlinked_outside_the_cache(cache_dir: Path,
                                                                 tmp_path: Path,
                                                                 suffix: str) -> None:
    path = cache_dir / f"{STEM}{suffix}"
    target = tmp_path / f"outside{suffix}"
    target.write_bytes(path.read_bytes())
    path.unlink()
    path.symlink_to(target)
    report = verify_cache(cache_dir)
    assert [p.path for p in report.problems] == [str(path)]
    assert "outside the cache" in report.problems[0].what


def test_a_symlink_inside_the_cache_is_fine(cache_dir: Path) -> None:
    path = cache_dir / f"{STEM}.bin"
    inside = cache_dir / "moved.bin"
    path.rename(inside)
    path.symlink_to(inside)
    assert verify_cache(cache_dir).ok
    ds = sw.TokenDataset(cache_dir, seq_len=8, shuffle="none")
    ds.__getitems__(list(range(len(ds))))


def test_verify_names_intact_chunks_whose_ids_exceed_the_vocabulary(tmp_path: Path) -> None:
    """Checksums match, but the manifest's vocabulary is smaller than the ids (a cache made
    by another tool): every such .bin is named, with the id."""
    root = make_cache(tmp_path / "c", [sample_docs(20, seed=3, vocab_size=1000)],
                      chunk_docs=5, vocab_size=100)
    report = verify_cache(root)
    assert {p.path for p in report.problems} == {
        str(p) for p in (root / "chunks/00000").glob("*.bin")}
    assert all("outside the vocabulary of 100 ids" in p.what for p in report.problems)
