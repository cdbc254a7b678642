"""``shardwise inspect read.json``: a blend schedule's stages and planned mix over steps, as
a terminal chart, an SVG file (no plotting library) and JSON; the plan matches what the
blend built from the same config reads."""

from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import orjson
import pytest

from shardwise.read.config import load_read_config

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from cachefactory import make_cache, sample_docs  # noqa: E402

B = 8
SCHEDULE = [[0, {"web": 0.7, "code": 0.3}], [5, {"web": 0.4, "code": 0.3, "math": 0.3}]]


@pytest.fixture(scope="module")
def config(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("schedule")
    for seed, name in enumerate(("web", "code", "math")):
        make_cache(d / name, [sample_docs(30, seed=seed)])
    path = d / "read.json"
    path.write_text(json.dumps({
        "blend": {"sources": {"web": "web", "code": "code", "math": "math"},
                  "schedule": SCHEDULE},
        "seq_len": 16, "global_batch_size": B, "micro_batch_size": 2, "world_size": 2}))
    return path


def test_terminal_chart_and_svg(cli, config: Path, tmp_path: Path) -> None:
    svg = tmp_path / "plots" / "mix.svg"
    code, out, _ = cli("inspect", config, "--plot", svg, "--steps", "10")
    assert code == 0
    lines = out.splitlines()
    assert lines[0] == "stage 0 from step 0 (example 0): web 0.7, code 0.3"
    assert lines[1] == "stage 1 from step 5 (example 40): web 0.4, code 0.3, math 0.3"
    rows = [ln for ln in lines if ln.lstrip().startswith("step ")]
    assert len(rows) == 10
    assert rows[0].endswith("| web 70% code 30%") and rows[0].count("#") == 35
    assert rows[9].endswith("| web 40% code 30% math 30%") and rows[9].count("+") == 15
    assert "legend  # web  = code  + math" in out and f"plot written to {svg}" in out
    root = ET.fromstring(svg.read_text())  # well-formed SVG, one part per source and step
    rects = root.findall("{http://www.w3.org/2000/svg}rect")
    assert len(rects) == 5 * 2 + 5 * 3 + 3  # bars, then the legend's swatches


def test_the_json_plan_is_what_the_blend_reads(cli, config: Path) -> None:
    code, out, _ = cli("inspect", config, "--json", "--steps", "10")
    assert code == 0
    got = orjson.loads(out)
    assert [s["example"] for s in got["stages"]] == [0, 40]
    blend, _ = load_read_config(config).build(rank=0)
    names = ["web", "code", "math"]
    for step, row in enumerate(got["mix"]):
        assert row["steps"] == f"step {step}"
        planned = np.asarray([row["shares"].get(n, 0.0) for n in names]) * B
        realised = blend.counts_at((step + 1) * B) - blend.counts_at(step * B)
        assert np.abs(realised - planned).max() <= 2  # two prefixes, each within one


def test_a_png_for_a_config_and_a_config_without_blend_are_refused(cli, config: Path,
                                                                   tmp_path: Path) -> None:
    code, _, err = cli("inspect", config, "--plot", tmp_path / "mix.png")
    assert code == 2 and "give a FILE.svg" in err
    single = tmp_path / "one.json"
    single.write_text(json.dumps({"cache": str(config.parent / "web"), "seq_len": 16,
                                  "global_batch_size": B, "micro_batch_size": 2,
                                  "world_size": 2}))
    code, _, err = cli("inspect", single)
    assert code == 2 and "no blend to inspect" in err
