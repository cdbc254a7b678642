"""``shardwise trace``: a step from a read config or a saved state (JSON, a checkpoint
directory, a torch file), ``--text`` with the cache's tokenizer only, ``--plot``."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import orjson
import pytest
import torch
from tests.conftest import sample_texts, write_jsonl
from tokenizers import Tokenizer

import shardwise as sw
from shardwise.read.config import load_read_config
from shardwise.read.trace import trace
from shardwise.torch import loader

LAYOUT = {"global_batch_size": 4, "micro_batch_size": 1, "world_size": 2}


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory, tokenizer_path: Path) -> Path:
    d = tmp_path_factory.mktemp("trace_cli")
    texts = [t[:200] for t in sample_texts()[:40]]
    write_jsonl(d / "a.jsonl", texts[:20])
    write_jsonl(d / "b.jsonl", texts[20:])
    for name in ("a", "b"):
        sw.build([str(d / f"{name}.jsonl")], d / f"cache_{name}", tokenizer=tokenizer_path,
                 chunk_docs=3, workers=1, append_eod=True, progress=False)
    (d / "read.json").write_text(json.dumps({"cache": "cache_a", "seq_len": 16, "seed": 2,
                                             "tokenizer": str(tokenizer_path), **LAYOUT}))
    (d / "blend.json").write_text(json.dumps({
        "blend": {"sources": {"web": "cache_a", "code": "cache_b"},
                  "weights": {"web": 0.5, "code": 0.5}}, "seq_len": 16, **LAYOUT}))
    return d


def _state_after(run_dir: Path, steps: int) -> dict[str, Any]:
    cfg = load_read_config(run_dir / "read.json")
    ds, _ = cfg.build(rank=0)
    dl = loader(ds, global_batch_size=4, micro_batch_size=1, world=sw.World(0, 2))
    for _ in itertools.islice(iter(dl), steps * cfg.accumulation):
        pass
    return dl.state_dict()


def test_step_from_a_read_config(cli, run_dir: Path) -> None:
    code, out, _ = cli("trace", run_dir / "read.json", "--step", 3, "--json")
    assert code == 0
    got = orjson.loads(out)
    assert got == orjson.loads(orjson.dumps(
        trace(load_read_config(run_dir / "read.json"), 3).to_dict()))
    assert {e["rank"] for e in got["examples"]} == {0, 1}
    code, out, _ = cli("trace", run_dir / "read.json", "--step", 3)
    assert code == 0 and "rank 1 micro-batch 1 row 0" in out
    assert f"{run_dir / 'a.jsonl'}:" in out


def test_text_needs_the_caches_tokenizer(cli, run_dir: Path, tokenizer_path: Path,
                                         tmp_path: Path) -> None:
    code, out, _ = cli("trace", run_dir / "read.json", "--step", 0, "--text")
    assert code == 0 and "      | " in out
    other = Tokenizer.from_file(str(tokenizer_path))
    other.add_tokens(["<zz-not-in-the-cache>"])
    other.save(str(tmp_path / "other.json"))
    code, _, err = cli("trace", run_dir / "read.json", "--step", 0, "--text",
                       "--tokenizer", tmp_path / "other.json")
    assert code == 2 and "was built with" in err and err.count("\n") == 1


@pytest.mark.parametrize("form", ["json", "checkpoint_dir", "torch"])
def test_a_saved_state_traces_its_last_step(cli, run_dir: Path, tmp_path: Path,
                                            form: str) -> None:
    state = _state_after(run_dir, 3)
    path = tmp_path / "state.json"
    if form == "checkpoint_dir":
        path = tmp_path / "checkpoint-3"
        path.mkdir()
        (path / "shardwise_loader.json").write_text(json.dumps(state))
    elif form == "torch":
        path = tmp_path / "ckpt.pt"
        torch.save({"model": {"w": torch.zeros(2)}, "data": {"loader": state}}, path)
    else:
        path.write_text(json.dumps(state))
    layout = [x for k, v in LAYOUT.items() for x in (f"--{k.replace('_', '-')}", v)]
    code, out, _ = cli("trace", path, "--cache", run_dir / "cache_a", *layout, "--json")
    assert code == 0
    got = orjson.loads(out)
    assert got["step"] == 2
    want = trace(load_read_config(run_dir / "read.json"), 2).to_dict()
    assert got["examples"] == orjson.loads(orjson.dumps(want["examples"]))
    code, _, err = cli("trace", path, "--cache", run_dir / "cache_a")
    assert code == 2 and "global_batch_size" in err
    code, _, err = cli("trace", path, "--cache", run_dir / "cache_b", *layout)
    assert code == 2 and "another read" in err and "cache: state has" in err
    assert err.count("\n") == 1


def test_plot_terminal_and_svg(cli, run_dir: Path, tmp_path: Path) -> None:
    code, out, _ = cli("trace", run_dir / "blend.json", "--plot", "0:6",
                       "--svg", tmp_path / "mix.svg")
    assert code == 0
    rows = out.splitlines()
    assert len(rows) == 7 and rows[-1].startswith("legend")
    assert "web" in rows[-1] and "code" in rows[-1]
    assert all(r.count("|") == 2 for r in rows[:-1])
    svg = (tmp_path / "mix.svg").read_text()
    assert svg.startswith("<svg") and svg.count("<rect") >= 6
    code, out, _ = cli("trace", run_dir / "read.json", "--plot", "0:2", "--json")
    steps = orjson.loads(out)["steps"]
    assert len(steps) == 2 and set(steps[0]) == {"a.jsonl"}
    assert sum(steps[0].values()) == 4 * 17  # 4 windows of seq_len + 1 tokens


def test_errors_are_one_line(cli, run_dir: Path, tmp_path: Path) -> None:
    code, _, err = cli("trace", run_dir / "read.json", "--examples", "5")
    assert code == 2 and "A:B" in err and err.count("\n") == 1
    code, _, err = cli("trace", run_dir / "read.json")
    assert code == 2 and "--step" in err
    (tmp_path / "bad.json").write_text("{")
    code, _, err = cli("trace", tmp_path / "bad.json", "--step", 0)
    assert code == 2 and "bad.json" in err
    code, _, err = cli("trace", tmp_path / "missing.json", "--step", 0)
    assert code == 3 and "missing.json" in err


def test_a_blend_state(cli, run_dir: Path, tmp_path: Path) -> None:
    cfg = load_read_config(run_dir / "blend.json")
    ds, _ = cfg.build(rank=1)
    dl = loader(ds, global_batch_size=4, micro_batch_size=1, world=sw.World(1, 2))
    for _ in itertools.islice(iter(dl), 5 * cfg.accumulation):
        pass
    (tmp_path / "s.json").write_text(json.dumps(dl.state_dict()))
    layout = [x for k, v in LAYOUT.items() for x in (f"--{k.replace('_', '-')}", v)]
    code, out, err = cli("trace", tmp_path / "s.json", "--blend",
                         f"web={run_dir / 'cache_a'}", f"code={run_dir / 'cache_b'}",
                         *layout, "--seq-len", 16, "--json")
    assert code == 0, err
    got = orjson.loads(out)
    assert got["step"] == 4
    assert got["examples"] == orjson.loads(orjson.dumps(trace(cfg, 4).to_dict()["examples"]))


def test_skipped_steps_are_drawn_and_the_header_names_the_accumulation(
        cli, run_dir: Path, tmp_path: Path) -> None:
    cfg = json.loads((run_dir / "read.json").read_text())
    cfg["skip"] = [[1, 2]]
    cfg["cache"] = str(run_dir / cfg["cache"])  # relative to the config's own directory
    path = tmp_path / "skip.json"
    path.write_text(json.dumps(cfg))
    code, out, _ = cli("trace", path, "--plot", "0:3", "--json")
    steps = orjson.loads(out)["steps"]
    assert code == 0 and set(steps[1]) == {"(skipped)"} and set(steps[0]) == {"a.jsonl"}
    code, out, _ = cli("trace", path, "--step", 0)
    accumulation = cfg["global_batch_size"] // (cfg["micro_batch_size"] * cfg["world_size"])
    assert f"× accumulation {accumulation})" in out.splitlines()[0]
