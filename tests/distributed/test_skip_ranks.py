"""Skip ranges across two real processes (gloo, ``World.detect()``): the skipped global
steps, and only they, are missing from what the ranks read; a loader stopped mid-run and
restored with a newly added future range continues exactly (and the same loader without
it continues unchanged). One group of two ranks runs every task."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest
from tests.cachefactory import make_cache
from tests.distributed.harness import Outcome, finish, launch

B, M, W = 8, 2, 2  # 2 micro-batches per rank per global step
STEPS = 12  # global steps of the reference run
SKIP = [[2, 4], [7, 8]]
RESUME_SKIP = [[2, 4]]  # steps 0, 1, 4 served, then the state: position 5 × B
ADDED = [[2, 4], [6, 8]]  # a new range after the saved position


def _opts(skip: list[list[int]] | None = None) -> dict[str, Any]:
    return {"global_batch_size": B, "micro_batch_size": M, "skip_steps": skip}


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Outcome:
    root = tmp_path_factory.mktemp("skip-ranks")
    docs = [[(11 * d + t) % 997 + 1 for t in range(40)] for d in range(30)]
    cache = str(make_cache(root / "cache", [docs], chunk_docs=5))
    ds = {"seq_len": 8, "seed": 3}
    per_rank = B // (M * W)
    tasks = [
        {"name": "plain", "kind": "run", "cache": cache, "dataset": ds, "loader": _opts(),
         "steps": STEPS * per_rank},
        {"name": "skipped", "kind": "run", "cache": cache, "dataset": ds,
         "loader": _opts(SKIP), "steps": (STEPS - 3) * per_rank},
        {"name": "resume", "kind": "resume", "cache": cache, "dataset": ds,
         "stop": 3 * per_rank, "tail": 4 * per_rank, "first": _opts(RESUME_SKIP),
         "second": _opts(ADDED)},
    ]
    (out,) = finish(launch(root, "w2", W, tasks))
    return out


def _global_steps(out: Outcome, task: str, part: str) -> list[np.ndarray]:
    rows = out.global_rows(task, part)
    return list(rows.reshape(-1, B, rows.shape[-1]))


def _same(got: list[np.ndarray], want: list[np.ndarray]) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert np.array_equal(g, w)


def test_the_skip_list_changes_only_the_skipped_steps(run: Outcome) -> None:
    plain = _global_steps(run, "plain", "run")
    skipped = [i for a, b in SKIP for i in range(a, b)]
    _same(_global_steps(run, "skipped", "run"),
          [s for i, s in enumerate(plain) if i not in skipped])


def test_a_new_future_range_on_resume_continues_exactly(run: Outcome) -> None:
    plain = _global_steps(run, "plain", "run")
    _same(_global_steps(run, "resume", "head"), [plain[0], plain[1], plain[4]])
    states = {json.loads(s)["consumed"] for s in run.states("resume")}
    assert states == {5 * B}  # the same position on both ranks
    _same(_global_steps(run, "resume", "again"), plain[5:9])  # the saved list, unchanged
    _same(_global_steps(run, "resume", "rewound"), plain[5:9])
    _same(_global_steps(run, "resume", "resumed"), [plain[5], plain[8], plain[9], plain[10]])


def test_the_ranks_state_holds_the_new_list(run: Outcome) -> None:
    for r in run.ranks("resume"):
        state = json.loads(r.info["state_after_resumed"])
        assert state["config"]["skip"] == [[a * B, b * B] for a, b in ADDED]
        assert state["consumed"] == 11 * B

