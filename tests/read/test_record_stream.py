"""RecordStream in one process: ranges, formats, order, resume, bad input, start-up reads."""

from __future__ import annotations

import builtins
import gzip
import json
import random
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard

from shardwise.errors import ConfigError, InputError, StateError
from shardwise.read.records.pipeline import is_pad
from shardwise.read.records.pool import Reject
from shardwise.read.records.ranges import iter_range, plan_ranges, resolve_files
from shardwise.read.records.ranks import merge_states
from shardwise.read.records.stream import RecordStream
from shardwise.read.records.streams import StreamOrder
from shardwise.testing import assert_resumes_exactly, assert_same_global_order
from shardwise.world import World


def _line(i: int) -> bytes:
    return json.dumps({"id": i, "text": "w" * (i * 7919 % 53)}).encode()


def write_jsonl(path: Path, ids: range | list[int]) -> Path:
    path.write_bytes(b"".join(_line(i) + b"\n" for i in ids))
    return path


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """3000 records over five files of every kind: plain, gz, zst, Parquet, Arrow stream."""
    d = tmp_path_factory.mktemp("records")
    write_jsonl(d / "a.jsonl", range(0, 1200))
    (d / "b.jsonl.gz").write_bytes(gzip.compress(b"".join(_line(i) + b"\n"
                                                          for i in range(1200, 1500))))
    (d / "c.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(
        b"".join(_line(i) + b"\n" for i in range(1500, 1800))))
    table = pa.table({"id": list(range(1800, 2400)),
                      "text": ["p" * (i % 11) for i in range(1800, 2400)]})
    pq.write_table(table, d / "d.parquet", row_group_size=100)
    arrow = pa.table({"id": list(range(2400, 3000)), "text": ["a"] * 600})
    with pa.ipc.new_stream(str(d / "e.arrow"), arrow.schema) as w:  # what datasets writes
        for batch in arrow.to_batches(max_chunksize=64):
            w.write_batch(batch)
    return {"dir": d, "sources": [str(d / "*.json*"), str(d / "d.parquet"),
                                  str(d / "e.arrow")], "n": 3000}


def make(corpus: dict[str, Any], **kw: Any) -> RecordStream:
    opts: dict[str, Any] = {"seed": 5, "streams": 8, "range_bytes": 4000,
                            "shuffle_buffer": 32}
    opts.update(kw)
    return RecordStream(corpus["sources"], **opts)


def ids(examples: list[Any]) -> list[int | None]:
    return [None if is_pad(x) else x["id"] for x in examples]


def test_ranges_are_aligned_by_their_reader(tmp_path: Path) -> None:
    """The module docstring's worked example."""
    p = tmp_path / "x.jsonl"
    p.write_bytes(b"aaaa\nbbbbbbbbb\ncc\ndddd\n")
    plan = plan_ranges(resolve_files([str(p)]), range_bytes=10, n_streams=1)
    assert plan.start.tolist() == [0, 10, 20] and plan.stop.tolist() == [10, 20, 23]
    got = [[(raw, pos) for raw, pos, _, _ in iter_range(plan, k)] for k in range(plan.n)]
    assert got == [[(b"aaaa", 0), (b"bbbbbbbbb", 5)], [(b"cc", 15), (b"dddd", 18)], []]
    # resuming inside a range continues from the byte offset
    assert [raw for raw, *_ in iter_range(plan, 1, 18, 1)] == [b"dddd"]


def test_ranges_of_streams_as_in_the_docstring(tmp_path: Path) -> None:
    p = tmp_path / "ten.jsonl"
    p.write_bytes(b"x" * 100)
    plan = plan_ranges(resolve_files([str(p)]), range_bytes=10, n_streams=4)
    order = StreamOrder(plan, n_streams=4, seed=0, shuffle=True, buffer_size=8)
    assert [order.ranges(s, 0) for s in range(4)] == [[1, 2, 0], [3, 4, 9], [8, 7], [5, 6]]


def test_order_is_pinned(tmp_path: Path) -> None:
    """A change of this order (ORDER_VERSION 1) must be deliberate."""
    p = write_jsonl(tmp_path / "g.jsonl", range(1000))
    rs = RecordStream([str(p)], seed=1234, streams=4, range_bytes=2000, shuffle_buffer=16)
    assert ids(rs.get_next_batch(24)) == [211, 166, 850, 810, 219, 172, 853, 807, 214, 170,
                                          848, 815, 221, 173, 845, 809, 213, 169, 856, 822,
                                          206, 182, 854, 819]


def test_streams_cross_epochs_together_as_in_the_docstring(tmp_path: Path) -> None:
    """records/pipeline.py's worked example: stream 0 holds a b c, stream 1 holds x.
    Version 1 gave a x b x c x a x (x four times before c's epoch ended)."""
    p = tmp_path / "wk.jsonl"
    p.write_bytes(b"".join(json.dumps({"id": i, "pad": "x" * 380}).encode() + b"\n"
                           for i in range(4)))  # ranges [0, 1024) and [1024, 1604)
    rs = RecordStream([str(p)], streams=2, shuffle=False, range_bytes=1024)
    assert ids(rs.get_next_batch(8)) == [0, 3, 1, 2, 0, 3, 1, 2]
    state = rs.state_dict()
    assert state["extra"]["order_version"] == 2
    assert {s: (v["epoch"], v["epoch_consumed"]) for s, v in state["extra"]["streams"].items()
            } == {"0": (1, 3), "1": (1, 1)}
    old = json.loads(json.dumps(state))
    old["extra"]["order_version"] = old["config"]["order_version"] = 1
    with pytest.raises(StateError, match="order_version: state has 1, this reader has 2"):
        RecordStream([str(p)], streams=2, shuffle=False, range_bytes=1024).load_state_dict(old)


def test_unaligned_epochs_keep_order_version_1(tmp_path: Path, corpus: dict[str, Any]) -> None:
    """align_epochs=False: each stream's epochs its own, the global order independent of
    the world size across epoch ends too, and an all-rejecting map_fn still raises."""
    p = tmp_path / "wk.jsonl"
    p.write_bytes(b"".join(json.dumps({"id": i, "pad": "x" * 380}).encode() + b"\n"
                           for i in range(4)))
    rs = RecordStream([str(p)], streams=2, shuffle=False, range_bytes=1024, align_epochs=False)
    assert ids(rs.get_next_batch(8)) == [0, 3, 1, 3, 2, 3, 0, 3]
    assert rs.state_dict()["extra"]["order_version"] == 1
    ref = ids(make(corpus, align_epochs=False).get_next_batch(5000))
    k = random.Random(3).randrange(2500, 4000)  # past the first stream's epoch end
    one = make(corpus, align_epochs=False)
    one.get_next_batch(k)
    tail, _ = _rank_rows(corpus, 4, 150, one.state_dict(), align_epochs=False)
    for r in range(4):
        assert tail[r] == [ref[i] for i in range(k, 5000) if i % 4 == r][:150]
    with pytest.raises(ConfigError, match="every one was rejected"):
        RecordStream([str(p)], streams=2, range_bytes=1024, align_epochs=False,
                     map_fn=lambda rec: rec if rec["id"] == 0 else None).get_next_batch(9)


def test_arrow_file_format_is_read_too(tmp_path: Path) -> None:
    table = pa.table({"id": list(range(300))})
    with pa.ipc.new_file(str(tmp_path / "f.arrow"), table.schema) as w:
        for batch in table.to_batches(max_chunksize=70):
            w.write_batch(batch)
    rs = RecordStream([str(tmp_path / "f.arrow")], streams=1, epochs=1, shuffle_buffer=8)
    assert sorted(ids(list(rs))) == list(range(300))  # type: ignore[type-var]
    with pytest.raises(ConfigError, match="text_mode reads lines"):
        RecordStream([str(tmp_path / "f.arrow")], streams=1, text_mode=True)


def test_one_pass_reads_every_record_once(corpus: dict[str, Any]) -> None:
    rs = make(corpus, epochs=1)
    got = ids(list(rs))
    real = [i for i in got if i is not None]
    assert sorted(real) == list(range(corpus["n"]))
    assert len(got) % 8 == 0  # padded to whole rounds of the 8 streams
    assert rs.get_next_batch(4) == [] and list(rs) == []


def test_each_epoch_reads_every_record_once(corpus: dict[str, Any]) -> None:
    rs = make(corpus, epochs=3)
    counts = Counter(i for i in ids(list(rs)) if i is not None)
    assert set(counts) == set(range(corpus["n"])) and set(counts.values()) == {3}


def test_order_is_shuffled_and_reshuffles_reproducibly(corpus: dict[str, Any]) -> None:
    first = ids(make(corpus).get_next_batch(400))
    assert first == ids(make(corpus).get_next_batch(400))
    assert first != sorted(first)
    rs = make(corpus)
    rs.set_epoch(epoch=2)
    two = ids(rs.get_next_batch(400))
    rs.set_epoch(epoch=2)
    assert ids(rs.get_next_batch(400)) == two != first
    assert ids(make(corpus, seed=6).get_next_batch(400)) != first


def test_no_shuffle_one_stream_reads_in_file_order(tmp_path: Path) -> None:
    p = write_jsonl(tmp_path / "s.jsonl", range(500))
    rs = RecordStream([str(p)], streams=1, shuffle=False, range_bytes=1000, epochs=1)
    assert ids(list(rs)) == list(range(500))


class Batches:
    """``get_next_batch`` as an iterable of ``{"id": array}`` batches, for the
    :mod:`shardwise.testing` helpers."""

    def __init__(self, rs: RecordStream, size: int) -> None:
        self.rs, self.size = rs, size

    def __iter__(self) -> Any:
        while True:
            yield {"id": np.array(ids(self.rs.get_next_batch(self.size)), dtype=np.int64)}

    def state_dict(self) -> dict[str, Any]:
        return self.rs.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.rs.load_state_dict(state)


def _double(rec: dict[str, Any]) -> dict[str, Any]:
    return {"id": rec["id"], "twice": 2 * rec["id"]}


def test_same_global_order_for_world_sizes_and_workers(corpus: dict[str, Any]) -> None:
    assert_same_global_order(lambda w: Batches(make(corpus, world=w), 1),
                             world_sizes=[1, 2, 4, 8], steps=800, key="id")
    plain = [x["twice"] for x in make(corpus, map_fn=_double).get_next_batch(3500)]
    with make(corpus, map_fn=_double, num_workers=2) as rs:
        assert [x["twice"] for x in rs.get_next_batch(3500)] == plain


def _rank_rows(corpus: dict[str, Any], R: int, n: int, state: dict[str, Any] | None = None,
               **kw: Any) -> tuple[list[list[int | None]], list[dict[str, Any]]]:
    """Each of R simulated ranks' next n ids (after ``state``) and its state afterwards."""
    out, states = [], []
    for r in range(R):
        rs = make(corpus, world=World(r, R), **kw)
        if state is not None:
            rs.load_state_dict(json.loads(json.dumps(state)))
        out.append(ids(rs.get_next_batch(n)))
        states.append(rs.state_dict())
    return out, states


@pytest.mark.parametrize("R", [3, 8])
def test_world_sizes_that_do_not_divide_the_streams_keep_the_order(
        corpus: dict[str, Any], R: int) -> None:
    """Levanter's rule against R* = 4: rank r of R takes global i ≡ r (mod R), reading the
    streams it shares with other ranks; exact resume from any of them into any other."""
    assert_same_global_order(lambda w: Batches(make(corpus, streams=4, world=w), 1),
                             world_sizes=[1, R], steps=600, key="id")
    full = ids(list(make(corpus, streams=4, epochs=1)))  # one pass, padded
    per, _ = _rank_rows(corpus, R, len(full), streams=4, epochs=1)
    for r in range(R):
        mine = [x for x in full[r::R] if x is not None]
        assert [x for x in per[r] if x is not None] == mine
    ref = ids(make(corpus, streams=4).get_next_batch(1300))
    one = make(corpus, streams=4)
    one.get_next_batch(301)
    tail, states = _rank_rows(corpus, R, 40, one.state_dict(), streams=4)
    for r in range(R):
        assert tail[r] == [ref[i] for i in range(301, 1300) if i % R == r][:40]
    merged = merge_states(states)  # the ranks sharing a stream agree on its position
    at = 301 + 40 * R
    back, _ = _rank_rows(corpus, 2, 50, merged, streams=4)
    for r in range(2):
        assert back[r] == [ref[i] for i in range(at, 1300) if i % 2 == r][:50]


@pytest.mark.parametrize("workers", [0, 2])
def test_resume_at_random_points_is_exact(corpus: dict[str, Any], workers: int) -> None:
    points = sorted(random.Random(workers).sample(range(1, 60), 5))
    assert_resumes_exactly(lambda: Batches(make(corpus, num_workers=workers), 37),
                           steps=60, stop_points=points, key="id")


def test_resume_under_another_world_size(corpus: dict[str, Any]) -> None:
    ref = ids(make(corpus).get_next_batch(6000))
    k = random.Random(1).randrange(200, 1000)  # before any stream has run out
    one = make(corpus)
    one.get_next_batch(k)
    state = json.loads(json.dumps(one.state_dict()))
    for world in (2, 4):
        tail, _ = _rank_rows(corpus, world, 150, state)
        for r in range(world):
            assert tail[r] == [ref[i] for i in range(k, 6000) if i % world == r][:150]
    # back from 4 ranks to 2: the ranks' states merged into one
    quarter = []
    for r in range(4):
        rs = make(corpus, world=World(r, 4))
        rs.get_next_batch(250)
        quarter.append(rs.state_dict())
    merged = merge_states(quarter)
    assert merged["consumed"] == 1000
    rs = make(corpus, world=World(1, 2))
    rs.load_state_dict(merged)
    assert ids(rs.get_next_batch(200)) == [ref[i] for i in range(1000, 6000) if i % 2 == 1][:200]


def test_resume_across_epochs_under_the_same_world_size(corpus: dict[str, Any]) -> None:
    """Past the first stream's epoch end each world size has its own order (each rank
    crosses epochs with its own streams); resuming it is exact."""
    for R in (1, 2):
        k = random.Random(R).randrange(2500, 3500) // R
        ref, _ = _rank_rows(corpus, R, k + 300)
        _, states = _rank_rows(corpus, R, k)
        tail, _ = _rank_rows(corpus, R, 300, merge_states(states))
        assert all(tail[r] == ref[r][k: k + 300] for r in range(R))


def test_one_epoch_is_every_record_once_across_streams(corpus: dict[str, Any]) -> None:
    """Endless mode: the streams cross each epoch together, so the first n examples are
    the n records once each, and so are the next n (version 1 repeated and missed some)."""
    n = corpus["n"]
    rs = make(corpus)
    for _ in range(2):
        assert sorted(ids(rs.get_next_batch(n))) == list(range(n))  # type: ignore[type-var]
    for r in range(2):  # each of 2 ranks: its streams' records of each epoch once
        sets = []
        for e in range(2):
            one = make(corpus, world=World(r, 2), epochs=1)
            one.set_epoch(e)
            sets.append(sorted(x for x in ids(list(one)) if x is not None))  # type: ignore[type-var]
        got = ids(make(corpus, world=World(r, 2)).get_next_batch(len(sets[0]) + len(sets[1])))
        assert sorted(got[:len(sets[0])]) == sets[0]  # type: ignore[type-var]
        assert sorted(got[len(sets[0]):]) == sets[1]  # type: ignore[type-var]


@pytest.mark.parametrize("epochs", [None, 1])
def test_a_map_fn_that_rejects_everything_raises_with_counts(
        tmp_path: Path, epochs: int | None) -> None:
    p = write_jsonl(tmp_path / "r.jsonl", range(300))
    rs = RecordStream([str(p)], streams=4, range_bytes=1000, epochs=epochs,
                      map_fn=lambda rec: Reject("too_long") if rec["id"] % 2 else None)
    with pytest.raises(ConfigError, match=r"streams \[0, 1, 2, 3\] read 300 records in "
                                          r"epoch 0 and produced no example: every one was "
                                          r"rejected \(rejected: 150, too_long: 150\)"):
        rs.get_next_batch(4)
    fine = RecordStream([str(p)], streams=4, range_bytes=1000, epochs=epochs,
                        map_fn=lambda rec: rec if rec["id"] == 7 else None)
    assert ids(fine.get_next_batch(3))[:1] == [7]


def test_all_ranks_state_needs_torch_distributed(corpus: dict[str, Any],
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    solo = make(corpus)
    solo.get_next_batch(30)
    assert solo.state_dict(all_ranks=True) == solo.state_dict()  # world size 1: local
    half = make(corpus, world=World(1, 2))
    half.get_next_batch(15)
    monkeypatch.delitem(sys.modules, "torch.distributed", raising=False)
    with pytest.raises(ConfigError, match="init_process_group.*merge_states"):
        half.state_dict(all_ranks=True)
    assert half.state_dict()["extra"]["streams"].keys() == {"1", "3", "5", "7"}


def test_all_ranks_state_refuses_an_uninitialised_process_group(
        corpus: dict[str, Any]) -> None:
    dist = pytest.importorskip("torch.distributed")
    assert not dist.is_initialized()
    with pytest.raises(ConfigError, match="world size 2.*not initialised.*merge_states"):
        make(corpus, world=World(0, 2)).state_dict(all_ranks=True)


def test_state_mismatches_are_refused_by_name(corpus: dict[str, Any]) -> None:
    rs = make(corpus)
    rs.get_next_batch(50)
    state = rs.state_dict()
    with pytest.raises(StateError, match="seed: state has 5, this reader has 6"):
        make(corpus, seed=6).load_state_dict(state)
    with pytest.raises(StateError, match="shuffle_buffer"):
        make(corpus, shuffle_buffer=8).load_state_dict(state)
    half = make(corpus, world=World(1, 2))
    half.get_next_batch(10)
    with pytest.raises(StateError, match=r"missing \[0, 2, 4, 6\].*merge_states"):
        make(corpus).load_state_dict(half.state_dict())
    bad = json.loads(json.dumps(state))
    bad["extra"]["streams"]["3"]["draws"] = -1
    with pytest.raises(StateError, match="extra.streams.3.draws"):
        make(corpus).load_state_dict(bad)
    bad["extra"]["streams"]["3"]["draws"] = 0
    bad["extra"]["streams"]["3"]["buffer"][0] = [10**6, 0, 0]
    with pytest.raises(StateError, match=r"extra.streams.3.buffer\[0\]: range 1000000"):
        make(corpus).load_state_dict(bad)


def test_state_counts_may_be_numpy_integers(corpus: dict[str, Any]) -> None:
    rs = make(corpus, epochs=2)
    rs.get_next_batch(30)
    state = json.loads(json.dumps(rs.state_dict()))
    want = ids(rs.get_next_batch(20))
    for pos in state["extra"]["streams"].values():
        for k in ("epoch", "range", "line", "draws", "consumed"):
            pos[k] = np.int64(pos[k])
        pos["stop_epoch"] = np.int32(pos["stop_epoch"])
        pos["buffer"] = [[np.int64(x) for x in w] for w in pos["buffer"]]
    back = make(corpus, epochs=2)
    back.load_state_dict(dict(state, consumed=np.int64(state["consumed"])))
    assert ids(back.get_next_batch(20)) == want
    json.dumps(back.state_dict())  # plain JSON again
    state["extra"]["streams"]["3"]["epoch"] = 2
    with pytest.raises(StateError, match="epoch 2 is past the end of this run"):
        make(corpus, epochs=2).load_state_dict(state)
    state["extra"]["streams"]["3"]["epoch"] = True
    with pytest.raises(StateError, match="epoch must be an integer"):
        make(corpus, epochs=2).load_state_dict(state)
    fresh, same = make(corpus), make(corpus)
    fresh.set_epoch(np.int64(1))
    same.set_epoch(1)
    assert ids(fresh.get_next_batch(np.int64(5))) == ids(same.get_next_batch(5))
    with pytest.raises(ConfigError, match="n must be an integer count"):
        fresh.get_next_batch(2.5)


def test_single_pass_pads_so_ranks_take_equal_steps(corpus: dict[str, Any]) -> None:
    full = ids(list(make(corpus, epochs=1)))
    ranks = [make(corpus, epochs=1, world=World(r, 4)) for r in range(4)]
    per = [ids(list(rs)) for rs in ranks]
    for r in range(4):  # real examples sit at their global positions on every rank
        mine = [full[i] for i in range(r, len(full), 4)]
        assert [x for x in per[r] if x is not None] == [x for x in mine if x is not None]
    steps = []
    for r in range(4):  # eval_batches: padded batches until every rank is done
        rs = make(corpus, epochs=1, world=World(r, 4))
        done_at = len(per[r]) // 16 + (len(per[r]) % 16 > 0)
        longest = max(len(p) for p in per) // 16 + 1
        flags = iter([False] * longest + [True])
        batches = list(rs.eval_batches(16, all_done=lambda local, f=flags: next(f)))
        assert all(len(b) == 16 for b in batches) and len(batches) == longest
        assert all(is_pad(x) for b in batches[done_at:] for x in b)
        steps.append(len(batches))
    assert len(set(steps)) == 1


def test_text_mode_yields_lines(tmp_path: Path) -> None:
    p = tmp_path / "t.txt.jsonl"
    p.write_bytes(b"first prompt\nsecond, not json\r\nthird")
    rs = RecordStream([str(p)], text_mode=True, streams=1, epochs=1)
    assert sorted(rs) == ["first prompt", "second, not json", "third"]


def _bad_corpus(path: Path, bad: dict[int, bytes], n: int = 2000) -> Path:
    lines = [bad.get(i, _line(i)) for i in range(1, n + 1)]
    path.write_bytes(b"\n".join(lines) + b"\n")
    return path


@pytest.mark.parametrize("suffix", [".jsonl", ".jsonl.gz"])
def test_bad_line_raises_naming_file_and_line(tmp_path: Path, suffix: str) -> None:
    p = _bad_corpus(tmp_path / "plain.jsonl", {1500: b'{"id": 1500, "text": "unterminated'})
    if suffix == ".jsonl.gz":
        p = tmp_path / "bad.jsonl.gz"
        p.write_bytes(gzip.compress((tmp_path / "plain.jsonl").read_bytes()))
    rs = RecordStream([str(p)], streams=2, range_bytes=2000, shuffle_buffer=4, epochs=1)
    with pytest.raises(InputError, match=f"{p}:1500: invalid JSON") as e:
        list(rs)
    assert e.value.line == 1500 and e.value.reason == "invalid_json"


def _picky(rec: dict[str, Any]) -> Any:
    if rec["id"] == 1234:
        raise KeyError("boom")
    if rec["id"] % 100 == 0:
        return None
    if rec["id"] % 100 == 1:
        return Reject("too_long")
    return rec


@pytest.mark.parametrize("workers", [0, 2])
def test_map_fn_errors_name_file_and_line(tmp_path: Path, workers: int) -> None:
    p = _bad_corpus(tmp_path / "m.jsonl", {})
    rs = RecordStream([str(p)], map_fn=_picky, streams=2, range_bytes=2000, num_workers=workers)
    with pytest.raises(InputError, match=f"{p}:1234: map_fn raised KeyError"):
        list(rs)
    rs.close()


def test_skip_counts_bad_records_by_reason(tmp_path: Path) -> None:
    bad = {300: b"{broken", 900: b"", 901: b"[1, 2]", 1700: b'{"id": "caf\xe9"}',
           1800: b"{also broken"}
    p = _bad_corpus(tmp_path / "s.jsonl", bad)
    rs = RecordStream([str(p)], map_fn=_picky, streams=4, range_bytes=2000, epochs=1,
                      on_error="skip", num_workers=2)
    got = [i for i in ids(list(rs)) if i is not None]
    rs.close()
    expect = [i for i in range(1, 2001) if i not in bad and i != 1234 and i % 100 > 1]
    assert sorted(got) == expect
    rejected = sum(1 for i in range(1, 2001) if i not in bad and i % 100 == 0)
    too_long = sum(1 for i in range(1, 2001) if i not in bad and i % 100 == 1)
    assert rs.errors == {"empty_line": 1, "invalid_json": 2, "map_error": 1, "not_object": 1,
                         "rejected": rejected, "too_long": too_long, "undecodable": 1}


class CountingFile:
    """A file proxy that counts read calls and bytes (for the start-up test)."""

    def __init__(self, f: Any, log: dict[str, int]) -> None:
        self._f, self._log = f, log

    def _count(self, data: bytes) -> bytes:
        self._log["reads"] += 1
        self._log["bytes"] += len(data)
        return data

    def read(self, *a: Any) -> bytes:
        return self._count(self._f.read(*a))

    def read1(self, *a: Any) -> bytes:
        return self._count(self._f.read1(*a))

    def readline(self, *a: Any) -> bytes:
        return self._count(self._f.readline(*a))

    def __enter__(self) -> CountingFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self._f.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._f, name)


def _startup_reads(path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[dict[str, int], ...]:
    real_open = builtins.open
    log = {"opens": 0, "reads": 0, "bytes": 0}

    def counting_open(file: Any, mode: str = "r", *a: Any, **kw: Any) -> Any:
        f = real_open(file, mode, *a, **kw)
        if str(file) == str(path):
            log["opens"] += 1
            return CountingFile(f, log)
        return f

    monkeypatch.setattr(builtins, "open", counting_open)
    rs = RecordStream([str(path)], range_bytes=4096, shuffle_buffer=64)
    built = dict(log)
    next(iter(rs))
    first = dict(log)
    monkeypatch.setattr(builtins, "open", real_open)
    return built, first


def test_startup_reads_do_not_grow_with_the_file(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    small = write_jsonl(tmp_path / "small.jsonl", range(4000))
    big = tmp_path / "big.jsonl"
    with open(big, "wb") as f:
        for _ in range(100):
            f.write(small.read_bytes())
    built_s, first_s = _startup_reads(small, monkeypatch)
    built_b, first_b = _startup_reads(big, monkeypatch)
    assert built_s == built_b == {"opens": 0, "reads": 0, "bytes": 0}  # os.stat only
    print(first_s, first_b)
    assert first_b["opens"] == first_s["opens"] <= 8  # two per range: align, then read
    assert first_b["reads"] <= first_s["reads"] + 2
    assert first_b["bytes"] <= 2 * first_s["bytes"] < big.stat().st_size // 50


def test_hf_dataset_through_its_arrow_files(tmp_path: Path) -> None:
    datasets = pytest.importorskip("datasets")
    ds = datasets.Dataset.from_dict({"id": list(range(500)), "text": ["t"] * 500})
    ds.save_to_disk(str(tmp_path / "saved"), max_shard_size="4KB")
    loaded = datasets.load_from_disk(str(tmp_path / "saved"))
    for source in (loaded, str(tmp_path / "saved")):
        rs = RecordStream(source, streams=2, epochs=1)
        assert sorted(i for i in ids(list(rs)) if i is not None) == list(range(500))
    with pytest.raises(ConfigError, match="flatten_indices"):
        RecordStream(loaded.select([3, 1, 2]), streams=1)


def test_a_saved_dataset_reads_without_datasets(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """A save_to_disk folder is read through its state.json: the library is not needed."""
    import datasets

    ds = datasets.Dataset.from_dict({"id": list(range(40)), "text": ["t"] * 40})
    ds.save_to_disk(str(tmp_path / "saved"), max_shard_size="1KB")
    monkeypatch.setitem(sys.modules, "datasets", None)  # as if not installed
    rs = RecordStream(str(tmp_path / "saved"), streams=2, epochs=1)
    assert sorted(i for i in ids(list(rs)) if i is not None) == list(range(40))
    (tmp_path / "saved" / "state.json").write_text("{}")
    with pytest.raises(ConfigError, match=r"state\.json.*_data_files"):
        RecordStream(str(tmp_path / "saved"))


def test_bind_sets_the_world_before_the_first_read(corpus: dict[str, Any]) -> None:
    """A reader made before the data-parallel layout is known binds its World late."""
    want = [ids(make(corpus, world=World(r, 2)).get_next_batch(40)) for r in range(2)]
    for r in range(2):
        rs = make(corpus)
        rs.bind(World(r, 2))
        assert rs.local_streams == sorted(World(r, 2).streams(8))
        assert ids(rs.get_next_batch(40)) == want[r]
        rs.bind(World(r, 2))  # the same world again: nothing changes
        with pytest.raises(ConfigError, match=r"already read as rank \d of 2; bind the world "
                                              "before the first"):
            rs.bind(World(0, 4))
    one = make(corpus)  # a loaded state is restarted under the bound world
    one.get_next_batch(100)
    late = make(corpus)
    late.load_state_dict(one.state_dict())
    late.bind(World(1, 4))
    ref = ids(make(corpus).get_next_batch(400))
    assert ids(late.get_next_batch(20)) == [ref[i] for i in range(100, 400) if i % 4 == 1][:20]


@pytest.mark.parametrize("world", [World(2, 3), World(5, 8)])
def test_shared_stream_ranks_resume_exactly(corpus: dict[str, Any], world: World) -> None:
    assert_resumes_exactly(lambda: Batches(make(corpus, streams=4, world=world), 7),
                           steps=30, stop_points=[1, 4, 13, 29], key="id")


def test_dataloader_workers_that_do_not_divide_the_streams(corpus: dict[str, Any]) -> None:
    """2 DataLoader workers against R* = 3: worker w serves i ≡ w (mod 2) reading every
    stream, and the DataLoader's round robin over them restores the one-process order."""
    from torch.utils.data import DataLoader

    ref = ids(make(corpus, streams=3).get_next_batch(600))
    rs = make(corpus, streams=3)
    it = iter(DataLoader(rs, batch_size=None, num_workers=2))  # type: ignore[arg-type]
    assert ids([next(it) for _ in range(600)]) == ref
