"""``overwrite=True`` (``--overwrite``) removes everything shardwise wrote in the directory,
reader plan caches included, or refuses before deleting anything."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from tests.helpers_cache import assert_same_cache, cache_files

import shardwise as sw
from shardwise.errors import ConfigError
from shardwise.storage.owned import foreign_names
from shardwise.writer.api import build

ARGS: dict[str, Any] = dict(workers=2, progress=False)


def _with_plans(out: Path) -> None:
    """What a user's directory holds after training from it: the document-shuffle reader's
    plan cache, and leftovers of a killed build."""
    ds = sw.TokenDataset(out, seq_len=32, seed=1, shuffle="document")
    ds[0]
    # the reader has stopped: its background checksum thread records the chunks it
    # verified under .shardwise-plans/, and one still running would write there again
    # after the overwrite's removal
    ds.cache.close()
    assert any((out / ".shardwise-plans").iterdir())
    (out / "chunks/00000/.tmp-00000-00000.bin.123.abcd").write_bytes(b"partial")
    (out / ".tmp-ledger.json.9.ffff").write_bytes(b"{")


def test_overwrite_removes_plans_and_leftovers_and_can_be_repeated(
        tmp_path: Path, sample_corpus: Path, tokenizer_path: Path) -> None:
    out = tmp_path / "cache"
    build([sample_corpus], out, tokenizer=tokenizer_path, chunk_docs=100, **ARGS)
    _with_plans(out)
    assert foreign_names(out) == []

    build([sample_corpus], out, tokenizer=tokenizer_path, chunk_docs=50, overwrite=True,
          **ARGS)
    assert not (out / ".shardwise-plans").exists()
    _with_plans(out)
    summary = build([sample_corpus], out, tokenizer=tokenizer_path, chunk_docs=60,
                    overwrite=True, **ARGS)  # again: every retry works too
    assert summary.new_chunks == 9 and summary.checked_chunks == 0

    clean = tmp_path / "clean"
    build([sample_corpus], clean, tokenizer=tokenizer_path, chunk_docs=60, **ARGS)
    assert_same_cache(clean, out)


def test_overwrite_refuses_before_deleting_anything_naming_foreign_files(
        tmp_path: Path, sample_corpus: Path, tokenizer_path: Path) -> None:
    out = tmp_path / "cache"
    build([sample_corpus], out, tokenizer=tokenizer_path, chunk_docs=100, **ARGS)
    _with_plans(out)
    (out / "notes.txt").write_text("my notes")
    (out / "chunks/00000/keep.bin").write_bytes(b"mine")
    (out / "runs/1").mkdir(parents=True)
    os.symlink(tmp_path, out / "chunks/link")
    before = cache_files(out)

    with pytest.raises(ConfigError) as e:
        build([sample_corpus], out, tokenizer=tokenizer_path, chunk_docs=50, overwrite=True,
              **ARGS)

    msg = str(e.value)
    assert "holds 4 other entries (chunks/00000/keep.bin, chunks/link, notes.txt, runs/)" in msg
    assert "nothing was deleted" in msg
    assert cache_files(out) == before
    assert sw.open_cache(out).num_documents == 516


def test_a_directory_holding_only_shardwise_leftovers_needs_overwrite(
        tmp_path: Path, sample_corpus: Path, tokenizer_path: Path) -> None:
    """As a killed overwrite leaves it: no manifest, plans and chunks still there."""
    out = tmp_path / "cache"
    build([sample_corpus], out, tokenizer=tokenizer_path, chunk_docs=100, **ARGS)
    _with_plans(out)
    for name in ("ledger.json", "manifest.json"):
        (out / name).unlink()
    with pytest.raises(ConfigError, match=r"is not a shardwise cache .* they are shardwise's "
                                          r"own files: pass overwrite=True \(--overwrite\)"):
        build([sample_corpus], out, tokenizer=tokenizer_path, chunk_docs=100, **ARGS)
    summary = build([sample_corpus], out, tokenizer=tokenizer_path, chunk_docs=100,
                    overwrite=True, **ARGS)
    assert summary.new_chunks == 6 and not (out / ".shardwise-plans").exists()


def test_a_download_directory_inside_is_shardwise_s_own(tmp_path: Path, sample_corpus: Path,
                                                        tokenizer_path: Path) -> None:
    from shardwise.storage.download import DownloadDir

    out = tmp_path / "cache"
    build([sample_corpus], out, tokenizer=tokenizer_path, chunk_docs=100, **ARGS)
    downloads = DownloadDir(out / "0123456789abcdef", 1 << 20)
    downloads.fetch("chunks/00000/00000-00001.bin", 3, lambda tmp: tmp.write_bytes(b"abc"))
    assert (out / "0123456789abcdef/.lock").exists()
    assert foreign_names(out) == []
    build([sample_corpus], out, tokenizer=tokenizer_path, chunk_docs=50, overwrite=True,
          **ARGS)
    assert not (out / "0123456789abcdef").exists()
