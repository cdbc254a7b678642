"""DataLoader worker processes end cleanly when a loop stops early.

A worker sends a batch from a background (queue feeder) thread. Torch shuts workers down
when the iterator is dropped; a spawned worker then finalises its interpreter while that
thread may still be inside torch's C++ (sharing the batch's storage), and CPython < 3.14
ends such a thread with ``pthread_exit``, whose unwinding through a ``noexcept`` frame
aborts the worker ("terminate called without an active exception", "DataLoader worker
... killed by signal: Aborted"). Wide batches keep the feeder busy long enough that the
race is hit nearly every time unless the loader receives what is in flight first.
"""

from __future__ import annotations

import multiprocessing as mp
import sys
from pathlib import Path

import numpy as np
import pytest

import shardwise as sw
from shardwise.torch import loader

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/
from cachefactory import make_cache  # noqa: E402

SEQ_LEN = 1 << 17  # a micro-batch of 2 is ~7 MB of tensors to share


@pytest.fixture(scope="module")
def wide(tmp_path_factory: pytest.TempPathFactory) -> sw.TokenDataset:
    rng = np.random.default_rng(0)
    docs = [rng.integers(0, 1000, size=300_000).tolist() for _ in range(2)]
    root = make_cache(tmp_path_factory.mktemp("wide") / "cache", [docs], chunk_docs=1)
    return sw.TokenDataset(root, seq_len=SEQ_LEN, seed=3)


@pytest.mark.parametrize("persistent", [False, True])
def test_stopping_early_ends_every_worker_cleanly(wide: sw.TokenDataset,
                                                  persistent: bool) -> None:
    dl = loader(wide, global_batch_size=2, micro_batch_size=2, world=sw.World(0, 1),
                num_workers=2, multiprocessing_context="spawn",
                persistent_workers=persistent)
    before = set(mp.active_children())
    workers: set[mp.process.BaseProcess] = set()
    for k in range(3):
        it = iter(dl)
        batch = next(it)
        workers |= set(mp.active_children()) - before
        del it  # stop early: batches are still in flight
        want = wide.__getitems__([2 * k, 2 * k + 1])["input_ids"]
        assert np.array_equal(batch["input_ids"].numpy(), want)
        assert dl.state_dict()["consumed"] == 2 * (k + 1)  # what was received, no more
    del dl
    assert workers
    for w in workers:
        w.join(timeout=60)
        assert w.exitcode == 0, f"worker {w.pid} ended with {w.exitcode}"
