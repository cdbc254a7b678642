"""``trace``: step k names exactly the examples the loader yields at step k, and the source
lines it names, tokenized, are those examples' tokens, piece by piece.

Real builds (the sample tokenizer) of corpora with a skipped bad record, a record without
text and an empty line, in several segments; the real loaders run per rank in one process
(``World(rank, size)``) for world sizes 1, 2 and 4.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import pytest
from tokenizers import Tokenizer

import shardwise as sw
from shardwise.read.config import ReadConfig, load_read_config
from shardwise.read.trace import Tracer, trace
from shardwise.torch import loader

SEQ = 24
B, M = 8, 2


def _corpus(path: Path, texts: list[str], bad: dict[int, str]) -> Path:
    """JSONL of ``texts``, with the raw line ``bad[i]`` written before text ``i``."""
    with open(path, "w", encoding="utf-8") as f:
        for i, t in enumerate(texts):
            if i in bad:
                f.write(bad[i] + "\n")
            f.write(json.dumps({"text": t}) + "\n")
    return path


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory, tokenizer_path: Path
          ) -> dict[str, Any]:
    from tests.conftest import sample_texts

    d = tmp_path_factory.mktemp("trace")
    texts = [t[:300] for t in sample_texts()[:90]]
    a = _corpus(d / "a.jsonl", texts[:50], {3: "{not json", 10: "", 17: '{"id": 4}'})
    b = _corpus(d / "b.jsonl", texts[50:], {0: "", 5: "[1, 2]"})
    cache = d / "cache"
    sw.build([str(a), str(b)], cache, tokenizer=tokenizer_path, chunk_docs=4,
             segment_bytes=4096, on_error="skip", append_eod=True, workers=1,
             progress=False)
    return {"cache": cache, "tok": Tokenizer.from_file(str(tokenizer_path)),
            "eod": sw.open_cache(cache).eod_id, "dir": d}


def _line_tokens(built: dict[str, Any], path: str, line: int) -> list[int]:
    with open(path, encoding="utf-8") as f:
        raw = next(itertools.islice(f, line - 1, None))
    ids = built["tok"].encode(json.loads(raw)["text"], add_special_tokens=False).ids
    return [*ids, built["eod"]]


def _window(batch: dict[str, Any], row: int) -> list[int]:
    ids = batch["input_ids"][row].tolist()
    return [*ids, int(batch["labels"][row][-1])]


def _check_pieces(built: dict[str, Any], window: list[int], ex: Any) -> None:
    assert ex.status == "data" and ex.pieces
    assert ex.pieces[0].at == 0 and sum(p.tokens for p in ex.pieces) == len(window)
    for p in ex.pieces:
        doc = _line_tokens(built, p.where.source_path, p.where.line)
        assert window[p.at: p.at + p.tokens] == doc[p.doc_offset: p.doc_offset + p.tokens]


def _token_config(built: dict[str, Any], world: int, **extra: Any) -> ReadConfig:
    return ReadConfig.from_dict({"cache": str(built["cache"]), "seq_len": SEQ, "seed": 3,
                                 "global_batch_size": B, "micro_batch_size": M,
                                 "world_size": world, **extra})


@pytest.mark.parametrize("world", [1, 2, 4])
@pytest.mark.parametrize("shuffle", ["window", "document"])
def test_global_placement_names_the_loaders_examples(built: dict[str, Any], world: int,
                                                     shuffle: str) -> None:
    cfg = _token_config(built, world, shuffle=shuffle)
    acc, steps = cfg.accumulation, (0, 3)
    tracer = Tracer(cfg)
    for r in range(world):
        ds, _ = cfg.build(rank=r)
        dl = loader(ds, global_batch_size=B, micro_batch_size=M, world=sw.World(r, world))
        batches = list(itertools.islice(iter(dl), (max(steps) + 1) * acc))
        for k in steps:
            traced = [e for e in tracer.step(k).examples if e.rank == r]
            assert len(traced) == acc * M
            for e in traced:
                batch = {key: v.numpy() for key, v in batches[k * acc + e.micro_batch].items()}
                _check_pieces(built, _window(batch, e.row), e)


@pytest.mark.parametrize("world", [1, 2, 4])
def test_stream_placement_names_the_loaders_examples(built: dict[str, Any],
                                                     world: int) -> None:
    cfg = _token_config(built, world, reader="stream", streams=4, block_chunks=2)
    tracer = Tracer(cfg)
    acc, step = cfg.accumulation, 2
    for r in range(world):
        ds, _ = cfg.build(rank=r)
        batches = list(itertools.islice(iter(ds), (step + 1) * acc))
        traced = [e for e in tracer.step(step).examples if e.rank == r]
        assert len(traced) == acc * M
        for e in traced:
            _check_pieces(built, _window(batches[step * acc + e.micro_batch], e.row), e)
        ds.close()


def test_blend_names_each_source(built: dict[str, Any], tmp_path: Path) -> None:
    conf = tmp_path / "read.json"
    conf.write_text(json.dumps({
        "blend": {"sources": {"x": str(built["cache"]), "y": str(built["cache"])},
                  "weights": {"x": 0.75, "y": 0.25}},
        "seq_len": SEQ, "seed": 1, "global_batch_size": B, "micro_batch_size": M,
        "world_size": 2}))
    cfg = load_read_config(conf)
    got = trace(cfg, 1)
    assert {e.source for e in got.examples} == {"x", "y"}
    for r in range(2):
        ds, _ = cfg.build(rank=r)
        dl = loader(ds, global_batch_size=B, micro_batch_size=M, world=sw.World(r, 2))
        batches = list(itertools.islice(iter(dl), 2 * cfg.accumulation))
        for e in (e for e in got.examples if e.rank == r):
            assert ds.locate([e.position])[1][0] == e.source_position
            batch = {k: v.numpy() for k, v in batches[cfg.accumulation + e.micro_batch].items()}
            _check_pieces(built, _window(batch, e.row), e)


def test_packed_sft_rows(built: dict[str, Any]) -> None:
    cfg = ReadConfig.from_dict({"cache": str(built["cache"]), "reader": "sft", "seq_len": 96,
                                "seed": 3, "group_size": 8, "epochs": 1, "overlong": "truncate",
                                "global_batch_size": B, "micro_batch_size": M,
                                "world_size": 1})
    ds, _ = cfg.build()
    rows = list(itertools.islice(iter(ds), 3 * B))
    got = Tracer(cfg).step(2)
    for e in got.examples:
        ids = rows[e.position]["input_ids"].tolist()
        for p in e.pieces:
            doc = _line_tokens(built, p.where.source_path, p.where.line)
            assert ids[p.at: p.at + p.tokens] == doc[: p.tokens]
    state = ds.state_dict()  # row 24: bin b of some window; trace from there and before
    again = ReadConfig.from_state(state, cache=str(built["cache"]), global_batch_size=B,
                                  micro_batch_size=M, world_size=1)
    anchored = Tracer(again, state=state)
    assert anchored.step(3).to_dict() == Tracer(cfg).step(3).to_dict()
    assert anchored.step(2).to_dict() == got.to_dict()


def test_skipped_lines_are_recorded(built: dict[str, Any]) -> None:
    cache = sw.open_cache(built["cache"])
    skipped = [cache.meta(c).skipped_lines for c in range(len(cache.chunks))]
    assert sum(len(s) for s in skipped if s) == 5  # 3 in a.jsonl, 2 in b.jsonl
    assert sum(s is None for s in skipped) > 0  # absent where nothing was skipped


def test_text_and_ids(built: dict[str, Any]) -> None:
    tok = built["tok"]
    got = Tracer(_token_config(built, 1), decode=lambda ids: tok.decode(ids)).step(0)
    piece = got.examples[0].pieces[0]
    assert piece.ids is not None and piece.text == tok.decode(piece.ids)
    assert json.loads(json.dumps(got.to_dict()))["examples"][0]["pieces"][0]["ids"]


def test_from_state_rebuilds_the_run(built: dict[str, Any]) -> None:
    cfg = _token_config(built, 2, shuffle="block")
    ds, _ = cfg.build(rank=1)
    dl = loader(ds, global_batch_size=B, micro_batch_size=M, world=sw.World(1, 2))
    for _ in itertools.islice(iter(dl), 3):
        pass
    state = dl.state_dict()
    again = ReadConfig.from_state(state, cache=str(built["cache"]), global_batch_size=B,
                                  micro_batch_size=M, world_size=2)
    assert again.options["shuffle"] == "block" and again.seed == 3
    assert trace(again, 1).to_dict() == trace(cfg, 1).to_dict()
    with pytest.raises(sw.ConfigError, match="global_batch_size"):
        ReadConfig.from_state(state, cache=str(built["cache"]))


@pytest.mark.parametrize("sharding", [True, False])
def test_a_cyclic_runs_state_traces_what_that_run_read(built: dict[str, Any],
                                                       sharding: bool) -> None:
    """Placement is a node of the read config: a state saved by a loader with Megatron's
    cyclic sampler rebuilds that sampler (kind, seed, sharding), so step k names the
    examples that run read, not the single sampler's."""
    cfg = _token_config(built, 2, shuffle="none")
    acc, steps = cfg.accumulation, 3
    states, seen = [], {}
    for r in range(2):
        ds, _ = cfg.build(rank=r)
        dl = loader(ds, global_batch_size=B, micro_batch_size=M, world=sw.World(r, 2),
                    sampler="cyclic", seed=11, data_sharding=sharding)
        seen[r] = list(itertools.islice(iter(dl), (steps + 1) * acc))
        states.append(dl.state_dict())
    again = ReadConfig.from_state(states[0], cache=str(built["cache"]),
                                  global_batch_size=B, micro_batch_size=M, world_size=2)
    assert again.placement.sampler.value == "cyclic" and again.placement.seed == 11
    assert again.placement.data_sharding is sharding
    tracer = Tracer(again, state=states[0])
    for k in range(steps + 1):
        for e in tracer.step(k).examples:
            batch = {key: v.numpy() for key, v in seen[e.rank][k * acc + e.micro_batch].items()}
            _check_pieces(built, _window(batch, e.row), e)
    single = _token_config(built, 2, shuffle="none")  # the same order, another placement
    with pytest.raises(sw.ConfigError, match="sampler"):
        Tracer(single, state=states[0])


def test_config_errors_name_the_field(tmp_path: Path) -> None:
    bad = tmp_path / "r.json"
    bad.write_text('{"cache": "c", "seq_len": 8}')
    with pytest.raises(sw.ConfigError, match="missing"):
        load_read_config(bad)
    bad.write_text("{")
    with pytest.raises(sw.ConfigError, match="not valid JSON"):
        load_read_config(bad)
    with pytest.raises(sw.ConfigError, match="multiple"):
        ReadConfig.from_dict({"cache": "c", "seq_len": 8, "global_batch_size": 6,
                              "micro_batch_size": 4, "world_size": 1})
    with pytest.raises(sw.ConfigError, match="not among its sources"):
        ReadConfig.from_dict({"blend": {"sources": {"a": "x"}, "weights": {"b": 1}},
                              "seq_len": 8, "global_batch_size": 4, "micro_batch_size": 4,
                              "world_size": 1})


def test_skipped_steps_are_named_and_the_rest_is_what_the_loader_yields(
        built: dict[str, Any]) -> None:
    cfg = _token_config(built, 2, skip=[[1, 3]])
    tracer = Tracer(cfg)
    assert {e.status for e in tracer.step(1).examples} == {"skipped"}
    assert not any(e.pieces for e in tracer.step(2).examples)
    acc = cfg.accumulation
    for r in range(2):
        ds, sampler = cfg.build(rank=r)
        assert sampler is not None and sampler.skip == ((B, 3 * B),)
        dl = loader(ds, global_batch_size=B, micro_batch_size=M, world=sw.World(r, 2),
                    skip_steps=cfg.skip)
        batches = list(itertools.islice(iter(dl), 3 * acc))  # steps 0, 3 and 4
        for served, k in ((0, 0), (1, 3), (2, 4)):
            for e in (e for e in tracer.step(k).examples if e.rank == r):
                batch = {key: v.numpy() for key, v in batches[served * acc + e.micro_batch].items()}
                _check_pieces(built, _window(batch, e.row), e)
    state = dl.state_dict()
    again = ReadConfig.from_state(state, cache=str(built["cache"]), global_batch_size=B,
                                  micro_batch_size=M, world_size=2)
    assert again.skip == ((1, 3),)
    assert [e.position for e in Tracer(again).example_range(8, 12).examples] == [8, 9, 10, 11]
    assert {e.status for e in Tracer(again).example_range(8, 12).examples} == {"skipped"}


def test_skipped_stream_steps_are_named_and_the_rest_is_what_the_stream_yields(
        built: dict[str, Any]) -> None:
    cfg = _token_config(built, 2, reader="stream", streams=4, block_chunks=2, skip=[[1, 3]])
    tracer = Tracer(cfg)
    for k in (1, 2):
        assert {e.status for e in tracer.step(k).examples} == {"skipped"}
        assert not any(e.pieces for e in tracer.step(k).examples)
    acc = cfg.accumulation
    for r in range(2):
        ds, _ = cfg.build(rank=r)
        assert ds.skip == ((B, 3 * B),)
        batches = list(itertools.islice(iter(ds), 3 * acc))  # steps 0, 3 and 4
        for served, k in ((0, 0), (1, 3), (2, 4)):
            traced = [e for e in tracer.step(k).examples if e.rank == r]
            assert len(traced) == acc * M and {e.status for e in traced} == {"data"}
            for e in traced:
                _check_pieces(built, _window(batches[served * acc + e.micro_batch], e.row), e)
        state = ds.state_dict()
        ds.close()
    assert state["consumed"] == 5 * B
    again = ReadConfig.from_state(state, cache=str(built["cache"]), global_batch_size=B,
                                  micro_batch_size=M, world_size=2)
    assert again.reader.value == "stream" and again.skip == ((1, 3),)
    assert {e.status for e in Tracer(again).example_range(B, B + 4).examples} == {"skipped"}


def _sft_record(rec: dict[str, Any]) -> dict[str, Any] | None:
    """A toy SFT processor: ids from the bytes of the text, loss on the second half."""
    if "text" not in rec:
        return None
    ids = list(rec["text"].encode()[:40])
    return {"input_ids": ids, "labels": [-100] * (len(ids) // 2) + ids[len(ids) // 2:]}


def test_packed_sft_over_a_record_cache(tmp_path: Path) -> None:
    from tests.conftest import sample_texts

    src = _corpus(tmp_path / "sft.jsonl", [t[:60] for t in sample_texts()[:60]],
                  {4: "{oops", 20: '{"id": 1}'})
    cache = tmp_path / "records"
    sw.build([str(src)], cache, processor=_sft_record, vocab_size=256, records=True,
             chunk_docs=7, on_error="skip", workers=1, progress=False)
    cfg = ReadConfig.from_dict({"cache": str(cache), "reader": "sft", "seq_len": 128,
                                "seed": 5, "group_size": 16, "global_batch_size": 4,
                                "micro_batch_size": 2, "world_size": 2})
    ranks = [list(itertools.islice(iter(cfg.build(rank=r)[0]), 6)) for r in range(2)]
    lines = src.read_text().splitlines()
    for e in Tracer(cfg).step(2).examples:  # rank r's j-th row is row 2j + r
        assert e.position % 2 == e.rank
        ids = ranks[e.rank][e.position // 2]["input_ids"].tolist()
        assert e.pieces
        for p in e.pieces:
            want = _sft_record(json.loads(lines[p.where.line - 1]))
            assert want is not None
            assert ids[p.at: p.at + p.tokens] == want["input_ids"][: p.tokens]
