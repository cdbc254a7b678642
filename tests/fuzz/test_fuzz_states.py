"""Property-based damage to saved states (issue 27): a loader's, a StreamDataset's and a
RecordStream's ``state_dict()``, edited, then loaded into a fresh reader that reads on.
Each case is accepted (a state may name another valid position) or refused with a
shardwise error — never a raw exception or a hang."""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.fuzz.conftest import examples
from tests.fuzz.harness import CASE_SECONDS, SEQ_LEN, Clean, within
from tests.fuzz.mutations import dumps, json_edit

import shardwise as sw
from shardwise.errors import ShardwiseError

Reader = Callable[[], Any]


def _loader(root: Path) -> Any:
    from shardwise.torch import loader

    ds = sw.TokenDataset(sw.open_cache(root), seq_len=SEQ_LEN, seed=1, shuffle="document")
    return loader(ds, global_batch_size=4, micro_batch_size=2, world=sw.World(0, 1),
                  epochs=1)


def _stream(root: Path) -> Any:
    return sw.StreamDataset(sw.open_cache(root), seq_len=SEQ_LEN, seed=1, streams=2,
                            epochs=1, world=sw.World(0, 1))


@pytest.fixture(scope="module")
def readers(finished: Clean, tmp_path_factory: pytest.TempPathFactory
            ) -> dict[str, tuple[Reader, dict[str, Any]]]:
    """Each reader's maker and a state it saved a few steps in."""
    src = tmp_path_factory.mktemp("fuzz-records") / "records.jsonl"
    src.write_text("".join(json.dumps({"text": f"record {i}"}) + "\n" for i in range(60)))
    makers: dict[str, Reader] = {
        "loader": lambda: _loader(finished.root),
        "StreamDataset": lambda: _stream(finished.root),
        "RecordStream": lambda: sw.RecordStream([str(src)], seed=1, streams=2, epochs=1,
                                                world=sw.World(0, 1))}
    out = {}
    for name, make in makers.items():
        reader = make()
        it = iter(reader)
        for _ in range(3):
            next(it)
        out[name] = (make, reader.state_dict())
    return out


def _load_and_read(make: Reader, state: Any) -> None:
    reader = make()
    try:
        reader.load_state_dict(state)
    except ShardwiseError:
        return
    try:
        list(itertools.islice(iter(reader), 3))
    except ShardwiseError:
        return


@settings(**examples(100))  # type: ignore[arg-type]
@given(data=st.data(), name=st.sampled_from(["loader", "StreamDataset", "RecordStream"]))
def test_a_damaged_state_is_resumed_or_named(readers: dict[str, tuple[Reader, Any]],
                                            data: st.DataObject, name: str) -> None:
    make, state = readers[name]
    edited = json.loads(data.draw(json_edit())(dumps(state)))
    within(CASE_SECONDS, lambda: _load_and_read(make, edited))
