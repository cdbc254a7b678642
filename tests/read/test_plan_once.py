"""Plans built once per node, with real processes: two racing for the same plan (one
builds, the other waits and maps the same bytes), a builder killed mid-build (a waiter
takes over and publishes a complete plan), and two TokenDatasets racing on one cache.

Who built is read from markers the processes write (``_plan_once_child.py``), never from
timing; a builder is held mid-build by its own progress hook until the test says go.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
from tests.cachefactory import make_cache, sample_docs
from tests.read._plan_once_child import LENGTHS, PARAMS, sha

import shardwise
from shardwise.concurrency.poll import wait_until
from shardwise.plan import build_doc_shuffle_index

CHILD = Path(__file__).resolve().with_name("_plan_once_child.py")

WAIT = 120.0  # seconds without progress before a test gives up (never reached when green)


def _start(*argv: object) -> subprocess.Popen[str]:
    """``python *argv`` with this checkout's shardwise first on the path."""
    env = dict(os.environ, OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join([str(Path(shardwise.__file__).parents[1]),
                                           os.environ.get("PYTHONPATH", "")]))
    return subprocess.Popen([sys.executable, *map(str, argv)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)


def _seen(marks: Path, pattern: str) -> list[str]:
    return sorted(p.name.split(".", 1)[1] for p in marks.glob(pattern))


def _wait(what: str, ready: object) -> None:
    wait_until(ready, timeout=WAIT, poll_interval=0.05, what=what)  # type: ignore[arg-type]


def _finish(proc: subprocess.Popen[str]) -> str:
    out, err = proc.communicate(timeout=WAIT)
    assert proc.returncode == 0, err
    return out.strip().splitlines()[-1]


def _expected() -> str:
    index = build_doc_shuffle_index(LENGTHS, **PARAMS)
    return sha(index.doc_order, index.cum_tokens)


def test_two_processes_racing_build_one_plan_and_map_the_same_bytes(tmp_path: Path) -> None:
    plans, marks = tmp_path / "plans", tmp_path / "marks"
    marks.mkdir()
    procs = {n: _start(CHILD, plans, marks, n, "hold") for n in ("a", "b")}
    # whoever took the lock is held mid-build; the other has asked for the plan by then
    _wait("one builder mid-build and both processes asking",
          lambda: len(_seen(marks, "building.*")) == 1 and len(_seen(marks, "entering.*")) == 2)
    assert all(json.loads((marks / f"entering.{n}").read_text()) is False for n in procs), \
        "both asked before any plan was published"
    (marks / "go").touch()
    out = {n: _finish(p) for n, p in procs.items()}
    assert len(_seen(marks, "built.*")) == 1  # exactly one built
    assert _seen(marks, "built.*") == _seen(marks, "building.*")
    assert out["a"] == out["b"] == _expected()  # the waiter mapped the builder's bytes
    assert not [p for p in plans.iterdir() if p.name.startswith(".tmp-")]


def test_a_builder_killed_mid_build_is_replaced_by_a_waiter(tmp_path: Path) -> None:
    plans, marks = tmp_path / "plans", tmp_path / "marks"
    marks.mkdir()
    builder = _start(CHILD, plans, marks, "killed", "hold")  # never told to go
    _wait("the first builder mid-build", lambda: _seen(marks, "building.*") == ["killed"])
    assert [p for p in plans.iterdir() if p.name.startswith(".tmp-")], "temp files mid-build"
    waiter = _start(CHILD, plans, marks, "waiter", "free")
    _wait("the second process asking", lambda: (marks / "entering.waiter").exists())
    assert json.loads((marks / "entering.waiter").read_text()) is False
    builder.send_signal(signal.SIGKILL)  # it holds the lock: the kernel releases it
    builder.communicate(timeout=WAIT)
    assert builder.returncode == -signal.SIGKILL
    assert _finish(waiter) == _expected()  # a complete plan, built by the waiter
    assert _seen(marks, "built.*") == ["killed", "waiter"]
    assert not [p for p in plans.iterdir() if p.name.startswith(".tmp-")]  # leftovers gone
    json_files = list(plans.glob("*.json"))
    assert len(json_files) == 1 and json.loads(json_files[0].read_text())["n_docs"] == 5000


DATASET_CODE = """
import sys, hashlib
import shardwise
ds = shardwise.TokenDataset(shardwise.open_cache(sys.argv[1]), seq_len=16, seed=3,
                            shuffle="document", plan_dir=sys.argv[2])
b = ds.get_batch(list(range(8)))
print(hashlib.sha256(b["input_ids"].tobytes()).hexdigest())
"""


def test_two_token_datasets_racing_share_one_plan(tmp_path: Path) -> None:
    root = tmp_path / "cache"
    make_cache(root, [sample_docs(400, seed=1), sample_docs(300, seed=2)], chunk_docs=50)
    plans = tmp_path / "plans"
    procs = [_start("-c", DATASET_CODE, root, plans) for _ in range(2)]
    outs = [_finish(p) for p in procs]
    ds = shardwise.TokenDataset(shardwise.open_cache(root), seq_len=16, seed=3,
                                shuffle="document", plan_dir=plans)
    want = ds.get_batch(list(range(8)))["input_ids"]
    assert outs == [sha(want)] * 2
    names = sorted(p.name.split(".", 1)[1] for p in plans.iterdir() if p.is_file())
    assert names == ["cum_tokens.npy", "doc_order.npy", "doc_starts.json", "doc_starts.lock",
                     "doc_starts.npy", "json", "lock"]
    stored = np.concatenate([ds.cache.doc_lengths(c) for c in range(len(ds.cache.chunks))])
    assert np.array_equal(np.diff(ds.order.doc_starts()), stored)
