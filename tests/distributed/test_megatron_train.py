"""A Megatron-style training loop on ``shardwise.megatron`` under ``torchrun
--nproc-per-node 2`` (gloo, CPU, a tiny LM, batch-size ramp-up): every micro-step's
samples are shardwise's global order split between the ranks, and resuming from the
checkpoint's ``consumed_train_samples`` continues bit-identically (same samples, same
losses, same parameters)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from tests.distributed.harness import said, torchrun

from shardwise.megatron import build_train_valid_test_datasets

SCRIPT = Path(__file__).resolve().with_name("_megatron_train.py")
SEQ_LEN, MBS, GBS, STEPS, SAVE_AT = 16, 2, 8, 9, 4
RAMPUP = [4, 4, 24]  # global batch 4 for the first 24 samples, then 8


def _torchrun(spec: dict[str, Any], path: Path) -> list[dict[str, Any]]:
    path.write_text(json.dumps(spec))
    done = torchrun(SCRIPT, str(path))
    assert done.returncode == 0, said(done)
    tag = "resumed" if spec["resume"] else "full"
    return [json.loads((Path(spec["out"]) / f"{tag}.r{r}.json").read_text())
            for r in range(2)]


@pytest.fixture(scope="module", params=["single", "cyclic"])
def runs(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory,
         small_chunk_cache: Path) -> tuple[str, list[Any], list[Any]]:
    d = tmp_path_factory.mktemp(f"megatron-{request.param}")
    spec = {"cache": str(small_chunk_cache), "out": str(d), "ckpt": str(d / "ckpt.pt"),
            "seq_len": SEQ_LEN, "mbs": MBS, "gbs": GBS, "rampup": RAMPUP, "steps": STEPS,
            "save_at": SAVE_AT, "dataloader_type": request.param, "resume": False}
    full = _torchrun(spec, d / "full.json")
    resumed = _torchrun({**spec, "resume": True}, d / "resumed.json")
    return request.param, full, resumed


def test_resume_from_consumed_samples_is_bit_identical(runs: Any) -> None:
    _, full, resumed = runs
    for f, r in zip(full, resumed, strict=True):
        assert r["steps"] == f["steps"][SAVE_AT:]  # samples, consumed counts and losses
        assert r["params"] == f["params"]


def test_the_ramp_up_schedule_and_the_global_order(runs: Any, small_chunk_cache: Path
                                                   ) -> None:
    kind, full, _ = runs
    steps = full[0]["steps"]
    sizes = [b - a for a, b in zip([0] + [s["consumed"] for s in steps],
                                   [s["consumed"] for s in steps], strict=False)]
    assert sizes == [4] * 6 + [8] * 3  # consumed 0..24 at 4, then 8
    if kind != "single":
        return
    train, _, _ = build_train_valid_test_datasets(
        str(small_chunk_cache), split="98,2,0", seq_length=SEQ_LEN, seed=1234,
        reset_position_ids=True, eod_mask_loss=True, create_attention_mask=False)
    assert train is not None
    seen = [np.asarray(rows) for s0, s1 in zip(full[0]["steps"], full[1]["steps"], strict=True)
            for m0, m1 in zip(s0["rows"], s1["rows"], strict=True)
            for rows in (m0, m1)]
    got = np.concatenate(seen)
    assert (got == train.__getitems__(list(range(len(got))))["tokens"]).all()
