"""Lightning under torchrun (DDP, gloo, CPU, 2 processes, gradient accumulation 2; a tiny
linear LM): every optimizer step's global batch is shardwise's, each Lightning epoch is a
reshuffled epoch of the order, and resuming from ``step=k.ckpt`` (mid-epoch, on 2 and on 1
process) continues with exactly the uninterrupted run's batches — although Lightning's
fetcher pulls one micro-batch ahead of the one it trains. Both loaders: ``shardwise.torch
.loader`` and torchdata's ``StatefulDataLoader``, through ``shardwise.lightning.loader``,
with Lightning's default ``use_distributed_sampler=True``."""

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

import shardwise as sw

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from cachefactory import make_cache, sample_docs  # noqa: E402

RUN = Path(__file__).resolve().with_name("_lightning_run.py")
REPO = Path(__file__).resolve().parents[2]
SEQ_LEN, MICRO, GLOBAL, VOCAB = 9, 2, 8, 500
KINDS = ["shardwise-single", "torchdata-single", "shardwise-cyclic", "torchdata-cyclic"]
pytest.importorskip("lightning")


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def torchrun(tmp: Path, name: str, nproc: int, spec: dict[str, Any]) -> Path:
    record = tmp / name
    record.mkdir()
    (record / "spec.json").write_text(json.dumps({**spec, "record": str(record)}))
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    env.update(OMP_NUM_THREADS="1", PYTHONHASHSEED="0",
               PYTHONPATH=os.pathsep.join([str(REPO / "src"), env.get("PYTHONPATH", "")]))
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={nproc}",
           "--master-addr=127.0.0.1", f"--master-port={_port()}", str(RUN),
           str(record / "spec.json")]
    done = subprocess.run(cmd, env=env, capture_output=True, timeout=300)
    assert done.returncode == 0, done.stdout.decode()[-3000:] + done.stderr.decode()[-6000:]
    return record


def _steps(record: Path, kind: str, world: int) -> list[np.ndarray]:
    """Per-rank micro-batches → each optimizer step's rows in shardwise's order (micro-step
    k of a step holds examples [k·m·W + r·m, …) on rank r)."""
    seen = [np.load(record / f"{kind}.seen.r{r}.npy") for r in range(world)]
    acc = GLOBAL // (MICRO * world)
    return [np.concatenate([seen[r][s * acc + k] for k in range(acc) for r in range(world)])
            for s in range(len(seen[0]) // acc)]


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("lightning") / "cache"
    return make_cache(root, [sample_docs(10, seed=2, vocab_size=VOCAB)], chunk_docs=3,
                      eod_id=0)


def test_lightning_resume_is_the_uninterrupted_run(cache: Path, tmp_path: Path) -> None:
    ds = sw.TokenDataset(cache, seq_len=SEQ_LEN, seed=7)
    per_epoch = len(ds) // GLOBAL
    assert per_epoch >= 3, len(ds)
    base = {"cache": str(cache), "seq_len": SEQ_LEN, "vocab": VOCAB, "micro": MICRO,
            "global": GLOBAL, "epochs": 2, "steps": 2 * per_epoch, "kinds": KINDS}
    full = torchrun(tmp_path, "full", 2, base)
    k = per_epoch + 1  # a checkpoint inside the second epoch
    on2 = torchrun(tmp_path, "on2", 2, {**base, "resume": str(full), "step": k})
    on1 = torchrun(tmp_path, "on1", 1, {**base, "resume": str(full), "step": k})
    order = [ds[i]["input_ids"] for i in range(len(ds))]
    for kind in KINDS:
        steps = _steps(full, kind, 2)
        assert len(steps) == 2 * per_epoch
        if kind.endswith("cyclic"):  # each Lightning epoch: one reshuffled epoch of the order
            _check_epochs(steps, per_epoch, order)
        for record, world in ((on2, 2), (on1, 1)):
            cont = _steps(record, kind, world)
            assert len(cont) == len(steps) - k, (kind, world, len(cont))
            for got, want in zip(cont, steps[k:], strict=True):
                np.testing.assert_array_equal(got, want, err_msg=f"{kind} resumed on {world}")
        np.testing.assert_array_equal(np.load(on2 / f"{kind}.params.npy"),
                                      np.load(full / f"{kind}.params.npy"))


def _check_epochs(steps: list[np.ndarray], per_epoch: int, order: list[np.ndarray]) -> None:
    epochs = [np.concatenate(steps[e * per_epoch:(e + 1) * per_epoch]) for e in (0, 1)]
    rows = [sorted(map(bytes, e)) for e in epochs]
    assert rows[0] == rows[1] and not np.array_equal(epochs[0], epochs[1])
    assert len(set(rows[0])) == len(rows[0]) and set(rows[0]) <= set(map(bytes, order))
