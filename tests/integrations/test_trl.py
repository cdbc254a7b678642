"""TRL's SFTTrainer over shardwise readers (issue 20 item 2), with the real trl and a 2-layer
GPT-2 from a config: ``class T(ShardwiseTrainerMixin, SFTTrainer)`` constructs and trains
with every reader; on 2 ranks (one torchrun launch) the assistant-only loss is the masked
next-token cross-entropy computed here by hand from the records, packed rows carry their
``position_ids``, each step is shardwise's global batch, and a resume continues exactly on
2 ranks and on 1 (the 2-rank runs: a job of the session's shared launches,
tests/integrations/_launches.py). A stock SFTTrainer given a shardwise reader names the mixin."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from tests.integrations._launches import FIRST, Job, Launches

import shardwise as sw

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_hf_trainer import _global_batches  # noqa: E402

from cachefactory import make_cache, sample_docs  # noqa: E402

RUN = Path(__file__).resolve().with_name("_trl_run.py")
SEQ_LEN, SFT_LEN, MICRO, WORLD = 16, 96, 2, 2
IGNORE = -100


def _data(root: Path, tokenizer_path: Path) -> dict[str, Any]:
    """A token cache (as in test_hf_trainer) and 40 distinct conversations processed by
    ChatProcessor: ``labels`` are the token ids on assistant turns, -100 elsewhere."""
    cache = make_cache(root / "cache", [sample_docs(12, seed=5, vocab_size=500)],
                       chunk_docs=3, eod_id=0)
    chat = sw.ChatProcessor(str(tokenizer_path))
    records = []
    for i in range(40):
        doc = chat({"messages": [{"role": "user", "content": f"What is {i} plus {i + 7}?"},
                                 {"role": "assistant", "content": f"It is {2 * i + 7}."}]})
        assert doc is not None
        records.append({"input_ids": doc["input_ids"].tolist(),
                        "labels": doc["labels"].tolist()})
    path = root / "records.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    from transformers import PreTrainedTokenizerFast

    vocab = len(PreTrainedTokenizerFast(tokenizer_file=str(tokenizer_path)))
    return {"cache": str(cache), "records": str(path), "tokenizer": str(tokenizer_path),
            "vocab": vocab, "n_positions": SFT_LEN, "seq_len": SEQ_LEN, "sft_len": SFT_LEN,
            "micro": MICRO, "recs": records}


def _tokens(data: dict[str, Any]) -> sw.TokenDataset:
    return sw.TokenDataset(data["cache"], seq_len=SEQ_LEN, seed=7, reset_position_ids=True)


def _steps(data: dict[str, Any]) -> tuple[int, int, int]:
    """The global batch, the steps of the token run and its checkpoint's step."""
    B = MICRO * WORLD * 2
    per_epoch = len(_tokens(data)) // B
    return B, per_epoch + 2, per_epoch - 1


def launch_jobs(root: Path) -> list[Job]:
    """PackedSFT's loss and position_ids; TokenDataset's order, a checkpoint and its
    resume on the same 2 ranks."""
    data = _data(root, Path(__file__).resolve().parents[2] / "sample" / "tokenizer.json")
    _, steps, save = _steps(data)
    return [Job("run", FIRST, RUN, _spec(data, accumulation=2, steps=steps, save=save,
                                         sft_steps=3, record=str(root / "run")))]


@pytest.fixture(scope="module")
def data(launches: Launches) -> dict[str, Any]:
    spec = launches.jobs["test_trl"]["run"].spec
    records = [json.loads(line) for line in Path(spec["records"]).read_text().splitlines()]
    return {**{k: v for k, v in spec.items()
               if k not in ("accumulation", "steps", "save", "sft_steps", "record")},
            "recs": records}


def _spec(data: dict[str, Any], **kw: Any) -> dict[str, Any]:
    return {**{k: v for k, v in data.items() if k != "recs"}, **kw}


# -- one process ------------------------------------------------------------------------
def _readers(data: dict[str, Any]) -> dict[str, Any]:
    recs = data["recs"]
    tokens = sw.TokenDataset(data["cache"], seq_len=SEQ_LEN, seed=7)
    return {
        "TokenDataset": tokens,
        "StreamDataset": sw.StreamDataset(data["cache"], seq_len=SEQ_LEN, streams=2, seed=7),
        "PackedSFT": sw.PackedSFT(recs, seq_len=SFT_LEN, group_size=16, seed=3, epochs=None),
        "Blend": sw.Blend([tokens, sw.TokenDataset(data["cache"], seq_len=SEQ_LEN, seed=8)],
                          [0.5, 0.5], seed=7),
        "RecordStream": sw.RecordStream([data["records"]], map_fn=_fixed_length, seed=7),
    }


def _fixed_length(rec: dict[str, Any]) -> dict[str, Any]:
    """A record in Hugging Face's own convention (labels per token, unshifted), with no
    attention_mask or position_ids (TRL's loss needs one of them: the mixin adds
    position_ids)."""
    ids = (rec["input_ids"] + [0] * SFT_LEN)[:SFT_LEN]
    labels = (rec["labels"] + [IGNORE] * SFT_LEN)[:SFT_LEN]
    return {"input_ids": ids, "labels": labels}


def test_stock_sft_trainer_names_the_mixin(data: dict[str, Any], tmp_path: Path) -> None:
    from _trl_run import config, model
    from transformers import PreTrainedTokenizerFast
    from trl import SFTTrainer

    tok = PreTrainedTokenizerFast(tokenizer_file=data["tokenizer"])
    args = config({"micro": MICRO, "accumulation": 1}, str(tmp_path), 1, None)
    for name, ds in _readers(data).items():
        with pytest.raises(sw.ConfigError, match="ShardwiseTrainerMixin") as e:
            SFTTrainer(model=model(data["vocab"], SFT_LEN), args=args, train_dataset=ds,
                       processing_class=tok)
        assert name in str(e.value)


def test_mixin_trains_every_reader(data: dict[str, Any], tmp_path: Path) -> None:
    """Each reader constructs and trains two steps (one process)."""
    from _trl_run import Recording, config, model
    from transformers import PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast(tokenizer_file=data["tokenizer"])
    for name, ds in _readers(data).items():
        args = config({"micro": MICRO, "accumulation": 1}, str(tmp_path / name), 2, None)
        trainer = Recording(model=model(data["vocab"], SFT_LEN), args=args, train_dataset=ds,
                            processing_class=tok)
        assert trainer.train_dataset is ds
        trainer.train()
        assert trainer.state.global_step == 2, name
        assert len(trainer.rec["loss"]) == 2 and np.isfinite(trainer.rec["loss"]).all(), name


# -- two processes ----------------------------------------------------------------------
def _hand_mask(row: np.ndarray, positions: np.ndarray, by_ids: dict[tuple[int, ...], list[int]]
               ) -> np.ndarray:
    """Which next-token targets of a packed row are trained, from the records alone:
    position ``t`` predicts ``row[t + 1]``, trained when that token is an assistant token of
    the same record. Records are found by their tokens between ``position_ids`` restarts."""
    mask = np.zeros(len(row) - 1, dtype=bool)
    starts = [*np.flatnonzero(positions == 0).tolist(), len(row)]
    matched = 0
    for s, e in zip(starts, starts[1:], strict=False):
        labels = by_ids.get(tuple(row[s:e].tolist()))
        if labels is None:  # the padding after the last record
            assert e == len(row) and (row[s:e] == 0).all(), "a segment that is no record"
            continue
        matched += 1
        assert np.array_equal(positions[s:e], np.arange(e - s))
        mask[s: e - 1] = np.asarray(labels[1:]) != IGNORE
    assert matched >= 1
    return mask


def _check_sft_placement(runs: list[Any], data: dict[str, Any]) -> None:
    """Each rank reads its share of PackedSFT's rows — rank r's j-th row is row j·R + r of
    the one-process order (stream placement's rule, as trace applies it) — so a global step
    holds B distinct rows, never one row on two ranks."""
    mine = [run["input_ids"].reshape(-1, SFT_LEN) for run in runs]
    n = sum(len(m) for m in mine)
    ref = sw.PackedSFT(data["recs"], seq_len=SFT_LEN, group_size=16, seed=3, epochs=None)
    order = np.stack([row["input_ids"] for _, row in zip(range(n), ref, strict=False)])
    for r, rows in enumerate(mine):
        for j, row in enumerate(rows):
            assert np.array_equal(row, order[j * WORLD + r]), f"rank {r} row {j}"


def _check_sft(rec: Path, data: dict[str, Any], accumulation: int) -> None:
    runs = [np.load(rec / f"sft.r{r}.npz") for r in range(WORLD)]
    _check_sft_placement(runs, data)
    by_ids = {tuple(r["input_ids"]): r["labels"] for r in data["recs"]}
    masks = [np.stack([[_hand_mask(row, pos, by_ids) for row, pos in zip(ids, ps,
                                                                          strict=True)]
                       for ids, ps in zip(run["input_ids"], run["position_ids"], strict=True)])
             for run in runs]
    steps = len(runs[0]["loss"]) // accumulation
    for s in range(steps):
        micro = range(s * accumulation, (s + 1) * accumulation)
        n = sum(int(masks[r][k].sum()) for r in range(WORLD) for k in micro)
        for r, run in enumerate(runs):
            for k in micro:
                assert run["items"][k] == n, f"step {s}: Trainer counted {run['items'][k]}"
                hand = -run["logp"][k][masks[r][k]].sum() / n * WORLD
                np.testing.assert_allclose(run["loss"][k], hand, rtol=2e-5, atol=1e-7,
                                           err_msg=f"rank {r} micro-step {k}")


def test_trl_two_ranks(data: dict[str, Any], launches: Launches, tmp_path: Path) -> None:
    """One launch: PackedSFT's loss and position_ids; TokenDataset's order, a checkpoint
    and its resume on the same 2 ranks. Then the resume on 1 rank, in this process."""
    tokens = _tokens(data)
    B, steps, save = _steps(data)
    rec = launches.record("test_trl", "run")
    _check_sft(rec, data, 2)

    seen = [np.load(rec / f"tokens.r{r}.npz")["input_ids"] for r in range(WORLD)]
    got = _global_batches(seen, 2)
    assert len(got) == steps
    for b, rows in enumerate(got):
        want = tokens.get_batch(list(range(b * B, (b + 1) * B)))["input_ids"]
        assert np.array_equal(rows, want), f"step {b} is not shardwise's global batch {b}"
    ckpt = rec / "tokens" / f"checkpoint-{save}"
    assert json.loads((ckpt / "shardwise_loader.json").read_text())["consumed"] == save * B

    tail = _global_batches([np.load(rec / f"resume.r{r}.npz")["input_ids"]
                            for r in range(WORLD)], 2)
    assert len(tail) == steps - save
    for j, rows in enumerate(tail):
        assert np.array_equal(rows, got[save + j]), f"2 → 2: step {save + j} differs"
    with np.load(rec / "tokens.params.npz") as a, np.load(rec / "resume.params.npz") as b:
        for k in a.files:
            assert np.array_equal(a[k], b[k]), f"2 → 2: parameter {k} differs"

    from _trl_run import train

    one = train(_spec(data, accumulation=4, record=str(tmp_path / "one")), "one",
                sw.TokenDataset(data["cache"], seq_len=SEQ_LEN, seed=7,
                                reset_position_ids=True), steps, resume=str(ckpt))
    tail1 = _global_batches([np.stack(one.rec["input_ids"])], 4)
    assert len(tail1) == steps - save
    for j, rows in enumerate(tail1):
        assert np.array_equal(rows, got[save + j]), f"2 → 1: step {save + j} differs"
    with np.load(rec / "tokens.params.npz") as a:
        for k in a.files:  # the same batches; one process sums the gradients in another order
            np.testing.assert_allclose(a[k], one.model.state_dict()[k].numpy(), rtol=1e-4,
                                       atol=1e-6)


def test_options_only_trl_preparation_applies_are_refused(data: dict[str, Any],
                                                          tmp_path: Path) -> None:
    """packing / assistant_only_loss / … would be silently not applied to a reader."""
    from _trl_run import Recording, config, model
    from transformers import PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast(tokenizer_file=data["tokenizer"])
    ds = sw.TokenDataset(data["cache"], seq_len=SEQ_LEN, seed=7)
    for option in ("packing", "padding_free", "assistant_only_loss", "completion_only_loss"):
        args = config({"micro": MICRO, "accumulation": 1}, str(tmp_path), 1, None)
        setattr(args, option, True)
        with pytest.raises(sw.ConfigError, match=rf"\['{option}'\].*{option}: "):
            Recording(model=model(data["vocab"], SFT_LEN), args=args, train_dataset=ds,
                      processing_class=tok)
