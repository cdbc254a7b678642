"""A ledger or journal record that names a path outside the cache, repeats a chunk, or
holds a count its chunk does not: refused by the loader itself (so by every reader), and
by ``verify`` with the same finding (issue 27, findings 4 and 6). Before, a journal record
listing chunk 0 forty times made a reader serve more examples than the cache holds, and a
negative ``tokens`` fewer, without an error; ``verify s3://…`` said OK to both (it did not
read the journal). The same cases through a bucket: tests/remote/test_hostile_remote.py."""

from __future__ import annotations

import dataclasses
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
from tests.cachefactory import make_cache, sample_docs

import shardwise as sw
from shardwise.errors import CorruptChunkError, ManifestError
from shardwise.format.checksum import bytes_checksum
from shardwise.format.files import LocalFiles
from shardwise.format.ledger import JOURNAL_DIR, LEDGER_NAME, Ledger, read_view
from shardwise.format.ledger_index import INDEX_NAME, LedgerView
from shardwise.storage.summary import summarize
from shardwise.storage.verify import verify_cache

Edit = Callable[[Path], None]


@pytest.fixture(scope="module")
def clean(tmp_path_factory: pytest.TempPathFactory) -> Path:
    docs = sample_docs(40, seed=3)
    return make_cache(tmp_path_factory.mktemp("hostile") / "c", [docs[:24], docs[24:]],
                      chunk_docs=4)


def examples(root: Path | str, **open_kw: Any) -> list[bytes]:
    """Every example of a TokenDataset over ``root``, then what the background checksum
    verification of the chunks read found (raised)."""
    cache = sw.open_cache(root, **open_kw)
    ds = sw.TokenDataset(cache, seq_len=16, seed=1)
    out = [np.asarray(ds[i]["input_ids"]).tobytes() for i in range(len(ds))]
    cache.wait_for_verify()
    cache.raise_if_damaged()
    return out


def journal_record(root: Path, chunks: Callable[[list[dict[str, Any]]], list[Any]]) -> None:
    """Record 1 after the snapshot: source 0 segment 0 again, its chunks ``chunks(old)``."""
    ledger = orjson.loads((root / LEDGER_NAME).read_bytes())
    seg = ledger["sources"][0]["segments"][0]
    entry = {"source": 0, "segment": 0, "from": 0, "chunks": chunks(seg["chunks"]),
             **{k: seg[k] for k in ("errors", "finished", "line", "position", "stop")}}
    (root / JOURNAL_DIR).mkdir(exist_ok=True)
    (root / JOURNAL_DIR / "00000001.json").write_bytes(orjson.dumps(
        {"version": 1, "record": 1, "segments": [entry]}))


def edit_snapshot(root: Path, edit: Callable[[dict[str, Any]], None]) -> None:
    ledger = orjson.loads((root / LEDGER_NAME).read_bytes())
    edit(ledger)
    (root / LEDGER_NAME).write_bytes(orjson.dumps(ledger, option=orjson.OPT_SORT_KEYS))


def _first(seg: list[dict[str, Any]], **change: Any) -> list[dict[str, Any]]:
    return [{**seg[0], **change}, *seg[1:]]


def outside(root: Path) -> None:
    journal_record(root, lambda seg: _first(seg, stem="../../evil"))


def forty_times(root: Path) -> None:
    journal_record(root, lambda seg: [seg[0]] * 40)


def negative_tokens(root: Path) -> None:
    edit_snapshot(root, lambda d: d["sources"][0]["segments"][0]["chunks"][1].update(
        tokens=-5))


def nul_in_stem(root: Path) -> None:
    journal_record(root, lambda seg: _first(seg, stem=seg[0]["stem"] + "\x00x"))


def chunk_left_out(root: Path) -> None:
    edit_snapshot(root, lambda d: d["sources"][0]["segments"][0]["chunks"].pop(1))


def record_of_no_chunks(root: Path) -> None:
    journal_record(root, lambda seg: [])


MISSING = r"source 0 segment 0: its chunks hold {} documents and it skipped 0 records, " \
          r"but it read 24 lines \(rows\): a chunk is missing"
HOSTILE: dict[str, tuple[Edit, str]] = {
    "a chunk entry left out of a finished segment": (chunk_left_out, MISSING.format(20)),
    "a record whose segment has no chunks": (record_of_no_chunks, MISSING.format(0)),
    "a record naming ../../evil": (outside, r"names '../../evil', not a relative path"),
    "a record listing chunk 0 forty times": (forty_times, r"already named by source 0 "
                                             r"segment 0 chunk 0"),
    "a negative tokens": (negative_tokens, r"chunk 1: tokens is -5, expected a count"),
    "a NUL in a stem": (nul_in_stem, r"holds a control character"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_the_loader_and_verify_refuse_a_hostile_ledger(clean: Path, tmp_path: Path,
                                                       case: str) -> None:
    edit, message = HOSTILE[case]
    root = Path(shutil.copytree(clean, tmp_path / "c"))
    edit(root)
    with pytest.raises(ManifestError, match=message):
        examples(root)
    with pytest.raises(ManifestError, match=message):
        Ledger.load(LocalFiles(root))
    report = verify_cache(root)
    assert not report.ok
    assert any(p.path == str(root / LEDGER_NAME) and re.search(
        message, p.what) for p in report.problems), report.problems
    assert not (tmp_path / "evil.json").exists()


def test_a_count_the_chunk_does_not_hold_is_refused_when_the_chunk_opens(
        clean: Path, tmp_path: Path) -> None:
    """A ledger count that is plausible (not negative) but not its chunk's: the chunk's own
    .idx is checked against the ledger row when it is opened, before any token is used."""
    root = Path(shutil.copytree(clean, tmp_path / "c"))
    want = examples(clean)
    edit_snapshot(root, lambda d: d["sources"][1]["segments"][0]["chunks"][2].update(
        tokens=d["sources"][1]["segments"][0]["chunks"][2]["tokens"] - 3))
    with pytest.raises(CorruptChunkError,
                       match=r"00000-00002.bin: 438 bytes, the ledger's 216 tokens"):
        assert examples(root) == want


def test_a_hostile_index_is_ignored_for_the_ledger(clean: Path, tmp_path: Path) -> None:
    """An index consistent with its own checksums and the ledger's bytes, but with a
    negative count or a stem twice: damaged, so readers read by the ledger (the clean data)
    and verify names it."""
    for column, value in (("tokens", -7), ("stem", b"chunks/00000/00000-00000")):
        root = Path(shutil.copytree(clean, tmp_path / column))
        view = LedgerView.from_ledger(Ledger.load(LocalFiles(root)))
        values = getattr(view.chunks, column).copy()
        values[3] = value
        chunks = type(view.chunks)(**{**vars(view.chunks), column: values})
        bad = type(view)(**{**vars(view), "chunks": chunks})
        ledger_xxh3 = bytes_checksum((root / LEDGER_NAME).read_bytes())
        (root / INDEX_NAME).write_bytes(bad.to_bytes(ledger_xxh3))
        assert examples(root) == examples(clean)
        assert [p.path for p in verify_cache(root).problems] == [str(root / INDEX_NAME)]


def reindex(root: Path) -> None:
    """The index made again from the edited ledger, as a hostile author's tooling would:
    readers then use it without parsing the ledger."""
    data = (root / LEDGER_NAME).read_bytes()
    view = LedgerView.from_ledger(Ledger.parse(data, check=False))
    (root / INDEX_NAME).write_bytes(view.to_bytes(bytes_checksum(data)))


def source_left_out(root: Path) -> None:
    edit_snapshot(root, lambda d: d["sources"].pop(1))


@pytest.mark.parametrize("edit", [chunk_left_out, source_left_out])
def test_a_ledger_that_left_chunks_out_is_refused_even_through_its_index(
        clean: Path, tmp_path: Path, cli, edit: Edit) -> None:
    """Issue 27, fuzz findings: a finished segment's chunk entry left out made readers
    serve 44 of 54 examples, a whole source left out 24 of 54 (StreamDataset 28 of 58),
    silently, and so did the same ledger with its index made again from it. Refused now by
    every reader, naming the ledger; ``inspect`` exits 2, ``verify`` reports it (1)."""
    root = Path(shutil.copytree(clean, tmp_path / "c"))
    edit(root)
    reindex(root)
    message = (MISSING.format(20) if edit is chunk_left_out
               else r"1 sources, .*manifest.json lists 2")
    with pytest.raises(ManifestError, match=message) as refused:
        examples(root)
    assert str(root / LEDGER_NAME) in str(refused.value)
    code, _, err = cli("inspect", root)
    assert code == 2 and str(root / LEDGER_NAME) in err, err
    code, out, _ = cli("verify", root)
    assert code == 1 and f"BAD {root / LEDGER_NAME}" in out, out


def test_an_index_from_before_lines_were_kept_still_opens(clean: Path, tmp_path: Path
                                                         ) -> None:
    """An index written before ``lines`` (its source totals lack it) is not checked by it,
    used, and passes ``verify``: old caches open as before."""
    root = Path(shutil.copytree(clean, tmp_path / "c"))
    data = (root / LEDGER_NAME).read_bytes()
    view = LedgerView.from_ledger(Ledger.parse(data))
    old = [dataclasses.replace(s, lines=None) for s in view.sources]
    index = dataclasses.replace(view, sources=old).to_bytes(bytes_checksum(data))
    gone = b'"lines":null,'  # as an older index: no such key (blanks keep its layout)
    assert index.count(gone) == len(old)
    (root / INDEX_NAME).write_bytes(index.replace(gone, b" " * len(gone)))
    assert b'"lines"' not in (root / INDEX_NAME).read_bytes()
    view, from_index = read_view(LocalFiles(root))
    assert from_index and [s.lines for s in view.sources] == [None, None]
    assert examples(root) == examples(clean)
    assert verify_cache(root).ok, verify_cache(root).problems


def test_inspect_names_a_missing_idx(clean: Path, tmp_path: Path) -> None:
    """A chunk's .idx missing (a journal record naming a stem with no files, in the long
    fuzz run): ``inspect``'s summary raised a raw FileNotFoundError (CLI exit 4)."""
    root = Path(shutil.copytree(clean, tmp_path / "c"))
    idx = root / "chunks/00001/00000-00001.idx"
    idx.unlink()
    cache = sw.open_cache(root, verify=False)
    with pytest.raises(CorruptChunkError, match=re.escape(f"{idx}: named by the ledger")):
        summarize(cache)
    cache.close()
