"""A ledger or journal record that names a path outside the cache, repeats a chunk, or
holds a count its chunk does not: refused by the loader itself (so by every reader), and
by ``verify`` with the same finding (issue 27, findings 4 and 6). Before, a journal record
listing chunk 0 forty times made a reader serve more examples than the cache holds, and a
negative ``tokens`` fewer, without an error; ``verify s3://…`` said OK to both (it did not
read the journal). The same cases through a bucket: tests/remote/test_hostile_remote.py."""

from __future__ import annotations

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
from shardwise.format.ledger import JOURNAL_DIR, LEDGER_NAME, Ledger
from shardwise.format.ledger_index import INDEX_NAME, LedgerView
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


HOSTILE: dict[str, tuple[Edit, str]] = {
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
