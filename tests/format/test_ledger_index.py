"""``ledger.index``: the readers' view of the ledger, as columns.

A cache of 2,000 synthesised chunks (the bench's synthesiser, at a small size): the index
agrees with the ledger and with every chunk's own files; a cache without it (the layout
before it) opens to the same chunks and serves the same examples; a stale or damaged
index is never used; a reader following a build sees new chunks through it."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import numpy as np
import orjson
import pytest

import shardwise as sw
from shardwise.bench.synth import SynthSpec, synth_cache, token_at
from shardwise.format.checksum import bytes_checksum
from shardwise.format.files import LocalFiles
from shardwise.format.ledger import LEDGER_NAME, Ledger, read_view
from shardwise.format.ledger_index import COLUMNS, INDEX_NAME, LedgerView
from shardwise.format.megatron import read_idx
from shardwise.storage.verify import verify_cache

SPEC = SynthSpec(2000, sources=3, segment_chunks=300, docs_per_chunk=3, doc_tokens=5)


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return synth_cache(tmp_path_factory.mktemp("synth") / "cache", SPEC)


@pytest.fixture
def cache_dir(made: Path, tmp_path: Path) -> Path:
    """A private copy (tests damage or edit it)."""
    return Path(shutil.copytree(made, tmp_path / "cache"))


def views_equal(a: LedgerView, b: LedgerView) -> bool:
    return (a.differences(b) == [] and a.sources == b.sources
            and all(np.array_equal(getattr(a.chunks, k), getattr(b.chunks, k))
                    for k in COLUMNS))


def without_index(root: Path) -> Path:
    (root / INDEX_NAME).unlink()
    return root


def test_the_index_is_the_ledgers_view_and_readers_use_it(made: Path) -> None:
    view, from_index = read_view(LocalFiles(made))
    assert from_index
    assert views_equal(view, LedgerView.from_ledger(Ledger.load(LocalFiles(made))))
    assert len(view.chunks) == SPEC.chunks and view.finished
    assert [s.chunks for s in view.sources] == [667, 667, 666]


def test_the_index_agrees_with_every_chunks_files(made: Path) -> None:
    cache = sw.open_cache(made)
    cols = cache.chunks.columns
    for c in range(len(cache.chunks)):
        info = cache.chunks[c]
        idx = read_idx(made / f"{info.stem}.idx")
        assert (idx.num_sequences, idx.num_tokens) == (cols.documents[c], cols.tokens[c])
        meta = (made / f"{info.stem}.json").read_bytes()
        assert bytes_checksum(meta) == info.meta_xxh3
        assert orjson.loads(meta)["source"] == info.source == c % SPEC.sources
    assert cache.num_tokens == int(sum(SPEC.lengths(c).sum() for c in range(SPEC.chunks)))


def test_a_cache_without_the_index_opens_the_same(cache_dir: Path, made: Path) -> None:
    """The layout before ``ledger.index``: readers parse ``ledger.json`` instead, and see
    the same chunks, totals and examples."""
    new, old = sw.open_cache(made), sw.open_cache(without_index(cache_dir))
    assert not read_view(LocalFiles(cache_dir))[1]
    assert np.array_equal(new.cum_tokens, old.cum_tokens)
    assert np.array_equal(new.cum_docs, old.cum_docs)
    assert [c.stem for c in new.chunks][::97] == [c.stem for c in old.chunks][::97]
    assert new.sources == old.sources and new.finished == old.finished
    for cache in (new, old):
        ds = sw.TokenDataset(cache, seq_len=16, seed=3)
        ids = [ds[i]["input_ids"].tolist() for i in (0, 1, len(ds) - 1)]
        assert ids == [token_at(SPEC, ds.windows([i])[0] * 16 + np.arange(16)).tolist()
                       for i in (0, 1, len(ds) - 1)]
    first = [next(iter(sw.StreamDataset(c, seq_len=16, streams=4, seed=3,
                                        world=sw.World(rank=1, size=4))))["input_ids"]
             for c in (new, old)]
    assert np.array_equal(*first)


def test_a_stale_index_is_not_used(cache_dir: Path) -> None:
    """The index of an earlier ledger (a reader between the two writes, a build killed
    between them) is ignored: the ledger's own view wins."""
    ledger = Ledger.load(LocalFiles(cache_dir))
    seg = ledger.sources[2].segments[-1]
    dropped = seg.chunks.pop()
    seg.finished, seg.position = False, seg.position - 1
    ledger.save(LocalFiles(cache_dir))
    stale = (cache_dir / INDEX_NAME).read_bytes()  # the index of the mid-build ledger
    seg.chunks.append(dropped)
    seg.finished, seg.position = True, seg.position + 1
    ledger.save(LocalFiles(cache_dir))
    (cache_dir / INDEX_NAME).write_bytes(stale)
    view, from_index = read_view(LocalFiles(cache_dir))
    assert not from_index and view.finished and len(view.chunks) == SPEC.chunks
    assert sw.open_cache(cache_dir).finished
    report = verify_cache(cache_dir)
    assert report.ok and [n.path for n in report.notes] == [str(cache_dir / INDEX_NAME)]
    assert "older than ledger.json" in report.notes[0].what


def test_a_damaged_index_is_ignored_by_readers_and_reported(cache_dir: Path) -> None:
    data = bytearray((cache_dir / INDEX_NAME).read_bytes())
    data[-20] ^= 0x40  # a stem byte of the last chunk
    (cache_dir / INDEX_NAME).write_bytes(bytes(data))
    assert not read_view(LocalFiles(cache_dir))[1]
    assert sw.open_cache(cache_dir).chunks[SPEC.chunks - 1].stem.startswith("chunks/")
    report = verify_cache(cache_dir)
    assert [p.path for p in report.problems] == [str(cache_dir / INDEX_NAME)]
    assert "do not match their checksum" in report.problems[0].what


def test_an_index_that_disagrees_with_its_ledger_is_a_problem(cache_dir: Path) -> None:
    """An index whose checksums hold but whose counts are not the ledger's (written by
    something else than a build): readers would trust it, so verify fails on it."""
    view = LedgerView.from_ledger(Ledger.load(LocalFiles(cache_dir)))
    tokens = view.chunks.tokens.copy()
    tokens[5] += 1
    bad = dataclasses.replace(view, chunks=dataclasses.replace(view.chunks, tokens=tokens))
    ledger_xxh3 = bytes_checksum((cache_dir / LEDGER_NAME).read_bytes())
    (cache_dir / INDEX_NAME).write_bytes(bad.to_bytes(ledger_xxh3))
    report = verify_cache(cache_dir)
    assert [p.path for p in report.problems] == [str(cache_dir / INDEX_NAME)]
    # the index's own totals no longer add up (its loader's check, before any comparison
    # with the ledger): readers ignore it, so no reader trusts the changed count
    what = report.problems[0].what
    assert "tokens" in what and "readers ignore it" in what, what


def test_an_index_naming_a_path_outside_the_cache_is_refused(cache_dir: Path) -> None:
    view = LedgerView.from_ledger(Ledger.load(LocalFiles(cache_dir)))
    stems = view.chunks.stem.astype("S32")
    stems[7] = b"../../etc/passwd"
    bad = dataclasses.replace(view, chunks=dataclasses.replace(view.chunks, stem=stems))
    ledger_xxh3 = bytes_checksum((cache_dir / LEDGER_NAME).read_bytes())
    (cache_dir / INDEX_NAME).write_bytes(bad.to_bytes(ledger_xxh3))
    # an index is derived: one that names a path outside is damaged, so readers read by
    # the ledger (the truth), and verify names the index
    assert sw.open_cache(cache_dir).chunks[7].stem == view.chunks.stem[7].decode()
    report = verify_cache(cache_dir)
    assert [p.path for p in report.problems] == [str(cache_dir / INDEX_NAME)]
    assert "'../../etc/passwd'" in report.problems[0].what


def test_a_follower_sees_new_chunks_through_the_index(cache_dir: Path) -> None:
    """Mid-build: a reader opens a ledger that names fewer chunks; each save of the ledger
    (with its index) is picked up by ``refresh``, which extends the chunks and sums."""
    full = Ledger.load(LocalFiles(cache_dir))
    part = Ledger.load(LocalFiles(cache_dir))
    for src in part.sources:
        src.segments[-1].chunks = src.segments[-1].chunks[:10]
        src.segments[-1].finished = False
    part.save(LocalFiles(cache_dir))
    cache = sw.open_cache(cache_dir)
    assert not cache.finished and len(cache.chunks) < SPEC.chunks
    seen = len(cache.chunks)
    full.save(LocalFiles(cache_dir))
    assert cache.refresh() == SPEC.chunks - seen and cache.finished
    whole = sw.open_cache(cache_dir)
    assert np.array_equal(cache.cum_tokens, whole.cum_tokens)
    assert cache.sources == whole.sources
    assert cache.read_tokens(0, 40).tolist() == token_at(SPEC, np.arange(40)).tolist()


def test_ledger_json_bytes_are_unchanged(made: Path) -> None:
    """``to_json`` builds its dicts by hand; the bytes are those of ``asdict``."""
    ledger = Ledger.load(LocalFiles(made))
    ledger.sources[0].segments[0].errors = {"invalid_json": 2, "empty_line": 1}
    ledger.sources[1].segments[0].chunks[3].empty = 2  # of its 3 documents
    assert ledger.to_json() == orjson.dumps(dataclasses.asdict(ledger),
                                            option=orjson.OPT_SORT_KEYS)
    assert Ledger.parse(ledger.to_json()) == ledger
