"""ShardwiseTrainer's loaders in one process (no model training): which loader each kind of
reader gets, and the replay-by-skipping that a stock Trainer would do, refused."""

from __future__ import annotations

import sys
from itertools import islice
from pathlib import Path

import numpy as np
import pytest
import torch
from accelerate import skip_first_batches
from transformers import GPT2Config, GPT2LMHeadModel, TrainingArguments

import shardwise as sw
from shardwise.hf import ShardwiseTrainer
from shardwise.torch import loader

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from cachefactory import make_cache, sample_docs  # noqa: E402


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("hf1") / "cache"
    return make_cache(root, [sample_docs(12, seed=5, vocab_size=500)], chunk_docs=3,
                      eod_id=0)


def _trainer(tmp: Path, train: object, eval_ds: object = None,
             **kw: object) -> ShardwiseTrainer:
    cfg = GPT2Config(vocab_size=500, n_positions=16, n_embd=8, n_layer=1, n_head=1)
    args = TrainingArguments(output_dir=str(tmp), per_device_train_batch_size=2,
                             per_device_eval_batch_size=2, gradient_accumulation_steps=2,
                             max_steps=3, report_to=[], use_cpu=True)
    return ShardwiseTrainer(model=GPT2LMHeadModel(cfg), args=args, train_dataset=train,
                            eval_dataset=eval_ds, **kw)  # type: ignore[arg-type]


def test_map_style_gets_shardwise_order_in_whole_global_batches(cache: Path,
                                                                tmp_path: Path) -> None:
    ds = sw.TokenDataset(cache, seq_len=16, seed=7)
    dl = _trainer(tmp_path, ds).get_train_dataloader()
    assert len(dl) == len(ds) // 4 * 2  # micro-batches of one Trainer epoch: whole steps
    first = [b["input_ids"] for b in dl]
    second = [b["input_ids"] for b in dl]  # the next epoch continues the global order
    rows = torch.cat(first + second).numpy()
    assert np.array_equal(rows, ds.get_batch(list(range(len(rows))))["input_ids"])


def test_iterable_readers_get_a_plain_per_rank_loader(cache: Path, tmp_path: Path) -> None:
    stream = sw.StreamDataset(cache, seq_len=16, streams=1, seed=7)
    trainer = _trainer(tmp_path, stream, eval_ds=stream)
    dl = trainer.get_train_dataloader()
    assert type(dl) is torch.utils.data.DataLoader  # no DataLoaderDispatcher / Shard
    batch = next(iter(dl))
    assert set(batch) == {"input_ids", "labels", "shift_labels", "position_ids"}
    assert type(trainer.get_eval_dataloader()) is torch.utils.data.DataLoader


def test_skip_steps_for_an_iterable_reader_are_refused_not_ignored(cache: Path,
                                                                    tmp_path: Path) -> None:
    stream = sw.StreamDataset(cache, seq_len=16, streams=1, seed=7)
    trainer = _trainer(tmp_path, stream)
    trainer._sw_skip = [(1, 2)]  # as ShardwiseTrainer(..., shardwise_skip_steps=[(1, 2)])
    with pytest.raises(sw.ConfigError, match=r"StreamDataset places its own examples: give "
                                             r"a StreamDataset skip=.*B = 4"):
        trainer.get_train_dataloader()
    skipping = sw.StreamDataset(cache, seq_len=16, streams=1, seed=7, skip=[(4, 8)])
    want = [e["input_ids"] for e in islice(sw.StreamDataset(cache, seq_len=16, streams=1,
                                                            seed=7), 10)]
    dl = _trainer(tmp_path, skipping).get_train_dataloader()
    got = torch.cat([b["input_ids"] for b in islice(dl, 3)])  # positions 4‥7 skipped
    assert torch.equal(got, torch.as_tensor(np.stack([want[i] for i in (0, 1, 2, 3, 8, 9)])))


def test_eval_pass_is_padded_not_duplicated(cache: Path, tmp_path: Path) -> None:
    ds = sw.TokenDataset(cache, seq_len=16, shuffle="none", drop_last=False)
    dl = _trainer(tmp_path, ds, eval_ds=ds).get_eval_dataloader()
    batches = list(dl)
    targets = torch.cat([b["shift_labels"] for b in batches])
    real = targets[(targets != -100).any(dim=1)]
    assert len(real) == len(ds)  # every example once; the padding is all -100


def test_replay_by_skipping_is_refused(cache: Path) -> None:
    """What a stock Trainer does with a shardwise loader on resume_from_checkpoint."""
    ds = sw.TokenDataset(cache, seq_len=16, seed=7)
    dl = loader(ds, global_batch_size=2, micro_batch_size=2, world=sw.World(0, 1))
    with pytest.raises(sw.ConfigError, match="SkipBatchSampler.*ShardwiseTrainer"):
        next(iter(skip_first_batches(dl, 2)))


def test_compact_batches_reach_the_model_as_the_default_inputs(cache: Path,
                                                               tmp_path: Path) -> None:
    """shardwise_output: the loader hands over compact batches; _prepare_inputs expands them
    on the device into exactly the inputs the default form gives the model."""
    ds = sw.TokenDataset(cache, seq_len=16, seed=7, eod_mask_loss=True)
    full = _trainer(tmp_path / "a", ds)
    small = _trainer(tmp_path / "b", ds, shardwise_output=sw.Output(dtype="stored",
                                                                    compact=True))
    for a, b in zip(full.get_train_dataloader(), small.get_train_dataloader(), strict=True):
        assert "tokens" in b and "input_ids" not in b
        got, want = small._prepare_inputs(b), full._prepare_inputs(a)
        assert list(got) == list(want)
        for k in want:
            assert got[k].dtype == want[k].dtype and torch.equal(got[k], want[k]), k
