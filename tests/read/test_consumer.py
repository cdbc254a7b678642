"""The sequential consumer: batch sizes, reproducible per-epoch shuffle, exact resume at
random points, prefetch that never leaks into the state, reader errors."""

from __future__ import annotations

import json
import random
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from shardwise.errors import ConfigError, StateError
from shardwise.read.records.consumer import ResumableSource, SequentialConsumer

N = 50


class ListReader:
    """The smallest ResumableSource: a list and an index; counts how far it was read."""

    def __init__(self, items: list[Any], fail_at: int | None = None) -> None:
        self.items, self.pos, self.fail_at = items, 0, fail_at
        self.read_up_to = 0
        self.epoch: int | None = None

    def __iter__(self) -> Iterator[Any]:
        while self.pos < len(self.items):
            if self.pos == self.fail_at:
                raise OSError(f"disk error at {self.pos}")
            self.pos += 1
            self.read_up_to = max(self.read_up_to, self.pos)
            yield self.items[self.pos - 1]

    def state_dict(self) -> dict[str, Any]:
        return {"pos": self.pos}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.pos = state["pos"]


class EpochReader(ListReader):
    """A reader with its own per-epoch order (reversed on odd epochs)."""

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self) -> Iterator[Any]:
        for x in super().__iter__():
            yield -x if self.epoch and self.epoch % 2 else x


def make(**kw: Any) -> SequentialConsumer:
    kw.setdefault("shuffle_block", 8)
    kw.setdefault("seed", 11)
    return SequentialConsumer(lambda: ListReader(list(range(N))), **kw)


def drain(c: SequentialConsumer, n: int = 7) -> list[int]:
    out: list[int] = []
    while batch := c.get_next_batch(n):
        out += batch
    return out


def test_batch_sizes_and_end_of_pass() -> None:
    with make(batch_size=6) as c:
        sizes = [len(c.get_next_batch()) for _ in range(8)]
        assert sizes == [6] * 8
        assert len(c.get_next_batch(5)) == 2 and c.get_next_batch(5) == []
        assert c.consumed == N
    with make(batch_size=6, cycle=True) as c:
        assert all(len(c.get_next_batch()) == 6 for _ in range(20))  # 120 > 2 epochs
        assert c.epoch == 2
    with make() as c, pytest.raises(ConfigError, match="n must be >= 1"):
        c.get_next_batch(0)


def test_prefetch_is_sized_from_the_consumers() -> None:
    assert make(batch_size=4, consumers=8).prefetch == 64
    assert make(batch_size=4, consumers=8, prefetch=10).prefetch == 10
    reader = ListReader(list(range(1000)))
    with SequentialConsumer(reader, batch_size=4, consumers=2) as c:
        c.get_next_batch()
        deadline = threading.Event()
        deadline.wait(0.2)  # let the prefetch thread fill its buffer
        assert reader.read_up_to <= 4 + 16 + 1  # received + 2 × 2 × 4 queued + 1 in hand


def test_shuffle_is_a_reproducible_permutation_per_epoch() -> None:
    orders: dict[int, list[int]] = {}
    for epoch in (0, 1, 2, 1):
        with make() as c:
            c.set_epoch(epoch)
            got = drain(c)
        assert sorted(got) == list(range(N))
        if epoch in orders:
            assert got == orders[epoch]
        orders[epoch] = got
    assert orders[0] != orders[1] != orders[2] != list(range(N))
    # blocks stay blocks: the shuffle never moves an example across a block boundary
    assert sorted(orders[1][:8]) == list(range(8))
    # the order does not depend on the consumers, batch size or prefetch
    with make(batch_size=3, consumers=5, prefetch=2) as c:
        c.set_epoch(1)
        assert drain(c, 13) == orders[1]


def test_exact_resume_at_random_points_with_shuffle_on() -> None:
    rng = random.Random(0)
    with make(cycle=True) as c:
        c.set_epoch(1)
        reference = [x for _ in range(30) for x in c.get_next_batch(5)]  # 3 epochs
    for _ in range(12):
        cut = rng.randrange(0, 150)
        with make(cycle=True, batch_size=rng.randrange(1, 9), consumers=rng.randrange(1, 4)
                  ) as first:
            first.set_epoch(1)
            head: list[int] = []
            while len(head) < cut:
                head += first.get_next_batch(min(rng.randrange(1, 9), cut - len(head)))
            state = json.loads(json.dumps(first.state_dict()))
        assert state["consumed"] == cut  # what the caller received, not what was prefetched
        with make(cycle=True) as second:
            second.load_state_dict(state)
            tail = [x for _ in range(150 - cut) for x in second.get_next_batch(1)]
        assert head + tail == reference, cut


def test_resume_rereads_at_most_one_shuffle_block() -> None:
    with make() as c:
        c.get_next_batch(21)
        state = c.state_dict()
    reader = ListReader(list(range(N)))
    with SequentialConsumer(reader, shuffle_block=8, seed=11, prefetch=1) as c:
        c.load_state_dict(state)
        assert state["extra"]["source"] == {"pos": 16}  # block 2 starts at example 16
        c.get_next_batch(1)
        assert reader.read_up_to <= 16 + 8 + 8 + 1


def test_object_reader_restarts_from_its_origin_and_honours_set_epoch() -> None:
    reader = EpochReader(list(range(1, 11)))
    with SequentialConsumer(reader, batch_size=4) as c:  # no consumer-side shuffle
        assert drain(c) == list(range(1, 11))
        c.set_epoch(1)  # allowed: the reader reorders itself per epoch
        assert drain(c) == [-x for x in range(1, 11)]
        state = c.state_dict()
        c.set_epoch(2)
        assert c.get_next_batch(3) == [1, 2, 3]
        c.load_state_dict(state)
        assert c.get_next_batch(3) == []  # the state was at the end of epoch 1
    with SequentialConsumer(lambda: ListReader([1, 2])) as c, pytest.raises(
            ConfigError, match="would not change the order"):
        c.set_epoch(1)
    assert isinstance(reader, ResumableSource)


def test_state_of_another_configuration_is_refused() -> None:
    with make() as c:
        c.get_next_batch(3)
        state = c.state_dict()
    with make(seed=12) as other, pytest.raises(StateError, match="seed: state has 11"):
        other.load_state_dict(state)


def test_reader_errors_surface_where_the_data_would_have_been() -> None:
    with SequentialConsumer(lambda: ListReader(list(range(10)), fail_at=7)) as c:
        assert c.get_next_batch(5) == [0, 1, 2, 3, 4]
        assert c.get_next_batch(5) == [5, 6]
        with pytest.raises(OSError, match="disk error at 7"):
            c.get_next_batch(5)
        with pytest.raises(OSError, match="disk error at 7"):
            c.get_next_batch(5)
        assert c.state_dict()["consumed"] == 7
    with pytest.raises(ConfigError, match="source must have"):
        SequentialConsumer(42)  # type: ignore[arg-type]


def test_numpy_counts_are_counts_and_a_damaged_position_is_refused() -> None:
    with make() as c:
        c.get_next_batch(np.int64(3))
        state = json.loads(json.dumps(c.state_dict()))
        want = c.get_next_batch(4)
    np_state = dict(state, consumed=np.int64(3),
                    extra={**state["extra"], **{k: np.int64(state["extra"][k])
                                                for k in ("epoch", "window", "offset")}})
    with make() as c:
        c.load_state_dict(np_state)
        assert c.get_next_batch(4) == want
        assert type(c.state_dict()["consumed"]) is int
    for extra, match in (({"offset": 8}, "past the end of a shuffle block of 8"),
                         ({"window": -1}, "extra.window must be >= 0"),
                         ({"epoch": 0.5}, "extra.epoch must be an integer")):
        with make() as c, pytest.raises(StateError, match=match):
            c.load_state_dict(dict(state, extra={**state["extra"], **extra}))
    with make() as c, pytest.raises(StateError, match="needs extra.source"):
        c.load_state_dict(dict(state, extra={"epoch": 0, "window": 0, "offset": 0}))


def _records_reader(tmp_path: Any, n: int) -> Any:
    from shardwise.read.records.stream import RecordStream

    path = tmp_path / "ten.jsonl"
    path.write_text("".join(json.dumps({"id": i}) + "\n" for i in range(n)))
    return RecordStream([str(path)], streams=1, epochs=1, shuffle=False)


@pytest.mark.parametrize("reader", ["RecordStream", "SequentialConsumer"])
def test_the_last_batch_is_short_unless_padded_in_every_reader(reader: str, tmp_path: Any
                                                               ) -> None:
    """One rule for ``get_next_batch`` at the end of a finite run: what is left, then
    ``[]``; ``pad=True`` fills the last batch up to ``n`` with pad examples."""
    from shardwise.read.records.pipeline import is_pad

    def make_reader() -> Any:
        return (_records_reader(tmp_path, 10) if reader == "RecordStream"
                else SequentialConsumer(ListReader([{"id": i} for i in range(10)])))

    short, padded = make_reader(), make_reader()
    assert [len(short.get_next_batch(4)) for _ in range(4)] == [4, 4, 2, 0]
    batches = [padded.get_next_batch(4, pad=True) for _ in range(4)]
    assert [len(b) for b in batches] == [4, 4, 4, 0]
    assert [is_pad(x) for x in batches[2]] == [False, False, True, True]
    assert [x["id"] for b in batches for x in b if not is_pad(x)] == list(range(10))
    for r in (short, padded):
        r.close()


def test_shuffle_window_is_the_deprecated_name_of_shuffle_block() -> None:
    with pytest.warns(DeprecationWarning, match="use shuffle_block="):
        old = SequentialConsumer(ListReader(list(range(N))), seed=3, shuffle_window=8)
    with old, SequentialConsumer(ListReader(list(range(N))), seed=3, shuffle_block=8) as new:
        assert drain(old) == drain(new)
        assert old.state_dict()["fingerprint"] == new.state_dict()["fingerprint"]
    with pytest.raises(ConfigError, match="pass only shuffle_block="):
        SequentialConsumer(ListReader([]), shuffle_block=4, shuffle_window=8)


@pytest.mark.parametrize("reader", ["RecordStream", "SequentialConsumer"])
def test_shuffle_is_the_deprecated_name_of_set_epoch(tmp_path: Path, reader: str) -> None:
    def make_reader() -> Any:
        return (_records_reader(tmp_path, 10) if reader == "RecordStream"
                else SequentialConsumer(ListReader([{"id": i} for i in range(10)]), seed=1,
                                        shuffle_block=4))

    old, new = make_reader(), make_reader()
    with pytest.warns(DeprecationWarning, match=r"shuffle\(\) is deprecated: use set_epoch\(\)"):
        old.shuffle(1)
    new.set_epoch(1)
    assert old.get_next_batch(10) == new.get_next_batch(10)
    assert old.state_dict() == new.state_dict()
    for r in (old, new):
        r.close()
