"""Skip ranges through the loaders, on real cache files: a skip list changes only the
skipped global steps (1 and 2 ranks, torch loader, torchdata sampler, Megatron and HF
adapters); a resume may add ranges at or after its position and continues exactly; a
state whose past ranges differ is refused naming the range; a position where a new range
starts continues at its end; describe() says what the skips leave out."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import shardwise as sw
from shardwise.errors import ConfigError, StateError
from shardwise.torch import loader

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/
from cachefactory import make_cache  # noqa: E402

B, M = 8, 2  # global batch, micro-batch
TOTAL = 120  # of 62 windows an epoch: 15 whole global steps, across an epoch boundary


@pytest.fixture(scope="module")
def ds(tmp_path_factory: pytest.TempPathFactory) -> sw.TokenDataset:
    docs = [[(7 * d + t) % 1000 for t in range(50)] for d in range(10)]
    root = make_cache(tmp_path_factory.mktemp("skip") / "cache", [docs], chunk_docs=4)
    return sw.TokenDataset(root, seq_len=8, seed=11)


def _steps(dl: Any, world_size: int) -> list[np.ndarray]:
    """This rank's rows, one array per global step (accumulation micro-batches joined)."""
    per_step = B // (M * world_size)
    batches = [b["input_ids"].numpy() for b in dl]
    return [np.concatenate(batches[i:i + per_step]) for i in range(0, len(batches), per_step)]


def _run(ds: Any, world_size: int, **kw: Any) -> list[np.ndarray]:
    per_rank = [_steps(loader(ds, global_batch_size=B, micro_batch_size=M,
                              world=sw.World(r, world_size), total_samples=TOTAL, **kw), world_size)
                for r in range(world_size)]
    return [np.concatenate(step) for step in zip(*per_rank, strict=True)]


def _same(got: list[np.ndarray], want: list[np.ndarray]) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert np.array_equal(g, w)


@pytest.mark.parametrize("world_size", [1, 2])
def test_a_skip_list_changes_only_the_skipped_steps(ds: sw.TokenDataset,
                                                    world_size: int) -> None:
    plain = _run(ds, world_size)
    assert len(plain) == 15
    skip = [(7, 8), (2, 4), (3, 5)]  # unsorted, overlapping: steps 2, 3, 4 and 7
    got = _run(ds, world_size, skip_steps=skip)
    _same(got, [s for i, s in enumerate(plain) if i not in (2, 3, 4, 7)])


def test_the_state_holds_the_skip_list_and_describe_counts_it(ds: sw.TokenDataset) -> None:
    plain = loader(ds, global_batch_size=B, micro_batch_size=M, world=sw.World(0, 1),
                   total_samples=TOTAL)
    dl = loader(ds, global_batch_size=B, micro_batch_size=M, world=sw.World(0, 1),
                total_samples=TOTAL, skip_steps=[(2, 4), (14, 20)])
    assert "skip" not in plain.state_dict()["config"]  # no skips: the fingerprint of before
    assert dl.state_dict()["config"]["skip"] == [[16, 32], [112, 160]]
    d = dl.describe()
    assert d["skip"] == [[16, 32], [112, 160]] and d["run_examples"] == TOTAL  # positions
    (drop,) = [x for x in d["drops"] if "skip list" in x["reason"]]
    assert drop["count"] == 16 + 8  # [112, 120) is inside the run's 15 whole steps
    assert "skip list" in repr(dl)
    assert len(dl) == 4 * (15 - 3)
    it = iter(dl)
    for _ in range(8):  # two global steps: the position jumps the skipped range
        next(it)
    assert dl.consumed == 16  # at the range: the jump comes with the next step
    next(it)
    assert dl.consumed == 32 + M


def _stopped(ds: Any, steps: int, **kw: Any) -> dict[str, Any]:
    dl = loader(ds, global_batch_size=B, micro_batch_size=M, world=sw.World(0, 1),
                total_samples=TOTAL, **kw)
    it = iter(dl)
    for _ in range(steps * B // M):
        next(it)
    return json.loads(json.dumps(dl.state_dict()))


def _resumed(ds: Any, state: dict[str, Any], **kw: Any) -> list[np.ndarray]:
    dl = loader(ds, global_batch_size=B, micro_batch_size=M, world=sw.World(0, 1),
                total_samples=TOTAL, **kw)
    dl.load_state_dict(state)
    return _steps(dl, 1)


def test_resume_with_a_new_future_range_continues_exactly(ds: sw.TokenDataset) -> None:
    plain = _run(ds, 1)
    state = _stopped(ds, 4, skip_steps=[(1, 2)])  # served steps 0, 2, 3, 4: at position 40
    assert state["consumed"] == 5 * B
    got = _resumed(ds, state, skip_steps=[(1, 2), (8, 10), (12, 13)])
    _same(got, [s for i, s in enumerate(plain) if i >= 5 and i not in (8, 9, 12)])
    # and the future range removed again: the rest of the order, unchanged
    _same(_resumed(ds, state, skip_steps=[(1, 2)]), plain[5:])


def test_a_position_where_a_new_range_starts_continues_at_its_end(
        ds: sw.TokenDataset) -> None:
    plain = _run(ds, 1)
    state = _stopped(ds, 3)  # no skips; at step 3
    got = _resumed(ds, state, skip_steps=[(3, 6)])
    _same(got, plain[6:])


@pytest.mark.parametrize(("resume_with", "named"), [
    ([], r"saved skipping \[8, 16\)"),  # a past range dropped
    ([(1, 3)], r"skip range \[8, 24\)"),  # a past range grown (step 2 was served)
    ([(1, 2), (4, 6)], r"skip range \[32, 48\)"),  # a new range reaching into the past
    ([(0, 2)], r"skip range \[0, 16\)"),
])
def test_a_state_whose_past_ranges_differ_is_refused_naming_the_range(
        ds: sw.TokenDataset, resume_with: list[tuple[int, int]], named: str) -> None:
    state = _stopped(ds, 4, skip_steps=[(1, 2)])  # at position 40
    with pytest.raises(StateError, match=r"(?s)refusing to resume.*" + named
                       + r".*at or after 40"):
        _resumed(ds, state, skip_steps=resume_with)


def test_other_config_is_still_refused_beside_a_skip_list(ds: sw.TokenDataset) -> None:
    state = _stopped(ds, 2, skip_steps=[(5, 6)])
    other = sw.TokenDataset(ds.cache.root, seq_len=8, seed=12)
    with pytest.raises(StateError, match="seed"):
        _resumed(other, state, skip_steps=[(5, 6)])


def test_bad_ranges_are_refused_naming_the_fix(ds: sw.TokenDataset) -> None:
    with pytest.raises(ConfigError, match=r"skip_steps range \(4, 2\)"):
        loader(ds, global_batch_size=B, micro_batch_size=M, world=sw.World(0, 1),
               skip_steps=[(4, 2)])
    with pytest.raises(ConfigError, match="eval.*skip"):
        loader(ds, global_batch_size=B, micro_batch_size=M, world=sw.World(0, 1),
               sampler="eval", skip_steps=[(0, 1)])


def test_the_torchdata_sampler_skips_and_resumes(ds: sw.TokenDataset) -> None:
    from torchdata.stateful_dataloader import StatefulDataLoader

    from shardwise.torch import collate
    from shardwise.torchdata import batch_sampler

    def make(skip: list[tuple[int, int]]) -> StatefulDataLoader:
        bs = batch_sampler(ds, global_batch_size=B, micro_batch_size=M,
                           world=sw.World(0, 1), total_samples=TOTAL, skip_steps=skip)
        return StatefulDataLoader(ds, batch_sampler=bs, collate_fn=collate)

    plain = _steps(make([]), 1)
    _same(_steps(make([(2, 4)]), 1), [s for i, s in enumerate(plain) if i not in (2, 3)])
    first = make([(2, 4)])
    it = iter(first)
    for _ in range(3 * B // M):  # steps 0, 1, 4
        next(it)
    state = first.state_dict()
    again = make([(2, 4), (6, 7)])
    again.load_state_dict(state)
    _same(_steps(again, 1), [s for i, s in enumerate(plain) if i == 5 or i >= 7])


def test_megatron_counts_trained_samples_and_skips_iterations(ds: sw.TokenDataset) -> None:
    from shardwise.megatron import build_pretraining_data_loader

    def run(consumed: int, **kw: Any) -> list[np.ndarray]:
        dl = build_pretraining_data_loader(ds, consumed, micro_batch_size=M,
                                           world=sw.World(0, 1), total_samples=TOTAL, **kw)
        return _steps(dl, 1)

    plain = run(0)
    skipped = run(0, skip_steps=[(2, 4)], global_batch_size=B)
    _same(skipped, [s for i, s in enumerate(plain) if i not in (2, 3)])
    # three iterations trained (steps 0, 1, 4): consumed_train_samples = 24, position 40
    _same(run(3 * B, skip_steps=[(2, 4)], global_batch_size=B), plain[5:])
    with pytest.raises(ConfigError, match="global_batch_size"):
        run(0, skip_steps=[(2, 4)])


def test_hf_trainer_epochs_skip_steps_and_check_the_served_count(
        ds: sw.TokenDataset, tmp_path: Path) -> None:
    from transformers import GPT2Config, GPT2LMHeadModel, TrainingArguments

    from shardwise.hf import ShardwiseTrainer

    def trainer(skip: list[tuple[int, int]] | None) -> ShardwiseTrainer:
        args = TrainingArguments(output_dir=str(tmp_path), per_device_train_batch_size=M,
                                 gradient_accumulation_steps=B // M, max_steps=3,
                                 report_to=[], use_cpu=True)
        cfg = GPT2Config(vocab_size=1000, n_positions=8, n_embd=8, n_layer=1, n_head=1,
                         bos_token_id=0, eos_token_id=0)
        return ShardwiseTrainer(model=GPT2LMHeadModel(cfg), args=args, train_dataset=ds,
                                shardwise_skip_steps=skip)

    epoch = _steps(trainer(None).get_train_dataloader(), 1)
    t = trainer([(2, 4)])
    dl = t.get_train_dataloader()
    _same(_steps(dl, 1), [s for i, s in enumerate(epoch) if i not in (2, 3)])
    # a checkpoint after 3 trained steps (0, 1, 4): the state is at position 40
    state = _stopped(ds, 3, skip_steps=[(2, 4)])
    ckpt = tmp_path / "checkpoint-3"
    ckpt.mkdir()
    (ckpt / "trainer_state.json").write_text(json.dumps({"global_step": 3}))
    (ckpt / "shardwise_loader.json").write_text(json.dumps(state))

    def restored() -> Any:
        t = trainer([(2, 4)])
        t._sw_resume = str(ckpt)
        return t.get_train_dataloader()

    assert restored().loader.consumed == 5 * B  # and Trainer's 3 steps × 8 = 24 served
    (ckpt / "trainer_state.json").write_text(json.dumps({"global_step": 5}))
    with pytest.raises(StateError, match=r"served 24 examples \(position 40\)"):
        restored()


def test_real_tensors_are_counts(ds: sw.TokenDataset) -> None:
    dl = loader(ds, global_batch_size=B, micro_batch_size=M, world=sw.World(0, 1),
                skip_steps=[(torch.tensor(1), np.int64(2))])
    assert dl.state_dict()["config"]["skip"] == [[8, 16]]


def test_a_blend_skips_and_resumes_through_its_seek_hints(ds: sw.TokenDataset) -> None:
    """A Blend's state carries per-source counts at the position (its O(1) seek): with
    skips the position is still one of the global order, so they stay right."""
    blend = sw.Blend([ds, sw.TokenDataset(ds.cache.root, seq_len=8, seed=5)], [0.6, 0.4],
                     seed=3)
    plain = _run(blend, 1)
    _same(_run(blend, 1, skip_steps=[(1, 3)]),
          [s for i, s in enumerate(plain) if i not in (1, 2)])
    state = _stopped(blend, 2, skip_steps=[(1, 3)])  # steps 0, 3: at position 32
    assert state["consumed"] == 4 * B and state["extra"]  # the per-source counts
    _same(_resumed(blend, state, skip_steps=[(1, 3), (5, 6)]),
          [s for i, s in enumerate(plain) if i == 4 or i >= 6])


def test_an_hf_epoch_whose_rest_is_skipped_goes_on_with_the_next(
        ds: sw.TokenDataset, tmp_path: Path) -> None:
    """Trainer epochs are whole global steps of the order (62 // 8 = 7 steps); a skip of
    steps 6 to 8 covers the end of epoch 0 and the start of epoch 1."""
    from transformers import GPT2Config, GPT2LMHeadModel, TrainingArguments

    from shardwise.hf import ShardwiseTrainer

    args = TrainingArguments(output_dir=str(tmp_path), per_device_train_batch_size=M,
                             gradient_accumulation_steps=B // M, max_steps=3, report_to=[],
                             use_cpu=True)
    cfg = GPT2Config(vocab_size=1000, n_positions=8, n_embd=8, n_layer=1, n_head=1,
                     bos_token_id=0, eos_token_id=0)
    dl = ShardwiseTrainer(model=GPT2LMHeadModel(cfg), args=args, train_dataset=ds,
                          shardwise_skip_steps=[(6, 8)]).get_train_dataloader()
    plain = _run(ds, 1)
    _same(_steps(dl, 1), plain[:6])
    _same(_steps(dl, 1), plain[8:14])  # not an empty epoch at position 48
