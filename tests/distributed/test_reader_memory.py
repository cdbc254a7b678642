"""Bounded reader memory, measured in a fresh reader process from ``/proc/self/status``.

Phase 1 reads 2,000 micro-batches of 8 × 512 tokens (about one epoch) from a ~16 MB cache:
VmRSS may grow by the pages of the memory-mapped chunks it touches (at most the cache's
16 MB), not by what it has served (a leak of the served batches would be ~130 kB a batch,
~250 MB in all). Phase 2 opens a dataset of 8 Mi one-token windows and seeks to the end of
several epochs, reading a few batches across each boundary: anonymous memory must not
grow by anything of the order of one integer per example (8 Mi × 8 bytes = 64 MiB).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from tests.distributed.harness import SEED, finish, launch

BATCHES = 2000
WARMUP = 200
RSS_GROWTH_KB = 100 * 1024
ANON_GROWTH_KB = 24 * 1024


@pytest.fixture(scope="module")
def measured(tmp_path_factory: pytest.TempPathFactory, big_token_cache: Path
             ) -> dict[str, Any]:
    task = {"name": "rss", "kind": "rss", "cache": str(big_token_cache),
            "dataset": {"seq_len": 512, "seed": SEED},
            "loader": {"global_batch_size": 8, "micro_batch_size": 8, "num_workers": 0},
            "batches": BATCHES, "warmup": WARMUP,
            "deep_dataset": {"seq_len": 1, "seed": SEED},
            "deep_loader": {"global_batch_size": 8, "micro_batch_size": 8, "num_workers": 0},
            "deep_epochs": [1, 2, 5, 1000]}
    (out,) = finish(launch(tmp_path_factory.mktemp("rss"), "reader", 1, [task],
                           distributed=False))
    info: dict[str, Any] = out.ranks("rss")[0].info
    return info


def test_reader_rss_stays_flat_over_2000_micro_batches(measured: dict[str, Any]) -> None:
    samples = measured["samples"]
    assert samples[0][0] == WARMUP and samples[-1][0] == BATCHES
    base = samples[0][1]
    growth = max(rss for _, rss, _ in samples) - base
    assert growth < RSS_GROWTH_KB, (
        f"VmRSS grew by {growth / 1024:.0f} MB after warm-up (samples: batch, VmRSS kB, "
        f"RssAnon kB = {samples})")


def test_seeking_through_epochs_of_millions_of_examples_is_not_per_example(
        measured: dict[str, Any]) -> None:
    assert measured["deep_examples"] > 8_000_000
    before, after = measured["deep_anon_kb"]
    assert after - before < ANON_GROWTH_KB, (
        f"anonymous memory grew by {(after - before) / 1024:.0f} MB while seeking through "
        f"{measured['deep_examples']:,} examples per epoch")
