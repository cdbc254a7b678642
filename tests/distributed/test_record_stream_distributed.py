"""RecordStream across real processes: ranks × torch DataLoader workers × map workers.

Each rank is a separate Python process running this file as a script; it writes what it
read as JSON. The global order rebuilt from the ranks (global example ``i`` is example
``i // R`` of rank ``i % R``) must equal the one-process order, for world sizes 1, 2, 4 and
0 or 2 DataLoader workers, until the first stream's epoch ends; a single pass must read
every record exactly once; and the ranks' merged states must resume exactly under another
world size. ``state_dict(all_ranks=True)`` gathers that merged state on every rank over
torch.distributed (gloo through a ``file://`` store in the test's tmp directory).
"""

from __future__ import annotations

import datetime
import gzip
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

N_RECORDS = 2400
GLOBAL = 1600  # examples of the endless order compared: all before the first stream's
# epoch ends (at 1737 here); past it each consumer (rank, or DataLoader worker) crosses
# epochs with its own streams, so the order depends on how the streams are split
RESUME_AT, RESUME_TAKE = 600, 160
CONFIGS = [(1, 0), (1, 2), (2, 0), (2, 2), (4, 0), (4, 2)]  # (world size, loader workers)
GATHER_BATCH, GATHER_STEPS = 45, 3  # each of 2 ranks, before state_dict(all_ranks=True)


def _line(i: int) -> bytes:
    return json.dumps({"id": i, "text": "z" * (i * 31 % 41)}).encode() + b"\n"


def make_stream(sources: list[str], rank: int, world: int, **kw: Any) -> Any:
    from shardwise.read.records.stream import RecordStream
    from shardwise.world import World

    return RecordStream(sources, seed=11, streams=8, range_bytes=3000, shuffle_buffer=24,
                        world=World(rank, world), **kw)


def _ids(examples: Any) -> list[int | None]:
    return [None if x.get("__pad__") else int(x["id"]) for x in examples]


def gather_main(args: dict[str, Any]) -> None:
    """One rank of a gloo group: a few batches, then its local and its gathered state."""
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    r, w = args["rank"], args["world"]
    dist.init_process_group("gloo", init_method=f"file://{args['store']}", rank=r,
                            world_size=w, timeout=datetime.timedelta(seconds=60))
    rs = make_stream(args["sources"], r, w)
    for _ in range(GATHER_STEPS):
        rs.get_next_batch(GATHER_BATCH)
    out = {"local": rs.state_dict(), "gathered": rs.state_dict(all_ranks=True)}
    from shardwise.errors import ConfigError

    for name, world in (("size_4", (r, 4)), ("both_rank_0", (0, 2))):  # raise on every rank
        try:
            make_stream(args["sources"], *world).state_dict(all_ranks=True)
        except ConfigError as e:
            out[name] = str(e)
    dist.destroy_process_group()
    Path(args["out"]).write_text(json.dumps(out))


def rank_main(args: dict[str, Any]) -> None:
    """One rank: the first examples of the endless order, then a single pass; or resume."""
    if args.get("store"):
        return gather_main(args)
    r, w, workers = args["rank"], args["world"], args["loader_workers"]
    out: dict[str, Any] = {}
    if args.get("resume"):
        rs = make_stream(args["sources"], r, w)
        rs.load_state_dict(json.loads(Path(args["resume"]).read_text()))
        out["resumed"] = _ids(rs.get_next_batch(RESUME_TAKE // w))
    else:
        if workers:  # torch first: a RecordStream made after it is a DataLoader dataset
            import torch.utils.data  # noqa: F401
        endless = make_stream(args["sources"], r, w, num_workers=args["map_workers"])
        one = make_stream(args["sources"], r, w, epochs=1)
        if workers:
            from torch.utils.data import DataLoader

            it = iter(DataLoader(endless, batch_size=None, num_workers=workers))
            out["endless"] = _ids(next(it) for _ in range(GLOBAL // w))
            out["one_pass"] = _ids(DataLoader(one, batch_size=None, num_workers=workers))
        else:
            out["endless"] = _ids(endless.get_next_batch(GLOBAL // w))
            out["one_pass"] = _ids(one)
            state = make_stream(args["sources"], r, w)
            state.get_next_batch(RESUME_AT // w)
            out["state"] = state.state_dict()
        endless.close()
    Path(args["out"]).write_text(json.dumps(out))


def _run(jobs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    procs = [subprocess.Popen([sys.executable, __file__, json.dumps(j)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE) for j in jobs]
    for p, j in zip(procs, jobs, strict=True):
        _, err = p.communicate(timeout=240)
        assert p.returncode == 0, f"rank {j['rank']}/{j['world']} failed:\n{err.decode()}"
    return [json.loads(Path(j["out"]).read_text()) for j in jobs]


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    d = tmp_path_factory.mktemp("dist")
    (d / "a.jsonl").write_bytes(b"".join(_line(i) for i in range(0, 1400)))
    (d / "b.jsonl.gz").write_bytes(gzip.compress(b"".join(_line(i) for i in range(1400, 1700))))
    pq.write_table(pa.table({"id": list(range(1700, N_RECORDS)), "text": ["q"] * 700}),
                   d / "c.parquet", row_group_size=90)
    return [str(d / "a.jsonl"), str(d / "b.jsonl.gz"), str(d / "c.parquet")]


def test_ranks_and_workers_share_one_global_order(sources: list[str], tmp_path: Path) -> None:
    jobs = [{"rank": r, "world": w, "loader_workers": lw, "map_workers": 2 if w == 2 else 0,
             "sources": sources, "out": str(tmp_path / f"w{w}-l{lw}-r{r}.json")}
            for w, lw in CONFIGS for r in range(w)]
    results = _run(jobs)
    by_config: dict[tuple[int, int], list[dict[str, Any]]] = {}
    for job, res in zip(jobs, results, strict=True):
        by_config.setdefault((job["world"], job["loader_workers"]), []).append(res)

    reference = make_stream(sources, 0, 1).get_next_batch(GLOBAL)
    want = _ids(reference)
    one_pass = _ids(make_stream(sources, 0, 1, epochs=1))
    for (w, lw), ranks in by_config.items():
        glob = [ranks[i % w]["endless"][i // w] for i in range(GLOBAL)]
        assert glob == want, f"world {w} × {lw} loader workers diverge"
        read = sorted(i for res in ranks for i in res["one_pass"] if i is not None)
        assert read == list(range(N_RECORDS)), f"world {w} × {lw}: not exactly once"
        if lw == 0:  # pads keep every real example at its global position
            for r, res in enumerate(ranks):
                mine = one_pass[r::w]
                assert [x for x in res["one_pass"] if x is not None] == \
                       [x for x in mine if x is not None]

    # resume: the two ranks' states at global example 600, merged, restore 4 ranks
    from shardwise.read.records.ranks import merge_states

    merged = merge_states([res["state"] for res in by_config[(2, 0)]])
    state_path = tmp_path / "merged.json"
    state_path.write_text(json.dumps(merged))
    resumed = _run([{"rank": r, "world": 4, "loader_workers": 0, "resume": str(state_path),
                     "sources": sources, "out": str(tmp_path / f"resume-{r}.json")}
                    for r in range(4)])
    glob = [resumed[i % 4]["resumed"][i // 4] for i in range(RESUME_TAKE)]
    assert glob == want[RESUME_AT:RESUME_AT + RESUME_TAKE]



def test_all_ranks_state_is_the_merged_state_on_every_rank(sources: list[str],
                                                           tmp_path: Path) -> None:
    from shardwise.read.records.ranks import merge_states

    store = tmp_path / "gloo-store"
    ranks = _run([{"rank": r, "world": 2, "store": str(store), "sources": sources,
                   "out": str(tmp_path / f"gather-{r}.json")} for r in range(2)])
    assert ranks[0]["gathered"] == ranks[1]["gathered"]
    assert ranks[0]["gathered"] == merge_states([res["local"] for res in ranks])
    at = 2 * GATHER_BATCH * GATHER_STEPS
    assert ranks[0]["gathered"]["consumed"] == at
    for res in ranks:  # a World that does not match the process group is named, not merged
        assert "World has size 4, torch.distributed has 2 ranks" in res["size_4"]
        assert "[(0, 2), (0, 2)] (rank, size), expected ranks 0..1" in res["both_rank_0"]

    # rank 0's gathered state alone restores 1 and 4 ranks: the uninterrupted continuation
    want = _ids(make_stream(sources, 0, 1).get_next_batch(at + 200))[at:]
    one = make_stream(sources, 0, 1)
    one.load_state_dict(ranks[0]["gathered"])
    assert _ids(one.get_next_batch(200)) == want
    for r in range(4):  # rank r of 4 serves the global examples i with i % 4 == r
        rs = make_stream(sources, r, 4)
        rs.load_state_dict(ranks[0]["gathered"])
        assert _ids(rs.get_next_batch(50)) == [x for j, x in enumerate(want)
                                               if (at + j) % 4 == r][:50]


if __name__ == "__main__":
    rank_main(json.loads(sys.argv[1]))
