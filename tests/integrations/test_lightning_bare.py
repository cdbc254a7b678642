"""A shardwise loader handed to Lightning without ``shardwise.lightning.loader`` is refused
naming the fix: Lightning's fetcher reads a micro-batch ahead of the step it trains, so the
loader's own state in a checkpoint would be one micro-batch past the trained one (the
issue's ``consumed=28`` at step 3 with 24 examples trained). One process, a few steps."""

from __future__ import annotations

import sys
import warnings
from pathlib import Path
from typing import Any

import pytest

import shardwise as sw

L = pytest.importorskip("lightning")
import torch  # noqa: E402
from torchdata.stateful_dataloader import StatefulDataLoader  # noqa: E402

import shardwise.torch as swt  # noqa: E402
from shardwise.errors import ConfigError  # noqa: E402
from shardwise.torchdata import batch_sampler  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from cachefactory import make_cache, sample_docs  # noqa: E402


class TinyLM(L.LightningModule):  # type: ignore[misc]
    def __init__(self) -> None:
        super().__init__()
        self.out = torch.nn.Embedding(500, 500)
        self.steps = 0

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        self.steps += 1
        ids = batch["input_ids"].long()
        return torch.nn.functional.cross_entropy(self.out(ids[:, :-1]).flatten(0, 1),
                                                 ids[:, 1:].flatten())

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.1)


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("lightning-bare") / "cache"
    make_cache(root, [sample_docs(40, seed=3, vocab_size=500)], vocab_size=500)
    return root


def _loader(cache: Path, kind: str) -> Any:
    ds = sw.TokenDataset(cache, seq_len=9, seed=7)
    args = dict(global_batch_size=4, micro_batch_size=2, world=sw.World.single())
    if kind == "shardwise":
        return swt.loader(ds, **args)
    return StatefulDataLoader(ds, batch_sampler=batch_sampler(ds, **args),
                              collate_fn=swt.collate)


def _fit(dl: Any, callbacks: list[Any]) -> TinyLM:
    model = TinyLM()
    trainer = L.Trainer(accelerator="cpu", devices=1, max_steps=2, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, accumulate_grad_batches=2,
                        callbacks=callbacks)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Lightning's own advice on workers and logging
        trainer.fit(model, train_dataloaders=dl)
    return model


@pytest.mark.parametrize("kind", ["shardwise", "torchdata"])
def test_a_bare_loader_is_refused_naming_the_wrapper(cache: Path, kind: str) -> None:
    with pytest.raises(ConfigError, match=r"shardwise\.lightning\.loader.*TrainedPosition"):
        _fit(_loader(cache, kind), [])


@pytest.mark.parametrize("kind", ["shardwise", "torchdata"])
def test_the_wrapped_loader_trains(cache: Path, kind: str) -> None:
    from shardwise.lightning import TrainedPosition, loader

    model = _fit(loader(_loader(cache, kind)), [TrainedPosition()])
    assert model.steps == 4  # 2 optimizer steps x 2 micro-batches
