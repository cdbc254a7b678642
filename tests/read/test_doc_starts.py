"""The node's document-starts file: built from plain reads of each ``.idx``, checked
against the cache's counts, rebuilt when damaged."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from shardwise import open_cache
from shardwise.errors import CorruptChunkError
from shardwise.format.megatron import idx_bytes
from shardwise.read.tokens.plans import (
    doc_lengths_from_starts,
    starts_path,
    stored_doc_starts,
)


def _megatron(prefix: Path, lengths: list[int], docs: list[int] | None = None) -> Path:
    prefix.with_name(prefix.name + ".idx").write_bytes(idx_bytes(lengths, np.uint16, docs))
    prefix.with_name(prefix.name + ".bin").write_bytes(np.zeros(sum(lengths), np.uint16))
    return prefix


def test_starts_and_lengths_match_the_index(tmp_path: Path) -> None:
    lengths = (np.arange(1000) % 17).tolist()
    cache = open_cache(_megatron(tmp_path / "d", lengths))
    starts = stored_doc_starts(cache, tmp_path / "plans", block=64)
    assert np.array_equal(starts, np.concatenate(([0], np.cumsum(lengths))))
    got = doc_lengths_from_starts(starts_path(cache, tmp_path / "plans"), 1000, block=100)
    assert got.dtype == np.int32 and np.array_equal(got, lengths)


def test_documents_of_several_sequences_stay_one_document(tmp_path: Path) -> None:
    cache = open_cache(_megatron(tmp_path / "d", [3, 1, 2, 5], docs=[0, 2, 3, 4]))
    assert stored_doc_starts(cache, tmp_path / "plans").tolist() == [0, 4, 6, 11]


def test_lengths_that_do_not_add_up_are_refused(tmp_path: Path) -> None:
    prefix = _megatron(tmp_path / "d", [3, 4, 5])
    idx = prefix.with_name("d.idx")
    data = bytearray(idx.read_bytes())
    data[34:38] = np.int32(9).tobytes()  # the first length; pointers and .bin unchanged
    idx.write_bytes(bytes(data))
    with pytest.raises(CorruptChunkError, match="add up to 18 tokens.*the cache says 12"):
        stored_doc_starts(open_cache(prefix), tmp_path / "plans")


def test_a_damaged_starts_file_is_rebuilt(tmp_path: Path) -> None:
    cache = open_cache(_megatron(tmp_path / "d", [3, 4, 5]))
    plans = tmp_path / "plans"
    stored_doc_starts(cache, plans)
    path = starts_path(cache, plans)
    path.write_bytes(path.read_bytes()[:-8])  # truncated in place
    assert stored_doc_starts(cache, plans).tolist() == [0, 3, 7, 12]
