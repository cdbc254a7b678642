"""Real multi-process runs: rank processes, and the helpers that turn what the ranks
recorded back into global rows and window indices.

Ranks are plain subprocesses running ``_rank.py`` (gloo over a ``file://`` store in a tmp
directory; no torchrun, no ports). A group of ranks runs a list of tasks in one go, so the
cost of starting Python and importing torch is paid once per rank, not per test.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import shardwise as sw

RANK_SCRIPT = Path(__file__).resolve().with_name("_rank.py")
SEQ_LEN = 32
SEED = 1234
GROUP_TIMEOUT = 240.0


# -- launching rank groups ---------------------------------------------------------------------
@dataclass
class Group:
    name: str
    world_size: int
    out: Path
    tasks: list[dict[str, Any]]
    procs: list[subprocess.Popen[bytes]]


def launch(root: Path, name: str, world_size: int, tasks: list[dict[str, Any]], *,
           distributed: bool = True) -> Group:
    """Start ``world_size`` rank processes running ``tasks``; returns at once."""
    out = root / name
    out.mkdir(parents=True)
    spec = {"world_size": world_size, "distributed": distributed,
            "store": str(out / "gloo-store"), "out": str(out), "tasks": tasks}
    (out / "spec.json").write_text(json.dumps(spec))
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONHASHSEED="0")
    procs = []
    for r in range(world_size):
        with open(out / f"log.r{r}", "wb") as log:
            procs.append(subprocess.Popen([sys.executable, str(RANK_SCRIPT),
                                           str(out / "spec.json"), str(r)],
                                          stdout=log, stderr=subprocess.STDOUT, env=env))
    return Group(name, world_size, out, tasks, procs)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def torchrun(script: Path, *args: str, timeout: float = 300.0
             ) -> subprocess.CompletedProcess[str]:
    """``script args`` under ``torchrun --nproc-per-node 2`` (one node, a free port on
    127.0.0.1, one thread per rank; the checkout importable as ``tests``). A rank that
    dies of a signal prints every thread's Python stack (``PYTHONFAULTHANDLER``): an abort
    at exit names where each thread was (:func:`said`)."""
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")}
    env.update(OMP_NUM_THREADS="1", PYTHONFAULTHANDLER="1",
               PYTHONPATH=os.pathsep.join([str(Path.cwd()), env.get("PYTHONPATH", "")]))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1",
           "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
           "--master-port", str(_free_port()), str(script), *args]
    with subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True, start_new_session=True) as proc:
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            ranks = _children(proc.pid)  # each a session of its own: not in torchrun's group
            os.killpg(proc.pid, signal.SIGKILL)
            for pid in ranks:  # the ranks too, and what they forked
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pid, signal.SIGKILL)
            raise
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def said(done: subprocess.CompletedProcess[str], chars: int = 12000) -> str:
    """What a failed torchrun printed, for an assertion message: the ends of its stdout and
    of its stderr, long enough to hold a rank's stacks beside torchrun's own traceback."""
    return f"{done.stdout[-chars // 4:]}\n{done.stderr[-chars:]}"


def _children(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (from /proc)."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError):
            if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == pid:
                out.append(int(stat.parent.name))
    return out


@dataclass
class RankResult:
    info: dict[str, Any]
    arrays: dict[str, np.ndarray]


class Outcome:
    """What every rank of a finished group recorded, task by task."""

    def __init__(self, group: Group) -> None:
        self.world_size = group.world_size
        self.tasks: dict[str, list[RankResult]] = {}
        for task in group.tasks:
            ranks = []
            for r in range(group.world_size):
                info = json.loads((group.out / f"{task['name']}.r{r}.json").read_text())
                with np.load(group.out / f"{task['name']}.r{r}.npz") as z:
                    arrays = {k: z[k] for k in z.files}
                ranks.append(RankResult(info, arrays))
            self.tasks[task["name"]] = ranks

    def ranks(self, task: str) -> list[RankResult]:
        """Every rank's record of ``task``; fails the calling test if any rank raised."""
        results = self.tasks[task]
        errors = [f"rank {r.info['rank']}:\n{r.info['error']}" for r in results
                  if "error" in r.info]
        if errors:
            pytest.fail(f"task {task!r} raised in W={self.world_size}:\n" + "\n".join(errors),
                        pytrace=False)
        return results

    def per_rank(self, task: str, part: str, key: str = "input_ids") -> list[np.ndarray]:
        """Each rank's rows of ``part``, shaped (steps, micro_batch, ...)."""
        out = []
        for r in self.ranks(task):
            steps = int(r.arrays[f"{part}__steps"])
            rows = r.arrays[f"{part}__{key}"]
            out.append(rows.reshape(steps, -1, *rows.shape[1:]) if steps
                       else rows.reshape(0, 0, *rows.shape[1:]))
        return out

    def states(self, task: str) -> list[str]:
        """The state JSON every rank saved in ``task`` (exchanged over gloo), rank order."""
        shared = self.ranks(task)[0].info["shared"]
        return [s["state"] if s else "" for s in shared]

    def steps(self, task: str, part: str) -> list[int]:
        return [int(r.arrays[f"{part}__steps"]) for r in self.ranks(task)]

    def global_rows(self, task: str, part: str, key: str = "input_ids") -> np.ndarray:
        """The global order the ranks consumed: each step's micro-batches in rank order."""
        per_rank = self.per_rank(task, part, key)
        steps = {len(x) for x in per_rank}
        assert len(steps) == 1, f"ranks ran different numbers of steps: {steps}"
        stacked = np.stack(per_rank, axis=1)  # (steps, ranks, m, ...)
        return stacked.reshape(-1, *stacked.shape[3:])


def finish(*groups: Group, timeout: float = GROUP_TIMEOUT) -> list[Outcome]:
    """Wait for every rank of ``groups``; kill them all and fail with their logs if one
    exits non-zero or the time runs out."""
    failed = []
    for g in groups:
        for r, p in enumerate(g.procs):
            try:
                code = p.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                code = None
            if code != 0:
                failed.append((g, r, code))
    if failed:
        for g in groups:
            for p in g.procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
        logs = "\n".join(f"--- {g.name} rank {r} exit {code}:\n"
                         + (g.out / f"log.r{r}").read_text(errors="replace")[-4000:]
                         for g, r, code in failed)
        pytest.fail(f"rank processes failed:\n{logs}", pytrace=False)
    return [Outcome(g) for g in groups]


# -- identifying windows by content -------------------------------------------------------------
class WindowIndex:
    """Which window of the stored stream a row is, from its tokens alone (the window's
    ``seq_len + 1`` tokens are ``input_ids`` plus the last label); -1 for an all-zero
    padding row. Independent of the sampler and of the dataset's order."""

    def __init__(self, cache_dir: Path, seq_len: int) -> None:
        self.cache = sw.open_cache(cache_dir)
        self.seq_len = seq_len
        tokens = np.asarray(self.cache.read_tokens(0, self.cache.num_tokens), dtype=np.int64)
        self.total = len(tokens)
        n = -(-(self.total - 1) // seq_len)  # drop_last=False: the last window is partial
        padded = np.zeros(n * seq_len + 1, dtype=np.int64)
        padded[: self.total] = tokens
        self.by_content: dict[bytes, int] = {}
        for w in range(n):
            key = padded[w * seq_len: w * seq_len + seq_len + 1].tobytes()
            if key in self.by_content:
                raise AssertionError(f"windows {self.by_content[key]} and {w} have the same "
                                     "tokens; this test needs distinct windows")
            self.by_content[key] = w

    def of(self, input_ids: np.ndarray, labels: np.ndarray) -> np.ndarray:
        # a label without loss is -100 (read/examples.py); the stream held padding there
        last = np.where(labels[:, -1:] == -100, 0, labels[:, -1:])
        rows = np.concatenate([input_ids, last], axis=1).astype(np.int64)
        out = np.empty(len(rows), dtype=np.int64)
        for i, row in enumerate(rows):
            if not row.any():
                out[i] = -1
                continue
            w = self.by_content.get(row.tobytes())
            if w is None:
                raise AssertionError(f"row {i} is not a window of the cache: {row[:8]}…")
            out[i] = w
        return out

    def chunk_stems(self, windows: np.ndarray) -> set[str]:
        """The chunks holding the tokens of ``windows`` (their ``seq_len + 1`` spans)."""
        cum = self.cache.cum_tokens
        stems: set[str] = set()
        for w in windows[windows >= 0].tolist():
            start = w * self.seq_len
            stop = min(start + self.seq_len + 1, self.total)
            first = int(np.searchsorted(cum, start, side="right")) - 1
            last = int(np.searchsorted(cum, stop - 1, side="right")) - 1
            stems.update(self.cache.chunks[c].stem for c in range(first, last + 1))
        return stems

    @property
    def all_stems(self) -> set[str]:
        return {c.stem for c in self.cache.chunks}
