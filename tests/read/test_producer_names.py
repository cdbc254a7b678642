"""Chunk names of a producer directory: format patterns and regexes with one capture group
(read/external/producer_dir/names.py), and a consumed chunk the producer deleted."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from shardwise.errors import ConfigError, InputError
from shardwise.read.external.producer_dir import ProducerDirDataset, delete_finished
from shardwise.read.external.producer_dir.names import ChunkNames
from shardwise.world import World


def test_regex_names_match_whole_names_only(tmp_path: Path) -> None:
    for name in ("chunk_3.jsonl", "chunk_10.jsonl", ".tmp-chunk_4.jsonl",
                 "chunk_3.jsonl.completed", "chunk_x.jsonl"):
        (tmp_path / name).write_text("")
    names = ChunkNames(r"chunk_(\d+)\.jsonl")
    assert names.indices(tmp_path) == [3, 10]
    assert names.name(tmp_path, 10) == "chunk_10.jsonl" and names.name(tmp_path, 4) is None
    (tmp_path / "chunk_003.jsonl").write_text("")
    with pytest.raises(ConfigError, match="both match the chunk pattern .* index 3"):
        names.indices(tmp_path)
    with pytest.raises(ConfigError, match="exactly one capture group"):
        ChunkNames(r"chunk_\d+\.jsonl")
    assert ChunkNames("c{index}.j").indices(tmp_path) == []  # format: chunk_3 is not c3


def test_a_deleted_chunk_is_known_by_its_marker_after_a_restart(tmp_path: Path) -> None:
    (tmp_path / "part-7.jsonl").write_text('{"a": 1}\n')
    ds = ProducerDirDataset(tmp_path, world=World(1, 2), pattern=r"part-(\d+)\.jsonl",
                            records_per_chunk=1, timeout=math.inf, marker=".completed")
    assert ds[3] == {"a": 1} and (tmp_path / "part-7.jsonl.completed").exists()
    assert delete_finished(tmp_path, 2, r"part-(\d+)\.jsonl", ".completed") == [7]
    (tmp_path / "part-7.jsonl.completed").write_text("")  # as if the producer kept the marker
    again = ProducerDirDataset(tmp_path, world=World(1, 2), pattern=r"part-(\d+)\.jsonl",
                               records_per_chunk=1, timeout=math.inf, marker=".completed")
    with pytest.raises(InputError, match="already consumed this chunk") as e:
        again[3]  # waiting for ever would hang: the chunk will not come back
    assert e.value.reason == "chunk_deleted" and e.value.path.endswith("part-7.jsonl")
