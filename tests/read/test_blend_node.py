"""A read config's blend node is a frozen value like its placement: it refuses each bad
input naming the field, writes back the JSON it read, compares by its mix, and rebuilds
from a Blend's state (no caches needed: the node holds paths, never opens them)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import orjson
import pytest

from shardwise.errors import ConfigError
from shardwise.read.compose.schedule import BlendConfig, BlendNode
from shardwise.read.config import ReadConfig, ReaderKind, load_read_config
from shardwise.read.placement import Placement
from shardwise.read.tokens.dataset import TokenConfig

SOURCES = {"web": "web/", "code": "code/"}
FIXED = {"sources": SOURCES, "weights": {"web": 0.7, "code": 0.3}}
STAGED = {"sources": SOURCES, "schedule": [[0, {"web": 1.0}], [5, {"web": 0.5, "code": 0.5}]],
          "length": 40}


@pytest.mark.parametrize(("node", "match"), [
    ("web=web/", r"blend is a JSON object .* got str"),
    ({"weights": {"web": 1}}, r"blend\.sources must map names to cache paths"),
    ({"sources": ["web/"], "weights": {"web": 1}}, r"blend\.sources must map .*\['web/'\]"),
    ({"sources": {}, "weights": {}}, r"blend\.sources must map .* got \{\}"),
    ({"sources": {"web": 3}, "weights": {"web": 1}}, r"blend\.sources: .* got \{'web': 3\}"),
    ({"sources": SOURCES}, r"'weights' or a 'schedule', exactly one; got neither"),
    ({**FIXED, "schedule": [[0, {"web": 1}]]}, r"exactly one; got both"),
    ({**FIXED, "lenght": 4}, r"blend takes no \['lenght'\]"),
    ({"sources": SOURCES, "weights": {"web": 1, "math": 1}},
     r"blend\.weights: weights name \['math'\], which are not among its sources"),
    ({"sources": SOURCES, "weights": [0.7, 0.3]}, r"blend\.weights must be an object"),
    ({"sources": SOURCES, "weights": {"web": "0.7"}}, r"blend\.weights: a weight is a number"),
    ({"sources": SOURCES, "weights": {"web": -1, "code": 2}}, r"blend\.weights: .*>= 0"),
    ({"sources": SOURCES, "weights": {"web": 0}}, r"blend\.weights: at least one weight"),
    ({"sources": SOURCES, "schedule": []}, r"blend\.schedule must be a non-empty list"),
    ({"sources": SOURCES, "schedule": {"0": {"web": 1}}}, r"blend\.schedule must be a non-emp"),
    ({"sources": SOURCES, "schedule": [[0, {"web": 1}, 3]]},
     r"blend\.schedule stage 0 must be \[step, \{name: weight\}\]"),
    ({"sources": SOURCES, "schedule": ["0:"]}, r"blend\.schedule stage 0 must be \[step"),
    ({"sources": SOURCES, "schedule": [[0, {"web": 1}], [4, {"math": 1}]]},
     r"blend\.schedule stage 1: weights name \['math'\]"),
    ({"sources": SOURCES, "schedule": [[2, {"web": 1}]]},
     r"blend\.schedule stage 0 starts at step 2: the first stage starts at step 0"),
    ({"sources": SOURCES, "schedule": [[0, {"web": 1}], [5, {"code": 1}], [5, {"web": 1}]]},
     r"blend\.schedule stage 2 starts at step 5: .* steps increase"),
    ({"sources": SOURCES, "schedule": [[0, {"web": 1}], ["5", {"code": 1}]]},
     r"blend\.schedule stage 1's step must be an integer"),
    ({**FIXED, "length": 0}, r"blend\.length must be >= 1, got 0"),
])
def test_the_node_refuses_each_bad_input_naming_the_field(node: Any, match: str) -> None:
    with pytest.raises(ConfigError, match=rf"^run\.json: .*{match}"):
        BlendNode.from_dict(node, "run.json")


def test_a_read_config_file_names_itself_and_the_field(tmp_path: Path) -> None:
    path = tmp_path / "run.json"
    path.write_text(json.dumps({"blend": {**STAGED, "schedule": STAGED["schedule"][::-1]},
                                "seq_len": 8, "global_batch_size": 4, "micro_batch_size": 4,
                                "world_size": 1}))
    with pytest.raises(ConfigError, match=rf"^{path}: blend\.schedule stage 0 starts at"):
        load_read_config(path)
    with pytest.raises(ConfigError, match=r"blend must be a BlendNode .* got \{'sources'"):
        ReadConfig(ReaderKind.TOKENS, TokenConfig(seq_len=8), Placement(4, 4, world_size=1),
                   blend=FIXED)  # type: ignore[arg-type]


@pytest.mark.parametrize("node", [FIXED, STAGED], ids=["weights", "schedule"])
def test_the_json_read_is_the_json_written(node: dict[str, Any], tmp_path: Path) -> None:
    """Byte for byte, in the documented key order; relative sources resolve against the
    config file's directory, as a cache does."""
    parsed = BlendNode.from_dict(node, "run.json")
    assert orjson.dumps(parsed.to_dict()) == orjson.dumps(node)
    assert BlendNode.from_dict(parsed.to_dict(), "again") == parsed
    path = tmp_path / "run.json"
    path.write_text(json.dumps({"blend": node, "seq_len": 8, "global_batch_size": 4,
                                "micro_batch_size": 4, "world_size": 1}))
    config = load_read_config(path)
    assert config.sources() == {n: str(tmp_path / p) for n, p in SOURCES.items()}
    written = config.to_dict()
    assert written["blend"] == {**node, "sources": config.sources()}
    assert ReadConfig.from_dict(written, where=str(path)) == config


def test_nodes_compare_by_their_mix() -> None:
    a, b = (BlendNode.from_dict(FIXED, "a"), BlendNode.from_dict(dict(FIXED), "b"))
    reordered = BlendNode.from_dict({**FIXED, "weights": {"code": 0.3, "web": 0.7}}, "c")
    other_mix = BlendNode.from_dict({**FIXED, "weights": {"web": 0.6, "code": 0.4}}, "d")
    assert a == b == reordered and hash(a) == hash(b) == hash(reordered)
    assert other_mix != a and len({a, b, reordered, other_mix}) == 2
    assert BlendNode.from_dict(STAGED, "e") != BlendNode.from_dict({**STAGED, "length": 41}, "f")
    assert a.to_dict() == reordered.to_dict()  # weights in the sources' order
    with pytest.raises(dataclasses.FrozenInstanceError):
        a.length = 3  # type: ignore[misc]


def test_stages_count_examples_of_the_global_batch() -> None:
    assert BlendNode.from_dict(STAGED, "s").stages(8) == [
        (0, {"web": 1.0}), (40, {"web": 0.5, "code": 0.5})]
    assert BlendNode.from_dict(FIXED, "f").stages(8) == [(0, {"web": 0.7, "code": 0.3})]


def test_from_a_blends_state() -> None:
    """The state holds the mix (a schedule in examples) and length; the sources are given,
    and a mix given replaces the state's."""
    state = BlendConfig(names=("web", "code"), weights=(0.7, 0.3), seed=4, length=50,
                        schedule=((8, (0.25, 0.75)),)).state()
    given: dict[str, Any] = {"blend": {"sources": SOURCES}, "global_batch_size": 4}
    seed, node = BlendNode.from_state(state, given)
    assert seed == 4 and "blend" not in given
    assert BlendNode.from_dict(node, "n") == BlendNode(
        tuple(SOURCES.items()), schedule=((0, (("web", 0.7), ("code", 0.3))),
                                          (2, (("web", 0.25), ("code", 0.75)))), length=50)
    _, mine = BlendNode.from_state(state, {"blend": {"sources": SOURCES,
                                                     "weights": {"code": 1}}})
    assert BlendNode.from_dict(mine, "m").to_dict() == {"sources": SOURCES,
                                                        "weights": {"code": 1.0}, "length": 50}
    with pytest.raises(ConfigError, match="whole steps of global_batch_size=3"):
        BlendNode.from_state(state, {"global_batch_size": 3})
