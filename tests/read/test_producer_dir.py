"""External producer directories in one process: len semantics, waiting and timeouts,
bad lines, done markers, bounded memory, the resumable stream view."""

from __future__ import annotations

import json
import pickle
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from shardwise.errors import ConfigError, InputError, ProducerTimeoutError, StateError
from shardwise.read.external.producer_dir import (
    ProducerDirDataset,
    ProducerDirStream,
    chunk_indices,
    delete_finished,
    finished_by_all,
    publish_chunk,
    write_expected,
)
from shardwise.read.guard import check_sampler
from shardwise.read.records.consumer import SequentialConsumer
from shardwise.world import World


def open_dir(directory: Path, **kw: Any) -> ProducerDirDataset:
    """A reader with a short timeout and fast polling."""
    kw.setdefault("timeout", 5.0)
    kw.setdefault("poll_interval", 0.01)
    return ProducerDirDataset(directory, **kw)


def encode(rec: dict[str, Any]) -> dict[str, Any]:
    """A stand-in for a chat template: token ids and labels."""
    ids = [ord(ch) for ch in rec["text"]]
    return {"id": rec["id"], "input_ids": ids, "labels": [-100] + ids[1:]}


def records(c: int, n: int) -> list[dict[str, Any]]:
    return [{"id": f"{c}-{j}", "text": f"sample {c}/{j}"} for j in range(n)]


def produce(d: Path, counts: list[int], *, declare: str = "uniform") -> None:
    if declare == "uniform":
        write_expected(d, num_chunks=len(counts), records_per_chunk=max(counts))
    elif declare == "exact":
        write_expected(d, num_chunks=len(counts), records=counts)
    for c, n in enumerate(counts):
        publish_chunk(d, c, records(c, n))


def ids(items: Iterable[dict[str, Any]]) -> list[str]:
    return [x["id"] for x in items]


def test_len_is_this_ranks_declared_records_and_union_is_everything(tmp_path: Path) -> None:
    produce(tmp_path, [4] * 5)
    seen = []
    for r, want in ((0, 12), (1, 8)):  # rank 0 owns chunks 0, 2, 4; rank 1 owns 1, 3
        ds = open_dir(tmp_path, map_fn=encode, world=World(r, 2))
        assert len(ds) == want and list(ds.my_chunks()) == list(range(r, 5, 2))
        got = ids([ds[i] for i in range(len(ds))])
        assert {int(x.split("-")[0]) % 2 for x in got} == {r}
        seen += got
        with pytest.raises(IndexError, match="out of range"):
            ds[len(ds)]
    assert sorted(seen) == sorted(ids(records(c, 4)[j] for c in range(5) for j in range(4)))
    assert ds[0]["labels"][0] == -100


def test_totals_from_arguments_and_conflicts_with_expected(tmp_path: Path) -> None:
    for c in range(3):
        publish_chunk(tmp_path, c, records(c, 2))
    ds = open_dir(tmp_path, num_chunks=3, records_per_chunk=2)
    assert len(ds) == 6  # no _EXPECTED needed
    write_expected(tmp_path, num_chunks=3, records_per_chunk=3)
    with pytest.raises(ConfigError, match="records_per_chunk=2 was passed .* declares 3"):
        len(open_dir(tmp_path, records_per_chunk=2))
    with pytest.raises(ConfigError, match="pattern must contain"):
        ProducerDirDataset(tmp_path, pattern="chunk.jsonl")


def test_len_waits_for_the_declaration_then_times_out(tmp_path: Path) -> None:
    ds = ProducerDirDataset(tmp_path, timeout=0.3, poll_interval=0.01)
    t = time.monotonic()
    with pytest.raises(ProducerTimeoutError, match="_EXPECTED: waited .* producer's totals"):
        len(ds)
    assert time.monotonic() - t < 2.0
    late = threading.Timer(0.2, write_expected, (tmp_path,), {"num_chunks": 2,
                                                                "records": [3, 1]})
    late.start()
    assert len(open_dir(tmp_path)) == 4
    late.join()


def test_waits_for_a_chunk_and_times_out_with_a_clear_error(tmp_path: Path) -> None:
    write_expected(tmp_path, num_chunks=4, records_per_chunk=2)
    publish_chunk(tmp_path, 0, records(0, 2))
    ds = ProducerDirDataset(tmp_path, world=World(0, 2), timeout=0.5, poll_interval=0.01)
    assert ds[1]["id"] == "0-1"
    later = threading.Timer(0.2, publish_chunk, (tmp_path, 2, records(2, 2)))
    later.start()
    assert ds[2]["id"] == "2-0"  # waited for chunk 2
    later.join()
    ok = ProducerDirDataset(tmp_path, world=World(1, 2), timeout=0.4, poll_interval=0.01)
    t = time.monotonic()
    with pytest.raises(ProducerTimeoutError) as e:
        ok[0]
    assert 0.4 <= time.monotonic() - t < 2.0
    msg = str(e.value)
    assert "chunk_00001.jsonl: waited" in msg and "index % 2 == 1" in msg
    assert "2 chunks are published now (highest 2; 0 of this rank's)" in msg


def test_short_chunk_never_repeats_or_invents(tmp_path: Path) -> None:
    produce(tmp_path, [3, 3, 1])  # declared 3 per chunk, the last holds 1
    ds = open_dir(tmp_path)
    assert len(ds) == 9
    assert ids([ds[i] for i in range(7)]) == [f"{c}-{j}" for c in range(3)
                                              for j in range(3)][:7]
    for i in (7, 8):
        with pytest.raises(IndexError, match="chunk_00002.jsonl, which holds only 1"):
            ds[i]
    # exact per-chunk counts make len exact
    exact = tmp_path / "exact"
    exact.mkdir()
    produce(exact, [3, 3, 1], declare="exact")
    ds = open_dir(exact)
    assert len(ds) == 7 and ids([ds[i] for i in range(7)]) == ids(
        [x for c, n in enumerate([3, 3, 1]) for x in records(c, n)])


def test_chunk_with_more_records_than_declared_is_an_error(tmp_path: Path) -> None:
    write_expected(tmp_path, num_chunks=1, records_per_chunk=2)
    publish_chunk(tmp_path, 0, records(0, 3))
    with pytest.raises(InputError, match="holds 3 records but the producer declared 2"):
        open_dir(tmp_path)[0]


def test_bad_line_names_file_and_line(tmp_path: Path) -> None:
    write_expected(tmp_path, num_chunks=2, records_per_chunk=3)
    publish_chunk(tmp_path, 0, records(0, 3))
    (tmp_path / "chunk_00001.jsonl").write_bytes(b'{"id": "a", "text": "x"}\n'
                                                 b'{"id": "b", "text": "y"}\n{"id": oops\n')
    ds = open_dir(tmp_path, map_fn=encode)
    assert ds[2]["id"] == "0-2"
    with pytest.raises(InputError, match=r"chunk_00001\.jsonl:3: invalid JSON") as e:
        ds[3]
    assert e.value.line == 3 and e.value.path.endswith("chunk_00001.jsonl")
    (tmp_path / "chunk_00001.jsonl").write_bytes(b'{"id": "a", "text": "x"}\n{"id": "b"}\n')
    ds = open_dir(tmp_path, map_fn=encode)
    with pytest.raises(InputError, match=r"chunk_00001\.jsonl:2: map_fn raised KeyError") as e:
        ds[3]
    assert e.value.reason == "map_error"  # RecordStream's reason for the same failure


def test_encode_fn_is_the_deprecated_name_of_map_fn(tmp_path: Path) -> None:
    write_expected(tmp_path, num_chunks=1, records_per_chunk=3)
    publish_chunk(tmp_path, 0, records(0, 3))
    with pytest.warns(DeprecationWarning, match="use map_fn="):
        ds = open_dir(tmp_path, encode_fn=encode)
    assert ds[0] == open_dir(tmp_path, map_fn=encode)[0]
    with pytest.raises(ConfigError, match="pass only map_fn="):
        open_dir(tmp_path, encode_fn=encode, map_fn=lambda r: r)


def test_done_markers_let_the_producer_delete_finished_chunks(tmp_path: Path) -> None:
    produce(tmp_path, [2] * 4)
    ds = open_dir(tmp_path, world=World(1, 2))  # chunks 1, 3
    ds[0]
    assert not finished_by_all(tmp_path, 1, 2) and delete_finished(tmp_path, 2) == []
    ds[1]
    assert finished_by_all(tmp_path, 1, 2) and not finished_by_all(tmp_path, 0, 2)
    assert (tmp_path / "chunk_00001.jsonl.done.1").exists()
    assert delete_finished(tmp_path, 2) == [1]
    assert chunk_indices(tmp_path) == [0, 2, 3] and ds.loaded_chunks() == [3]  # prefetched
    assert not (tmp_path / "chunk_00001.jsonl.done.1").exists()
    quiet = open_dir(tmp_path, world=World(0, 2), done_marker=False)
    [quiet[i] for i in range(len(quiet))]
    assert not list(tmp_path.glob("*.done.*"))


def test_memory_holds_at_most_current_and_next_chunk(tmp_path: Path) -> None:
    produce(tmp_path, [5] * 12)
    ds = open_dir(tmp_path, world=World(0, 3))  # 4 chunks
    for i in range(len(ds)):
        ds[i]
        assert len(ds.loaded_chunks()) <= 2
    assert ds.peak_loaded_chunks == 2 and ds.chunks_loaded == 4
    assert ds.loaded_chunks() == []  # the last chunk was evicted after use
    st = ds.stream()
    for _ in st:
        assert len(ds.loaded_chunks()) <= 2
    assert ds.peak_loaded_chunks == 2


def test_stream_view_resumes_exactly_from_every_position(tmp_path: Path) -> None:
    produce(tmp_path, [3, 2, 4, 1, 3], declare="exact")

    def make() -> ProducerDirStream:
        return open_dir(tmp_path, world=World(1, 2), done_marker=False).stream()

    reference = ids(list(make()))
    assert reference == ["1-0", "1-1", "3-0"]
    everything = ids(list(open_dir(tmp_path, done_marker=False).stream()))
    assert len(everything) == 13
    for k in range(len(reference) + 1):
        first = make()
        it = iter(first)
        head = [next(it)["id"] for _ in range(k)]
        state = json.loads(json.dumps(first.state_dict()))
        again = make()
        again.load_state_dict(state)
        assert head + ids(list(again)) == reference
        assert state["consumed"] == k
    other = open_dir(tmp_path, world=World(0, 2)).stream()
    with pytest.raises(StateError, match="rank: state has 1, this reader has 0"):
        other.load_state_dict(make().state_dict())
    numpy = make()
    numpy.load_state_dict(dict(state, consumed=np.int64(1),
                               extra={"chunk": np.int64(1), "record": np.int32(1)}))
    assert ids(list(numpy)) == reference[1:]
    for extra, match in (({"chunk": 7, "record": 0}, "past the end of this rank's chunks"),
                         ({"chunk": 5, "record": 1}, "ends at chunk 5"),
                         ({"chunk": 2, "record": 0}, "not a position of rank 1 of 2"),
                         ({"chunk": 1, "record": "0"}, "extra.record must be an integer")):
        with pytest.raises(StateError, match=match):
            make().load_state_dict(dict(state, extra=extra))
    at_end = make()
    at_end.load_state_dict(dict(state, extra={"chunk": 5, "record": 0}))
    assert list(at_end) == []


def test_stream_ends_when_the_end_is_declared_late(tmp_path: Path) -> None:
    for c in range(3):
        publish_chunk(tmp_path, c, records(c, 2))
    ds = ProducerDirDataset(tmp_path, timeout=5.0, poll_interval=0.01)
    late = threading.Timer(0.2, write_expected, (tmp_path,), {"num_chunks": 3})
    late.start()
    assert len(list(ds.stream())) == 6
    late.join()


def test_stream_plugs_into_the_sequential_consumer(tmp_path: Path) -> None:
    produce(tmp_path, [4] * 6)

    def make() -> ProducerDirStream:
        return open_dir(tmp_path, world=World(0, 2), done_marker=False).stream()

    with SequentialConsumer(make, batch_size=5, shuffle_block=4, seed=2) as c:
        first = ids(c.get_next_batch()) + ids(c.get_next_batch(2))
        state = c.state_dict()
        rest = [x for b in c for x in ids(b)]
    assert sorted(first + rest) == sorted(ids([r for k in (0, 2, 4) for r in records(k, 4)]))
    with SequentialConsumer(make, batch_size=5, shuffle_block=4, seed=2) as c:
        c.load_state_dict(state)
        assert [x for b in c for x in ids(b)] == rest


def test_map_view_pickles_and_refuses_distributed_samplers(tmp_path: Path) -> None:
    from torch.utils.data import DataLoader, DistributedSampler

    produce(tmp_path, [3] * 4)
    ds = open_dir(tmp_path, map_fn=encode, world=World(0, 2))
    copy = pickle.loads(pickle.dumps(ds))
    assert copy[0] == ds[0] and ds.is_sharded
    dl: DataLoader[Any] = DataLoader(ds, batch_size=2, collate_fn=list)  # type: ignore[arg-type]
    check_sampler(dl)
    assert ids([x for b in dl for x in b]) == ["0-0", "0-1", "0-2", "2-0", "2-1", "2-2"]
    with pytest.raises(ConfigError, match="DistributedSampler splits the indices"):
        DistributedSampler(ds, num_replicas=2, rank=0)  # type: ignore[arg-type]


def test_set_epoch_is_accepted_and_keeps_the_producers_order(tmp_path: Path) -> None:
    """The hook every framework calls exists; a producer directory's order is the
    producer's, so every epoch reads the same records in the same order."""
    produce(tmp_path, [3] * 4)
    ds = open_dir(tmp_path, map_fn=encode, world=World(0, 2))
    first = ids([ds[i] for i in range(len(ds))])
    ds.set_epoch(3)
    assert ids([ds[i] for i in range(len(ds))]) == first
    with pytest.raises(ConfigError, match="epoch"):
        ds.set_epoch(-1)
