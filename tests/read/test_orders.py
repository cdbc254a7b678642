"""Orders are parts: a new order is one class in one file (here: windows last to first),
and the reader, ``ds[i]``, the loader (and its resume), ``trace`` and the resume contract
accept it. Every order answers ``locate(indices)``: the runs of stored tokens (chunk,
offset, length) behind those examples, which are exactly what the reader returns."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

import shardwise as sw
from shardwise.checkpoint import fingerprint
from shardwise.errors import ConfigError, StateError
from shardwise.plan.block_shuffle import BlockShuffle
from shardwise.read.config import ReadConfig
from shardwise.read.orders import OrderOptions, WindowOrder, register_order
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


@dataclass(frozen=True)
class Rotation(OrderOptions):
    offset: int = 0


class Rotated(WindowOrder):
    """Windows rotated by an option of its own: adding it touches no line outside this
    file (on ef5652e it took a field in TokenConfig and in StreamConfig, each kept out of
    the state at its default so saved states still matched, and a test's table)."""

    name, Options = "rotated", Rotation
    options: Rotation

    def window_block(self, epoch: int, positions: npt.NDArray[np.int64]
                     ) -> npt.NDArray[np.int64]:
        return (positions + self.options.offset) % self.n


register_order(Rotated)


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


def _block(shuffle: str, **options: int) -> dict[str, int]:
    """The block order's options, for the block order only (they are its own)."""
    return options if shuffle == "block" else {}


def _stream(cache_dir: Path) -> npt.NDArray[np.int64]:
    cache = sw.open_cache(cache_dir)
    return np.concatenate([cache.tokens(i) for i in range(len(cache.chunks))]).astype(np.int64)


def _gathered(ds: Any, idx: list[int]) -> npt.NDArray[np.int64]:
    """The tokens of ``ds.locate(idx)``, read straight from the chunk maps."""
    runs = ds.locate(idx)
    return np.concatenate([np.zeros(0, np.int64)] + [ds.cache.tokens(c)[o: o + n] for c, o, n
                                                     in zip(runs.chunk.tolist(),
                                                            runs.offset.tolist(),
                                                            runs.length.tolist(), strict=True)]
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
                         seed=4, shuffle=shuffle, drop_last=False,
                         **_block(shuffle, block_size=4, blocks_per_group=2))
    n = len(ds)
    rng = np.random.default_rng(0)
    for idx in ([*range(8)], rng.integers(0, 3 * n, 9).tolist(), [n - 1, 0, n],
                rng.permutation(n)[:9].tolist(), [n - 1, 3, 0], [n + 2]):  # one epoch
        batch = ds.get_batch(idx)
        want = np.concatenate([np.append(batch["input_ids"][r], batch["labels"][r, -1])
                               [: int(batch["loss_mask"][r].sum()) + 1] for r in range(len(idx))])
        assert _gathered(ds, idx).tolist() == want.tolist()


@pytest.mark.parametrize("shuffle", ["none", "document"])
@pytest.mark.parametrize("chunks", ["chunks", "one chunk"])
def test_a_micro_batch_of_consecutive_windows_is_read_as_one_span(
        cache_dir: Path, one_chunk_dir: Path, shuffle: str, chunks: str) -> None:
    """A sampler's micro-batch (consecutive indices) of an order whose neighbours are
    neighbouring windows is located as their one span (``step = seq_len``): each stored
    token once, neighbours sharing one, across chunk edges and up to the stream's short
    last window; its rows, document bounds included, are those of the same examples read
    one by one (the indices reversed: no span)."""
    ds = sw.TokenDataset(cache_dir if chunks == "chunks" else one_chunk_dir, seq_len=SEQ,
                         seed=4, shuffle=shuffle, drop_last=False, reset_position_ids=True,
                         cu_seqlens=True, world=sw.World.single())
    n = len(ds)
    for first, k in ((0, 8), (n // 2, 8), (n - 5, 5)):
        idx = list(range(first, first + k))
        span = ds.order.locate(idx)
        assert span.step == SEQ
        assert int(span.length.sum()) == int(span.tokens.sum()) - (k - 1)
        got, one_by_one = ds.get_batch(idx), ds.get_batch(idx[::-1])
        assert got.keys() == one_by_one.keys()
        for key in got.keys() - {"cu_seqlens"}:
            want = one_by_one[key] if key == "max_seqlen" else one_by_one[key][::-1]
            assert np.array_equal(got[key], want), (key, first)
        assert (_row_bounds(got["cu_seqlens"], SEQ)  # rows in the other order
                == _row_bounds(one_by_one["cu_seqlens"], SEQ)[::-1])
    assert ds.order.locate([3]).step == 0 and ds.order.locate(np.arange(3, 6)).step == 0


def _row_bounds(cu: npt.NDArray[np.int32], L: int) -> list[list[int]]:
    """``cu_seqlens`` of a batch as each row's document starts inside it."""
    rows: list[list[int]] = []
    for x in cu.tolist()[:-1]:
        if x % L == 0:
            rows.append([])
        else:
            rows[-1].append(x % L)
    return rows


def test_an_order_with_an_option_of_its_own(cache_dir: Path) -> None:
    """The option is an argument of every reader, held by that order's states only."""
    ds = sw.TokenDataset(cache_dir, seq_len=SEQ, shuffle="rotated", offset=3)
    n = len(ds)
    assert ds.windows(np.arange(n)).tolist() == [(i + 3) % n for i in range(n)]
    assert ds.state_config()["offset"] == 3
    assert "offset" not in sw.TokenDataset(cache_dir, seq_len=SEQ).state_config()
    st = _stream_ds(cache_dir, "rotated", offset=1, epochs=1)
    assert len(list(st)) > 0 and st.state_config()["offset"] == 1


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

    ds = sw.TokenDataset(cache_dir, seq_len=SEQ, seed=5, shuffle=shuffle,
                         **_block(shuffle, block_size=4))
    idx = np.random.default_rng(1).integers(0, 3 * len(ds), 40).tolist()
    want = ds.windows(idx).tolist()
    monkeypatch.setattr(windows, "CACHE_WINDOWS", 0)
    fresh = sw.TokenDataset(cache_dir, seq_len=SEQ, seed=5, shuffle=shuffle,
                            **_block(shuffle, block_size=4))
    assert fresh.order.window_list(idx[::3]) == want[::3]  # scattered: one by one
    assert fresh.order.window_list([idx[0]]) == want[:1]
    assert not fresh.order.derived.get()["blocks"]  # no order block was computed
    batch = fresh.get_batch(idx)
    assert batch["input_ids"].tolist() == ds.get_batch(idx)["input_ids"].tolist()


# -- stream placement and blends answer locate too, and take the new order ----------------
def _window_of(example: dict[str, Any]) -> list[int]:
    """An example's real tokens: its inputs and the last real label (none: padding)."""
    valid = int(np.asarray(example["loss_mask"]).sum())
    if not valid:
        return []
    return [*np.asarray(example["input_ids"])[:valid].tolist(),
            int(np.asarray(example["labels"])[valid - 1])]


def _stream_ds(cache_dir: Path, shuffle: str, **kw: Any) -> Any:
    return sw.StreamDataset(cache_dir, seq_len=SEQ, streams=2, seed=3, world=sw.World(0, 1),
                            block_chunks=2, shuffle=shuffle, **kw)


@pytest.mark.parametrize("shuffle", ["window", "none", "reversed"])
def test_stream_locate_gives_the_tokens_of_each_example(cache_dir: Path, shuffle: str
                                                        ) -> None:
    """A StreamDataset's global example ``i`` (rank 0 of 1 reads them all, in order) is
    the tokens of ``locate([i])``; padding locates none; all at once, the same runs."""
    ds = _stream_ds(cache_dir, shuffle, epochs=1, drop_last=False)
    examples = list(ds)
    assert any(not _window_of(e) for e in examples)  # padding: the streams' lengths differ
    for i, example in enumerate(examples):
        assert _gathered(ds, [i]).tolist() == _window_of(example)
    every = list(range(len(examples)))
    assert _gathered(ds, every).tolist() == [t for e in examples for t in _window_of(e)]
    with pytest.raises(IndexError, match="'end'"):
        ds.locate([len(examples)])


def test_a_new_order_orders_the_windows_of_each_stream_block(cache_dir: Path) -> None:
    """``shuffle="reversed"`` serves each block's windows last to first: the examples of
    every block are those of the stored order (``"none"``), reversed."""
    stored, rev = (_by_block(_stream_ds(cache_dir, shuffle, epochs=1))
                   for shuffle in ("none", "reversed"))
    assert stored.keys() == rev.keys() and any(len(v) > 1 for v in stored.values())
    assert all(rev[k] == stored[k][::-1] for k in stored)
    assert _stream_ds(cache_dir, "reversed").state_config()["shuffle"] == "reversed"
    assert "shuffle" not in _stream_ds(cache_dir, "window").state_config()  # as before it
    with pytest.raises(ConfigError, match="stream placement orders each block's windows") as e:
        _stream_ds(cache_dir, "document")
    offered = str(e.value).rsplit("use one of", 1)[1]
    assert "'document'" not in offered and "'block'" in offered and "'reversed'" in offered


def test_the_block_order_with_its_own_options_orders_stream_blocks(cache_dir: Path) -> None:
    """``shuffle="block"`` under stream placement (it failed before: StreamConfig had no
    ``block_size``): each block's windows in the block order of that block, over the
    options given, which the stream's state holds (and resumes by)."""
    opts = {"block_size": 2, "blocks_per_group": 1}
    stored, shuffled = (_by_block(_stream_ds(cache_dir, shuffle, epochs=1, **kw))
                        for shuffle, kw in (("none", {}), ("block", opts)))
    assert stored.keys() == shuffled.keys()
    moved = 0
    for key, windows in stored.items():
        order = BlockShuffle(len(windows), 3, key[1], 2, 1)(np.arange(len(windows)))
        assert shuffled[key] == [windows[w] for w in order.tolist()]
        moved += order.tolist() != sorted(order.tolist())
    assert moved  # some block is not in stored order
    ds = _stream_ds(cache_dir, "block", **opts)
    assert {k: ds.state_config()[k] for k in ("shuffle", *opts)} == {"shuffle": "block", **opts}
    assert_resumes_exactly(lambda: _stream_ds(cache_dir, "block", batch_size=2, **opts),
                           steps=6)
    with pytest.raises(ConfigError, match=r"\['block_size'\] is an option of shuffle='block'"):
        _stream_ds(cache_dir, "none", block_size=2)


def _by_block(ds: Any) -> dict[tuple[int, ...], list[list[int]]]:
    out: dict[tuple[int, ...], list[list[int]]] = {}
    for i, example in enumerate(ds):
        where = ds.order.where(i)
        if not isinstance(where, str):
            out.setdefault(where[:3], []).append(_window_of(example))
    return out


@pytest.mark.parametrize("shuffle", ["window", "none", "document", "reversed"])
def test_a_state_holds_only_what_its_order_reads_and_old_states_resume(
        cache_dir: Path, shuffle: str) -> None:
    """Only the block order's state holds ``block_size``; a state saved before (every
    TokenDataset state held it, unread) still resumes, by its config or its fingerprint
    alone, and the dataset's fingerprint (what a blend's state records) is as it was."""
    def make() -> Any:
        return loader(sw.TokenDataset(cache_dir, seq_len=SEQ, shuffle=shuffle),
                      global_batch_size=4, micro_batch_size=2, world=sw.World(0, 1))

    dl = make()
    batches = iter(dl)
    next(batches)
    state = dl.state_dict()
    assert not {"block_size", "blocks_per_group"} & set(state["config"])
    old_config = {**state["config"], "block_size": 64, "blocks_per_group": 8}
    old = {**state, "config": old_config, "fingerprint": fingerprint(old_config)}
    want = next(batches)["input_ids"].tolist()
    for saved in (old, {**old, "config": {}}):
        again = make()
        again.load_state_dict(saved)
        assert next(iter(again))["input_ids"].tolist() == want
    ds = dl.dataset
    assert ds.fingerprint == fingerprint({**ds.state_config(), "block_size": 64,
                                          "blocks_per_group": 8})
    as_written = sw.TokenDataset(cache_dir, seq_len=SEQ, shuffle=shuffle, block_size=64,
                                 blocks_per_group=8)  # what a read config held then
    assert as_written.state_config() == ds.state_config()
    with pytest.raises(StateError, match="shuffle"):
        make_block = loader(sw.TokenDataset(cache_dir, seq_len=SEQ, shuffle="block"),
                            global_batch_size=4, micro_batch_size=2, world=sw.World(0, 1))
        make_block.load_state_dict(old)


def test_a_blend_locates_prefetches_and_reads_through_its_sources_orders(
        cache_dir: Path, one_chunk_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``Blend.locate``: each example's source, its position there and that source's runs
    (its order's ``locate``: the new one, and the document order), which hold the tokens
    the blend reads; ``prefetch`` asks each source's cache for exactly those chunks."""
    parts = [sw.TokenDataset(cache_dir, seq_len=SEQ, seed=1, shuffle="reversed"),
             sw.TokenDataset(one_chunk_dir, seq_len=SEQ, seed=1, shuffle="document")]
    mix = sw.Blend(parts, [0.6, 0.4], seed=2)
    idx = np.random.default_rng(3).integers(0, 4 * len(mix), 12).tolist()
    where = mix.locate(idx)
    batch = mix.get_batch(idx)
    for j, ds in enumerate(parts):
        rows, located = np.flatnonzero(where.source == j), where.runs[j]
        assert rows.size and located is not None
        want = [t for r in rows.tolist() for t in _window_of({k: v[r] for k, v in
                                                               batch.items()})]
        assert np.concatenate([ds.cache.tokens(c)[o: o + n] for c, o, n in zip(
            located.chunk.tolist(), located.offset.tolist(), located.length.tolist(),
            strict=True)]).tolist() == want
        assert where.offset[rows].tolist() == mix.place(np.asarray(idx))[1][rows].tolist()
    asked: dict[int, list[int]] = {0: [], 1: []}
    for j, ds in enumerate(parts):
        monkeypatch.setattr(ds.cache.store, "prefetches", True)  # as a bucket store would
        monkeypatch.setattr(ds.cache, "prefetch", asked[j].extend)
    mix.prefetch(idx)
    assert {j: sorted(v) for j, v in asked.items()} == {
        j: sorted(where.runs[j].chunks()) for j in (0, 1)}  # type: ignore[union-attr]


@pytest.mark.parametrize("reader", ["stream", "tokens"])
def test_trace_names_a_new_orders_examples_in_a_stream_and_a_blend(
        cache_dir: Path, one_chunk_dir: Path, reader: str) -> None:
    """``trace`` of a read config with ``shuffle="reversed"`` under stream placement, and
    of a blend of two caches in that order: the pieces it names are the tokens read."""
    where: dict[str, Any] = ({"cache": str(cache_dir), "streams": 2, "block_chunks": 2}
                             if reader == "stream" else
                             {"blend": {"sources": {"a": str(cache_dir), "b": str(one_chunk_dir)},
                                        "weights": {"a": 0.5, "b": 0.5}}})
    cfg = ReadConfig.from_dict({**where, "reader": reader, "seq_len": SEQ, "seed": 0,
                                "shuffle": "reversed", "global_batch_size": 4,
                                "micro_batch_size": 2, "world_size": 1})
    ds, _ = cfg.build(rank=0)
    batches = (iter(ds) if reader == "stream" else
               iter(loader(ds, global_batch_size=4, micro_batch_size=2, world=sw.World(0, 1))))
    first = [next(batches), next(batches)]
    traced = Tracer(cfg, lines=False, ids=True).step(0).examples
    assert len(traced) == 4 and all(e.status == "data" for e in traced)
    for e in traced:
        b = first[e.micro_batch]
        assert [t for p in e.pieces for t in (p.ids or [])] == _window_of(
            {k: np.asarray(v)[e.row] for k, v in b.items()})
