"""StreamDataset in one process: the global order across world sizes, block-local packing,
single-pass padding, locality, options and the torch DataLoader."""

from __future__ import annotations

from itertools import islice
from pathlib import Path

import numpy as np
import pytest
from tests.cachefactory import make_cache, sample_docs

import shardwise as sw
from shardwise.errors import ConfigError, ProducerTimeoutError
from shardwise.plan.stream import shuffled_stream_chunks
from shardwise.read.stream.dataset import StreamDataset
from shardwise.testing import assert_same_global_order

S = 4  # R*


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """3 sources, 52 chunks of 3 documents (uneven lengths), 6k tokens."""
    root = tmp_path_factory.mktemp("stream") / "cache"
    return make_cache(root, [sample_docs(60, seed=1), sample_docs(50, seed=2),
                             sample_docs(45, seed=3)], chunk_docs=3)


def reader(cache_dir: Path, world: sw.World, **kw: object) -> StreamDataset:
    opts: dict[str, object] = dict(seq_len=16, streams=S, seed=7, block_chunks=3)
    opts.update(kw)
    return StreamDataset(cache_dir, world=world, **opts)  # type: ignore[arg-type]


def rows(ds: StreamDataset, n: int | None = None, key: str = "input_ids") -> np.ndarray:
    it = iter(ds) if n is None else islice(ds, n)
    return np.stack([e[key] for e in it])


def interleave(per_rank: list[np.ndarray]) -> np.ndarray:
    """Rank r's j-th row is global row j·R + r."""
    R = len(per_rank)
    n = min(len(p) for p in per_rank) * R
    return np.stack([per_rank[i % R][i // R] for i in range(n)])


def expected_blocks(cache: sw.Cache, s: int, epoch: int, *, seed: int = 7,
                    block_chunks: int = 3, L: int = 16) -> list[list[tuple[int, ...]]]:
    """An independent oracle: stream s's windows per block, from the plan's chunk order."""
    order = shuffled_stream_chunks(s, len(cache.chunks), S, seed=seed, epoch=epoch,
                                   block_chunks=block_chunks)
    out = []
    for b in range(0, len(order), block_chunks):
        toks = np.concatenate([cache.tokens(int(c)) for c in order[b:b + block_chunks]])
        n = max(len(toks) - 1, 0) // L
        out.append([tuple(toks[w * L: w * L + L + 1].tolist()) for w in range(n)])
    return out


def test_same_global_order_for_world_sizes_1_2_4(cache_dir: Path) -> None:
    ref = rows(reader(cache_dir, sw.World(0, 1)), 480)
    for R in (2, 4):
        per_rank = [rows(reader(cache_dir, sw.World(r, R)), 480 // R) for r in range(R)]
        assert np.array_equal(interleave(per_rank), ref), f"world size {R} diverges"


def test_every_window_once_per_epoch_block_by_block(cache_dir: Path) -> None:
    cache = sw.open_cache(cache_dir)
    blocks = {(s, e): expected_blocks(cache, s, e) for s in range(S) for e in range(2)}
    per_epoch = {s: sum(len(b) for b in blocks[s, 0]) for s in range(S)}
    n = 2 * max(per_epoch.values()) * S
    examples = rows(reader(cache_dir, sw.World(0, 1)), n, key="labels")
    inputs = rows(reader(cache_dir, sw.World(0, 1)), n)
    windows = np.concatenate([inputs, examples[:, -1:]], axis=1)
    for s in range(S):
        mine = windows[s::S]  # stream s's examples, in order
        for e in range(2):
            k = e * per_epoch[s]
            for block in blocks[s, e]:  # served block after block, each a shuffle of it
                got = [tuple(w.tolist()) for w in mine[k: k + len(block)]]
                assert sorted(got) == sorted(block)
                k += len(block)
        first = [tuple(w.tolist()) for w in mine[: per_epoch[s]]]
        second = [tuple(w.tolist()) for w in mine[per_epoch[s]: 2 * per_epoch[s]]]
        assert first != second, "each epoch has its own shuffle"


def test_single_pass_pads_every_stream_to_the_longest(cache_dir: Path) -> None:
    cache = sw.open_cache(cache_dir)
    per_epoch = [sum(len(b) for b in expected_blocks(cache, s, 0)) for s in range(S)]
    assert len(set(per_epoch)) > 1, "the test wants streams of unequal length"
    longest = max(per_epoch)
    per_rank = [list(reader(cache_dir, sw.World(r, 2), epochs=1)) for r in range(2)]
    assert [len(p) for p in per_rank] == [longest * S // 2] * 2
    ex = [per_rank[i % 2][i // 2] for i in range(longest * S)]
    for s in range(S):
        mine = ex[s::S]
        real, pad = mine[: per_epoch[s]], mine[per_epoch[s]:]
        assert all(e["loss_mask"].all() for e in real)
        assert all(not e["loss_mask"].any() and not e["input_ids"].any() for e in pad)
        got = sorted(tuple(e["input_ids"].tolist()) for e in real)
        want = sorted(w[:-1] for b in expected_blocks(cache, s, 0) for w in b)
        assert got == want  # nothing repeated, nothing dropped


def test_two_epochs_then_end(cache_dir: Path) -> None:
    one = rows(reader(cache_dir, sw.World(0, 1), epochs=1))
    two = rows(reader(cache_dir, sw.World(0, 1), epochs=2))
    assert len(two) == 2 * len(one)
    forever = rows(reader(cache_dir, sw.World(0, 1)), len(two))
    cache = sw.open_cache(cache_dir)
    per_epoch = [sum(len(b) for b in expected_blocks(cache, s, 0)) for s in range(S)]
    for s in range(S):  # a stream's real examples match the cycling reader's two epochs
        n = 2 * per_epoch[s]
        assert np.array_equal(two[s::S][:n], forever[s::S][:n])


@pytest.mark.parametrize("R", [1, 2, 4])
def test_a_rank_opens_only_its_own_chunks(cache_dir: Path, R: int) -> None:
    for r in range(R):
        ds = reader(cache_dir, sw.World(r, R), epochs=1)
        list(ds)
        stems = [c.stem for c in ds.cache.chunks]
        opened = {stems.index(stem) for stem in ds.cache.opened}
        assert opened == set(ds.opened)
        assert opened and all(c % S % R == r for c in opened)
        assert all(n == 1 for n in ds.opened.values()), "one pass reads each chunk once"


@pytest.mark.parametrize("R", [3, 8])
def test_world_sizes_that_do_not_divide_the_streams_keep_the_global_order(
        cache_dir: Path, R: int) -> None:
    """Levanter's rule: R=3 and R=8 against R*=4 give R=1's order (rank r takes global
    j·R + r), reading shared streams; in one pass every rank stops with the order."""
    assert_same_global_order(lambda w: reader(cache_dir, w), world_sizes=[1, R], steps=40 * R)
    one_pass = rows(reader(cache_dir, sw.World(0, 1), epochs=1))
    per_rank = [rows(reader(cache_dir, sw.World(r, R), epochs=1)) for r in range(R)]
    assert sum(len(p) for p in per_rank) == len(one_pass)
    merged = interleave(per_rank)
    assert np.array_equal(merged, one_pass[: len(merged)])
    if R == 8:  # ranks r and r + 4 share stream r % 4 and read only its chunks
        ds = reader(cache_dir, sw.World(5, 8), epochs=1)
        list(ds)
        assert ds.opened and all(c % S == 1 for c in ds.opened)


def test_options_are_checked(cache_dir: Path) -> None:
    with pytest.raises(ConfigError, match="seq_len"):
        reader(cache_dir, sw.World(0, 1), seq_len=0)
    with pytest.raises(ConfigError, match="cannot cycle"):
        reader(cache_dir, sw.World(0, 1), seq_len=10_000)
    assert len(list(reader(cache_dir, sw.World(0, 1), seq_len=10_000, epochs=1))) == 0


def test_batches_are_the_examples_stacked(cache_dir: Path) -> None:
    single = rows(reader(cache_dir, sw.World(1, 2)), 50)
    ds = reader(cache_dir, sw.World(1, 2), batch_size=8)
    batches = list(islice(ds, 6))
    assert all(b["input_ids"].shape == (8, 16) for b in batches)
    assert np.array_equal(np.concatenate([b["input_ids"] for b in batches]), single[:48])
    assert ds.consumed == 48 * 2
    last = list(reader(cache_dir, sw.World(0, 1), batch_size=64, epochs=1))
    assert sum(len(b["input_ids"]) for b in last) == len(rows(reader(cache_dir,
                                                                       sw.World(0, 1),
                                                                       epochs=1)))


def test_drop_last_false_keeps_every_token(cache_dir: Path) -> None:
    ex = list(reader(cache_dir, sw.World(0, 1), epochs=1, drop_last=False, seq_len=16))
    kept = sum(int(e["loss_mask"].sum()) for e in ex)
    dropped = list(reader(cache_dir, sw.World(0, 1), epochs=1, seq_len=16))
    assert kept > sum(int(e["loss_mask"].sum()) for e in dropped)
    cache = sw.open_cache(cache_dir)
    labels = 0
    for s in range(S):  # every token but the first of each block is a label exactly once
        toks = [int(cache.chunks[c].tokens) for c in range(s, len(cache.chunks), S)]
        labels += sum(max(sum(toks[b:b + 3]) - 1, 0) for b in range(0, len(toks), 3))
    assert kept == labels


def test_torch_dataloader_batch_size_none(cache_dir: Path) -> None:
    torch = pytest.importorskip("torch")
    from torch.utils.data import DataLoader

    want = rows(reader(cache_dir, sw.World(0, 2)), 20)
    ds = reader(cache_dir, sw.World(0, 2))
    got = [b["input_ids"] for b in islice(DataLoader(ds, batch_size=None), 20)]
    assert all(isinstance(g, torch.Tensor) for g in got)
    assert np.array_equal(np.stack([g.numpy() for g in got]), want)
    assert ds.state_dict()["consumed"] == 40
    batched = reader(cache_dir, sw.World(0, 2), batch_size=4)
    b = next(iter(DataLoader(batched, batch_size=None)))
    assert b["input_ids"].shape == (4, 16) and np.array_equal(b["input_ids"].numpy(), want[:4])
    workers = iter(DataLoader(reader(cache_dir, sw.World(0, 1)), batch_size=None,
                              num_workers=1))
    with pytest.raises(ConfigError, match="main process"):
        next(workers)
    workers._shutdown_workers()  # type: ignore[attr-defined]


def test_unfinished_cache_needs_follow_and_times_out(tmp_path: Path) -> None:
    root = make_cache(tmp_path / "c", [sample_docs(40, seed=4)], chunk_docs=2,
                      unfinished_last=True)
    with pytest.raises(ConfigError, match="follow=True"):
        StreamDataset(root, seq_len=8, streams=2, world=sw.World(0, 1))
    ds = StreamDataset(root, seq_len=8, streams=2, world=sw.World(0, 1), follow=True,
                       block_chunks=2, timeout=0.4, poll_interval=0.05)
    got = 0
    with pytest.raises(ProducerTimeoutError, match=r"stream \d waited .* nothing new"):
        for _ in ds:
            got += 1
    assert got > 0, "the final blocks were served before the wait"
    assert ds.stats()["producer_wait_s"] >= 0.4
    with pytest.raises(ProducerTimeoutError, match="no shardwise cache appeared"):
        StreamDataset(tmp_path / "nothing", seq_len=8, streams=2, world=sw.World(0, 1),
                      follow=True, timeout=0.2, poll_interval=0.05)


def test_close_stops_the_thread(cache_dir: Path) -> None:
    import threading

    before = set(threading.enumerate())  # other tests' readers are not this one's concern
    with reader(cache_dir, sw.World(0, 1), prefetch_chunks=8) as ds:
        it = iter(ds)
        next(it)
        mine = [t for t in set(threading.enumerate()) - before
                if t.name.startswith("shardwise")]
        assert mine
    assert not any(t.is_alive() for t in mine)
    assert ds.chunk_cache.stats()["bytes"] == 0
    with pytest.raises(RuntimeError, match="call iter"):
        for _ in range(10_000):
            next(it)


def test_drops_count_the_block_tails_no_window_holds(cache_dir: Path) -> None:
    cache = sw.open_cache(cache_dir)
    blocks = [sum(int(cache.chunks[c].tokens) for c in range(s, len(cache.chunks), S)[b:b + 3])
              for s in range(S) for b in range(0, len(range(s, len(cache.chunks), S)), 3)]
    short = sum(1 for t in blocks if 0 < t <= 16)  # no window: all dropped, one label less
    assert short  # than padding would give (its first token is no label)
    ds = reader(cache_dir, sw.World(0, 1), epochs=1, seq_len=16)
    (drop,) = ds.drops()
    dropped_labels = sum(int(e["loss_mask"].sum()) for e in reader(
        cache_dir, sw.World(0, 1), epochs=1, drop_last=False, seq_len=16)) - sum(
        int(e["loss_mask"].sum()) for e in ds)
    assert drop.count == dropped_labels + short and drop.unit == "tokens per epoch"
    assert f"dropped {drop.count:,} tokens per epoch" in repr(ds)
    assert reader(cache_dir, sw.World(0, 1), epochs=1, drop_last=False).drops() == []


def test_the_reader_reads_the_blocks_its_order_yields(cache_dir: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """One walker: the reader asks the stream order for each block (its chunks and window
    order), so an order that changes a block changes what the reader serves, example for
    example as ``locate`` says; a finite run pads by the order's one rule; and reading
    writes nothing into the dataset but its position."""
    from shardwise.read.orders.stream import StreamOrder

    block = StreamOrder.block

    def reversed_block(self: StreamOrder, *args: object, **kw: object) -> object:
        chunks, sizes, order = block(self, *args, **kw)  # type: ignore[arg-type]
        return chunks, sizes, order[::-1].copy()

    monkeypatch.setattr(StreamOrder, "block", reversed_block)
    ds = reader(cache_dir, sw.World(0, 1), epochs=1)
    got = rows(ds, key="input_ids")
    assert len(got) == ds._end() == S * ds.order.pad_to()
    runs = ds.locate(list(range(len(got))))
    flat = ds.cache.gather(runs[:3])
    at = 0
    for i, k in enumerate(runs.tokens.tolist()):
        want = np.zeros(16, dtype=np.int64)
        want[: max(k - 1, 0)] = flat[at: at + k][:16]
        np.testing.assert_array_equal(got[i], want)
        at += k
    before = set(vars(ds))
    for _ in islice(iter(ds), 3):
        pass
    assert set(vars(ds)) == before
