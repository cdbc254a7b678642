"""One config per run: every field of every reader's config goes state -> ReadConfig ->
reader and comes back equal, with the same fingerprint — and a new field needs no other edit.

Each reader is built from its frozen config (``config_class``); its state holds that
config's fields (``ReaderConfig.state``) and ``ReadConfig.from_state`` reads them back
through the same mapping. The tables below give every field a value that is not its
default, and the first test fails when a field has none: a new reader argument is then
covered here by adding its value, and by nothing else.
"""

from __future__ import annotations

import dataclasses
import itertools
import sys
from pathlib import Path
from typing import Any

import pytest

import shardwise as sw
import shardwise.read.config as read_config
from shardwise.errors import ConfigError
from shardwise.read.compose.blend import Blend
from shardwise.read.compose.records import CacheRecords
from shardwise.read.compose.schedule import BlendConfig
from shardwise.read.compose.sft_pack import PackedSFT, SftConfig
from shardwise.read.config import ReadConfig, ReaderKind, check_state
from shardwise.read.loader import sampler_state_config
from shardwise.read.orders.base import OrderOptions, option_defaults
from shardwise.read.orders.block import BlockOptions
from shardwise.read.orders.stream import StreamConfig
from shardwise.read.placement import Placement
from shardwise.read.reader_config import ReaderConfig
from shardwise.read.sampler import BatchSampler, SamplerKind
from shardwise.read.stream.dataset import StreamDataset
from shardwise.read.tokens.dataset import TokenConfig, TokenDataset
from shardwise.read.trace import Tracer
from shardwise.torch import loader
from shardwise.world import World

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/
from cachefactory import make_cache, sample_docs  # noqa: E402

B, M = 4, 2
LAYOUT = {"global_batch_size": B, "micro_batch_size": M, "world_size": 1}
# a value other than the default for every field of every reader's config
VALUES: dict[type[ReaderConfig], dict[str, Any]] = {
    TokenConfig: {"seq_len": 16, "seed": 5, "shuffle": "block", "drop_last": False,
                  "block_size": 4, "blocks_per_group": 2, "reset_position_ids": True,
                  "cu_seqlens": True, "eod_mask_loss": True},
    StreamConfig: {"seq_len": 16, "streams": 3, "seed": 2, "block_chunks": 2,
                   "drop_last": False, "epochs": 2, "shuffle": "block", "block_size": 3,
                   "blocks_per_group": 2},
    SftConfig: {"seq_len": 64, "group_size": 7, "seed": 3, "epochs": 2,
                "overlong": "truncate", "pad_id": 1},
    BlendConfig: {"names": ("web", "code"), "weights": (0.7, 0.3), "seed": 4, "length": 50,
                  "schedule": ((8, (0.25, 0.75)),)},
}


@pytest.fixture(scope="module")
def caches(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    d = tmp_path_factory.mktemp("read-config")
    return {name: str(make_cache(d / name, [sample_docs(60, seed=seed, max_len=120)],
                                 chunk_docs=5, eod_id=0))
            for name, seed in (("web", 1), ("code", 2))}


@pytest.mark.parametrize("config_class", list(VALUES), ids=lambda c: c.__name__)
def test_every_field_has_a_value_other_than_its_default(config_class: Any) -> None:
    """Every field is an argument, but ``order``, whose fields (the order's own options)
    are arguments instead."""
    values = VALUES[config_class]
    fields = {f.name: f.default for f in dataclasses.fields(config_class)}
    if "order" in fields:
        del fields["order"]
        fields.update(option_defaults(values["shuffle"]))
    assert set(values) == set(fields), (
        f"give every field of {config_class.__name__} a non-default value in VALUES")
    for name, value in values.items():
        assert value != fields[name], name


def _rebuilt(state: dict[str, Any], **given: Any) -> tuple[ReadConfig, Any]:
    config = ReadConfig.from_state(state, **LAYOUT, **given)
    again = ReadConfig.from_dict(config.to_dict())  # and through the config file's form
    assert again == dataclasses.replace(config, where=again.where)
    dataset, _ = config.build(rank=0)
    check_state(dataset, state)
    return config, dataset


def test_tokens_round_trip(caches: dict[str, str]) -> None:
    ds = TokenDataset(caches["web"], **VALUES[TokenConfig])
    dl = loader(ds, global_batch_size=B, micro_batch_size=M, world=World(0, 1),
                skip_steps=[(3, 4)])
    next(iter(dl))
    config, again = _rebuilt(dl.state_dict(), cache=caches["web"])
    assert config.skip == ((3, 4),)
    assert again.config == ds.config and again.fingerprint == ds.fingerprint


def test_stream_round_trip(caches: dict[str, str]) -> None:
    with StreamDataset(caches["web"], **VALUES[StreamConfig], world=World(0, 1),
                       batch_size=M, skip=[(4, 8)]) as ds:
        next(iter(ds))
        config, again = _rebuilt(ds.state_dict(), cache=caches["web"])
        with again:
            assert config.reader is ReaderKind.STREAM and config.skip == ((1, 2),)
            assert again.config == ds.config and again.state_config() == ds.state_config()


def test_sft_round_trip(caches: dict[str, str]) -> None:
    rows = PackedSFT(CacheRecords(caches["web"]), **VALUES[SftConfig], world=World(0, 1))
    next(iter(rows))
    config, again = _rebuilt(rows.state_dict(), cache=caches["web"])
    assert config.reader is ReaderKind.SFT
    assert again.config == rows.config and again.fingerprint == rows.fingerprint
    assert again.state_config()["window"] == 7  # group_size keeps its first state key


@pytest.mark.parametrize("staged", [False, True], ids=["weights", "schedule"])
def test_blend_round_trip(caches: dict[str, str], staged: bool) -> None:
    """The blend's own fields come back from its state; its sources' options (which its
    state holds only as fingerprints) and their paths are given."""
    values = dict(VALUES[BlendConfig], schedule=VALUES[BlendConfig]["schedule"] * staged)
    parts = [TokenDataset(caches[n], seq_len=16, seed=4, shuffle="none") for n in
             values["names"]]
    mix = Blend(parts, config=BlendConfig(**values))
    dl = loader(mix, global_batch_size=B, micro_batch_size=M, world=World(0, 1))
    next(iter(dl))
    config, again = _rebuilt(dl.state_dict(), seq_len=16, shuffle="none",
                             blend={"sources": {n: caches[n] for n in values["names"]}})
    assert again.config == mix.config and again.fingerprint == mix.fingerprint
    assert config.blend is not None and (config.blend.schedule is not None) is staged
    Tracer(config, state=dl.state_dict())  # trace takes the state it was built from


def test_a_new_config_field_needs_no_other_edit(caches: dict[str, str],
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """A field added to a reader's config alone is an argument, part of the state and the
    fingerprint, and comes back from a state through ReadConfig."""
    @dataclasses.dataclass(frozen=True)
    class Knobbed(TokenConfig):
        knob: int = 0

    class KnobbedTokens(TokenDataset):
        config_class = Knobbed

    monkeypatch.setattr(read_config, "reader_class", lambda kind: KnobbedTokens)
    plain, knobbed = (KnobbedTokens(caches["web"], seq_len=16, knob=k) for k in (0, 3))
    assert knobbed.state_config()["knob"] == 3
    assert knobbed.fingerprint != plain.fingerprint
    dl = loader(knobbed, global_batch_size=B, micro_batch_size=M, world=World(0, 1))
    _, again = _rebuilt(dl.state_dict(), cache=caches["web"])
    assert again.config.knob == 3 and again.fingerprint == knobbed.fingerprint


def test_unknown_arguments_are_named_with_the_configs_fields(caches: dict[str, str]
                                                             ) -> None:
    with pytest.raises(ConfigError, match=r"takes no argument \['shufle'\].*'shuffle'"):
        TokenDataset(caches["web"], seq_len=16, shufle="block")
    config = ReadConfig.from_dict({"cache": caches["web"], "seq_len": 16, "shufle": "x",
                                   **LAYOUT}, where="run.json")  # not the order's: runtime
    with pytest.raises(ConfigError, match=r"run.json: TokenDataset takes no argument"):
        config.build()
    with pytest.raises(ConfigError, match=r"StreamDataset needs \['streams'\]"):
        StreamDataset(caches["web"], seq_len=16, world=World(0, 1))
    with pytest.raises(ConfigError, match=r"config must be a TokenConfig, got 16"):
        TokenDataset(caches["web"], 16)  # type: ignore[arg-type]


def test_a_config_object_and_arguments_build_the_same_reader(caches: dict[str, str]
                                                             ) -> None:
    """The order's options are one field of the config object (``order``), each its own
    argument of the reader; a config replaced by arguments keeps the options it had."""
    by_args = TokenDataset(caches["web"], **VALUES[TokenConfig])
    fields = {k: v for k, v in VALUES[TokenConfig].items() if "block" not in k}
    by_config = TokenDataset(caches["web"], TokenConfig(
        **fields, order=BlockOptions(block_size=4, blocks_per_group=2)))
    replaced = TokenDataset(caches["web"], by_config.config, seed=9)
    assert by_args.config == by_config.config and by_args.fingerprint == by_config.fingerprint
    assert replaced.config == dataclasses.replace(by_config.config, seed=9)
    smaller = TokenDataset(caches["web"], by_config.config, block_size=2)
    assert smaller.config.order == BlockOptions(block_size=2, blocks_per_group=2)
    with pytest.raises(ConfigError, match=r"\['block_size'\] is an option of shuffle='block', "
                       r"not of shuffle='window' \(whose options are \[\]\)"):
        TokenDataset(caches["web"], by_config.config, shuffle="window", block_size=2)
    assert TokenDataset(caches["web"], by_config.config, shuffle="window").config.order \
        == OrderOptions()


@pytest.mark.parametrize("kind", ["single", "cyclic", "eval"])
def test_placement_keys_are_the_ones_check_state_leaves_out(caches: dict[str, str],
                                                           kind: str) -> None:
    """What a sampler adds to a state's config is named once (BatchSampler.STATE_KEYS),
    and is all that check_state leaves out of the order it compares."""
    ds = TokenDataset(caches["web"], seq_len=16)
    skip = () if kind == "eval" else ((4, 8),)  # evaluation sees every example
    s = BatchSampler(len(ds) - 1, B, M, World(0, 2), kind=SamplerKind(kind), skip=skip)
    added = set(sampler_state_config(ds, s)) - set(ds.state_config())
    assert added <= BatchSampler.STATE_KEYS and "sampler" in added
    assert ("skip" in added) == bool(skip)


def test_the_config_is_a_tree_of_nodes_and_the_flat_form_still_reads(caches: dict[str, str]
                                                                     ) -> None:
    """The JSON is the tree (data, reader with its order, placement); a file of the flat
    form of earlier versions is the same config."""
    flat = {"cache": caches["web"], "reader": "tokens", "seq_len": 16, "seed": 5,
            "shuffle": "block", "block_size": 4, "skip": [[2, 3]], **LAYOUT}
    tree = {"cache": caches["web"],
            "reader": {"kind": "tokens", "seq_len": 16, "seed": 5, "shuffle": "block",
                       "block_size": 4},
            "placement": {**LAYOUT, "skip": [[2, 3]]}}
    a, b = ReadConfig.from_dict(flat), ReadConfig.from_dict(tree)
    assert a == b and isinstance(a.config, TokenConfig)
    assert a.config.order == BlockOptions(block_size=4)
    assert a.placement == Placement(B, M, skip_steps=((2, 3),), world_size=1)
    written = a.to_dict()
    assert set(written) == {"cache", "reader", "placement"}
    assert written["reader"]["kind"] == "tokens" and written["reader"]["block_size"] == 4
    assert written["placement"] == {**LAYOUT, "skip_steps": [[2, 3]]}
    assert ReadConfig.from_dict(written) == a
    with pytest.raises(ConfigError, match=r"block_size.*shuffle='block'"):  # at parse time
        ReadConfig.from_dict({**tree, "reader": {"kind": "tokens", "seq_len": 16,
                                                 "block_size": 4}})
    with pytest.raises(ConfigError, match=r"placement takes no \['sampler_seed'\]"):
        ReadConfig.from_dict({**tree, "placement": {**LAYOUT, "sampler_seed": 1}})
    with pytest.raises(ConfigError, match="places its own examples"):
        ReadConfig.from_dict({**tree, "reader": {"kind": "stream", "seq_len": 16,
                                                 "streams": 2},
                              "placement": {**LAYOUT, "sampler": "cyclic"}})


def test_a_cyclic_placement_rebuilds_from_a_state_and_a_loader_takes_the_node(
        caches: dict[str, str]) -> None:
    ds = TokenDataset(caches["web"], seq_len=16, shuffle="none")
    kw = {"global_batch_size": B, "micro_batch_size": M, "sampler": "cyclic", "seed": 7,
          "data_sharding": False}
    by_args = loader(ds, world=World(0, 1), **kw)
    placement = sw.Placement(B, M, "cyclic", seed=7, data_sharding=False)
    by_node = loader(ds, world=World(0, 1), placement=placement)
    first = [b["input_ids"].tolist() for b in itertools.islice(iter(by_args), 3)]
    assert [b["input_ids"].tolist() for b in itertools.islice(iter(by_node), 3)] == first
    state = by_args.state_dict()
    assert by_node.state_dict() == state
    config = ReadConfig.from_state(state, cache=caches["web"], **LAYOUT)
    assert config.placement == dataclasses.replace(placement, world_size=1)
    rebuilt, sampler = config.build(rank=0)
    check_state(rebuilt, state, sampler)
    again = loader(rebuilt, world=World(0, 1), placement=config.placement)
    again.load_state_dict(state)
    assert again.state_dict() == state
    with pytest.raises(ConfigError, match=r"\['seed'\] given beside placement="):
        loader(ds, world=World(0, 1), placement=placement, seed=3)
    with pytest.raises(ConfigError, match=r"needs \['global_batch_size', 'micro_batch_size'\]"):
        loader(ds, world=World(0, 1))
    with pytest.raises(ConfigError, match="for world_size=1, and the job has 2 ranks"):
        loader(ds, world=World(0, 2), placement=config.placement)


def test_a_state_of_a_reader_no_config_rebuilds_is_named(caches: dict[str, str]) -> None:
    """No fallback: a state whose kind no read config rebuilds is refused by its kind."""
    ds = TokenDataset(caches["web"], seq_len=16)
    state = {**loader(ds, world=World(0, 1), global_batch_size=B,
                      micro_batch_size=M).state_dict(), "kind": "record_stream"}
    with pytest.raises(ConfigError, match="this state's kind is 'record_stream'"):
        ReadConfig.from_state(state, cache=caches["web"], **LAYOUT)
