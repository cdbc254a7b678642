"""Orders are parts: a new order is one class in one file (here: windows last to first),
and the reader, ``ds[i]``, the loader (and its resume), ``trace`` and the resume contract
accept it. Every order answers ``locate(indices)``: the runs of stored tokens (chunk,
offset, length) behind those examples, which are exactly what the reader returns."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

import shardwise as sw
from shardwise.errors import StateError
from shardwise.read.config import ReadConfig
from shardwise.read.orders import WindowOrder, register_order
from shardwise.read.trace import Tracer
from shardwise.testing import assert_resumes_exactly
from shardwise.torch import loader

SEQ = 16


class Reversed(WindowOrder):
    """Windows last to first, every epoch alike (the trivial order of issue 22)."""

    name = "reversed"

    def window_block(self, epoch: int, positions: npt.NDArray[np.int64]
                     ) -> npt.NDArray[np.int64]:
        return self.n - 1 - positions


register_order(Reversed)


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory: pytest.TempPathFactory, sample_corpus: Path,
              tokenizer_path: Path) -> Path:
    out = tmp_path_factory.mktemp("orders") / "cache"
    sw.build([sample_corpus], out, tokenizer=tokenizer_path, chunk_docs=8, append_eod=True,
             workers=1, progress=False)
    return out


@pytest.fixture(scope="module")
def one_chunk_dir(tmp_path_factory: pytest.TempPathFactory, sample_corpus: Path,
                  tokenizer_path: Path) -> Path:
    out = tmp_path_factory.mktemp("orders1") / "cache"
    sw.build([sample_corpus], out, tokenizer=tokenizer_path, chunk_docs=1 << 20,
             append_eod=True, workers=1, progress=False)
    assert len(sw.open_cache(out).chunks) == 1
    return out


def _stream(cache_dir: Path) -> npt.NDArray[np.int64]:
    cache = sw.open_cache(cache_dir)
    return np.concatenate([cache.tokens(i) for i in range(len(cache.chunks))]).astype(np.int64)


def _gathered(ds: Any, idx: list[int]) -> npt.NDArray[np.int64]:
    """The tokens of ``ds.locate(idx)``, read straight from the chunk maps."""
    runs = ds.locate(idx)
    return np.concatenate([ds.cache.tokens(c)[o: o + n] for c, o, n in zip(
        runs.chunk.tolist(), runs.offset.tolist(), runs.length.tolist(), strict=True)]
                          ).astype(np.int64)


def test_a_new_order_is_read_by_the_dataset(cache_dir: Path) -> None:
    ds = sw.TokenDataset(cache_dir, seq_len=SEQ, shuffle="reversed")
    stream, n = _stream(cache_dir), len(ds)
    idx = [0, 5, n - 1, n, 2 * n + 3, 1]  # several epochs, in no order
    batch = ds.__getitems__(idx)
    for row, i in enumerate(idx):
        w = n - 1 - i % n
        assert batch["input_ids"][row].tolist() == stream[w * SEQ: w * SEQ + SEQ].tolist()
        assert batch["labels"][row].tolist() == stream[w * SEQ + 1: w * SEQ + SEQ + 1].tolist()
        assert ds[i]["input_ids"].tolist() == batch["input_ids"][row].tolist()
    assert ds.windows(idx).tolist() == [n - 1 - i % n for i in idx]
    assert "reversed" in repr(ds) and ds.state_config()["shuffle"] == "reversed"


@pytest.mark.parametrize("shuffle", ["none", "window", "block", "document", "reversed"])
@pytest.mark.parametrize("chunks", ["chunks", "one chunk"])
def test_locate_gives_the_tokens_of_each_example(cache_dir: Path, one_chunk_dir: Path,
                                                 shuffle: str, chunks: str) -> None:
    ds = sw.TokenDataset(cache_dir if chunks == "chunks" else one_chunk_dir, seq_len=SEQ,
                         seed=4, shuffle=shuffle, block_size=4, blocks_per_group=2,
                         drop_last=False)
    n = len(ds)
    rng = np.random.default_rng(0)
    for idx in ([*range(8)], rng.integers(0, 3 * n, 9).tolist(), [n - 1, 0, n],
                rng.permutation(n)[:9].tolist(), [n - 1, 3, 0], [n + 2]):  # one epoch
        batch = ds.get_batch(idx)
        want = np.concatenate([np.append(batch["input_ids"][r], batch["labels"][r, -1])
                               [: int(batch["loss_mask"][r].sum()) + 1] for r in range(len(idx))])
        assert _gathered(ds, idx).tolist() == want.tolist()


def test_the_loader_resumes_a_new_order_and_refuses_another(cache_dir: Path) -> None:
    def make(shuffle: str = "reversed") -> Any:
        return loader(sw.TokenDataset(cache_dir, seq_len=SEQ, shuffle=shuffle),
                      global_batch_size=4, micro_batch_size=2, world=sw.World(0, 1))

    assert_resumes_exactly(make, steps=5)
    dl = make()
    next(iter(dl))
    state = dl.state_dict()
    other = make("window")
    with pytest.raises(StateError, match="shuffle"):
        other.load_state_dict(state)


def test_trace_names_a_new_orders_examples(cache_dir: Path) -> None:
    cfg = ReadConfig.from_dict({"cache": str(cache_dir), "seq_len": SEQ, "seed": 0,
                                "shuffle": "reversed", "global_batch_size": 4,
                                "micro_batch_size": 2, "world_size": 1})
    ds, _ = cfg.build(rank=0)
    batches = iter(loader(ds, global_batch_size=4, micro_batch_size=2, world=sw.World(0, 1)))
    first = [next(batches), next(batches)]
    for e in Tracer(cfg, lines=False, ids=True).step(0).examples:
        b = first[e.micro_batch]
        window = [*b["input_ids"][e.row].tolist(), int(b["labels"][e.row][-1])]
        assert [t for p in e.pieces for t in (p.ids or [])] == window


@pytest.mark.parametrize("shuffle", ["none", "window", "block", "reversed"])
def test_an_epoch_beyond_the_order_cache_is_computed_per_position(
        cache_dir: Path, shuffle: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Random indices of an epoch longer than the order cache: each computed alone
    (``window_at``), the same windows as whole order blocks give."""
    import shardwise.read.orders.windows as windows

    ds = sw.TokenDataset(cache_dir, seq_len=SEQ, seed=5, shuffle=shuffle, block_size=4)
    idx = np.random.default_rng(1).integers(0, 3 * len(ds), 40).tolist()
    want = ds.windows(idx).tolist()
    monkeypatch.setattr(windows, "CACHE_WINDOWS", 0)
    fresh = sw.TokenDataset(cache_dir, seq_len=SEQ, seed=5, shuffle=shuffle, block_size=4)
    assert fresh.order.window_list(idx[::3]) == want[::3]  # scattered: one by one
    assert fresh.order.window_list([idx[0]]) == want[:1]
    assert not fresh.order._blocks  # no order block was computed
    batch = fresh.get_batch(idx)
    assert batch["input_ids"].tolist() == ds.get_batch(idx)["input_ids"].tolist()
