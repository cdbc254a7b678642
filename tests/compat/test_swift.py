"""ms-swift's LazyShardedDataset, called as the plan documents it: regex chunk names, the
world from torch.distributed, markers once consumed, evict_chunk, return_length, and what
the plan got wrong (bad JSON, short chunks, timeouts, samplers that shard again)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from torch.utils.data import BatchSampler, DataLoader, DistributedSampler, SequentialSampler

from shardwise.compat.swift import LazyShardedDataset
from shardwise.errors import ConfigError, InputError, ProducerTimeoutError
from shardwise.read.external.producer_dir import publish_chunk


def encode(sample: dict[str, Any], return_length: bool = False) -> dict[str, Any]:
    """A stand-in for template.encode: the length only when asked for it."""
    ids = [ord(ch) for ch in sample["text"]]
    out: dict[str, Any] = {"id": sample["id"], "input_ids": ids}
    if return_length:
        out["length"] = len(ids)
    return out


def write_chunks(d: Path, n: int, k: int, name: str = "chunk_{:05d}.jsonl") -> None:
    for c in range(n):
        publish_chunk(d, c, [{"id": f"{c}-{j}", "text": f"s{c}/{j}"} for j in range(k)],
                      pattern=name.replace("{:05d}", "{index:05d}").replace("{}", "{index}"))


def ids(batches: Any) -> list[str]:
    return [x["id"] for b in batches for x in b]


def loader(ds: LazyShardedDataset, batch_sampler: Any) -> DataLoader[Any]:
    return DataLoader(ds, batch_sampler=batch_sampler, collate_fn=lambda b: b)  # type: ignore[arg-type]


def test_plan_signature_positionally_with_a_regex_pattern(tmp_path: Path) -> None:
    write_chunks(tmp_path, 4, 3, name="part-{}.json")
    # directory, encode_fn, chunk_pattern, samples_per_chunk, max_samples,
    # wait_poll_interval, max_wait_time, mark_completed, world_size, rank
    ds = LazyShardedDataset(tmp_path, encode, r"part-(\d+)\.json", 3, 12, 0.01, 0, True, 2, 1)
    assert (ds.world_size, ds.rank, len(ds)) == (2, 1, 12)
    got = [ds[i] for i in range(6)]
    assert [x["id"] for x in got] == [f"{c}-{j}" for c in (1, 3) for j in range(3)]
    assert all(x["length"] == len(x["input_ids"]) for x in got)  # return_length=True
    assert sorted(p.name for p in tmp_path.glob("*.completed")) == [
        "part-1.json.completed", "part-3.json.completed"]


def test_encode_fn_without_return_length_is_called_plainly(tmp_path: Path) -> None:
    write_chunks(tmp_path, 1, 2)
    ds = LazyShardedDataset(tmp_path, lambda s: {"id": s["id"]}, world_size=1, rank=0)
    assert ds[1] == {"id": "0-1"}


def test_world_comes_from_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                          ) -> None:
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    write_chunks(tmp_path, 2, 2)
    ds = LazyShardedDataset(tmp_path, encode, samples_per_chunk=2)
    assert (ds.rank, ds.world_size) == (1, 2) and ds[0]["id"] == "1-0"
    with pytest.raises(ConfigError, match="every rank would read all the data"):
        LazyShardedDataset(tmp_path, encode, world_size=1, rank=0)


def test_marker_only_once_every_sample_was_returned_and_evict_reloads(tmp_path: Path) -> None:
    write_chunks(tmp_path, 1, 3)
    ds = LazyShardedDataset(tmp_path, encode, samples_per_chunk=3, world_size=1, rank=0)
    marker = tmp_path / "chunk_00000.jsonl.completed"
    assert ds[0]["id"] == "0-0" and not marker.exists()  # loaded is not consumed
    ds.evict_chunk(0)
    assert ds.loaded_chunks() == []
    assert [ds[1]["id"], ds[2]["id"]] == ["0-1", "0-2"]  # reloaded after the eviction
    assert marker.exists() and ds.dataset.chunks_loaded == 2
    (tmp_path / "chunk_00000.jsonl").unlink()  # the producer deletes it
    with pytest.raises(InputError, match="already consumed this chunk"):  # no endless wait
        ds[0]


def test_bad_json_and_none_from_encode_are_named(tmp_path: Path) -> None:
    (tmp_path / "chunk_00000.jsonl").write_text('{"id": "a", "text": "x"}\n{"id": \n')
    ds = LazyShardedDataset(tmp_path, encode, samples_per_chunk=2, world_size=1, rank=0)
    with pytest.raises(InputError, match=r"chunk_00000\.jsonl:2"):
        ds[0]
    (tmp_path / "chunk_00000.jsonl").write_text('{"id": "a", "text": "x"}\n' * 2)
    ds = LazyShardedDataset(tmp_path, lambda s: None, samples_per_chunk=2, world_size=1, rank=0)
    with pytest.raises(InputError, match=r"chunk_00000\.jsonl:1: .*returned None"):
        ds[0]


def test_a_short_chunk_never_wraps_around(tmp_path: Path) -> None:
    write_chunks(tmp_path, 1, 2)
    ds = LazyShardedDataset(tmp_path, encode, samples_per_chunk=3, world_size=1, rank=0)
    assert [ds[0]["id"], ds[1]["id"]] == ["0-0", "0-1"]
    with pytest.raises(IndexError, match="holds only 2 records although 3"):
        ds[2]  # the plan returned samples[2 % 2], a duplicate


def test_a_timeout_is_named(tmp_path: Path) -> None:
    ds = LazyShardedDataset(tmp_path, encode, samples_per_chunk=2, wait_poll_interval=0.01,
                            max_wait_time=0.2, world_size=2, rank=1)
    with pytest.raises(ProducerTimeoutError, match=r"chunk 1 \(a file matching"):
        ds[0]


def test_batch_sampler_shard_in_one_process(tmp_path: Path) -> None:
    """accelerate's BatchSamplerShard deals batch k to rank k % 2; each rank still gets
    all of its chunks, in order (the plan's local indexing gave each half)."""
    from accelerate.data_loader import BatchSamplerShard

    write_chunks(tmp_path, 4, 4)
    for split in (False, True):
        for r in (0, 1):
            ds = LazyShardedDataset(tmp_path, encode, samples_per_chunk=4, max_samples=16,
                                    world_size=2, rank=r, mark_completed=False,
                                    max_wait_time=2)
            inner = BatchSampler(SequentialSampler(ds), 4 if split else 2, drop_last=False)
            got = ids(loader(ds, BatchSamplerShard(inner, 2, r, split_batches=split)))
            assert got == [f"{c}-{j}" for c in (r, r + 2) for j in range(4)]


def test_samplers_that_would_lose_or_repeat_are_refused(tmp_path: Path) -> None:
    from accelerate.data_loader import BatchSamplerShard

    write_chunks(tmp_path, 2, 2)
    ds = LazyShardedDataset(tmp_path, encode, samples_per_chunk=2, max_samples=4,
                            world_size=2, rank=0)
    with pytest.raises(ConfigError, match="RandomSampler draws random indices"):
        DataLoader(ds, shuffle=True)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="deals to rank 1 of 2, but this dataset reads"):
        DistributedSampler(ds, num_replicas=2, rank=1, shuffle=False)  # type: ignore[arg-type]
    sampler = DistributedSampler(ds, num_replicas=2, rank=0, shuffle=False)  # type: ignore[arg-type]
    assert [ds[i]["id"] for i in sampler] == ["0-0", "0-1"]
    odd = LazyShardedDataset(tmp_path, encode, samples_per_chunk=2, max_samples=6,
                             world_size=2, rank=0)
    inner = BatchSampler(SequentialSampler(odd), 2, drop_last=False)
    with pytest.raises(ConfigError, match="max_samples=6 is not a multiple of 4"):
        len(BatchSamplerShard(inner, 2, 0))


def test_dataloader_workers_are_refused(tmp_path: Path) -> None:
    write_chunks(tmp_path, 1, 2)
    ds = LazyShardedDataset(tmp_path, encode, samples_per_chunk=2, max_samples=2,
                            world_size=1, rank=0)
    dl = DataLoader(ds, batch_size=2, num_workers=1, collate_fn=lambda b: b,  # type: ignore[arg-type]
                    multiprocessing_context="fork")
    with pytest.raises(ConfigError, match="num_workers=0"):
        next(iter(dl))


def test_repr_names_the_dealing(tmp_path: Path) -> None:
    ds = LazyShardedDataset(tmp_path, None, world_size=1, rank=0, max_samples=8)
    assert "max_samples=8" in repr(ds) and "rank 0 of 1" in repr(ds)
