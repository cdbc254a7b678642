"""``verify --quick``: every visible chunk's files present, of the right size, with a sound
``.idx`` header — without hashing. Each kind of damage it is meant to find is named by
path; what it is not meant to find (a flipped token bit) passes."""

from __future__ import annotations

import os
import shutil
import struct
import sys
from pathlib import Path

import pytest

from shardwise.bench.synth import SynthSpec, synth_cache
from shardwise.format.ledger_index import INDEX_NAME
from shardwise.storage.verify import verify_cache
from shardwise.storage.verify_quick import verify_quick

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from cachefactory import make_cache, sample_docs  # noqa: E402

SPEC = SynthSpec(240, sources=2, segment_chunks=50, docs_per_chunk=2, doc_tokens=3)
STEM = "chunks/00001/00001-00007"


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return synth_cache(tmp_path_factory.mktemp("synth") / "cache", SPEC)


@pytest.fixture
def cache_dir(made: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(made, tmp_path / "cache"))


def bad_paths(root: Path) -> list[str]:
    report = verify_quick(root)
    assert report.chunks_checked == SPEC.chunks and report.quick
    return [p.path for p in report.problems]


def test_an_intact_cache_passes(made: Path) -> None:
    report = verify_quick(made)
    assert report.ok and report.notes == [] and report.chunks_checked == SPEC.chunks
    assert report.to_dict()["quick"] is True


@pytest.mark.parametrize("suffix", [".bin", ".idx"])
def test_a_truncated_file_is_named(cache_dir: Path, suffix: str) -> None:
    path = cache_dir / f"{STEM}{suffix}"
    path.write_bytes(path.read_bytes()[:-2])
    assert bad_paths(cache_dir) == [str(path)]


def test_a_missing_file_is_named(cache_dir: Path) -> None:
    (cache_dir / f"{STEM}.json").unlink()
    (cache_dir / "chunks/00000/00001-00011.bin").unlink()
    assert bad_paths(cache_dir) == [str(cache_dir / "chunks/00000/00001-00011.bin"),
                                    str(cache_dir / f"{STEM}.json")]


@pytest.mark.parametrize(("offset", "value", "what"), [
    (0, b"X", "bad magic"),
    (9, struct.pack("<Q", 2), "version 2"),
    (17, struct.pack("<B", 4), "dtype int32, the manifest says uint16"),
    (18, struct.pack("<Q", 1), "size"),  # a sequence count the file's size denies
])
def test_a_bad_idx_header_is_named(cache_dir: Path, offset: int, value: bytes,
                                   what: str) -> None:
    path = cache_dir / f"{STEM}.idx"
    data = bytearray(path.read_bytes())
    data[offset:offset + len(value)] = value
    path.write_bytes(bytes(data))
    report = verify_quick(cache_dir)
    assert [p.path for p in report.problems] == [str(path)]
    assert what in report.problems[0].what


def test_a_symlink_out_of_the_cache_is_named(cache_dir: Path, tmp_path: Path) -> None:
    path = cache_dir / f"{STEM}.bin"
    outside = tmp_path / "outside.bin"
    shutil.copy(path, outside)
    path.unlink()
    os.symlink(outside, path)
    assert bad_paths(cache_dir) == [str(path)]


def test_flipped_bits_are_for_the_full_verify(cache_dir: Path) -> None:
    path = cache_dir / f"{STEM}.bin"
    data = bytearray(path.read_bytes())
    data[1] ^= 0x10
    path.write_bytes(bytes(data))
    assert verify_quick(cache_dir).ok
    assert [p.path for p in verify_cache(cache_dir).problems] == [str(path)]


def test_without_the_index_it_reads_the_ledger(cache_dir: Path) -> None:
    (cache_dir / INDEX_NAME).unlink()
    path = cache_dir / f"{STEM}.idx"
    path.write_bytes(path.read_bytes()[:-8])
    report = verify_quick(cache_dir)
    assert [p.path for p in report.problems] == [str(path)]
    assert [n.path for n in report.notes] == [str(cache_dir / INDEX_NAME)]


def test_record_chunks(tmp_path: Path) -> None:
    root = make_cache(tmp_path / "rec", [sample_docs(9, seed=4)], chunk_docs=4,
                      kind="records")
    assert verify_quick(root).ok
    path = root / "chunks/00000/00000-00001.parquet"
    path.write_bytes(path.read_bytes()[:-1])
    assert [p.path for p in verify_quick(root).problems] == [str(path)]
