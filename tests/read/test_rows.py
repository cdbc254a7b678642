"""``Rows``: the micro-batch as a real list of per-example dicts. Every consumer sees every
row, including the C code that reads a list's items directly (what a lazily filled list
would get wrong, silently), and the row boundaries follow ``cu_seqlens`` exactly."""

from __future__ import annotations

import pickle
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch.utils.data import default_collate
from transformers import (
    DataCollatorForLanguageModeling,
    DataCollatorWithPadding,
    PreTrainedTokenizerFast,
    default_data_collator,
)

import shardwise as sw
from shardwise.read.rows import Rows, stack_rows

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from cachefactory import make_cache, sample_docs  # noqa: E402

L = 16


@pytest.fixture(scope="module")
def rows(tmp_path_factory: pytest.TempPathFactory) -> Rows:
    root = make_cache(tmp_path_factory.mktemp("rows") / "c", [sample_docs(40, seed=3)],
                      chunk_docs=6)
    return sw.TokenDataset(root, seq_len=L, seed=1).__getitems__([0, 3, 5, 7])


def _same(a: Any, b: Any) -> bool:
    return list(a) == list(b) and all(np.array_equal(a[k], b[k]) for k in a)


def _want(rows: Rows) -> list[dict[str, Any]]:
    return [{k: v[i] for k, v in rows.batch.items()} for i in range(len(rows.batch["labels"]))]


def test_every_list_reader_sees_every_row(rows: Rows) -> None:
    want = _want(rows)
    assert len(rows) == 4 and all(type(r) is dict for r in rows)
    for got in (list(rows), [*rows], [] + rows, rows + [], sum([rows], []), rows[:],
                pickle.loads(pickle.dumps(rows)), list(zip(*zip(*rows, strict=True), strict=True))):
        assert len(got) == 4, got
        assert all(_same(g, w) if isinstance(g, dict) else list(g) == list(w)
                   for g, w in zip(got, want, strict=True))
    target: list[Any] = []
    target[:] = rows  # list slice assignment reads the items in C
    assert len(target) == 4 and len(rows + rows) == 8 and len(rows[1:3]) == 2
    assert np.array(rows, dtype=object).shape == (4,)
    assert rows == [dict(r) for r in rows]  # equality, item by item
    again = pickle.loads(pickle.dumps(rows))  # what a DataLoader worker sends back
    assert isinstance(again, Rows) and np.array_equal(again["input_ids"], rows["input_ids"])


def test_stock_collators_stack_the_rows(rows: Rows) -> None:
    ids = torch.from_numpy(rows.batch["input_ids"])
    for batch in (default_collate(rows), default_data_collator(rows)):
        assert torch.equal(batch["input_ids"], ids)
        assert torch.equal(batch["labels"], torch.from_numpy(rows.batch["labels"]))
    tok = PreTrainedTokenizerFast(tokenizer_file=str(
        Path(__file__).resolve().parents[2] / "sample" / "tokenizer.json"))
    tok.pad_token = tok.convert_ids_to_tokens(0)
    for collator in (DataCollatorWithPadding(tok, return_tensors="pt"),
                     DataCollatorForLanguageModeling(tok, mlm=False, return_tensors="pt")):
        assert torch.equal(collator(rows)["input_ids"], ids)


def test_each_row_gets_its_own_boundaries() -> None:
    """cu [0, 3, 4, 4, 8] over rows of 4 (a zero-length document at 4):
    row 0 → [0, 3, 4], row 1 → [0, 4]; a flat list missing a row edge still splits."""
    ids = np.arange(8).reshape(2, 4)
    for cu, want in (([0, 3, 4, 4, 8], [[0, 3, 4], [0, 4]]),
                     ([0, 3, 6, 8], [[0, 3, 4], [0, 2, 4]])):
        rows = Rows({"input_ids": ids, "cu_seqlens": np.array(cu, np.int32),
                     "max_seqlen": np.asarray(4, np.int32)})
        assert [r["cu_seqlens"].tolist() for r in rows] == want
        assert [r["max_seqlen"].shape for r in rows] == [(), ()]
        assert [int(r["max_seqlen"]) for r in rows] == [max(np.diff(w)) for w in want]
        assert all(r["cu_seqlens"].dtype == np.int32 for r in rows)


@given(st.lists(st.lists(st.integers(0, L), max_size=6), min_size=1, max_size=5))
def test_row_boundaries_invert_stack_rows(cuts: list[list[int]]) -> None:
    """Per-row boundaries, stacked (stack_rows) and split again, come back unchanged."""
    per_row = [[0, *sorted(c for c in cs if 0 < c < L), L] for cs in cuts]
    rows = [{"input_ids": np.zeros(L, np.int64), "cu_seqlens": np.array(b, np.int32)}
            for b in per_row]
    again = Rows(stack_rows(rows))
    assert [r["cu_seqlens"].tolist() for r in again] == per_row
    assert [int(r["max_seqlen"]) for r in again] == [int(np.diff(b).max()) for b in per_row]


def test_a_batch_without_rows() -> None:
    assert Rows({}) == [] and Rows({"input_ids": np.zeros((0, 4))}) == []
