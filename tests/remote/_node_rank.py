"""One rank of the simulated multi-node run (launched by tests/distributed/test_remote_*.py).

usage: ``torchrun --nnodes 2 --node-rank N --nproc-per-node 2 --master-addr 127.0.0.1
--master-port P _node_rank.py SPEC.json``: torchrun sets ``RANK``, ``WORLD_SIZE``,
``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``GROUP_RANK`` (the node) and the rendezvous address.
The node's ranks share ``<local_root>/node<GROUP_RANK>``; gloo gathers every rank's
download counts to rank 0, which writes them with the rows.
"""

from __future__ import annotations

import datetime
import json
import os
import sys
from pathlib import Path

import numpy as np


def main() -> None:
    spec = json.loads(Path(sys.argv[1]).read_text())
    import torch.distributed as dist

    import shardwise as sw
    from shardwise.torch import loader

    rank, size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))  # env://
    world = sw.World.detect()  # the global rank and size: placement ignores the node
    node = int(os.environ["GROUP_RANK"])
    cache = sw.open_cache(spec["url"], local_dir=Path(spec["local_root"]) / f"node{node}",
                          local_bytes=spec["local_bytes"])
    ds = sw.TokenDataset(cache, seq_len=spec["seq_len"], seed=spec["seed"])
    dl = loader(ds, global_batch_size=spec["global_batch"], micro_batch_size=spec["micro"],
                world=world)
    it = iter(dl)
    rows = np.concatenate([next(it)["input_ids"].numpy() for _ in range(spec["steps"])])
    it.close()
    cache.close()  # settles the look-ahead downloads (running ones finish), so counts are final
    assert cache.store.downloads is not None
    mine = {"rank": rank, "node": node, "local_rank": int(os.environ["LOCAL_RANK"]),
            "downloaded": dict(cache.store.downloads.downloaded), "state": dl.state_dict()}
    gathered: list[object] = [None] * size
    dist.all_gather_object(gathered, mine)
    out = Path(spec["out"])
    np.save(out / f"rows.r{rank}.npy", rows)
    if rank == 0:
        (out / "ranks.json").write_text(json.dumps(gathered))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
