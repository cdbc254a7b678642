"""Every reader is placed, in every integration (issue 20, items 1 and 6).

A matrix of readers (``_placement.READERS``) × integrations (``INTEGRATIONS``), in real
2-process runs (torchrun, gloo, CPU): ONE job of the session's shared launches
(tests/integrations/_launches.py) runs every integration in turn, each
reading every reader, ``world=`` left out as a user would. For each optimizer step, the
rows every rank trained on, micro-step by micro-step, must be the examples ``shardwise
trace`` names for that rank and micro-step: no row is read on two ranks, none is missing.
Under the Trainer, ``compute_metrics`` and ``predict`` must see each real eval row exactly
once: no duplicate from another rank, no padding row (eval sets that do not divide 2 × 4).

A reader (an example reader of shardwise) or an integration (a module of
``shardwise.integrations``) without a row here fails
``test_every_reader_and_integration_has_a_row``.
"""

from __future__ import annotations

import importlib
import pkgutil
import sys
from pathlib import Path

import numpy as np
import pytest
from tests.integrations._launches import FIRST, Job, Launches

import shardwise
from shardwise.checkpoint import Configured
from shardwise.plan.stream import rank_example_to_global
from shardwise.read.config import ReadConfig
from shardwise.read.trace.core import Tracer

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _placement import (  # noqa: E402
    ACCUMULATION,
    GLOBAL,
    MICRO,
    READERS,
    STEPS,
    WORLD,
    Data,
    make_data,
    reference,
)

RUN = Path(__file__).resolve().with_name("_placement_run.py")

# integration row -> the shardwise module it exercises (None: a recipe over another row's
# module)
INTEGRATIONS: dict[str, str | None] = {
    "trainer": "shardwise.integrations.hf",  # ShardwiseTrainer / ShardwiseTrainerMixin
    "torch": "shardwise.integrations.torch",  # shardwise.torch.loader; DataLoader(reader)
    "torchdata": "shardwise.integrations.torchdata",  # StatefulDataLoader
    "accelerate": None,  # the README's recipe: the torch loader, the model prepared
    "trl": "shardwise.integrations.hf_trl",  # ShardwiseTrainerMixin + TRL's SFTTrainer
    # Lightning's DDP: shardwise.lightning.loader + TrainedPosition (iterable readers: their
    # DataLoader, which Lightning leaves alone)
    "lightning": "shardwise.integrations.lightning",
    # without torch: sw.numpy_loader (the core of the torch loader; iterable readers: a loop)
    "numpy": None,
    # OLMo-core's data loader: ShardwiseDataLoader, each rank batch split into micro-steps
    # as OLMo's train module splits it (rank_microbatch_size)
    "olmo": "shardwise.integrations.olmo",
    # torchtitan: ShardwiseDataLoader built from its config (iterable readers: titan's own
    # ParallelAwareDataloader, which leaves placement to them)
    "torchtitan": "shardwise.integrations.torchtitan",
    # Lightning Fabric DDP: setup_dataloaders over litgpt's ShardwiseData loader (iterable
    # readers: their DataLoader)
    "fabric": "shardwise.integrations.litgpt",
}
# modules placed through another row, with where their multi-rank runs are checked
NOT_A_ROW = {"shardwise.integrations.megatron": "builds shardwise.torch.loader; "
             "tests/distributed/test_megatron_train.py runs Megatron's own code",
             "shardwise.integrations.megatron_loader": "builds shardwise.torch.loader; "
             "tests/distributed/test_megatron_train.py runs Megatron's own code",
             "shardwise.integrations.torch_batches": "no loader: batch conversion (collate, "
             "worker arrays, expand) of the 'torch' row's loader",
             "shardwise.integrations.hf_batches": "no loader: the Trainer's collators, "
             "under the 'trainer' and 'trl' rows",
             "shardwise.integrations.grain": "no loader: a Grain transformation (batched "
             "reads); Grain places by its own slicing (ds[rank::world]): "
             "tests/integrations/test_grain.py",
             "shardwise.integrations.torch_indices": "the torch loader's index stream "
             "and sampler: the 'torch', 'fabric' and 'torchtitan' rows",
             "shardwise.integrations.guards": "no loader: the frameworks' wrappers every "
             "reader refuses; tests/integrations/test_hf_trainer.py (accelerate, torchrun), "
             "test_trl.py, test_lightning_bare.py, tests/test_framework_seam.py"}
# readers that are not example readers (records, not model inputs), where their
# placement on real ranks is checked
RECORD_READERS = {
    "ProducerDirDataset": "tests/distributed/test_producer_dir.py",
    "ProducerDirStream": "tests/distributed/test_producer_dir.py",
    "ContiguousShards": "tests/distributed/test_world_default.py",
    "SequentialConsumer": "tests/read/test_consumer.py (one consumer, slime's setup)",
    "DistributedShardedDataset": "tests/compat/test_llm_processes.py (rank, world_size given)",
    "ResumableSequentialSampler": "tests/compat/test_llm_processes.py",
    "ShardwiseLoader": "the 'torch' row (the loader itself)",
    "Loader": "the 'numpy' row (the loader itself)",
    "StatefulBatchSampler": "the 'torchdata' row (the sampler itself)",
}


def _classes(cls: type) -> set[type]:
    out = set()
    for sub in cls.__subclasses__():
        out |= {sub} | _classes(sub)
    return out


def test_every_reader_and_integration_has_a_row() -> None:
    for mod in pkgutil.walk_packages(shardwise.__path__, "shardwise."):
        if not mod.name.startswith(("shardwise.bench", "shardwise.cli")):
            importlib.import_module(mod.name)
    readers = {c.__name__ for c in _classes(Configured) if c.__module__.startswith("shardwise.")
               and c.__name__ != "Resumable"}
    missing = readers - set(READERS) - set(RECORD_READERS)
    assert not missing, f"add a row to _placement.READERS for {sorted(missing)}"
    import shardwise.integrations as integ
    modules = {m.name for m in pkgutil.iter_modules(integ.__path__, "shardwise.integrations.")}
    missing = modules - set(INTEGRATIONS.values()) - set(NOT_A_ROW)
    assert not missing, f"add a row to INTEGRATIONS for {sorted(missing)}"


def launch_jobs(root: Path) -> list[Job]:
    """ONE 2-process job running every integration (imports paid once)."""
    spec = {"integrations": sorted(INTEGRATIONS), "data": make_data(root),
            "record": str(root / "runs")}
    return [Job("runs", FIRST, RUN, spec)]


@pytest.fixture(scope="module")
def data(launches: Launches) -> Data:
    return launches.jobs["test_placement_matrix"]["runs"].spec["data"]  # type: ignore[no-any-return]


def _check_against_trace(record: Path, name: str, data: Data) -> None:
    """Each rank's micro-batches of each step are the positions trace names for it."""
    seen = [np.load(record / f"{name}.r{r}.npy") for r in range(WORLD)]
    assert all(len(s) == STEPS * ACCUMULATION for s in seen), f"{name}: micro-steps"
    ref = reference(name, data, True, STEPS * GLOBAL)
    config = READERS[name].config
    tracer = None if config is None else Tracer(ReadConfig.from_dict(config(data)),
                                                lines=False)
    for s in range(STEPS):
        slots = _stream_rule(s) if tracer is None else tracer.slots(s)
        assert sorted(p for p, *_ in slots) == list(range(s * GLOBAL, (s + 1) * GLOBAL))
        rows = {seen[r][s * ACCUMULATION + a][row].tobytes() for _, r, a, row, _ in slots}
        distinct = f"{len(rows)}/{GLOBAL} distinct rows"
        for p, r, a, row, status in slots:
            assert status == "data"
            got = seen[r][s * ACCUMULATION + a][row]
            assert np.array_equal(got, ref[p]), (
                f"{name}: step {s}, rank {r}, micro-step {a}, row {row} is not position {p} "
                f"of the global order, as trace says ({distinct} in the step)")


def _stream_rule(step: int) -> list[tuple[int, int, int, int, str]]:
    """Trace's slots of a step under stream placement, for a reader trace cannot open:
    rank ``r``'s ``j``-th example is global ``j·R + r``."""
    per_rank = GLOBAL // WORLD
    return [(int(rank_example_to_global(step * per_rank + a * MICRO + row, r, WORLD)), r, a,
             row, "data") for r in range(WORLD) for a in range(ACCUMULATION)
            for row in range(MICRO)]


def _check_eval(record: Path, name: str, data: Data) -> None:
    """compute_metrics and predict got every real row of the eval pass once, no pad."""
    real = sorted(np.asarray(r, dtype=np.int64).tobytes()
                  for r in reference(name, data, False, None))
    rows = np.load(record / f"{name}.metrics.r0.npy")
    got = sorted(np.asarray(r, dtype=np.int64).tobytes() for r in rows)
    assert len(got) == len(real), (f"{name}: compute_metrics received {len(got)} rows for "
                                    f"{len(real)} real examples")
    assert got == real, f"{name}: compute_metrics' rows are not the eval set's, once each"
    labels = np.load(record / f"{name}.predict_labels.r0.npy")
    predictions = np.load(record / f"{name}.predict.r0.npy")
    assert len(predictions) == len(labels) == len(real), (
        f"{name}: predict returned {len(predictions)} rows for {len(real)} real examples")


@pytest.fixture(scope="module")
def runs(launches: Launches) -> Path:
    return launches.record("test_placement_matrix", "runs")


@pytest.mark.parametrize("integration", sorted(INTEGRATIONS))
def test_every_reader_is_placed(integration: str, data: Data, runs: Path) -> None:
    record = runs / integration
    for r in range(WORLD):
        error = record / f"error.r{r}.txt"
        if error.exists():
            pytest.fail(f"{integration} raised on rank {r}:\n{error.read_text()}")
    for name in READERS:
        _check_against_trace(record, name, data)
        if integration in ("trainer", "trl") and READERS[name].eval:
            _check_eval(record, name, data)
    if integration in ("trainer", "trl"):  # a reader made for one rank, under two: refused
        for r in range(WORLD):
            message = (record / f"refused.r{r}.txt").read_text()
            assert "World.detect()" in message and "2 processes" in message, message
