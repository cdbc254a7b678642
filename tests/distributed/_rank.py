"""One rank of a real multi-process run; launched by ``conftest.launch`` (not a test module).

usage: ``python _rank.py SPEC.json RANK``

The spec names the world size, a ``file://`` store for gloo and a list of tasks. Each task
writes ``<out>/<name>.r<rank>.json`` (scalars, opened chunks, gathered states, or the
traceback if it failed) and ``<out>/<name>.r<rank>.npz`` (the rows this rank received, per
part). The parent compares ranks and world sizes; this side only records.
"""

from __future__ import annotations

import datetime
import json
import sys
import time
import traceback
import warnings
from pathlib import Path
from typing import Any

import numpy as np

Result = dict[str, Any]
Arrays = dict[str, np.ndarray]


def _status_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/self/status")


def _gather(obj: Any) -> list[Any]:
    """Every rank's ``obj``, in rank order (gloo all_gather). Called exactly once per task
    on every rank, whether the task raised or not, so collectives always pair up."""
    import torch.distributed as dist

    if not dist.is_initialized():
        return [obj]
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def _state_json(dl: Any) -> str:
    return json.dumps(dl.state_dict(), sort_keys=True)


def _dataset(task: dict[str, Any]) -> Any:
    import shardwise as sw

    return sw.TokenDataset(task["cache"], **task.get("dataset", {}))


def _take(dl: Any, steps: int | None) -> list[dict[str, Any]]:
    """``steps`` batches (all if ``None``), then close the iterator as a broken loop would."""
    it = iter(dl)
    if steps is None:
        return list(it)
    got = [next(it) for _ in range(steps)]
    it.close()
    return got


def _record(arrays: Arrays, part: str, batches: list[dict[str, Any]], seq_len: int) -> None:
    def stack(key: str, dtype: Any) -> np.ndarray:
        if not batches:
            return np.zeros((0, seq_len), dtype=dtype)
        return np.concatenate([b[key].numpy() for b in batches])

    arrays[f"{part}__input_ids"] = stack("input_ids", np.int64)
    arrays[f"{part}__labels"] = stack("labels", np.int64)
    arrays[f"{part}__loss_mask"] = stack("loss_mask", np.float32)
    arrays[f"{part}__steps"] = np.asarray(len(batches))


def _loader(ds: Any, world: Any, options: dict[str, Any]) -> Any:
    from shardwise.torch import loader

    return loader(ds, world=world, **options)


# -- tasks ------------------------------------------------------------------------------------
def task_run(task: dict[str, Any], world: Any, result: Result, arrays: Arrays) -> None:
    """A fresh dataset and loader (optionally restored from ``state_in``), ``steps`` batches;
    records rows, the chunks this process opened, and every rank's final state."""
    ds = _dataset(task)
    dl = _loader(ds, world, task["loader"])
    if task.get("state_in"):
        dl.load_state_dict(json.loads(Path(task["state_in"]).read_text()))
    _record(arrays, "run", _take(dl, task.get("steps")), ds.config.seq_len)
    result["opened"] = dict(ds.cache.opened)
    result["share"] = {"state": _state_json(dl)}


def task_resume(task: dict[str, Any], world: Any, result: Result, arrays: Arrays) -> None:
    """Stop loader A after ``stop`` micro-batches and save its state; then (a) iterate A
    again, (b) rewind A to the state (``load_state_dict`` on a live, maybe persistent,
    loader), (c) restore the state into a fresh loader B over a fresh dataset."""
    k, t = task["stop"], task["tail"]
    ds = _dataset(task)
    seq_len = ds.config.seq_len
    a = _loader(ds, world, task["first"])
    it = iter(a)
    _record(arrays, "head", [next(it) for _ in range(k)], seq_len)
    saved = _state_json(a)  # prefetched batches are outstanding here when A has workers
    it.close()
    result["share"] = {"state": saved}
    if task.get("save_to") and world.rank == 0:
        Path(task["save_to"]).write_text(saved)
    _record(arrays, "again", _take(a, t), seq_len)
    result["state_after_again"] = _state_json(a)
    a.load_state_dict(json.loads(saved))
    _record(arrays, "rewound", _take(a, t), seq_len)
    b = _loader(_dataset(task), world, task["second"])
    b.load_state_dict(json.loads(saved))
    _record(arrays, "resumed", _take(b, t), seq_len)
    result["state_after_resumed"] = _state_json(b)


def task_seek(task: dict[str, Any], world: Any, result: Result, arrays: Arrays) -> None:
    """One micro-batch from a loader built at each ``consumed`` (a fresh cache each time),
    and one from a loader at 0 restored to a deep state; records opened chunks and time."""
    from shardwise.torch import loader

    result["points"] = []
    for i, consumed in enumerate(task["consumed"]):
        ds = _dataset(task)
        started = time.perf_counter()
        dl = loader(ds, world=world, consumed=consumed, **task["loader"])
        batch = _take(dl, 1)
        seconds = time.perf_counter() - started
        _record(arrays, f"at{i}", batch, ds.config.seq_len)
        result["points"].append({"consumed": consumed, "seconds": seconds,
                                 "opened": dict(ds.cache.opened)})
    deep = task["consumed"][-1]
    state = loader(_dataset(task), world=world, consumed=deep, **task["loader"]).state_dict()
    ds = _dataset(task)
    dl = loader(ds, world=world, **task["loader"])
    dl.load_state_dict(state)
    _record(arrays, "restored", _take(dl, 1), ds.config.seq_len)
    result["restored_opened"] = dict(ds.cache.opened)


def task_eval(task: dict[str, Any], world: Any, result: Result, arrays: Arrays) -> None:
    """A whole evaluation pass, to its end."""
    ds = _dataset(task)
    _record(arrays, "run", list(_loader(ds, world, task["loader"])), ds.config.seq_len)


def task_rss(task: dict[str, Any], world: Any, result: Result, arrays: Arrays) -> None:
    """RSS over a long read (phase 1), then anonymous memory while seeking through epochs
    of a dataset with millions of examples (phase 2)."""
    from shardwise.torch import loader

    ds = _dataset(task)
    dl = loader(ds, world=world, **task["loader"])
    it = iter(dl)
    samples = []
    for k in range(task["batches"]):
        batch = next(it)
        assert batch["input_ids"].shape[1] == ds.config.seq_len
        if k + 1 == task["warmup"] or (k + 1) % 250 == 0:
            samples.append((k + 1, _status_kb("VmRSS"), _status_kb("RssAnon")))
    it.close()
    result["samples"] = samples

    deep = _dataset({"cache": task["cache"], "dataset": task["deep_dataset"]})
    n, m = len(deep), task["deep_loader"]["micro_batch_size"]
    result["deep_examples"] = n
    before = _status_kb("RssAnon")
    for epoch in task["deep_epochs"]:
        consumed = (epoch * n - 4 * m) // m * m  # just before an epoch boundary
        dl = loader(deep, world=world, consumed=consumed, **task["deep_loader"])
        for batch in _take(dl, 16):
            assert batch["input_ids"].shape == (m, deep.config.seq_len)
    result["deep_anon_kb"] = [before, _status_kb("RssAnon")]


TASKS = {"run": task_run, "resume": task_resume, "seek": task_seek, "eval": task_eval,
         "rss": task_rss}


def main() -> None:
    spec = json.loads(Path(sys.argv[1]).read_text())
    rank, size = int(sys.argv[2]), int(spec["world_size"])
    warnings.simplefilter("error")
    # torch's own notice that pin_memory does nothing without an accelerator (CPU CI)
    warnings.filterwarnings("ignore", message=".*pin_memory.*accelerator", category=UserWarning)
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    if spec["distributed"]:
        dist.init_process_group("gloo", init_method=f"file://{spec['store']}", rank=rank,
                                world_size=size, timeout=datetime.timedelta(seconds=60))
    import shardwise as sw

    world = sw.World.detect()
    if world != sw.World(rank, size):
        raise SystemExit(f"World.detect() gave {world}, expected rank {rank} of {size}")
    out = Path(spec["out"])
    for task in spec["tasks"]:
        result: Result = {"rank": rank, "world_size": size}
        arrays: Arrays = {}
        try:
            TASKS[task["kind"]](task, world, result, arrays)
        except Exception:
            result["error"] = traceback.format_exc()
        result["shared"] = _gather(result.pop("share", None))
        np.savez(out / f"{task['name']}.r{rank}.npz", **arrays)
        (out / f"{task['name']}.r{rank}.json").write_text(json.dumps(result))
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
