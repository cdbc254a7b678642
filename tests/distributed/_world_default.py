"""Run under ``torchrun --nproc-per-node 2``: build every per-rank reader with no ``world=``
and record what this rank read (``_world_default.r{RANK}.json``).

Argument: a JSON spec with ``cache`` (a token cache), ``jsonl`` (record files),
``producer`` (a producer directory) and ``out``.
"""

from __future__ import annotations

import json
import sys
import traceback
from pathlib import Path
from typing import Any


def _rows(batches: Any, n: int) -> list[list[int]]:
    out: list[list[int]] = []
    it = iter(batches)
    while len(out) < n:
        b = next(it)
        ids = b["input_ids"]
        out += [list(map(int, r)) for r in (ids.tolist() if hasattr(ids, "tolist") else ids)]
    return out[:n]


def _readers(spec: dict[str, Any]) -> dict[str, Any]:
    import shardwise as sw
    from shardwise.read.external.producer_dir import ProducerDirDataset
    from shardwise.torch import loader

    cache = sw.open_cache(spec["cache"])
    got: dict[str, Any] = {}
    ds = sw.TokenDataset(cache, seq_len=16, seed=3)
    got["loader"] = _rows(loader(ds, global_batch_size=8, micro_batch_size=2), 8)
    stream = sw.StreamDataset(cache, seq_len=16, streams=4, seed=3, epochs=1)
    got["stream"] = [list(map(int, ex["input_ids"])) for ex in stream]
    rs = sw.RecordStream(spec["jsonl"], seed=3, streams=4, epochs=1)
    got["records"] = _drain_records(rs)
    pd = ProducerDirDataset(spec["producer"], timeout=30.0, poll_interval=0.01)
    got["producer"] = [pd[i]["id"] for i in range(len(pd))]
    shards = sw.ContiguousShards(spec["jsonl"], _Lines)
    got["contiguous"] = [shards[i] for i in range(len(shards))]
    return got


def _drain_records(rs: Any) -> list[str]:
    out: list[str] = []
    while batch := rs.get_next_batch(5):
        out += [r["id"] for r in batch if not r.get("__pad__")]
    return out


class _Lines:
    """A shard: the ids of one JSONL file."""

    def __init__(self, path: str) -> None:
        self.ids = [json.loads(x)["id"] for x in Path(path).read_text().splitlines()]

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> str:
        return self.ids[i]


def main() -> None:
    spec = json.loads(Path(sys.argv[1]).read_text())
    import torch.distributed as dist

    import shardwise as sw

    result: dict[str, Any] = {"env_world": str(sw.World.detect())}
    dist.init_process_group("gloo")
    result["dist_world"] = str(sw.World.detect())
    try:
        result["read"] = _readers(spec)
        for name, make in (("World()", sw.World), ("World(0, 1)", lambda: sw.World(0, 1))):
            try:
                sw.StreamDataset(spec["cache"], seq_len=16, streams=4, world=make())
                result.setdefault("accepted", []).append(name)
            except sw.ConfigError as e:
                result.setdefault("refused", []).append(str(e))
        single = sw.RecordStream(spec["jsonl"], seed=3, streams=4, epochs=1,
                                 world=sw.World.single())
        result["single"] = _drain_records(single)
    except Exception:
        result["error"] = traceback.format_exc()
    rank = dist.get_rank()
    Path(spec["out"], f"_world_default.r{rank}.json").write_text(json.dumps(result))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
