"""One World (DESIGN contract 7): under ``torchrun --nproc-per-node 2`` every per-rank
reader built with no ``world=`` reads a disjoint share, the shares cover the data, and a
one-rank world inside the job is refused instead of duplicating it on every rank."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
from tests.distributed.harness import said, torchrun

import shardwise as sw
from shardwise.read.external.producer_dir import publish_chunk, write_expected
from shardwise.torch import loader

SCRIPT = Path(__file__).resolve().with_name("_world_default.py")


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory: pytest.TempPathFactory, small_chunk_cache: Path
              ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    d = tmp_path_factory.mktemp("world-default")
    jsonl = []
    for f in range(4):
        p = d / f"part-{f}.jsonl"
        p.write_bytes(b"".join(orjson.dumps({"id": f"{f}-{j}"}) + b"\n" for j in range(10)))
        jsonl.append(str(p))
    producer = d / "producer"
    producer.mkdir()
    write_expected(producer, num_chunks=4, records_per_chunk=3)
    for c in range(4):
        publish_chunk(producer, c, [{"id": f"c{c}-{j}"} for j in range(3)])
    spec = {"cache": str(small_chunk_cache), "jsonl": jsonl, "producer": str(producer),
            "out": str(d)}
    (d / "spec.json").write_text(json.dumps(spec))
    done = torchrun(SCRIPT, str(d / "spec.json"), timeout=240)
    assert done.returncode == 0, said(done)
    ranks = [json.loads((d / f"_world_default.r{r}.json").read_text()) for r in range(2)]
    for r in ranks:
        assert "error" not in r, r["error"]
    return spec, ranks


def test_the_default_world_is_the_real_one(two_ranks: Any) -> None:
    _, ranks = two_ranks
    assert [r["env_world"] for r in ranks] == ["rank 0 of 2", "rank 1 of 2"]
    assert [r["dist_world"] for r in ranks] == ["rank 0 of 2", "rank 1 of 2"]


@pytest.mark.parametrize("reader", ["records", "producer", "contiguous"])
def test_record_readers_split_the_data(two_ranks: Any, reader: str) -> None:
    _, ranks = two_ranks
    a, b = (r["read"][reader] for r in ranks)
    assert a and b and not set(a) & set(b)
    everything = ({f"{f}-{j}" for f in range(4) for j in range(10)} if reader != "producer"
                  else {f"c{c}-{j}" for c in range(4) for j in range(3)})
    assert set(a) | set(b) == everything
    assert len(a) + len(b) == len(everything)  # and nothing twice within a rank


def test_token_readers_split_the_global_order(two_ranks: Any, small_chunk_cache: Path
                                              ) -> None:
    _, ranks = two_ranks
    ds = sw.TokenDataset(small_chunk_cache, seq_len=16, seed=3)
    it = iter(loader(ds, global_batch_size=8, micro_batch_size=2, world=sw.World(0, 1)))
    want = np.concatenate([next(it)["input_ids"].numpy() for _ in range(8)])
    got = np.asarray([ranks[r]["read"]["loader"] for r in range(2)])  # [rank, row, token]
    steps = got.reshape(2, -1, 2, 16).transpose(1, 0, 2, 3).reshape(-1, 16)
    np.testing.assert_array_equal(steps, want[:len(steps)])
    stream = sw.StreamDataset(small_chunk_cache, seq_len=16, streams=4, seed=3, epochs=1,
                              world=sw.World(0, 1))
    order = [list(map(int, ex["input_ids"])) for ex in stream]  # the global order
    assert [r["read"]["stream"] for r in ranks] == [order[0::2], order[1::2]]


def test_a_one_rank_world_inside_the_job_is_refused(two_ranks: Any) -> None:
    _, ranks = two_ranks
    for r in ranks:
        assert "accepted" not in r
        assert len(r["refused"]) == 2
        assert all("World.single()" in m and "2 ranks" in m for m in r["refused"])
        assert len(r["single"]) == 40  # World.single(): this rank reads everything, knowingly
