"""A map-style reader in a multi-rank job refuses examples that no shardwise placement dealt
(issue 29, item 1), in one process: the job is torchrun's environment (RANK, WORLD_SIZE).
Real ranks (titan's own loader, a plain DataLoader): tests/integrations/test_torchtitan.py."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from torch.utils.data import DataLoader

import shardwise as sw
from shardwise.errors import ConfigError
from shardwise.read.guard import Placed
from shardwise.torch import loader

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from cachefactory import make_cache, sample_docs  # noqa: E402

SEQ = 8


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    docs = [d[:20] or [1] for d in sample_docs(20, seed=4, vocab_size=300)]
    return make_cache(tmp_path_factory.mktemp("unplaced") / "c", [docs], chunk_docs=5,
                      vocab_size=300, eod_id=0)


@pytest.fixture
def rank1of2(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")


def _blend(cache: Path, **kwargs: object) -> sw.Blend:
    parts = [sw.TokenDataset(cache, seq_len=SEQ, seed=s) for s in (1, 2)]
    return sw.Blend(parts, [0.5, 0.5], seed=3, **kwargs)  # type: ignore[arg-type]


@pytest.mark.usefixtures("rank1of2")
@pytest.mark.parametrize("reader", ["tokens", "blend"])
def test_a_foreign_sampler_is_refused_naming_the_fix(reader: str, cache: Path) -> None:
    ds = sw.TokenDataset(cache, seq_len=SEQ) if reader == "tokens" else _blend(cache)
    for read in (lambda: next(iter(DataLoader(ds, batch_size=2))), lambda: ds[0],
                 lambda: ds.get_batch([0, 1])):
        with pytest.raises(ConfigError) as e:
            read()
        said = str(e.value)
        assert "job of 2 ranks (this process is rank 1 of 2)" in said
        assert "shardwise.torch.loader(ds" in said and "world=World.single()" in said
        assert "torchtitan: shardwise.torchtitan.ShardwiseDataLoader" in said


@pytest.mark.usefixtures("rank1of2")
def test_a_worker_refuses_too(cache: Path) -> None:
    ds = sw.TokenDataset(cache, seq_len=SEQ)
    with pytest.raises(ConfigError, match="by a sampler that is not shardwise's"):
        next(iter(DataLoader(ds, batch_size=2, num_workers=1)))


@pytest.mark.usefixtures("rank1of2")
@pytest.mark.parametrize("workers", [0, 1])
def test_shardwise_placement_reads_this_ranks_slice(cache: Path, workers: int) -> None:
    ds = sw.TokenDataset(cache, seq_len=SEQ)
    got = next(iter(loader(ds, global_batch_size=4, micro_batch_size=2, num_workers=workers)))
    whole = sw.TokenDataset(cache, seq_len=SEQ, world=sw.World.single())
    assert np.array_equal(got["input_ids"].numpy(), whole.get_batch([2, 3])["input_ids"])
    blend = next(iter(loader(_blend(cache), global_batch_size=4, micro_batch_size=2)))
    assert np.array_equal(blend["input_ids"].numpy(),
                          _blend(cache, world=sw.World.single()).get_batch([2, 3])["input_ids"])


@pytest.mark.usefixtures("rank1of2")
def test_world_single_reads_anything_on_purpose(cache: Path) -> None:
    one = sw.TokenDataset(cache, seq_len=SEQ, world=sw.World.single())
    batch = next(iter(DataLoader(one, batch_size=2)))
    assert np.array_equal(batch["input_ids"].numpy(), one.get_batch(Placed([0, 1]))["input_ids"])
    mix = _blend(cache, world=sw.World.single())
    first = next(iter(mix))  # iterating a blend reads its parts: allowed with the opt-in
    assert np.array_equal(first["input_ids"], mix[0]["input_ids"])


def test_one_process_reads_directly(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    ds = sw.TokenDataset(cache, seq_len=SEQ)
    assert len(next(iter(DataLoader(ds, batch_size=2)))["input_ids"]) == 2
    with pytest.raises(ConfigError, match="in a job of 2 ranks"):  # a 2-rank world given
        sw.TokenDataset(cache, seq_len=SEQ, world=sw.World(0, 2))[0]
