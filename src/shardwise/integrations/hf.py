"""Hugging Face Trainer / accelerate: shardwise's order, locality and exact resume.

``ShardwiseTrainer`` (a ``transformers.Trainer``) and ``ShardwiseTrainerMixin`` (for
Trainer subclasses such as TRL's: ``class MyTrainer(ShardwiseTrainerMixin, SFTTrainer)``)
take any shardwise dataset as ``train_dataset`` / ``eval_dataset``, under torchrun:

* **Order.** The train loader is :func:`shardwise.torch.loader` with
  ``global_batch_size = per_device_train_batch_size × world size ×
  gradient_accumulation_steps``: each optimizer step (all ranks, all accumulation
  micro-steps) is global batch ``b`` of shardwise's order, across epochs (a TokenDataset
  reshuffles each epoch). Trainer's own sampler, ``accelerator.prepare`` and its
  ``BatchSamplerShard`` are not used: each rank reads only its share. A Trainer "epoch" is
  ``len(dataset) // global_batch_size`` whole steps; the rest of a shardwise epoch is not
  lost but opens the next one (the global order runs on across epochs)::

      len 10, B 4:  HF epoch 0 = examples [0, 8), epoch 1 = [8, 16), …

* **Labels.** shardwise's labels are next-token targets aligned to ``input_ids``
  (``labels[t]`` is the target of position ``t``). :func:`collate` passes them as
  ``shift_labels`` (which transformers' causal-LM loss and Trainer's token count use
  as-is), with ``loss_mask == 0`` as -100, and ``labels`` in HF's unshifted convention
  (``labels[t + 1] = shift_labels[t]``) for code that shifts itself. ``position_ids``
  (restarting per document with ``reset_position_ids``) are passed too.
* **Resume.** Every checkpoint holds ``shardwise_loader.json`` (the loader's
  ``state_dict()``); ``train(resume_from_checkpoint=...)`` restores it — no
  ``skip_first_batches`` replay (``args.ignore_data_skip`` is set) — and checks it against
  the checkpoint's ``global_step``. The state is global, so another number of processes
  continues exactly when the global batch size is kept (e.g. 2 ranks → 1 rank with twice
  the accumulation).
* **Skipping steps** (``shardwise_skip_steps=[(a, b)]``: optimizer steps ``a`` to ``b - 1``
  of shardwise's order are never read — the skip-and-resume recipe after a loss spike;
  a resume may add ranges at or after the checkpoint). Trainer counts the steps it
  trains, the loader's state counts positions: an epoch ends at the same position and
  yields fewer steps, and ``global_step`` is checked against the examples served. An
  iterable reader refuses them (give a StreamDataset its own ``skip=``).
* **Records** (a RecordStream's, a producer directory's, a foreign dataset's: anything
  without ``label_convention = "next_token"``) keep HF's own per-token labels and go to
  ``default_data_collator`` unchanged.
* **Iterable readers** (StreamDataset, PackedSFT, RecordStream, a ProducerDirDataset's
  ``stream()``) place themselves (``world=``, default ``World.detect()``): they get a plain
  per-rank DataLoader, never accelerate's dispatcher; one made for another world than the
  Trainer's (``World.single()`` under 2 processes) is refused. Their own ``state_dict()``
  is saved per rank (``shardwise_rank{r}.json``).
* **Compact batches** (``shardwise_output=shardwise.Output(dtype="stored", compact=True)``):
  DataLoader workers send the window's tokens (2 bytes each from a uint16 cache) instead
  of the model inputs; they are expanded on the device before the model runs.
* **Evaluation and prediction** see each real example once: the eval loader pads the last
  step with masked rows (the ``eval`` sampler's index -1, a finite PackedSFT's aligned
  end), marks them in each batch (``shardwise_pad``, removed before the model runs), and
  the rows gathered for ``compute_metrics``, ``predict()``'s arrays and ``num_samples``
  leave them out (``eval_loss`` still averages the batches' losses, to which padding adds
  no token).

Without the mixin, a stock Trainer or ``accelerator.prepare`` that would shard a shardwise
loader or stream again (or dispatch it from rank 0) is refused when it starts iterating
(:mod:`shardwise.read.guard`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Generator, Iterator
from pathlib import Path
from typing import Any, cast

from shardwise.errors import ConfigError, MissingExtraError, StateError
from shardwise.format.atomic import atomic_write_bytes
from shardwise.integrations.hf_batches import collate, model_inputs
from shardwise.integrations.hf_trl import SFTHooks
from shardwise.integrations.torch import ShardwiseLoader, loader
from shardwise.integrations.torch_batches import expand
from shardwise.plan.skips import advance
from shardwise.read.examples import NEXT_TOKEN, Output, with_output
from shardwise.world import World

try:
    import torch
    from torch.utils.data import DataLoader
    from transformers import Trainer, default_data_collator
except ImportError as e:  # pragma: no cover - exercised only without the extra
    raise MissingExtraError("shardwise.hf needs transformers and accelerate: "
                            "pip install 'shardwise[hf]'") from e

STATE_FILE = "shardwise_loader.json"
PAD_KEY = "shardwise_pad"  # an eval batch's padding rows (bool per row); never reaches a model


def _is_iterable(ds: Any) -> bool:
    return isinstance(ds, torch.utils.data.IterableDataset) or not hasattr(ds, "__getitem__")


class _Epochs:
    """Trainer's view of a :class:`ShardwiseLoader`: ``len()`` is one Trainer epoch of
    whole global batches, and each ``iter()`` runs to the end of the current one from
    the loader's position (so a resumed epoch yields only what is left of it)."""

    def __init__(self, dl: ShardwiseLoader, epoch_examples: int) -> None:
        self.loader, self.dataset = dl, dl.dataset
        self.epoch_examples = epoch_examples
        self.step = dl._indices.sampler.step_examples

    def __len__(self) -> int:
        return self.epoch_examples // self.step

    def __iter__(self) -> Iterator[Any]:
        sampler, e = self.loader._indices.sampler, self.epoch_examples
        # the next step served (past a skipped range that starts here): its epoch is this one
        c = advance(sampler.skip, self.loader.consumed, 1, self.step) - self.step
        end = (c // e + 1) * e
        left = (end - c - sampler.skipped(c, end)) // self.step
        it = cast(Generator[Any, None, None], iter(self.loader))
        try:
            for _ in range(left):
                yield next(it)
        finally:
            it.close()

    def state_dict(self) -> dict[str, Any]:
        return self.loader.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.loader.load_state_dict(state)


class _EvalBatches:
    """An eval loader whose dict batches carry ``PAD_KEY``: which rows are padding.
    ``pads()`` yields, batch by batch, how many rows are padding; padding rows are always
    a rank's last rows (the ``eval`` sampler's index -1 past the data; a finite
    PackedSFT's aligned end), so they are the batch's last ones."""

    def __init__(self, dl: Any, pads: Callable[[], Iterator[int]]) -> None:
        self.loader, self.dataset, self.pads = dl, dl.dataset, pads
        self.batch_size = getattr(dl, "batch_size", None)

    def __len__(self) -> int:  # a TypeError without one, as for the loader itself
        return len(self.loader)

    def __iter__(self) -> Iterator[Any]:
        counts = self.pads()
        for batch in self.loader:
            k = next(counts)
            rows = batch.get("input_ids", batch.get("tokens")) if isinstance(batch, dict) else None
            if isinstance(rows, torch.Tensor):
                n = len(rows)
                batch[PAD_KEY] = torch.arange(n) >= n - k
            yield batch


def _sampler_pads(dl: ShardwiseLoader) -> Callable[[], Iterator[int]]:
    """Padding rows per micro-batch of an ``eval`` loader: its indices -1 (a pure sampler,
    iterated beside the loader)."""
    return lambda: (sum(1 for i in idx if i < 0) for idx in dl._indices.sampler)


def _served_pads(ds: Any) -> Callable[[], Iterator[int]]:
    """Padding rows per batch of an iterable reader that counts them (``pads_served``)."""
    def counts() -> Iterator[int]:
        before = ds.pads_served
        while True:  # read after the batch arrived (num_workers=0: the same object)
            after = ds.pads_served
            yield after - before
            before = after
    return counts


class ShardwiseTrainerMixin(SFTHooks):
    """Put before a ``transformers.Trainer`` class (see module docs). Extra keyword
    arguments: ``shardwise_sampler`` (``"single"``: the dataset's own global order, for
    TokenDataset / Blend; ``"cyclic"``: Megatron's per-epoch reshuffle of ``[0, n)``, for
    other map-style datasets; default: chosen by the dataset) and ``shardwise_seed`` (the
    cyclic sampler's seed). A ``data_collator`` you pass gets the list of examples torch
    gives any collator; the default is :func:`collate`. ``shardwise_skip_steps``: ranges
    ``[a, b)`` of optimizer steps whose data is never read (see the module docs).
    ``shardwise_output``: the form shardwise readers hand over
    (:class:`~shardwise.read.examples.Output`; compact batches expand on the device)."""

    def __init__(self, *args: Any, shardwise_sampler: str | None = None,
                 shardwise_seed: int = 0, shardwise_skip_steps: Any = None,
                 shardwise_output: Output | None = None, **kwargs: Any) -> None:
        self._sw_output = shardwise_output
        given = kwargs.get("data_collator") or (args[2] if len(args) > 2 else None)
        self._sw_given = given
        self._sw_sampler, self._sw_seed = shardwise_sampler, shardwise_seed
        self._sw_skip = shardwise_skip_steps
        self._sw_resume: str | None = None
        self._sw_train: Any = None
        train = kwargs.get("train_dataset", args[3] if len(args) > 3 else None)
        self._sw_construct(super().__init__, args, kwargs, self._sw_collate_for(train))
        self.args.ignore_data_skip = True  # type: ignore[attr-defined]  # the state resumes

    # -- the loaders ---------------------------------------------------------------------
    def _sw_collate_for(self, ds: Any) -> Any:
        """Your ``data_collator``; else :func:`collate` for shardwise's next-token examples;
        else (records in HF's own per-token convention, a foreign dataset) HF's
        ``default_data_collator``, labels untouched."""
        chosen = self._sw_given
        if chosen is None:
            chosen = (collate if getattr(ds, "label_convention", None) == NEXT_TOKEN
                      else default_data_collator)
        return self._sw_for_trl(chosen)

    def _prepare_inputs(self, inputs: Any) -> Any:
        """Trainer's move to the device, then a compact batch expanded into model inputs
        there (what crossed from the workers was the window's tokens)."""
        inputs = super()._prepare_inputs(inputs)  # type: ignore[misc]
        if isinstance(inputs, dict) and "tokens" in inputs:
            inputs = model_inputs(expand(inputs))
        return inputs

    def _sw_shaped(self, ds: Any) -> Any:
        return ds if self._sw_output is None else with_output(ds, self._sw_output)

    def _sw_world(self) -> World:
        a = self.args  # type: ignore[attr-defined]
        return World(a.process_index, a.world_size)

    def get_train_dataloader(self) -> Any:
        ds = self.train_dataset  # type: ignore[attr-defined]
        if ds is None:
            raise ValueError("Trainer: training requires a train_dataset.")
        ds = self._sw_shaped(ds)
        if _is_iterable(ds):
            self._sw_refuse_skip_steps(ds)
            self._sw_train = self._iterable_loader(ds, self.args.per_device_train_batch_size)  # type: ignore[attr-defined]
        else:
            self._sw_train = self._map_loader(ds)
        if self._sw_resume is not None:
            self._sw_restore(self._sw_resume)
        return self._sw_train

    def _sw_refuse_skip_steps(self, ds: Any) -> None:
        """``shardwise_skip_steps`` is the map-style loader's; an iterable reader places
        its own examples, and ignoring the list would train on the steps it names."""
        if self._sw_skip:
            a = self.args  # type: ignore[attr-defined]
            B = a.per_device_train_batch_size * a.world_size * a.gradient_accumulation_steps
            raise ConfigError(f"shardwise_skip_steps={self._sw_skip!r} skips the steps of a "
                              f"map-style dataset's loader; {type(ds).__name__} places its "
                              "own examples: give a StreamDataset skip=[(a × B, b × B)] "
                              f"(positions of the global order; B = {B}, the global batch), "
                              "or drop shardwise_skip_steps")

    def _map_loader(self, ds: Any) -> _Epochs:
        a, world = self.args, self._sw_world()  # type: ignore[attr-defined]
        m, accumulation = self._train_batch_size, a.gradient_accumulation_steps  # type: ignore[attr-defined]
        if getattr(ds, "is_sharded", False):  # already this rank's share: no second split
            world = World.single()
        B = m * world.size * accumulation
        per_epoch = len(ds) // B * B
        if per_epoch == 0:
            raise ConfigError(f"the train dataset has {len(ds)} examples, fewer than one "
                              f"global batch of {B} (per_device_train_batch_size {m} × "
                              f"{world.size} ranks × gradient_accumulation_steps "
                              f"{accumulation})")
        sampler = self._sw_sampler or ("single" if hasattr(ds, "get_batch") else "cyclic")
        workers = a.dataloader_num_workers
        dl = loader(ds, global_batch_size=B, micro_batch_size=m, world=world,
                    sampler=sampler, seed=self._sw_seed, data_sharding=False,
                    num_workers=workers, pin_memory=a.dataloader_pin_memory,
                    persistent_workers=a.dataloader_persistent_workers and workers > 0,
                    collate_fn=self._sw_collate_for(ds), skip_steps=self._sw_skip)
        return _Epochs(dl, per_epoch)

    def _iterable_loader(self, ds: Any, batch_size: int) -> DataLoader:  # type: ignore[type-arg]
        """A per-rank DataLoader over a reader that places itself, for this world."""
        world, mine = getattr(ds, "world", None), self._sw_world()
        if isinstance(world, World) and world.size != mine.size:
            raise ConfigError(f"{type(ds).__name__} was made for {world}, but this Trainer "
                              f"runs {mine.size} processes: each would read "
                              f"{'all' if world.size == 1 else 'a wrong share'} of the data; "
                              "make it with world= left out (World.detect()) inside the job")
        return DataLoader(ds, batch_size=batch_size, collate_fn=self._sw_collate_for(ds),
                          num_workers=0)

    def get_eval_dataloader(self, eval_dataset: Any = None) -> Any:
        ds = eval_dataset if eval_dataset is not None else self.eval_dataset  # type: ignore[attr-defined]
        if isinstance(ds, str):
            ds = self.eval_dataset[ds]  # type: ignore[attr-defined]
        if ds is None:
            raise ValueError("Trainer: evaluation requires an eval_dataset.")
        ds = self._sw_shaped(ds)
        m = self.args.eval_batch_size  # type: ignore[attr-defined]
        if _is_iterable(ds):
            dl = self._iterable_loader(ds, m)
            return _EvalBatches(dl, _served_pads(ds)) if hasattr(ds, "pads_served") else dl
        world = World.single() if getattr(ds, "is_sharded", False) else self._sw_world()
        dl = loader(ds, global_batch_size=m * world.size, micro_batch_size=m,
                    world=world, sampler="eval", collate_fn=self._sw_collate_for(ds))
        return _EvalBatches(dl, _sampler_pads(dl))

    def get_test_dataloader(self, test_dataset: Any) -> Any:
        """``predict()``'s loader: the eval loader's placement and padding marks."""
        return self.get_eval_dataloader(test_dataset)

    # -- evaluation: real rows only ------------------------------------------------------
    gather_function: Any  # Trainer's: the eval loop's gathers (see prediction_step)

    def evaluation_loop(self, *args: Any, **kwargs: Any) -> Any:
        self._sw_real: int | None = None
        self._sw_gather = self.gather_function  # Trainer's own
        out = super().evaluation_loop(*args, **kwargs)  # type: ignore[misc]
        if self._sw_real is not None:  # the batches marked their padding: count real rows
            out = out._replace(num_samples=self._sw_real)
        return out

    def prediction_step(self, model: Any, inputs: dict[str, Any], *args: Any,
                        **kwargs: Any) -> Any:
        """Take the padding marks out of the batch; gather them (every rank evaluates
        in step) so the loop's gathers for metrics keep only the real rows."""
        pad = inputs.pop(PAD_KEY, None) if isinstance(inputs, dict) else None
        if pad is not None:
            acc = self.accelerator  # type: ignore[attr-defined]
            real = acc.gather(pad.to(torch.int64).to(acc.device)).cpu() == 0
            self._sw_real = (self._sw_real or 0) + int(real.sum())
            self.gather_function = _real_rows(self._sw_gather, real)
        return super().prediction_step(model, inputs, *args, **kwargs)  # type: ignore[misc]

    # -- checkpoints ---------------------------------------------------------------------
    def _inner_training_loop(self, *args: Any, **kwargs: Any) -> Any:
        resume = kwargs.get("resume_from_checkpoint")
        if resume is None and len(args) > 2:
            resume = args[2]
        self._sw_resume = resume
        return super()._inner_training_loop(*args, **kwargs)  # type: ignore[misc]

    def _sw_state_path(self, directory: str) -> str:
        if isinstance(self._sw_train, _Epochs):  # global: one state for every rank
            return os.path.join(directory, STATE_FILE)
        return os.path.join(directory, f"shardwise_rank{self.args.process_index}.json")  # type: ignore[attr-defined]

    def _save_checkpoint(self, model: Any, trial: Any) -> None:
        from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

        out = os.path.join(self._get_output_dir(trial=trial),  # type: ignore[attr-defined]
                           f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}")  # type: ignore[attr-defined]
        train, state = self._sw_train, None
        if isinstance(train, _Epochs):  # the same on every rank: the main process writes it
            state = train.state_dict() if self.args.should_save else None  # type: ignore[attr-defined]
        elif train is not None and hasattr(train.dataset, "state_dict"):
            state = train.dataset.state_dict()
        if state is not None:
            os.makedirs(out, exist_ok=True)
            atomic_write_bytes(Path(self._sw_state_path(out)), json.dumps(state).encode())
        super()._save_checkpoint(model, trial)  # type: ignore[misc]

    def _sw_restore(self, checkpoint: str) -> None:
        path = self._sw_state_path(checkpoint)
        if not os.path.isfile(path):
            raise StateError(f"{checkpoint} has no {os.path.basename(path)}: it was not saved "
                             "by a ShardwiseTrainer, so the data position is unknown; resume "
                             "from a checkpoint ShardwiseTrainer saved")
        with open(path, "rb") as f:
            state = json.load(f)
        train = self._sw_train
        if isinstance(train, _Epochs):
            train.load_state_dict(state)  # first: a past skip range that differs is named
            self._sw_check_step(checkpoint, state, train)
        else:
            train.dataset.load_state_dict(state)

    def _sw_check_step(self, checkpoint: str, state: dict[str, Any], train: _Epochs) -> None:
        """The examples the loader served (its position less the skipped ranges before
        it) must be the checkpoint's steps × this global batch."""
        with open(os.path.join(checkpoint, "trainer_state.json"), "rb") as f:
            step = int(json.load(f)["global_step"])
        sampler, consumed = train.loader._indices.sampler, int(state.get("consumed", -1))
        B, served = sampler.global_batch_size, consumed - sampler.skipped(0, consumed)
        if served != step * B:
            raise StateError(f"{checkpoint}: the loader state has served {served} examples "
                             f"(position {consumed}) but global_step {step} × global batch "
                             f"{B} = {step * B}; resume with the global batch size the run was "
                             "saved with (per_device_train_batch_size × world size × "
                             "gradient_accumulation_steps)")


def _real_rows(gather: Callable[[Any], Any], real: torch.Tensor) -> Callable[[Any], Any]:
    """``gather`` (Trainer's: accelerate's ``gather_for_metrics``), then only the rows of
    ``real`` (gathered in rank order, as ``gather`` concatenates) of a tensor with one row
    each."""
    def gather_real(data: Any) -> Any:
        out = gather(data)
        if isinstance(out, torch.Tensor) and out.dim() and len(out) == len(real):
            return out[real.to(out.device)]
        return out
    return gather_real


class ShardwiseTrainer(ShardwiseTrainerMixin, Trainer):
    """``transformers.Trainer`` reading shardwise datasets in shardwise's order, with the
    loader's position in every checkpoint (see the module docs)."""


__all__ = ["ShardwiseTrainer", "ShardwiseTrainerMixin"]
