"""PackedSFT: rows hold every record once per epoch, labels never cross records, resume is
exact at any point, foreign states are refused."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardwise.errors import ConfigError, InputError, StateError
from shardwise.format.chunk import IGNORE_INDEX
from shardwise.read.compose.records import CacheRecords
from shardwise.read.compose.sft_pack import PackedSFT
from shardwise.testing import assert_resumes_exactly, take
from shardwise.world import World

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/
from cachefactory import make_cache, sample_docs  # noqa: E402


def make_records(n: int, seed: int = 0, max_len: int = 40) -> list[dict[str, Any]]:
    """Record ``r`` holds ids ``r*1000 + 1 ..``; its first half is prompt (-100 labels)."""
    rng = np.random.default_rng(seed)
    out = []
    for r, k in enumerate(rng.integers(1, max_len, size=n).tolist()):
        ids = np.arange(k, dtype=np.int64) + r * 1000 + 1
        labels = ids.copy()
        labels[: k // 2] = IGNORE_INDEX
        out.append({"input_ids": ids, "labels": labels})
    return out


def records_in(row: dict[str, np.ndarray]) -> list[int]:
    cu = row["cu_seqlens"]
    return [int(row["input_ids"][a]) // 1000 for a, b in zip(cu[:-1], cu[1:], strict=True)
            if row["input_ids"][a] != 0]


@pytest.mark.parametrize("seed", [None, 7])
def test_each_epoch_packs_every_record_once(seed: int | None) -> None:
    recs = make_records(150)
    rows = list(PackedSFT(recs, seq_len=64, group_size=32, seed=seed, epochs=2))
    seen = [r for row in rows for r in records_in(row)]
    half = len(seen) // 2
    assert sorted(seen[:half]) == sorted(seen[half:]) == list(range(150))
    for row in rows:
        ids, labels, cu, pos = (row[k] for k in ("input_ids", "labels", "cu_seqlens",
                                                 "position_ids"))
        assert ids.shape == labels.shape == pos.shape == (64,) and cu[-1] == 64
        for a, b in zip(cu[:-1], cu[1:], strict=True):
            assert (pos[a:b] == np.arange(b - a)).all()
            if ids[a] == 0:  # padding segment
                assert (labels[a:b] == IGNORE_INDEX).all() and (ids[a:b] == 0).all()
                continue
            rec = recs[int(ids[a]) // 1000]
            assert (ids[a:b] == rec["input_ids"]).all()
            # next-token targets inside the record; its last token predicts nothing (never
            # the next record's first)
            want = np.append(rec["labels"][1:], IGNORE_INDEX)
            assert (labels[a:b] == want).all()
        assert (row["loss_mask"] == (labels != IGNORE_INDEX)).all()
    if seed is not None:
        assert seen[:half] != seen[half:]  # epochs are reshuffled


def test_labels_default_to_the_loss_mask_or_all_tokens() -> None:
    recs = [{"input_ids": [5, 6, 7], "loss_mask": [0, 1, 1]}, {"input_ids": [8, 9]}]
    row = next(iter(PackedSFT(recs, seq_len=8)))
    assert row["input_ids"].tolist() == [5, 6, 7, 8, 9, 0, 0, 0]
    # next-token targets: 5 -> 6, 6 -> 7, 7 -> (end of record), 8 -> 9, 9 -> (end)
    assert row["labels"].tolist() == [6, 7, -100, 9, -100, -100, -100, -100]
    assert row["cu_seqlens"].tolist() == [0, 3, 5, 8]


@settings(max_examples=15, deadline=None)
@given(seed=st.none() | st.integers(0, 1000), group=st.integers(1, 40),
       stop=st.integers(0, 59))
def test_resume_is_exact_at_random_points(seed: int | None, group: int, stop: int) -> None:
    recs = make_records(90, seed=3)

    def make() -> PackedSFT:
        return PackedSFT(recs, seq_len=48, group_size=group, seed=seed, epochs=None)

    assert_resumes_exactly(make, steps=60, stop_points=[stop])
    assert_resumes_exactly(make, steps=60, stop_points=[stop], key="labels")


def test_state_is_position_and_refuses_other_configs() -> None:
    recs = make_records(60)
    rows = PackedSFT(recs, seq_len=64, group_size=16, seed=1)
    take(rows, 5)
    state = json.loads(json.dumps(rows.state_dict()))
    assert state["kind"] == "sft_pack" and state["consumed"] == 5
    assert set(state["extra"]) == {"epoch", "window", "bin"}
    with pytest.raises(StateError, match="seq_len"):
        PackedSFT(recs, seq_len=32, group_size=16, seed=1).load_state_dict(state)
    with pytest.raises(StateError, match="records"):
        PackedSFT(recs[:50], seq_len=64, group_size=16, seed=1).load_state_dict(state)
    bad = dict(state, extra={"epoch": 0, "window": 99, "bin": 0})
    with pytest.raises(StateError, match="outside"):
        PackedSFT(recs, seq_len=64, group_size=16, seed=1).load_state_dict(bad)


def test_state_counts_may_be_numpy_and_past_the_end_is_refused() -> None:
    recs = make_records(60)
    rows = PackedSFT(recs, seq_len=64, group_size=16, seed=1, epochs=1)
    take(rows, 5)
    state = json.loads(json.dumps(rows.state_dict()))
    want = take(rows, 2)
    back = PackedSFT(recs, seq_len=64, group_size=16, seed=1, epochs=1)
    back.load_state_dict(dict(state, consumed=np.int64(5),
                              extra={k: np.int64(v) for k, v in state["extra"].items()}))
    assert [r["input_ids"].tolist() for r in take(back, 2)] == [
        r["input_ids"].tolist() for r in want]
    assert type(back.state_dict()["extra"]["bin"]) is int
    end = PackedSFT(recs, seq_len=64, group_size=16, seed=1, epochs=1)
    total = len(list(end))  # a finished pass stops at epoch 1, group 0, bin 0
    assert end.state_dict()["extra"] == {"epoch": 1, "window": 0, "bin": 0}
    again = PackedSFT(recs, seq_len=64, group_size=16, seed=1, epochs=1)
    again.load_state_dict(end.state_dict())
    assert list(again) == [] and total > 0
    for extra, match in (({"epoch": 5, "window": 0, "bin": 0}, "past the end of this run"),
                         ({"epoch": 0, "window": 0, "bin": 10**6}, "past the end of that"),
                         ({"epoch": 0, "window": 0, "bin": 1.5}, "bin must be an integer"),
                         ({"epoch": 0, "window": True, "bin": 0}, "window must be")):
        with pytest.raises(StateError, match=match):
            again.load_state_dict(dict(state, extra=extra))


def test_overlong_and_bad_records() -> None:
    recs = make_records(10) + [{"input_ids": np.arange(100) + 1}]
    with pytest.raises(InputError, match="record 10 has 100 tokens"):
        list(PackedSFT(recs, seq_len=64))
    dropped = PackedSFT(recs, seq_len=64, overlong="drop")
    assert sorted(r for row in dropped for r in records_in(row)) == list(range(10))
    assert dropped.stats["dropped"] == 1
    assert "dropped 1 records: empty, or longer than seq_len" in repr(dropped)
    truncated = PackedSFT(recs, seq_len=64, overlong="truncate")
    assert any(row["cu_seqlens"].tolist() == [0, 64] for row in truncated)
    assert "dropped 36 tokens: cut from 1 records" in repr(truncated)
    with pytest.raises(InputError, match="no 'input_ids'"):
        list(PackedSFT([{"text": "x"}], seq_len=8))
    with pytest.raises(ConfigError, match="at least one record"):
        PackedSFT([], seq_len=8)
    with pytest.raises(ConfigError, match="nothing to pack"):
        list(PackedSFT([{"input_ids": []}], seq_len=8, epochs=None))


def test_window_is_the_deprecated_name_of_group_size() -> None:
    recs = [{"input_ids": list(range(1, 2 + i % 7))} for i in range(40)]
    with pytest.warns(DeprecationWarning, match="use group_size="):
        old = PackedSFT(recs, seq_len=16, window=8, seed=1)
    new = PackedSFT(recs, seq_len=16, group_size=8, seed=1)
    assert [r["input_ids"].tolist() for r in old] == [r["input_ids"].tolist() for r in new]
    assert old.state_dict() == new.state_dict()  # the fingerprint did not change
    with pytest.raises(ConfigError, match="pass only group_size="):
        PackedSFT(recs, seq_len=16, group_size=4, window=8)


# -- placement (issue 20): rank r of R serves rows p ≡ r (mod R) ------------------------------
def _key(row: dict[str, np.ndarray]) -> bytes:
    return bytes(row["input_ids"].tobytes())


@pytest.mark.parametrize("world", [2, 3])
def test_ranks_share_the_rows_once_and_end_together(world: int) -> None:
    """Every row of the one global order on exactly one rank, rank r's j-th being row
    j·R + r; a finite run ends every rank at the same count, the short ones padded."""
    recs = make_records(90, seed=3)
    rows = list(PackedSFT(recs, seq_len=64, group_size=16, seed=5, epochs=1))
    ranks = [list(PackedSFT(recs, seq_len=64, group_size=16, seed=5, epochs=1,
                            world=World(r, world))) for r in range(world)]
    assert {len(x) for x in ranks} == {-(-len(rows) // world)}
    for r, got in enumerate(ranks):
        for j, row in enumerate(got):
            p = j * world + r
            if p < len(rows):
                assert _key(row) == _key(rows[p]), f"rank {r} row {j} is not row {p}"
            else:  # padding: masked, no target
                assert not row["input_ids"].any() and not row["loss_mask"].any()


def test_a_state_resumes_on_another_number_of_ranks() -> None:
    """A state saved by 2 ranks (the same on both) continues on 1 and on 3 ranks at the
    same global row: each rank at its first row at or after the saved position."""
    from shardwise.world import World

    recs = make_records(90, seed=4)
    rows = list(PackedSFT(recs, seq_len=64, group_size=16, seed=5, epochs=1))
    two = [PackedSFT(recs, seq_len=64, group_size=16, seed=5, epochs=1, world=World(r, 2))
           for r in range(2)]
    for ds in two:
        take(ds, 7)
    states = [ds.state_dict() for ds in two]
    assert states[0] == states[1] and states[0]["consumed"] == 14
    for size in (1, 3):
        for r in range(size):
            ds = PackedSFT(recs, seq_len=64, group_size=16, seed=5, epochs=1,
                           world=World(r, size))
            ds.load_state_dict(states[0])
            first = next(p for p in range(14, 14 + size) if p % size == r)  # its first >= 14
            assert _key(next(iter(ds))) == _key(rows[first])


def test_a_one_rank_world_inside_a_job_and_workers_are_refused(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from shardwise.world import World

    recs = make_records(10)
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert PackedSFT(recs, seq_len=64).world == World(1, 2)  # the default is the job's
    with pytest.raises(ConfigError, match="every rank would read all the data"):
        PackedSFT(recs, seq_len=64, world=World(0, 1))
    monkeypatch.delenv("RANK")
    monkeypatch.delenv("WORLD_SIZE")
    import torch

    dl = torch.utils.data.DataLoader(PackedSFT(recs, seq_len=64), batch_size=2,
                                     num_workers=1)
    with pytest.raises(ConfigError, match="DataLoader worker"):
        next(iter(dl))


@pytest.mark.parametrize("overlong", ["truncate", "drop"])
def test_locate_gives_each_rows_stored_tokens(tmp_path: Path, overlong: str) -> None:
    """PackedSFT answers ``locate(rows)`` as every order does: each record of a row is one
    run of its cache's stored tokens (a truncated one cut), the row's real tokens in
    order; padding (``PAD``, or past a finite run) has none. Records not of a token cache
    have no runs, and say so."""
    cache = make_cache(tmp_path / "c", [sample_docs(40, seed=3, max_len=90)], chunk_docs=6)
    packed = PackedSFT(CacheRecords(cache), seq_len=64, group_size=9, seed=2,
                       overlong=overlong, world=World(0, 1))
    rows = list(PackedSFT(CacheRecords(cache), seq_len=64, group_size=9, seed=2,
                          overlong=overlong, world=World(0, 1)))
    order = np.random.default_rng(0).permutation(len(rows)).tolist() + [-1, len(rows)]
    runs = packed.locate(order)
    tokens = [packed.records.cache.tokens(c)[o: o + n] for c, o, n in zip(
        runs.chunk.tolist(), runs.offset.tolist(), runs.length.tolist(), strict=True)]
    flat, at = np.concatenate(tokens).tolist(), 0
    for p, n in zip(order, runs.tokens.tolist(), strict=True):
        want = rows[p]["input_ids"][:n].tolist() if 0 <= p < len(rows) else []
        assert flat[at: at + n] == want and (n > 0) == bool(want)
        at += n
    with pytest.raises(ConfigError, match="needs records of a token cache"):
        PackedSFT(make_records(10), seq_len=64, world=World(0, 1)).locate([0])
