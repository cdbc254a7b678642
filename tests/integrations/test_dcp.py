"""torchtitan-style checkpointing under torchrun (gloo, CPU): the shardwise loader, kept in
a ``Stateful`` under ``"dataloader"``, is saved with ``torch.distributed.checkpoint`` after
step k on 2 ranks, loaded on 2 and on 1 rank (global batch kept: the 1-rank run
accumulates twice as many micro-batches), and the continuation's global batches equal the
uninterrupted run's — a TokenDataset and a Blend. One launch per run."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

import shardwise as sw

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_hf_trainer import torchrun  # noqa: E402

from cachefactory import make_cache, sample_docs  # noqa: E402

RUN = Path(__file__).resolve().with_name("_dcp_run.py")
SEQ_LEN, MICRO, GLOBAL, SEED = 9, 2, 8, 7
KINDS = ["tokens", "blend"]


@pytest.fixture(scope="module")
def caches(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    root = tmp_path_factory.mktemp("dcp")
    return [str(make_cache(root / f"c{i}", [sample_docs(8, seed=3 + i, vocab_size=500)],
                           chunk_docs=3, eod_id=0)) for i in range(2)]


def _steps(record: Path, kind: str, world: int) -> list[np.ndarray]:
    """Per-rank micro-batches → each step's global batch in shardwise's order (micro-step
    a of a step holds examples [a·m·W + r·m, …) on rank r)."""
    seen = [np.load(record / f"{kind}.seen.r{r}.npy") for r in range(world)]
    acc = GLOBAL // (MICRO * world)
    return [np.concatenate([seen[r][s * acc + a] for a in range(acc) for r in range(world)])
            for s in range(len(seen[0]) // acc)]


def test_dcp_resume_on_2_and_1_ranks_is_the_uninterrupted_run(caches: list[str],
                                                                tmp_path: Path) -> None:
    datasets = {"tokens": sw.TokenDataset(caches[0], seq_len=SEQ_LEN, seed=SEED)}
    per_epoch = len(datasets["tokens"]) // GLOBAL
    assert per_epoch >= 2, len(datasets["tokens"])
    save, steps = per_epoch + 1, 2 * per_epoch + 2  # saved inside the second epoch
    base = {"caches": caches, "seq_len": SEQ_LEN, "seed": SEED, "micro": MICRO,
            "global": GLOBAL, "steps": steps, "save": save, "kinds": KINDS,
            "checkpoints": str(tmp_path / "ckpt")}
    full = torchrun(tmp_path, "full", 2, base, script=RUN)
    runs = {w: torchrun(tmp_path, f"on{w}", w, {**base, "resume": True}, script=RUN)
            for w in (2, 1)}
    ds = datasets["tokens"]
    uninterrupted = _steps(full, "tokens", 2)
    for b, rows in enumerate(uninterrupted):  # the 2-rank run reads the one global order
        want = ds.get_batch(list(range(b * GLOBAL, (b + 1) * GLOBAL)))["input_ids"]
        np.testing.assert_array_equal(rows, want, err_msg=f"step {b}")
    for kind in KINDS:
        want = _steps(full, kind, 2)
        assert len(want) == steps
        for w, record in runs.items():
            got = _steps(record, kind, w)
            assert len(got) == steps - save, (kind, w, len(got))
            for s, (g, x) in enumerate(zip(got, want[save:], strict=True)):
                np.testing.assert_array_equal(g, x, err_msg=f"{kind} on {w}: step {save + s}")
            end = json.loads((record / f"{kind}.state.json").read_text())
            assert end == json.loads((full / f"{kind}.state.json").read_text()), (kind, w)
