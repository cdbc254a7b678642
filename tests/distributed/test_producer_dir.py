"""A real producer process writing JSONL chunks (temporary name, then rename) while two
real rank processes read them: every sample once per pass, none repeated or invented; the
producer deletes what the readers marked done; a producer that stops → a clear timeout."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

PRODUCER = r"""
import json, os, sys, time
from pathlib import Path
from shardwise.read.external.producer_dir import chunk_indices, delete_finished, write_expected

d, counts, stop_after, world = Path(sys.argv[1]), json.loads(sys.argv[2]), int(sys.argv[3]), 2
write_expected(d, num_chunks=len(counts), records=counts)
deleted = []
for c in range(stop_after):
    lines = [json.dumps({"id": f"{c}-{j}", "text": f"sample {c}/{j}"}) + "\n"
             for j in range(counts[c])]
    tmp, final = d / f".tmp-chunk_{c:05d}.jsonl", d / f"chunk_{c:05d}.jsonl"
    with open(tmp, "w") as f:          # written slowly: readers must never see it half done
        f.writelines(lines[: len(lines) // 2]); f.flush(); time.sleep(0.02)
        f.writelines(lines[len(lines) // 2:]); f.flush(); os.fsync(f.fileno())
    os.rename(tmp, final)
    time.sleep(0.03)
    deleted += delete_finished(d, world)
if stop_after == len(counts):
    deadline = time.monotonic() + 30
    while chunk_indices(d) and time.monotonic() < deadline:
        deleted += delete_finished(d, world)
        time.sleep(0.02)
print(json.dumps({"deleted": sorted(deleted)}))
"""

READER = r"""
import json, sys, time
from shardwise.errors import ProducerTimeoutError
from shardwise.read.external.producer_dir import ProducerDirDataset
from shardwise.world import World

d, rank, mode, timeout = sys.argv[1], int(sys.argv[2]), sys.argv[3], float(sys.argv[4])

def encode(rec):  # a stand-in for a chat template
    ids = [ord(ch) for ch in rec["text"]]
    return {"id": rec["id"], "input_ids": ids, "labels": [-100] + ids[1:]}

ds = ProducerDirDataset(d, map_fn=encode, world=World(rank, 2), timeout=timeout,
                        poll_interval=0.02)
out = {"rank": rank, "ids": []}
last = time.monotonic()
try:
    if mode == "map":
        out["len"] = len(ds)
        for i in range(out["len"]):
            out["ids"].append(ds[i]["id"])
            last = time.monotonic()
    else:
        for rec in ds.stream():
            out["ids"].append(rec["id"])
            last = time.monotonic()
except ProducerTimeoutError as e:
    out["timeout"] = str(e)
    out["gap"] = time.monotonic() - last
out["peak"], out["loads"] = ds.peak_loaded_chunks, ds.chunks_loaded
print(json.dumps(out))
"""


def run(tmp_path: Path, counts: list[int], stop_after: int, mode: str, timeout: float
        ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Start the producer and both readers together; their JSON reports."""
    py = [sys.executable, "-W", "error", "-c"]
    producer = subprocess.Popen([*py, PRODUCER, str(tmp_path), json.dumps(counts),
                                 str(stop_after)], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE)
    readers = [subprocess.Popen([*py, READER, str(tmp_path), str(r), mode, str(timeout)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
               for r in range(2)]
    reports = []
    for p in [producer, *readers]:
        out, err = p.communicate(timeout=60)
        assert p.returncode == 0, err.decode()
        reports.append(json.loads(out))
    return reports[0], reports[1:]


COUNTS = [6, 6, 6, 6, 6, 6, 6, 6, 3]  # 9 chunks: rank 0 owns 5, rank 1 owns 4


@pytest.mark.parametrize("mode", ["map", "stream"])
def test_two_ranks_read_while_the_producer_writes(tmp_path: Path, mode: str) -> None:
    producer, ranks = run(tmp_path, COUNTS, len(COUNTS), mode, timeout=20.0)
    produced = {f"{c}-{j}" for c, n in enumerate(COUNTS) for j in range(n)}
    seen: list[str] = []
    for r, rep in enumerate(ranks):
        assert "timeout" not in rep, rep
        mine = [c for c in range(len(COUNTS)) if c % 2 == r]
        if mode == "map":
            assert rep["len"] == sum(COUNTS[c] for c in mine) == len(rep["ids"])
        assert {int(x.split("-")[0]) for x in rep["ids"]} == set(mine)  # only its chunks
        assert rep["peak"] <= 2 and rep["loads"] == len(mine)  # each chunk loaded once
        seen += rep["ids"]
    assert len(seen) == len(set(seen)) and set(seen) == produced  # once each, none invented
    assert producer["deleted"] == list(range(len(COUNTS)))  # the done markers freed them all
    assert not list(tmp_path.glob("chunk_*"))


def test_a_producer_that_stops_makes_readers_time_out(tmp_path: Path) -> None:
    timeout = 1.0
    _, ranks = run(tmp_path, [4] * 8, 3, "map", timeout=timeout)  # only chunks 0, 1, 2
    for rank, waiting_for, got in ((0, 4, 8), (1, 3, 4)):
        rep = ranks[rank]
        assert len(rep["ids"]) == got and rep["len"] == 16
        assert f"chunk_{waiting_for:05d}.jsonl: waited" in rep["timeout"]
        assert "Is the producer still running?" in rep["timeout"]
        assert timeout <= rep["gap"] < timeout + 1.5
