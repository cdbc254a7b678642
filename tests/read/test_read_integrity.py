"""No damaged bytes reach a model unannounced: every reader path that returns token ids
refuses ids outside the vocabulary, a damaged ``.idx`` or short ``.bin`` is named when its
chunk is opened, and chunk checksums are verified (before use where a chunk is read whole,
in the background where reads are random), once per node."""

from __future__ import annotations

import contextlib
import struct
from pathlib import Path

import pytest
from tests.cachefactory import make_cache, sample_docs

import shardwise as sw
from shardwise.errors import CacheError, ConfigError, CorruptChunkError
from shardwise.format.megatron import HEADER_SIZE, read_idx
from shardwise.read.stream.dataset import StreamDataset

VOCAB = 1000
L = 16
STEM = "chunks/00000/00000-00001"  # the second chunk


@pytest.fixture
def cache_dir(tmp_path: Path) -> Path:
    """One source of 40 documents in 8 chunks of 5, ids below 1000."""
    return make_cache(tmp_path / "cache", [sample_docs(40, seed=3)], chunk_docs=5,
                      vocab_size=VOCAB, eod_id=0)


def flip(path: Path, byte: int, bit: int) -> None:
    data = bytearray(path.read_bytes())
    data[byte] ^= bit
    path.write_bytes(bytes(data))


def flip_token(root: Path, token: int, bit: int) -> tuple[int, int]:
    """Flip ``bit`` of token ``token`` of chunk STEM; returns (new id, its stream offset).
    Bit 0x8000 is one flipped byte that makes an id >= the vocabulary; bit 1 keeps it
    inside (only the checksum can tell)."""
    path = root / f"{STEM}.bin"
    (old,) = struct.unpack_from("<H", path.read_bytes(), 2 * token)
    lo, hi = bit & 0xFF, bit >> 8
    if lo:
        flip(path, 2 * token, lo)
    if hi:
        flip(path, 2 * token + 1, hi)
    cache = sw.open_cache(root)
    return old ^ bit, int(cache.cum_tokens[1]) + token


def window_holding(offset: int) -> int:
    """A window (of seq_len L, stride L) whose L + 1 tokens include stream ``offset``."""
    return offset // L


# -- token ids outside the vocabulary ---------------------------------------------------
def test_window_path_refuses_an_id_outside_the_vocabulary(cache_dir: Path) -> None:
    bad_id, offset = flip_token(cache_dir, 10, 0x8000)
    assert bad_id >= VOCAB
    ds = sw.TokenDataset(cache_dir, seq_len=L, shuffle="none")
    with pytest.raises(CorruptChunkError, match=rf"{STEM}\.bin.*{bad_id}"):
        ds.__getitems__([window_holding(offset)])


def test_document_shuffle_path_refuses_an_id_outside_the_vocabulary(cache_dir: Path) -> None:
    bad_id, _ = flip_token(cache_dir, 10, 0x8000)
    ds = sw.TokenDataset(cache_dir, seq_len=L, shuffle="document", seed=5)
    with pytest.raises(CorruptChunkError, match=rf"{STEM}\.bin.*{bad_id}"):
        ds.__getitems__(list(range(len(ds))))


def test_stream_refuses_a_flipped_chunk_before_use(cache_dir: Path) -> None:
    flip_token(cache_dir, 10, 0x8000)
    ds = StreamDataset(cache_dir, seq_len=L, streams=1, epochs=1, world=sw.World(0, 1))
    with pytest.raises(CorruptChunkError, match=rf"{STEM}\.bin: xxh3_64"):
        list(ds)


def test_intact_chunks_with_ids_beyond_the_manifest_vocabulary_are_refused(
        tmp_path: Path) -> None:
    """Checksums intact, but ids >= vocab_size (a wrong vocabulary at build or import):
    the per-batch check still refuses them, on every reader path."""
    root = make_cache(tmp_path / "c", [sample_docs(40, seed=3, vocab_size=VOCAB)],
                      chunk_docs=5, vocab_size=100)
    for shuffle in ("window", "document"):
        ds = sw.TokenDataset(root, seq_len=L, shuffle=shuffle)
        with pytest.raises(CorruptChunkError, match=r"chunks/00000/00000-0000\d\.bin: token "
                                                    r"id \d+ .*vocabulary of 100"):
            ds.__getitems__(list(range(8)))
    with pytest.raises(CorruptChunkError, match=r"token id \d+ .*vocabulary of 100"):
        list(StreamDataset(root, seq_len=L, streams=2, epochs=1, world=sw.World(0, 1)))


def test_int32_caches_refuse_negative_ids(tmp_path: Path) -> None:
    root = make_cache(tmp_path / "c", [sample_docs(20, seed=4)], chunk_docs=5,
                      dtype="int32", vocab_size=100_000)
    path = root / "chunks/00000/00000-00000.bin"
    data = bytearray(path.read_bytes())
    data[8:12] = struct.pack("<i", -7)
    path.write_bytes(bytes(data))
    ds = sw.TokenDataset(root, seq_len=L, shuffle="none")
    with pytest.raises(CorruptChunkError, match=r"00000-00000\.bin: token id -7 "):
        ds.__getitems__([0])


# -- structure, when a chunk is opened ----------------------------------------------------
def test_an_edited_idx_length_is_refused_when_the_chunk_is_opened(cache_dir: Path) -> None:
    idx = cache_dir / f"{STEM}.idx"
    before = read_idx(idx).sequence_lengths.tolist()
    flip(idx, HEADER_SIZE + 4, 0x04)  # a byte of document 1's length
    assert read_idx(idx).sequence_lengths.tolist() != before
    ds = sw.TokenDataset(cache_dir, seq_len=L, shuffle="none", reset_position_ids=True)
    with pytest.raises(CorruptChunkError, match=rf"{STEM}\.idx"):
        ds.__getitems__(list(range(len(ds))))


def test_a_bin_one_byte_short_is_named(cache_dir: Path) -> None:
    path = cache_dir / f"{STEM}.bin"
    path.write_bytes(path.read_bytes()[:-1])
    ds = sw.TokenDataset(cache_dir, seq_len=L, shuffle="none")
    with pytest.raises(CorruptChunkError, match=rf"{STEM}\.bin: .*bytes"):
        ds.__getitems__(list(range(len(ds))))


def test_a_megatron_bin_one_byte_short_is_named(tmp_path: Path) -> None:
    from shardwise.writer.convert import to_megatron

    root = make_cache(tmp_path / "c", [sample_docs(20, seed=4)], chunk_docs=5)
    prefix = tmp_path / "m" / "corpus"
    prefix.parent.mkdir()
    to_megatron(root, prefix)
    path = prefix.with_name("corpus.bin")
    path.write_bytes(path.read_bytes()[:-1])
    with pytest.raises(CorruptChunkError, match=r"corpus\.bin"):
        sw.TokenDataset(sw.open_cache(prefix), seq_len=L, shuffle="none")[0]


def test_a_bin_symlinked_outside_the_cache_is_refused(cache_dir: Path, tmp_path: Path
                                                      ) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    path = cache_dir / f"{STEM}.bin"
    (elsewhere / "x.bin").write_bytes(path.read_bytes())
    path.unlink()
    path.symlink_to(elsewhere / "x.bin")
    ds = sw.TokenDataset(cache_dir, seq_len=L, shuffle="none")
    with pytest.raises(CacheError, match=rf"{STEM}\.bin.*outside the cache"):
        ds.__getitems__(list(range(len(ds))))
    stream = StreamDataset(cache_dir, seq_len=L, streams=1, epochs=1, world=sw.World(0, 1))
    with pytest.raises(CacheError, match=rf"{STEM}\.bin.*outside the cache"):
        list(stream)


def test_an_idx_symlinked_outside_the_cache_is_refused(cache_dir: Path, tmp_path: Path
                                                       ) -> None:
    path = cache_dir / f"{STEM}.idx"
    (tmp_path / "x.idx").write_bytes(path.read_bytes())
    path.unlink()
    path.symlink_to(tmp_path / "x.idx")
    ds = sw.TokenDataset(cache_dir, seq_len=L, shuffle="document")
    with pytest.raises(CacheError, match=rf"{STEM}\.idx.*outside the cache"):
        ds[0]


# -- checksums, in the background where reads are random --------------------------------
def test_global_placement_raises_at_a_later_batch_once_the_damage_is_found(
        cache_dir: Path) -> None:
    bad_id, offset = flip_token(cache_dir, 10, 1)
    assert bad_id < VOCAB  # only the checksum can tell
    ds = sw.TokenDataset(cache_dir, seq_len=L, seed=9)  # window shuffle: random reads
    batches = [list(range(k, k + 4)) for k in range(0, len(ds) - 3, 4)]
    first = next(b for b in batches
                 if any(w * L <= offset <= w * L + L for w in ds.windows(b).tolist()))
    verifier = ds.cache.checks.verifier
    assert verifier is not None
    jobs: list = []  # type: ignore[type-arg]
    verifier._submit = jobs.append  # type: ignore[assignment]  # hold the thread's start
    ds.__getitems__(first)  # served: its ids are in range, its checksum not yet known
    assert ds.cache.opened[STEM] == 1 and len(jobs) == 1
    jobs[0]()  # the background job, run to its end
    with pytest.raises(CorruptChunkError, match=rf"{STEM}\.bin: xxh3_64 [0-9a-f]+, the "
                                                r"metadata says [0-9a-f]+"):
        ds.__getitems__(batches[0])
    with pytest.raises(CorruptChunkError):  # and every batch after it
        ds.__getitems__(batches[1])


def test_verify_false_trusts_the_cache(cache_dir: Path) -> None:
    flip_token(cache_dir, 10, 1)
    ds = sw.TokenDataset(cache_dir, seq_len=L, seed=9, verify=False)
    for k in range(0, len(ds), 4):
        ds.__getitems__(list(range(k, min(k + 4, len(ds)))))
    ds.cache.wait_for_verify()
    ds.__getitems__([0])
    assert ds.cache.verify_stats()["hashed"] == 0
    stream = StreamDataset(cache_dir, seq_len=L, streams=1, epochs=1, world=sw.World(0, 1),
                           verify=False)
    assert len(list(stream)) > 0


def test_verify_must_agree_with_an_open_cache(cache_dir: Path) -> None:
    with pytest.raises(ConfigError, match="open_cache"):
        sw.TokenDataset(sw.open_cache(cache_dir), seq_len=L, verify=False)


def _read_all(ds: sw.TokenDataset) -> None:
    for k in range(0, len(ds), 4):
        ds.__getitems__(list(range(k, min(k + 4, len(ds)))))
    ds.cache.wait_for_verify()
    ds.__getitems__([0])  # no damage found


def test_each_chunk_is_hashed_once_per_node(cache_dir: Path) -> None:
    first = sw.TokenDataset(cache_dir, seq_len=L, seed=1)
    _read_all(first)
    stats = first.cache.verify_stats()
    assert stats["hashed"] == 8 and stats["skipped"] == 0
    verifier = first.cache.checks.verifier
    assert verifier is not None and verifier.settled  # the per-batch id check retires
    logs = list((cache_dir / ".shardwise-plans" / "verified").iterdir())
    assert len(logs) == 1
    again = sw.TokenDataset(cache_dir, seq_len=L, seed=2)  # another process, a later run
    _read_all(again)
    assert again.cache.verify_stats() == {"hashed": 0, "skipped": 8, "queued": 0}


def test_a_chunk_changed_after_verification_is_hashed_again(cache_dir: Path) -> None:
    _read_all(sw.TokenDataset(cache_dir, seq_len=L, seed=1))
    flip_token(cache_dir, 10, 1)
    ds = sw.TokenDataset(cache_dir, seq_len=L, seed=1)
    with pytest.raises(CorruptChunkError, match=rf"{STEM}\.bin: xxh3_64"):
        _read_all(ds)  # raised by a batch of the loop, or by the one after the wait


def test_the_verified_log_falls_back_when_the_cache_is_not_writable(
        cache_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    (cache_dir / ".shardwise-plans").write_text("not a directory")  # mkdir fails, even as root
    _read_all(sw.TokenDataset(cache_dir, seq_len=L, seed=1))
    logs = list((tmp_path / "xdg" / "shardwise" / "verified").iterdir())
    assert len(logs) == 1
    again = sw.TokenDataset(cache_dir, seq_len=L, seed=1)
    _read_all(again)
    assert again.cache.verify_stats()["hashed"] == 0


def test_a_cache_with_pending_verification_pickles(cache_dir: Path) -> None:
    import pickle

    ds = sw.TokenDataset(cache_dir, seq_len=L, seed=1)
    ds.__getitems__([0, 1, 2])
    copy = pickle.loads(pickle.dumps(ds))
    copy.__getitems__([0, 1, 2])
    copy.cache.wait_for_verify()
    ds.cache.wait_for_verify()


def test_torch_loader_workers_report_a_damaged_chunk(cache_dir: Path) -> None:
    """Forked DataLoader workers verify in their own background threads; the damage is
    raised in the main process, naming the file, within a bounded number of batches."""
    from shardwise.torch import loader

    flip_token(cache_dir, 10, 1)
    ds = sw.TokenDataset(cache_dir, seq_len=L, seed=9)
    dl = loader(ds, global_batch_size=4, micro_batch_size=4, world=sw.World(0, 1),
                num_workers=2)
    with pytest.raises(CorruptChunkError, match=rf"{STEM}\.bin: xxh3_64"):
        for step, _ in enumerate(dl):
            assert step < 20_000, "the damage was never reported"


def _child_reads(ds: sw.TokenDataset, batch: list[int], out: object) -> None:
    try:
        verifier = ds.cache.checks.verifier
        assert verifier is not None
        verifier._submit = ds.cache.store.submit  # the child's own threads, whatever the parent did
        ds.cache.wait_for_verify()
        ds.__getitems__(batch)
        out.put("no error")  # type: ignore[attr-defined]
    except CorruptChunkError as e:
        out.put(f"CorruptChunkError: {e}")  # type: ignore[attr-defined]


@pytest.mark.parametrize("parent", ["verifying", "stalled"])
def test_a_forked_child_finishes_the_verification_its_parent_started(cache_dir: Path,
                                                                     parent: str) -> None:
    """Forked while the parent verifies (or before its thread ever ran: ``stalled``), the
    child neither hangs on the parent's lock nor skips the chunks it inherited mapped."""
    import multiprocessing

    flip_token(cache_dir, 10, 1)
    ds = sw.TokenDataset(cache_dir, seq_len=L, shuffle="none")
    verifier = ds.cache.checks.verifier
    assert verifier is not None
    if parent == "stalled":
        verifier._submit = lambda job: None  # type: ignore[assignment,return-value]
    with contextlib.suppress(CorruptChunkError):  # if the parent's thread was that quick
        ds.__getitems__(list(range(len(ds))))  # every chunk mapped and queued for verifying
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    child = ctx.Process(target=_child_reads, args=(ds, [0, 1], out))
    child.start()
    result = out.get(timeout=60)
    child.join(timeout=60)
    assert result.startswith("CorruptChunkError") and f"{STEM}.bin: xxh3_64" in result
    if parent == "stalled":
        assert verifier.stats()["queued"] == 8  # the parent itself never verified
