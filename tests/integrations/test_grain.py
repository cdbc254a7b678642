"""Grain over shardwise without torch (issue 29, item 5b): every map-style reader has
Grain's batched-read method, Grain's transformations pass it down, and
``shardwise.grain.batch`` reads each batch with ONE call (Grain's own ``.batch`` makes
one per example) and yields exactly ``.batch``'s elements."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import grain
import numpy as np
import pytest

import shardwise as sw
from shardwise.grain import batch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from cachefactory import make_cache, sample_docs  # noqa: E402


class Counting(sw.TokenDataset):
    """A TokenDataset counting how Grain reads it."""

    calls: dict[str, int]

    def __getitem__(self, index: int) -> Any:
        self.calls["getitem"] += 1
        return super().__getitem__(index)

    def _getitems(self, indices: Any) -> Any:
        self.calls["getitems"] += 1
        return super()._getitems(indices)


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    docs = [d or [1] for d in sample_docs(80, seed=2, vocab_size=300)]
    return make_cache(tmp_path_factory.mktemp("grain") / "c", [docs], chunk_docs=9,
                      vocab_size=300, eod_id=0)


def _counting(cache: Path) -> Counting:
    ds = Counting(cache, seq_len=16, seed=4)
    ds.calls = {"getitem": 0, "getitems": 0}
    return ds


@pytest.mark.parametrize("rank", [0, 1])
def test_one_batched_read_per_batch_same_elements(cache: Path, rank: int) -> None:
    ds = _counting(cache)
    pipeline = grain.MapDataset.source(ds).shuffle(seed=9)[rank::2]  # Grain's sharding
    ours, theirs = batch(pipeline, 4, drop_remainder=True), pipeline.batch(
        4, drop_remainder=True)
    assert len(ours) == len(theirs) == (len(ds) // 2) // 4
    got = [ours[i] for i in range(len(ours))]
    assert ds.calls == {"getitem": 0, "getitems": len(ours)}  # one read per batch
    want = [theirs[i] for i in range(len(theirs))]
    assert ds.calls["getitem"] == 4 * len(theirs)  # Grain's own: one read per example
    for g, w in zip(got, want, strict=True):
        assert sorted(g) == sorted(w)
        for k in w:
            assert np.array_equal(g[k], w[k]), k


def test_every_map_style_reader_has_the_batched_read(cache: Path) -> None:
    """Grain's protocol check (``SupportsBatchedReadRandomAccessDataSource``) passes for
    each map-style reader, and its rows are the reader's own ``__getitems__``."""
    from grain._src.python.dataset.base import SupportsBatchedReadRandomAccessDataSource

    tokens = sw.TokenDataset(cache, seq_len=16, seed=4)
    blend = sw.Blend([tokens, sw.TokenDataset(cache, seq_len=16, seed=5)], [0.5, 0.5],
                     seed=1)
    contiguous = sw.ContiguousShards([list(range(5)), list(range(5, 9))], lambda s: s,
                                     world=sw.World(0, 1))
    for reader in (tokens, blend, contiguous):
        assert isinstance(reader, SupportsBatchedReadRandomAccessDataSource), reader
        rows = grain.MapDataset.source(reader)._getitems([3, 1, 2])
        want = reader.__getitems__([3, 1, 2])
        for r, w in zip(rows, want, strict=True):
            if isinstance(w, dict):
                assert all(np.array_equal(r[k], w[k]) for k in w)
            else:
                assert r == w


def test_batches_across_epochs_match_grain(cache: Path) -> None:
    """Past one epoch (``repeat``), a batch never spans two epochs, as Grain's."""
    pipeline = grain.MapDataset.source(_counting(cache)).repeat(3)
    ours, theirs = batch(pipeline, 5), pipeline.batch(5)
    assert len(ours) == len(theirs)
    for i in (0, len(ours) // 3, len(ours) - 1):
        assert np.array_equal(ours[i]["input_ids"], theirs[i]["input_ids"])


def test_jax_gets_int32_batches_without_torch(cache: Path) -> None:
    """``Output(dtype="int32")``: Grain batches and the numpy loader's batches become
    int32 ``jax.numpy`` arrays (JAX's default integer), values unchanged — in a process
    where torch cannot be imported."""
    import subprocess
    import textwrap

    code = textwrap.dedent(f"""
        import sys
        sys.modules["torch"] = None
        import grain, jax.numpy as jnp, numpy as np
        import shardwise as sw
        from shardwise.grain import batch
        out = sw.Output(dtype="int32")
        ds = sw.TokenDataset({str(cache)!r}, seq_len=16, seed=4, output=out)
        plain = sw.TokenDataset({str(cache)!r}, seq_len=16, seed=4)
        b = batch(grain.MapDataset.source(ds).shuffle(seed=1), 4)[0]
        x = jnp.asarray(b["input_ids"])
        assert b["input_ids"].dtype == b["labels"].dtype == np.int32, b["labels"].dtype
        assert x.dtype == jnp.int32
        dl = sw.numpy_loader(plain, global_batch_size=4, micro_batch_size=4,
                             world=sw.World(0, 1), output=out)
        first = next(iter(dl))
        assert first["input_ids"].dtype == np.int32  # numpy's (jnp.asarray would cast)
        assert jnp.asarray(first["input_ids"]).dtype == jnp.int32
        assert np.array_equal(first["input_ids"], plain.get_batch([0, 1, 2, 3])["input_ids"])
        print("ok")
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-3000:]
