"""Output forms: int32 ids and compact batches are the default examples, losslessly.

For every example reader, ``expand(compact) == full`` (keys, dtypes and values) and the
int32 form equals the default form's values; the form is not part of the order."""

from __future__ import annotations

from itertools import islice
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from tests.cachefactory import make_cache, sample_docs
from tests.read.test_sft_pack import make_records

import shardwise as sw
from shardwise.errors import ConfigError
from shardwise.read.examples import expand

COMPACT = sw.Output(dtype="stored", compact=True)


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("output") / "cache"
    return make_cache(root, [sample_docs(60, seed=1), sample_docs(40, seed=2)], chunk_docs=4,
                      eod_id=0)


def same(a: dict[str, Any], b: dict[str, Any]) -> None:
    assert list(a) == list(b)
    for k in a:
        assert a[k].dtype == b[k].dtype, k
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)


TOKEN_OPTIONS = [{}, {"shuffle": "document"}, {"shuffle": "block"}, {"shuffle": "none"},
                 {"reset_position_ids": True, "cu_seqlens": True},
                 {"eod_mask_loss": True}, {"drop_last": False, "shuffle": "none"}]


@pytest.mark.parametrize("options", TOKEN_OPTIONS)
def test_token_dataset_compact_expands_to_the_full_batch(cache_dir: Path,
                                                         options: dict[str, Any]) -> None:
    full = sw.TokenDataset(cache_dir, seq_len=16, seed=3, **options)
    small = sw.TokenDataset(cache_dir, seq_len=16, seed=3, output=COMPACT, **options)
    assert small.fingerprint == full.fingerprint  # the form is not the order
    n = len(full)
    for idx in ([0, 5, 9, 2], [n - 1, sw.PAD, 3], [1], [4, 5, 6, 7]):  # last: one span
        got = small.get_batch(idx)
        assert got["tokens"].dtype == np.uint16 and got["tokens"].shape == (len(idx), 17)
        same(expand(got), full.get_batch(idx))
    assert "loss_mask" not in small.get_batch([0, 1]) or options  # only when masked
    same(expand(small[4]), full[4])


def test_int32_is_the_default_form_in_int32(cache_dir: Path) -> None:
    full = sw.TokenDataset(cache_dir, seq_len=16, seed=3, cu_seqlens=True)
    narrow = sw.TokenDataset(cache_dir, seq_len=16, seed=3, cu_seqlens=True,
                             output=sw.Output(dtype="int32"))
    a, b = full.get_batch([3, 1, sw.PAD]), narrow.get_batch([3, 1, sw.PAD])
    assert list(a) == list(b)
    for k in a:
        assert b[k].dtype == (np.int32 if k != "loss_mask" else np.float32), k
        np.testing.assert_array_equal(a[k], b[k])
    small = sw.TokenDataset(cache_dir, seq_len=16, seed=3, cu_seqlens=True,
                            output=sw.Output(dtype="int32", compact=True))
    assert small.get_batch([3])["tokens"].dtype == np.int32
    same(expand(small.get_batch([3, 1]), np.int32), narrow.get_batch([3, 1]))


@pytest.mark.parametrize("batch_size", [None, 3])
def test_stream_dataset_compact(cache_dir: Path, batch_size: int | None) -> None:
    def read(output: sw.Output | None) -> list[dict[str, Any]]:
        ds = sw.StreamDataset(cache_dir, seq_len=16, streams=2, seed=7, epochs=1,
                              world=sw.World(0, 1), batch_size=batch_size, output=output)
        return list(ds)
    full, small = read(None), read(COMPACT)
    assert len(full) == len(small) > 2
    if batch_size is None:  # single examples keep the same keys, so they collate
        assert {tuple(e) for e in small} == {("tokens", "loss_mask")}
    assert all(e["tokens"].dtype == np.uint16 for e in small)
    assert all(e["loss_mask"].dtype == np.uint8 for e in small if "loss_mask" in e)
    for a, b in zip(full, small, strict=True):
        same(expand(b), a)


def test_blend_compact_map_style_and_iterable(cache_dir: Path) -> None:
    def parts() -> list[sw.TokenDataset]:
        return [sw.TokenDataset(cache_dir, seq_len=16, seed=s) for s in (1, 2)]
    full = sw.Blend(parts(), [0.6, 0.4], seed=5)
    small = sw.Blend(parts(), [0.6, 0.4], seed=5, output=COMPACT)
    same(expand(small.get_batch([0, 7, 3, sw.PAD])), full.get_batch([0, 7, 3, sw.PAD]))
    for a, b in zip(islice(iter(full), 6), islice(iter(small), 6), strict=True):
        same(expand(b), a)
    with pytest.raises(ConfigError, match="pass output= to the Blend"):
        sw.Blend([sw.TokenDataset(cache_dir, seq_len=16, output=COMPACT)], [1.0])


def test_packed_sft_compact_rows_and_foreign_labels() -> None:
    recs = make_records(40)
    def rows(output: sw.Output | None, records: list[dict[str, Any]]) -> list[Any]:
        ds = sw.PackedSFT(records, seq_len=64, epochs=1, world=sw.World(0, 1), output=output)
        return list(ds)
    full, small = rows(None, recs), rows(sw.Output(dtype="int32", compact=True), recs)
    assert len(full) == len(small) > 3
    for a, b in zip(full, small, strict=True):
        assert set(b) == {"tokens", "loss_mask", "position_ids", "cu_seqlens"}
        same(expand(b), a)
    odd = [dict(r, labels=np.where(r["labels"] >= 0, r["labels"] + 1, r["labels"]))
           for r in recs]
    with pytest.raises(ConfigError, match="labels of their own"):
        rows(sw.Output(compact=True), odd)


def test_output_options_are_checked() -> None:
    with pytest.raises(ConfigError, match="needs compact=True"):
        sw.Output(dtype="stored")
    with pytest.raises(ConfigError, match="Output.dtype must be one of"):
        sw.Output(dtype="float16")
    with pytest.raises(ConfigError, match="shardwise.Output"):
        sw.TokenDataset("nowhere", seq_len=4, output="compact")  # type: ignore[arg-type]
