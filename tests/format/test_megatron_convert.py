"""cache → Megatron → cache → Megatron is lossless, byte for byte, in constant memory."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from tests.helpers_cache import cache_documents

import shardwise
from shardwise.errors import CacheError, ConfigError, CorruptChunkError
from shardwise.format.megatron import read_idx
from shardwise.storage.verify import verify_cache
from shardwise.writer.convert import to_megatron
from shardwise.writer.megatron_import import from_megatron

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from cachefactory import make_cache, sample_docs  # noqa: E402


def files_equal(a: Path, b: Path) -> bool:
    return all(Path(f"{a}{s}").read_bytes() == Path(f"{b}{s}").read_bytes()
               for s in (".bin", ".idx"))


@pytest.mark.parametrize(("chunk_docs", "chunk_mb"), [(5, None), (1, None), (None, 0.001),
                                                      (None, 64)])
def test_round_trip_is_byte_identical(tmp_path: Path, chunk_docs: int | None,
                                      chunk_mb: float | None) -> None:
    docs = sample_docs(60, seed=1)
    root = make_cache(tmp_path / "c", [docs[:20], docs[20:45], docs[45:]], chunk_docs=4,
                      segment_docs=9)
    first = to_megatron(root, tmp_path / "m1" / "corpus")
    assert (first.documents, first.tokens) == (60, sum(map(len, docs)))
    imported = from_megatron(tmp_path / "m1" / "corpus", tmp_path / "c2",
                             chunk_docs=chunk_docs, chunk_mb=chunk_mb or 64)
    to_megatron(tmp_path / "c2", tmp_path / "m2" / "corpus")
    assert files_equal(tmp_path / "m1" / "corpus", tmp_path / "m2" / "corpus")
    assert verify_cache(tmp_path / "c2").ok
    if chunk_docs == 1:
        assert imported.chunks == 60


def test_to_megatron_follows_the_global_chunk_order(tmp_path: Path) -> None:
    docs = sample_docs(30, seed=2)
    root = make_cache(tmp_path / "c", [docs[:8], docs[8:]], chunk_docs=3)
    to_megatron(root, tmp_path / "corpus")
    assert cache_documents(shardwise.open_cache(tmp_path / "corpus")) == cache_documents(
        shardwise.open_cache(root))


def test_from_megatron_then_open_cache_gives_the_same_documents(tmp_path: Path) -> None:
    docs = sample_docs(25, seed=5, vocab_size=700)
    root = make_cache(tmp_path / "c", [docs], chunk_docs=25)
    to_megatron(root, tmp_path / "corpus")
    from_megatron(tmp_path / "corpus", tmp_path / "c2", chunk_docs=4)
    cache = shardwise.open_cache(tmp_path / "c2")
    assert cache.finished and len(cache.chunks) == 7
    assert cache_documents(cache) == docs
    assert np.concatenate([cache.doc_lengths(i) for i in range(7)]).tolist() == [
        len(d) for d in docs]
    m = cache.manifest
    assert m is not None
    assert m.tokenizer.vocab_size == max(max(d) for d in docs if d) + 1
    assert (m.tokenizer.fingerprint, m.tokenizer.eod_id) == ("unknown", None)
    assert m.processor == {"kind": "megatron-import"} and m.sources[0].format == "megatron"


def test_chunk_mb_closes_chunks_once_they_reach_the_size(tmp_path: Path) -> None:
    docs = [[1] * 100] * 10  # 200 bytes each in uint16
    root = make_cache(tmp_path / "c", [docs], chunk_docs=10)
    to_megatron(root, tmp_path / "corpus")
    from_megatron(tmp_path / "corpus", tmp_path / "c2", chunk_mb=450 / (1 << 20))
    cache = shardwise.open_cache(tmp_path / "c2")
    assert [c.documents for c in cache.chunks] == [3, 3, 3, 1]


def test_an_unfinished_cache_is_refused_unless_partial_is_allowed(tmp_path: Path) -> None:
    docs = sample_docs(20, seed=6)
    root = make_cache(tmp_path / "c", [docs[:10], docs[10:]], chunk_docs=3,
                      unfinished_last=True)
    with pytest.raises(CacheError, match="still being built"):
        to_megatron(root, tmp_path / "corpus")
    assert not list(tmp_path.glob("corpus*"))
    summary = to_megatron(root, tmp_path / "corpus", allow_partial=True)
    assert summary.notes and summary.documents == shardwise.open_cache(root).num_documents


def test_record_caches_and_non_empty_outputs_are_refused(tmp_path: Path) -> None:
    root = make_cache(tmp_path / "r", [sample_docs(4)], kind="records")
    with pytest.raises(ConfigError, match="records"):
        to_megatron(root, tmp_path / "corpus")
    tokens = make_cache(tmp_path / "t", [sample_docs(4)])
    to_megatron(tokens, tmp_path / "corpus")
    with pytest.raises(ConfigError, match="not an empty directory"):
        from_megatron(tmp_path / "corpus", tokens)


def test_an_empty_cache_converts_both_ways(tmp_path: Path) -> None:
    root = make_cache(tmp_path / "c", [[]])
    to_megatron(root, tmp_path / "corpus")
    assert shardwise.open_cache(tmp_path / "corpus").num_documents == 0
    from_megatron(tmp_path / "corpus", tmp_path / "c2")
    cache = shardwise.open_cache(tmp_path / "c2")
    assert cache.num_documents == 0 and cache.manifest is not None
    assert cache.manifest.tokenizer.vocab_size == 65536  # the uint16 range


def _flip_byte(path: Path, at: int) -> None:
    """Damage ``path`` in place, keeping its size (bit rot, not truncation)."""
    data = bytearray(path.read_bytes())
    data[at] ^= 0x01
    path.write_bytes(bytes(data))


def _merge_two_documents(idx: Path) -> None:
    """Set the ``.idx``'s second document index to 0: still a valid, non-decreasing
    index that only checksums can tell from the published one."""
    sequences = read_idx(idx).num_sequences
    data = bytearray(idx.read_bytes())
    at = len(data) - 8 * (sequences + 1) + 8
    data[at: at + 8] = (0).to_bytes(8, "little")
    idx.write_bytes(bytes(data))


@pytest.mark.parametrize("damage", ["bin", "idx", "json"])
def test_a_damaged_chunk_is_refused_naming_it_and_nothing_is_written(
        tmp_path: Path, damage: str) -> None:
    docs = sample_docs(30, seed=4)
    root = make_cache(tmp_path / "c", [docs[:12], docs[12:]], chunk_docs=4)
    chunk = shardwise.open_cache(root).chunks[2].base
    victim = Path(f"{chunk}.{damage}")
    if damage == "idx":
        _merge_two_documents(victim)
    else:
        _flip_byte(victim, victim.stat().st_size // 2)
    out = tmp_path / "out"
    with pytest.raises(CorruptChunkError) as e:
        to_megatron(root, out / "corpus")
    message = str(e.value)
    assert str(victim) in message and "xxh3_64" in message
    assert f"shardwise verify {root}" in message and "rerun the same build" in message
    assert list(out.iterdir()) == []  # no partial .bin, no temporary file
    assert verify_cache(root).problems[0].path == str(victim)


def test_no_verify_trusts_the_chunks(tmp_path: Path) -> None:
    """``verify=False`` copies what is on disk, damaged or not, as before checksums."""
    docs = sample_docs(12, seed=9)
    root = make_cache(tmp_path / "c", [docs], chunk_docs=4)
    to_megatron(root, tmp_path / "good")
    victim = Path(f"{shardwise.open_cache(root).chunks[1].base}.bin")
    _flip_byte(victim, 0)
    to_megatron(root, tmp_path / "bad", verify=False)
    good, bad = (Path(f"{tmp_path / n}.bin").read_bytes() for n in ("good", "bad"))
    assert sum(a != b for a, b in zip(good, bad, strict=True)) == 1
