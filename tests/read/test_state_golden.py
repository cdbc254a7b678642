"""Saved states stay loadable: the states each reader kind saves are pinned byte for byte.

A state is what was trained on (contract 10): a change to a reader's config, its
``state_config()`` or its fingerprint must not turn a saved checkpoint into a refusal. The
caches here are written by ``cachefactory`` (deterministic, so their fingerprints are
too); every reader is made with non-default values for each of its order's arguments.

If an intended change alters these states, it is a new state version: keep the old one
loading, then regenerate with
``SHARDWISE_REGEN_GOLDEN=1 python -m pytest tests/read/test_state_golden.py``.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import shardwise as sw
from shardwise.read.compose.blend import Blend
from shardwise.read.compose.records import CacheRecords
from shardwise.read.compose.sft_pack import PackedSFT
from shardwise.read.stream.dataset import StreamDataset
from shardwise.read.tokens.dataset import TokenDataset
from shardwise.torch import loader
from shardwise.world import World

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/
from cachefactory import make_cache, sample_docs  # noqa: E402

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "read_states_v1.json"
TOKENS = {"seq_len": 16, "seed": 5, "shuffle": "block", "drop_last": False,
          "block_size": 4, "blocks_per_group": 2, "reset_position_ids": True,
          "cu_seqlens": True, "eod_mask_loss": True}
STREAM = {"seq_len": 16, "streams": 3, "seed": 2, "block_chunks": 2, "drop_last": False,
          "epochs": 2}
SFT = {"seq_len": 64, "group_size": 7, "seed": 3, "epochs": 2, "overlong": "truncate",
       "pad_id": 1}


@pytest.fixture(scope="module")
def caches(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("golden-states")
    return {name: make_cache(d / name, [sample_docs(60, seed=seed, max_len=120)],
                             chunk_docs=5, eod_id=0)
            for name, seed in (("a", 1), ("b", 2))}


def _steps(dl: Any, n: int) -> Any:
    it = iter(dl)
    for _ in range(n):
        next(it)
    return dl


def _tokens(c: dict[str, Path]) -> dict[str, Any]:
    dl = loader(TokenDataset(c["a"], **TOKENS), global_batch_size=4, micro_batch_size=2,
                world=World(0, 1), skip_steps=[(3, 4)])
    return _steps(dl, 2).state_dict()  # type: ignore[no-any-return]


def _stream(c: dict[str, Path]) -> dict[str, Any]:
    ds = StreamDataset(c["a"], **STREAM, world=World(0, 1), batch_size=2, skip=[(4, 6)])
    it = iter(ds)
    for _ in range(3):
        next(it)
    state = ds.state_dict()
    ds.close()
    return state


def _sft(c: dict[str, Path]) -> dict[str, Any]:
    rows = PackedSFT(CacheRecords(c["a"]), **SFT, world=World(0, 1))
    it = iter(rows)
    for _ in range(5):
        next(it)
    return rows.state_dict()


def _blend(c: dict[str, Path], **mix: Any) -> dict[str, Any]:
    parts = [TokenDataset(c[n], seq_len=16, seed=4) for n in ("a", "b")]
    dl = loader(Blend(parts, seed=4, names=["a", "b"], **mix), global_batch_size=4,
                micro_batch_size=2, world=World(0, 1))
    return _steps(dl, 3).state_dict()  # type: ignore[no-any-return]


CASES: dict[str, Callable[[dict[str, Path]], dict[str, Any]]] = {
    "tokens": _tokens,
    "stream": _stream,
    "sft": _sft,
    "blend_weights": lambda c: _blend(c, weights=[0.7, 0.3]),
    "blend_schedule": lambda c: _blend(c, schedule=[(0, [0.5, 0.5]), (8, {"b": 1.0})]),
}


def test_states_match_the_golden_file(caches: dict[str, Path]) -> None:
    now = {name: make(caches) for name, make in CASES.items()}
    if os.environ.get("SHARDWISE_REGEN_GOLDEN") == "1":
        lines = [f"  {json.dumps(k)}: {json.dumps(v, sort_keys=True)}" for k, v in now.items()]
        GOLDEN.write_text("{\n" + ",\n".join(lines) + "\n}\n")
    golden = json.loads(GOLDEN.read_text())
    for name in CASES:
        assert json.loads(json.dumps(now[name])) == golden[name], name


def test_golden_states_resume_the_readers_that_saved_them(caches: dict[str, Path]) -> None:
    golden = json.loads(GOLDEN.read_text())
    dl = loader(TokenDataset(caches["a"], **TOKENS), global_batch_size=4,
                micro_batch_size=2, world=World(0, 1), skip_steps=[(3, 4)])
    dl.load_state_dict(golden["tokens"])
    assert dl.consumed == golden["tokens"]["consumed"]
    with StreamDataset(caches["a"], **STREAM, world=World(0, 1), batch_size=2,
                       skip=[(4, 6)]) as ds:
        ds.load_state_dict(golden["stream"])
        assert ds.consumed == golden["stream"]["consumed"]
    rows = PackedSFT(CacheRecords(caches["a"]), **SFT, world=World(0, 1))
    rows.load_state_dict(golden["sft"])
    assert rows.state_dict()["extra"] == golden["sft"]["extra"]
    for name, mix in (("blend_weights", {"weights": [0.7, 0.3]}),
                      ("blend_schedule", {"schedule": [(0, [0.5, 0.5]), (8, {"b": 1.0})]})):
        parts = [TokenDataset(caches[n], seq_len=16, seed=4) for n in ("a", "b")]
        bl = loader(Blend(parts, seed=4, names=["a", "b"], **mix), global_batch_size=4,
                    micro_batch_size=2, world=World(0, 1))
        bl.load_state_dict(golden[name])
        assert bl.consumed == golden[name]["consumed"]


def test_the_cache_fingerprints_are_the_golden_ones(caches: dict[str, Path]) -> None:
    """The pinned states name these caches: the factory must still write the same ones."""
    golden = json.loads(GOLDEN.read_text())
    assert golden["tokens"]["config"]["cache"] == sw.open_cache(caches["a"]).fingerprint
