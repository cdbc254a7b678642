"""Two simulated nodes of two ranks each read one cache on S3 (SeaweedFS on 127.0.0.1).

Two torchrun agents (one per simulated node, rendezvous on 127.0.0.1) run four ranks
(gloo): global placement uses the global rank and world size, so the global batches equal
a single-process run's; each node's ranks share one local download directory, so every
chunk crosses the network once per node.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

import shardwise as sw
from shardwise.bench.seaweed import S3Server
from shardwise.world import World

RANK_SCRIPT = Path(__file__).resolve().parents[1] / "remote" / "_node_rank.py"
NODES, PER_NODE = 2, 2
SPEC = {"seq_len": 32, "seed": 11, "global_batch": 8, "micro": 2, "steps": 12}


@pytest.fixture(scope="module")
def remote_cache(s3_server: S3Server, sample_corpus: Path, tokenizer_path: Path) -> str:
    url = s3_server.make_bucket("sw-nodes") + "/cache"
    sw.build([str(sample_corpus)], url, tokenizer=tokenizer_path, chunk_docs=8,
             append_eod=True, progress=False, workers=2)
    return url


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _single_process_rows(url: str, local: Path) -> np.ndarray:
    from shardwise.torch import loader

    cache = sw.open_cache(url, local_dir=local, local_bytes=64 << 20)
    ds = sw.TokenDataset(cache, seq_len=SPEC["seq_len"], seed=SPEC["seed"])
    dl = loader(ds, global_batch_size=SPEC["global_batch"], micro_batch_size=SPEC["micro"],
                world=World(0, 1))
    it = iter(dl)
    steps = SPEC["steps"] * NODES * PER_NODE
    rows = np.concatenate([next(it)["input_ids"].numpy() for _ in range(steps)])
    it.close()
    cache.close()
    return rows


def test_two_nodes_match_one_process_and_download_each_chunk_once_per_node(
        remote_cache: str, tmp_path: Path) -> None:
    world = NODES * PER_NODE
    spec = dict(SPEC, url=remote_cache, local_root=str(tmp_path / "local"),
                local_bytes=64 << 20, out=str(tmp_path))
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    port = _free_port()
    env = dict(os.environ, OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join([str(Path.cwd()), os.environ.get("PYTHONPATH", "")]))
    procs = []
    for node in range(NODES):  # one torchrun agent per simulated node, rendezvous on loopback
        log = open(tmp_path / f"log.node{node}", "wb")  # noqa: SIM115 - closed below
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", str(NODES),
               "--node-rank", str(node), "--nproc-per-node", str(PER_NODE),
               "--master-addr", "127.0.0.1", "--master-port", str(port),
               str(RANK_SCRIPT), str(tmp_path / "spec.json")]
        procs.append((subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env),
                      log))
    failed = []
    for node, (p, log) in enumerate(procs):
        try:
            code = p.wait(timeout=240)
        except subprocess.TimeoutExpired:
            p.kill()
            code = None
        log.close()
        if code != 0:
            failed.append(f"node {node} exit {code}:\n"
                          + (tmp_path / f"log.node{node}").read_text(errors="replace")[-3000:])
    assert not failed, "\n".join(failed)

    # identical global batches: each step is ranks 0..3's micro-batches in rank order
    per_rank = [np.load(tmp_path / f"rows.r{r}.npy").reshape(SPEC["steps"], SPEC["micro"], -1)
                for r in range(world)]
    global_rows = np.stack(per_rank, axis=1).reshape(-1, SPEC["seq_len"])
    np.testing.assert_array_equal(global_rows, _single_process_rows(remote_cache,
                                                                    tmp_path / "single"))
    ranks = json.loads((tmp_path / "ranks.json").read_text())
    assert len({json.dumps(r["state"], sort_keys=True) for r in ranks}) == 1

    # every chunk file a node needed was downloaded exactly once on that node
    for node in range(NODES):
        counts: Counter[str] = Counter()
        for r in ranks:
            if r["node"] == node:
                counts.update(r["downloaded"])
        assert counts, f"node {node} downloaded nothing"
        assert set(counts.values()) == {1}, {k: v for k, v in counts.items() if v > 1}
        files = {p.relative_to(p.parents[2]).as_posix() for p in
                 (tmp_path / "local" / f"node{node}").rglob("chunks/*/*") if p.is_file()}
        assert files == set(counts), "the node directory holds what the node downloaded"
