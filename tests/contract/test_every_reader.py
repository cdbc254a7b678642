"""Every resumable reader keeps the one protocol (``checkpoint.Resumable``): resumed after
any step it continues exactly, and a state of another configuration or of another reader
is refused naming what differs. A reader added to shardwise without a row here fails
``test_every_reader_is_covered``, so none can skip these checks."""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable, Iterator
from itertools import islice
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
from tests.cachefactory import make_cache, sample_docs
from tests.read.test_consumer import ListReader
from tests.read.test_orders import Reversed

import shardwise
import shardwise as sw
from shardwise.checkpoint import Configured, Resumable
from shardwise.compat.llm import DistributedShardedDataset, ResumableSequentialSampler
from shardwise.errors import StateError
from shardwise.read.external.producer_dir import (
    ProducerDirDataset,
    ProducerDirStream,
    publish_chunk,
)
from shardwise.read.orders import ORDERS
from shardwise.testing import assert_resumes_exactly
from shardwise.torch import ShardwiseLoader, loader
from shardwise.torchdata import StatefulBatchSampler, batch_sampler
from shardwise.world import World

ONE = World(0, 1)
STEPS = 6


class Rows:
    """A reader whose items become ``{"input_ids": array}`` rows for the contract helper
    (record readers yield dicts, lists or tensors); state calls go to the reader."""

    def __init__(self, reader: Any, pick: Callable[[Any], Any] = lambda x: x) -> None:
        self.reader, self.pick = reader, pick

    def __iter__(self) -> Iterator[dict[str, Any]]:
        for item in self.reader:
            yield {"input_ids": np.asarray(self.pick(item))}

    def state_dict(self) -> dict[str, Any]:
        return self.reader.state_dict()  # type: ignore[no-any-return]

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.reader.load_state_dict(state)


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    d = tmp_path_factory.mktemp("contract")
    caches = [make_cache(d / f"cache{i}", [sample_docs(60, seed=i)], chunk_docs=7)
              for i in range(2)]
    jsonl = d / "records.jsonl"
    jsonl.write_bytes(b"".join(orjson.dumps({"id": j}) + b"\n" for j in range(40)))
    producer = d / "producer"
    producer.mkdir()
    for c in range(4):
        publish_chunk(producer, c, [{"id": f"{c}-{j}"} for j in range(5)])
    shards = []
    for k, n in enumerate([7, 0, 11, 5]):
        p = d / f"shard{k}.json"
        p.write_bytes(orjson.dumps(list(range(100 * k, 100 * k + n))))
        shards.append(p)
    sft = [{"input_ids": list(range(1, 3 + j % 9))} for j in range(60)]
    return {"caches": caches, "jsonl": str(jsonl), "producer": producer, "shards": shards,
            "sft": sft}


def _shard(path: Path) -> list[int]:
    return list(orjson.loads(path.read_bytes()))


def _tokens(d: dict[str, Any], other: bool) -> Any:
    return loader(sw.TokenDataset(d["caches"][0], seq_len=16, seed=2 if other else 1),
                  global_batch_size=4, micro_batch_size=2, world=ONE)


def _tokens_numpy(d: dict[str, Any], other: bool) -> Any:
    """The torch-free loader (the torch loader's core)."""
    return sw.numpy_loader(sw.TokenDataset(d["caches"][0], seq_len=16, seed=2 if other else 1),
                           global_batch_size=4, micro_batch_size=2, world=ONE)


def _tokens_skipping(d: dict[str, Any], other: bool) -> Any:
    """The loader with skip ranges: its position jumps them; every step still resumes."""
    return loader(sw.TokenDataset(d["caches"][0], seq_len=16, seed=2 if other else 1),
                  global_batch_size=4, micro_batch_size=2, world=ONE,
                  skip_steps=[(0, 1), (2, 4)])


def _torchdata(d: dict[str, Any], other: bool) -> Any:
    """The batch sampler a StatefulDataLoader checkpoints (its index lists as rows)."""
    ds = sw.TokenDataset(d["caches"][0], seq_len=16, seed=2 if other else 1)
    return Rows(batch_sampler(ds, global_batch_size=4, micro_batch_size=2, world=ONE))


def _stream(d: dict[str, Any], other: bool) -> Any:
    return sw.StreamDataset(d["caches"][0], seq_len=16, streams=2, seed=2 if other else 1,
                            world=ONE)


def _stream_skipping(d: dict[str, Any], other: bool) -> Any:
    """Stream placement with skip ranges (one at the start, one later): its position jumps
    them, its read-ahead restarts past them; every step still resumes."""
    return sw.StreamDataset(d["caches"][0], seq_len=16, streams=2, seed=2 if other else 1,
                            world=ONE, skip=[(0, 1), (2, 4)])


def _records(d: dict[str, Any], other: bool) -> Any:
    rs = sw.RecordStream([d["jsonl"]], seed=2 if other else 1, streams=2, world=ONE,
                         range_bytes=64)
    return Rows(rs, lambda r: r["id"])


def _producer(d: dict[str, Any], other: bool) -> Any:
    ds = ProducerDirDataset(d["producer"], world=World(1, 2) if other else ONE,
                            timeout=5.0, poll_interval=0.01)
    return Rows(ds.stream(), lambda r: r["id"])


def _contiguous(d: dict[str, Any], other: bool) -> Any:
    ds = sw.ContiguousShards(d["shards"], _shard, world=ONE, order="shuffled",
                             seed=2 if other else 1)
    # the dataset is this rank's share already: the loader must not split it again
    return Rows(loader(ds, global_batch_size=2, micro_batch_size=2, world=World.single()))


def _consumer(d: dict[str, Any], other: bool) -> Any:
    return Rows(sw.SequentialConsumer(lambda: ListReader(list(range(50))), batch_size=3,
                                      shuffle_block=8, seed=2 if other else 1))


def _blend_map(d: dict[str, Any], other: bool) -> Any:
    parts = [sw.TokenDataset(c, seq_len=16, seed=1) for c in d["caches"]]
    return loader(sw.Blend(parts, [0.7, 0.3], seed=2 if other else 1),
                  global_batch_size=4, micro_batch_size=2, world=ONE)


def _blend_schedule(d: dict[str, Any], other: bool) -> Any:
    parts = [sw.TokenDataset(c, seq_len=16, seed=1) for c in d["caches"]]
    schedule = [(0, [0.7, 0.3]), (6, [0.1, 0.9]), (13, [0.5, 0.5])]  # inside steps of 4
    return loader(sw.Blend(parts, seed=2 if other else 1, schedule=schedule),
                  global_batch_size=4, micro_batch_size=2, world=ONE)


def _blend_streams(d: dict[str, Any], other: bool) -> Any:
    parts = [sw.StreamDataset(c, seq_len=16, streams=2, seed=1, world=ONE)
             for c in d["caches"]]
    return sw.Blend(parts, [0.6, 0.4], seed=2 if other else 1)


def _packed(d: dict[str, Any], other: bool) -> Any:
    return sw.PackedSFT(d["sft"], seq_len=24, group_size=16, seed=2 if other else 1,
                        epochs=None)


class SamplerRows(Rows):
    """Rows of ``dataset[i]`` for the indices a resumable sampler hands out."""

    def __init__(self, dataset: Any, sampler: Any) -> None:
        super().__init__(sampler)
        self.dataset = dataset

    def __iter__(self) -> Iterator[dict[str, Any]]:
        for i in self.reader:
            yield {"input_ids": np.asarray(self.dataset[i])}


def _llm(d: dict[str, Any], other: bool) -> Any:
    params = {p.name: ((p,), {}) for p in d["shards"]}
    ds = DistributedShardedDataset(_ShardFile, params, rank=0, world_size=1, shuffle=True,
                                   seed=2 if other else 1)
    return SamplerRows(ds, ResumableSequentialSampler(ds))


class _ShardFile(list):  # type: ignore[type-arg]
    """llm.datasets' dataset_type: built from a shard's parameters."""

    def __init__(self, path: Path) -> None:
        super().__init__(_shard(path))


# name -> (factory(data, other_config) -> a resumable iterable, the classes it covers)
READERS: dict[str, tuple[Callable[[dict[str, Any], bool], Any], tuple[type, ...]]] = {
    "TokenDataset+loader": (_tokens, (sw.TokenDataset, ShardwiseLoader)),
    "TokenDataset+loader(skip)": (_tokens_skipping, (ShardwiseLoader,)),
    "TokenDataset+numpy_loader": (_tokens_numpy, (sw.Loader,)),
    "TokenDataset+torchdata": (_torchdata, (StatefulBatchSampler,)),
    "StreamDataset": (_stream, (sw.StreamDataset,)),
    "StreamDataset(skip)": (_stream_skipping, (sw.StreamDataset,)),
    "RecordStream": (_records, (sw.RecordStream,)),
    "ProducerDirDataset.stream": (_producer, (ProducerDirDataset, ProducerDirStream)),
    "ContiguousShards+loader": (_contiguous, (sw.ContiguousShards,)),
    "SequentialConsumer": (_consumer, (sw.SequentialConsumer,)),
    "Blend(map)+loader": (_blend_map, (sw.Blend,)),
    "Blend(schedule)+loader": (_blend_schedule, (sw.Blend,)),
    "Blend(streams)": (_blend_streams, (sw.Blend,)),
    "PackedSFT": (_packed, (sw.PackedSFT,)),
    "compat.llm": (_llm, (DistributedShardedDataset, ResumableSequentialSampler)),
}



def _ordered(shuffle: str) -> Callable[[dict[str, Any], bool], Any]:
    """The loader over a TokenDataset in order ``shuffle``."""
    def make(d: dict[str, Any], other: bool) -> Any:
        return loader(sw.TokenDataset(d["caches"][0], seq_len=16, seed=2 if other else 1,
                                      shuffle=shuffle),
                      global_batch_size=4, micro_batch_size=2, world=ONE)
    return make


# every registered order, the trivial one tests/read/test_orders.py adds included
assert Reversed.name in ORDERS
READERS.update({f"TokenDataset+loader(shuffle={name})": (_ordered(name), (sw.TokenDataset,))
                for name in sorted(ORDERS) if name != "window"})


def _stream_reversed(d: dict[str, Any], other: bool) -> Any:
    """Stream placement serving each block's windows in the new order."""
    return sw.StreamDataset(d["caches"][0], seq_len=16, streams=2, seed=2 if other else 1,
                            world=ONE, shuffle=Reversed.name)


def _blend_reversed(d: dict[str, Any], other: bool) -> Any:
    """A blend of sources in the new order (one of them in the document order)."""
    parts = [sw.TokenDataset(c, seq_len=16, seed=1, shuffle=s)
             for c, s in zip(d["caches"], [Reversed.name, "document"], strict=True)]
    return loader(sw.Blend(parts, [0.5, 0.5], seed=2 if other else 1),
                  global_batch_size=4, micro_batch_size=2, world=ONE)


READERS.update({f"StreamDataset(shuffle={Reversed.name})": (_stream_reversed,
                                                            (sw.StreamDataset,)),
                f"Blend(shuffle={Reversed.name})+loader": (_blend_reversed, (sw.Blend,))})


def _all_subclasses(cls: type) -> set[type]:
    out = set()
    for sub in cls.__subclasses__():
        out |= {sub} | _all_subclasses(sub)
    return out


def test_every_reader_is_covered() -> None:
    for mod in pkgutil.walk_packages(shardwise.__path__, "shardwise."):
        if not mod.name.startswith(("shardwise.bench", "shardwise.cli")):
            importlib.import_module(mod.name)
    readers = {c for c in _all_subclasses(Configured)
               if c.__module__.startswith("shardwise.") and c is not Resumable}
    covered = {c for _, classes in READERS.values() for c in classes}
    assert readers - covered == set(), "add a row to READERS for every shardwise reader"


@pytest.mark.parametrize("name", sorted(READERS))
def test_resumes_exactly_from_every_step(data: dict[str, Any], name: str) -> None:
    make = READERS[name][0]
    assert_resumes_exactly(lambda: make(data, False), steps=STEPS)


@pytest.mark.parametrize("name", sorted(READERS))
def test_refuses_a_state_of_another_config(data: dict[str, Any], name: str) -> None:
    make = READERS[name][0]
    first = make(data, False)
    next(iter(first))
    state = first.state_dict()
    assert set(state) == {"kind", "version", "fingerprint", "consumed", "config", "extra"}
    differs = r"(?s)refusing to resume.*: state has .*, this reader has "
    with pytest.raises(StateError, match=differs):
        make(data, True).load_state_dict(state)


def test_refuses_a_state_of_another_reader(data: dict[str, Any]) -> None:
    states = {name: make(data, False).state_dict() for name, (make, _) in READERS.items()}
    for name, (make, _) in READERS.items():
        kind = states[name]["kind"]
        foreign = next(s for s in states.values() if s["kind"] != kind)
        with pytest.raises(StateError, match="belongs to a"):
            make(data, False).load_state_dict(foreign)


def test_resumable_readers_share_one_implementation() -> None:
    """No reader writes its own state_dict/load_state_dict (RecordStream adds all_ranks=
    on top of the shared one)."""
    own = {c.__name__ for c in _all_subclasses(Resumable)
           if "load_state_dict" in vars(c) or "fingerprint" in vars(c)}
    assert own == set()


# -- one label convention (read/examples.py) ---------------------------------------------------
def _examples(d: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    ds = sw.TokenDataset(d["caches"][0], seq_len=16, seed=1, drop_last=False)
    tail = ds.__getitems__([len(ds) - 1, sw.PAD])  # a short last window and a pad row
    stream = list(sw.StreamDataset(d["caches"][0], seq_len=16, streams=2, seed=1,
                                   epochs=1, world=ONE))
    packed = list(islice(_packed(d, False), 20))
    blend = sw.Blend([ds, sw.TokenDataset(d["caches"][1], seq_len=16, seed=1)], [0.5, 0.5])
    return {"TokenDataset": [{k: v[i] for k, v in tail.items()} for i in range(2)],
            "StreamDataset": stream, "PackedSFT": packed,
            "Blend": [blend[i] for i in range(8)]}


def test_every_example_reader_emits_next_token_labels(data: dict[str, Any]) -> None:
    for name, examples in _examples(data).items():
        for ex in examples:
            ids, labels, mask = ex["input_ids"], ex["labels"], ex["loss_mask"]
            assert ((labels == -100) == (mask == 0)).all(), name
            # where both are real tokens of one document, the target is the next input
            both = (mask[:-1] == 1) & (ids[1:] != 0)
            assert (labels[:-1][both] == ids[1:][both]).all(), name
    for cls in (sw.TokenDataset, sw.StreamDataset, sw.PackedSFT, sw.Blend):
        assert cls.label_convention == "next_token"


def test_a_blend_refuses_parts_that_disagree_on_labels(data: dict[str, Any]) -> None:
    class Unshifted(list):  # type: ignore[type-arg]
        label_convention = "unshifted"

    ds = sw.TokenDataset(data["caches"][0], seq_len=16, seed=1)
    with pytest.raises(sw.ConfigError, match="disagree on what 'labels' means"):
        sw.Blend([ds, Unshifted([ds[0]] * 4)], [0.5, 0.5])
    other = sw.TokenDataset(data["caches"][1], seq_len=16, seed=1, reset_position_ids=True,
                            cu_seqlens=True)
    with pytest.raises(sw.ConfigError, match="different keys"):
        sw.Blend([ds, other], [0.5, 0.5])
