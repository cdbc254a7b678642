"""ShardwiseTrainer under torchrun (2 ranks, gloo, CPU, a tiny GPT-2 from a config):
every optimizer step's global batch is shardwise's, the loss is a hand-computed next-token
cross-entropy, and resuming (2 → 2 and 2 → 1 processes) continues bit-identically. And
accelerate's wrappers are refused over shardwise readers. Each run is a job of the
session's shared launches (tests/integrations/_launches.py), several assertions each."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from tests.integrations._launches import FIRST, ONE, RESUME, Job, Launches
from tokenizers import Tokenizer

import shardwise as sw
from shardwise.hf import collate

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from cachefactory import make_cache, sample_docs  # noqa: E402

RUN = Path(__file__).resolve().with_name("_hf_run.py")
REPO = Path(__file__).resolve().parents[2]
SEQ_LEN, MICRO = 16, 2
TIMEOUT = 600


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def torchrun(tmp: Path, name: str, nproc: int, spec: dict[str, Any], *,
             script: Path = RUN) -> Path:
    """Run ``script spec.json`` on ``nproc`` processes; returns the record directory."""
    record = tmp / name
    record.mkdir()
    spec = {**spec, "record": str(record)}
    (record / "spec.json").write_text(json.dumps(spec))
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    env.update(OMP_NUM_THREADS="1", PYTHONHASHSEED="0", TOKENIZERS_PARALLELISM="false",
               PYTHONPATH=os.pathsep.join([str(REPO / "src"), str(REPO / "tests"),
                                           env.get("PYTHONPATH", "")]))
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={nproc}",
           "--master-addr=127.0.0.1", f"--master-port={_port()}", str(script),
           str(record / "spec.json")]
    done = subprocess.run(cmd, env=env, capture_output=True, timeout=TIMEOUT)
    assert done.returncode == 0, done.stdout.decode()[-3000:] + done.stderr.decode()[-6000:]
    return record


def _cache(root: Path) -> Path:
    """About 3 global batches of 8 windows per epoch and a remainder, in 4 chunks: a few
    steps cross an epoch (with its reshuffle) and chunk edges."""
    return make_cache(root / "cache", [sample_docs(12, seed=5, vocab_size=500)], chunk_docs=3,
                      eod_id=0)


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _cache(tmp_path_factory.mktemp("hf"))


def _plan(cache: Path) -> tuple[sw.TokenDataset, int, int, int]:
    """The dataset, global batch, steps (crossing into the second, reshuffled epoch) and
    the step of the checkpoint (inside the first epoch)."""
    ds = sw.TokenDataset(cache, seq_len=SEQ_LEN, seed=7, reset_position_ids=True)
    B = MICRO * 2 * 2
    per_epoch = len(ds) // B
    return ds, B, per_epoch + 2, per_epoch - 1


def launch_jobs(root: Path) -> list[Job]:
    """One full run (2 ranks, accumulation 2), resumed from a mid-epoch checkpoint on 2
    ranks and on 1 rank (accumulation 4: the same global batch); the misuse checks."""
    cache = _cache(root)
    tokenizer = REPO / "sample" / "tokenizer.json"
    vocab = Tokenizer.from_file(str(tokenizer)).get_vocab_size()
    _, _, steps, save = _plan(cache)
    base = {"cache": str(cache), "seq_len": SEQ_LEN, "vocab": vocab, "micro": MICRO,
            "max_steps": steps, "save_steps": save}
    ckpt = str(root / "out" / f"checkpoint-{save}")
    return [Job("full", FIRST, RUN, {**base, "accumulation": 2, "output_dir": str(root / "out"),
                                     "record": str(root / "full")}),
            Job("misuse", FIRST, RUN, {"cache": str(cache), "seq_len": SEQ_LEN, "misuse": True,
                                       "record": str(root / "misuse")}),
            Job("resume2", RESUME, RUN, {**base, "accumulation": 2, "resume": ckpt,
                                         "output_dir": str(root / "r2"),
                                         "record": str(root / "resume2")}),
            Job("resume1", ONE, RUN, {**base, "accumulation": 4, "resume": ckpt,
                                      "output_dir": str(root / "r1"),
                                      "record": str(root / "resume1")})]


def _global_batches(seen: list[np.ndarray], accumulation: int) -> list[np.ndarray]:
    """Per-rank micro-batches → each optimizer step's rows in shardwise's order: micro-step
    k holds examples [k·m·W + r·m, …) on rank r."""
    steps = len(seen[0]) // accumulation
    return [np.concatenate([seen[r][s * accumulation + k] for k in range(accumulation)
                            for r in range(len(seen))]) for s in range(steps)]


def test_trainer_order_loss_and_resume(launches: Launches, tokenizer_path: Path) -> None:
    """One full run (2 ranks, accumulation 2), resumed from a mid-epoch checkpoint on 2
    ranks and on 1 rank (accumulation 4: the same global batch)."""
    jobs = launches.jobs["test_hf_trainer"]
    vocab = Tokenizer.from_file(str(tokenizer_path)).get_vocab_size()
    assert jobs["full"].spec["vocab"] == vocab
    ds, B, steps, save = _plan(Path(jobs["full"].spec["cache"]))
    out = Path(jobs["full"].spec["output_dir"])
    full = launches.record("test_hf_trainer", "full")

    seen = [np.load(full / f"seen.r{r}.npy") for r in range(2)]
    got = _global_batches(list(seen), 2)
    assert len(got) == steps
    for b, rows in enumerate(got):  # HF epoch e = global batches [e·per_epoch, …)
        want = ds.get_batch(list(range(b * B, (b + 1) * B)))["input_ids"]
        assert np.array_equal(rows, want), f"step {b} is not shardwise's global batch {b}"
    losses = np.concatenate([np.load(full / f"losses.r{r}.npy") for r in range(2)])
    np.testing.assert_allclose(losses[:, 0], losses[:, 1], rtol=1e-6)

    ckpt = out / f"checkpoint-{save}"
    state = json.loads((ckpt / "shardwise_loader.json").read_text())
    assert state["consumed"] == save * B

    assert jobs["resume2"].spec["resume"] == jobs["resume1"].spec["resume"] == str(ckpt)
    again = launches.record("test_hf_trainer", "resume2")
    tail = _global_batches([np.load(again / f"seen.r{r}.npy") for r in range(2)], 2)
    assert len(tail) == steps - save  # no step replayed, none skipped twice
    for j, rows in enumerate(tail):
        assert np.array_equal(rows, got[save + j]), f"resumed step {save + j} differs"
    with np.load(full / "params.npz") as a, np.load(again / "params.npz") as b:
        for k in a.files:
            assert np.array_equal(a[k], b[k]), f"2 → 2: parameter {k} differs"

    one = launches.record("test_hf_trainer", "resume1")
    tail1 = _global_batches([np.load(one / "seen.r0.npy")], 4)
    assert len(tail1) == steps - save
    for j, rows in enumerate(tail1):
        assert np.array_equal(rows, got[save + j]), f"2 → 1: step {save + j} differs"
    with np.load(full / "params.npz") as a, np.load(one / "params.npz") as b:
        for k in a.files:  # the same batches; one process sums the gradients in another order
            np.testing.assert_allclose(a[k], b[k], rtol=1e-4, atol=1e-6)


def test_accelerate_wrappers_are_refused(launches: Launches) -> None:
    rec = launches.record("test_hf_trainer", "misuse")
    for r in range(2):
        result = json.loads((rec / f"misuse.r{r}.json").read_text())
        assert set(result) >= {"prepare(loader)", "prepare(stream) no dispatch"}
        for name, message in result.items():
            assert "ShardwiseTrainer" in message, f"rank {r}: {name}: {message}"
        assert "BatchSamplerShard" in result["prepare(loader)"]
        assert "IterableDatasetShard" in result["prepare(stream) no dispatch"]
        if r == 0:
            assert "DataLoaderDispatcher" in result["prepare(stream) dispatch"]


def test_collate_converts_labels_to_hf(cache: Path) -> None:
    """shift_labels are shardwise's next-token targets with loss_mask 0 as -100; labels are
    HF's unshifted convention (what a model that shifts itself expects)."""
    ds = sw.TokenDataset(cache, seq_len=SEQ_LEN, seed=7, eod_mask_loss=True)
    rows = ds.__getitems__([0, 1, 2])
    batch = collate(rows)
    want = np.where(rows.batch["loss_mask"] > 0, rows.batch["labels"], -100)
    assert np.array_equal(batch["shift_labels"].numpy(), want)
    assert (batch["labels"][:, 0] == -100).all()
    assert torch.equal(batch["labels"][:, 1:], batch["shift_labels"][:, :-1])
    assert set(batch) == {"input_ids", "labels", "shift_labels", "position_ids"}
