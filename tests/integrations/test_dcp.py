"""torchtitan-style checkpointing under torchrun (gloo, CPU): the shardwise loader, kept in
a ``Stateful`` under ``"dataloader"``, is saved with ``torch.distributed.checkpoint`` after
step k on 2 ranks, loaded on 2 and on 1 rank (global batch kept: the 1-rank run takes
micro-batches of 2 × 4 accumulation and of 4 × 2), and the continuation's global batches
equal the uninterrupted run's, which are the dataset's global order — a TokenDataset and a
Blend. Each run is a job of the session's shared launches (tests/integrations/_launches.py)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
from tests.integrations._launches import FIRST, ONE, RESUME, Job, Launches

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _dcp_run import dataset  # noqa: E402

from cachefactory import make_cache, sample_docs  # noqa: E402

RUN = Path(__file__).resolve().with_name("_dcp_run.py")
SEQ_LEN, MICRO, GLOBAL, SEED = 9, 2, 8, 7
KINDS = ["tokens", "blend"]


def _caches(root: Path) -> list[str]:
    return [str(make_cache(root / f"c{i}", [sample_docs(8, seed=3 + i, vocab_size=500)],
                           chunk_docs=3, eod_id=0)) for i in range(2)]


def _base(caches: list[str], checkpoints: Path) -> dict[str, Any]:
    base = {"caches": caches, "seq_len": SEQ_LEN, "seed": SEED, "global": GLOBAL,
            "kinds": KINDS, "checkpoints": str(checkpoints)}
    per_epoch = len(dataset(base, "tokens")) // GLOBAL
    save, steps = per_epoch + 1, 2 * per_epoch + 2  # saved inside the second epoch
    return {**base, "steps": steps, "save": save}


def launch_jobs(root: Path) -> list[Job]:
    """The uninterrupted run on 2 ranks; resumed on 2 and on 1 rank."""
    base = _base(_caches(root), root / "ckpt")
    return [Job("full", FIRST, RUN, {**base, "micros": [MICRO], "record": str(root / "full")}),
            Job("on2", RESUME, RUN, {**base, "micros": [MICRO], "resume": True,
                                      "record": str(root / "on2")}),
            Job("on1", ONE, RUN, {**base, "micros": [MICRO, 2 * MICRO], "resume": True,
                                   "record": str(root / "on1")})]


def _steps(record: Path, kind: str, micro: int, world: int) -> list[np.ndarray]:
    """Per-rank micro-batches → each step's global batch in shardwise's order (micro-step
    a of a step holds examples [a·m·W + r·m, …) on rank r)."""
    seen = [np.load(record / f"{kind}.m{micro}.seen.r{r}.npy") for r in range(world)]
    acc = GLOBAL // (micro * world)
    return [np.concatenate([seen[r][s * acc + a] for a in range(acc) for r in range(world)])
            for s in range(len(seen[0]) // acc)]


def _states(record: Path, kind: str, micro: int, world: int) -> list[dict]:
    return [json.loads((record / f"{kind}.m{micro}.state.r{r}.json").read_text())
            for r in range(world)]


def test_dcp_resume_on_2_and_1_ranks_is_the_uninterrupted_run(launches: Launches) -> None:
    base = launches.jobs["test_dcp"]["full"].spec
    per_epoch = len(dataset(base, "tokens")) // GLOBAL
    assert per_epoch >= 2, per_epoch
    save, steps = per_epoch + 1, 2 * per_epoch + 2  # saved inside the second epoch
    assert (base["save"], base["steps"]) == (save, steps)
    full, on2, on1 = (launches.record("test_dcp", name) for name in ("full", "on2", "on1"))
    for kind in KINDS:
        ds, want = dataset(base, kind), _steps(full, kind, MICRO, 2)
        assert len(want) == steps
        for b, rows in enumerate(want):  # the uninterrupted run reads the global order
            order = [ds[i]["input_ids"] for i in range(b * GLOBAL, (b + 1) * GLOBAL)]
            np.testing.assert_array_equal(rows, np.stack(order), err_msg=f"{kind} step {b}")
        end = _states(full, kind, MICRO, 2)
        assert end[0] == end[1] and end[0]["consumed"] == steps * GLOBAL, end
        for record, world, micro in ((on2, 2, MICRO), (on1, 1, MICRO), (on1, 1, 2 * MICRO)):
            got, where = _steps(record, kind, micro, world), f"{kind} on {world}×{micro}"
            assert len(got) == steps - save, (where, len(got))
            for s, (g, x) in enumerate(zip(got, want[save:], strict=True)):
                np.testing.assert_array_equal(g, x, err_msg=f"{where}: step {save + s}")
            assert all(e == end[0] for e in _states(record, kind, micro, world)), where
