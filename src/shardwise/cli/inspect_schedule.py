"""``shardwise inspect read.json``: a read config's blend schedule, stage by stage, and its
planned mix over the steps of the run (a terminal chart; ``--plot FILE.svg`` writes it as
SVG; ``--json`` for scripts). Nothing is read from the caches: the plan is the weights
(the blend holds every stage's prefixes within one example of them).

    stage 0 from step 0 (example 0): web 0.7, code 0.3
    stage 1 from step 100,000 (example 51,200,000): web 0.4, code 0.3, math 0.3
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import orjson

import shardwise.chart as chart
from shardwise.errors import ConfigError
from shardwise.read.compose.schedule import Stages, mix_by_steps, stages_of
from shardwise.read.config import load_read_config


def is_read_config(path: str) -> bool:
    """A ``.json`` file is a read config; a cache is a directory (or a Megatron prefix)."""
    return path.endswith(".json") and Path(path).is_file()


def schedule_of(path: str) -> tuple[list[str], Stages, int]:
    """``(source names, stages in examples, global batch size)`` of a read config."""
    config = load_read_config(path)
    if config.blend is None:
        raise ConfigError(f"{path}: no blend to inspect (this read config reads one cache, "
                          f"{config.cache}); inspect the cache directory instead")
    names = list(config.blend.names)
    stages = stages_of(None, config.blend.stages(config.global_batch_size), names)
    return names, stages, config.global_batch_size


def run(args: argparse.Namespace) -> int:
    names, stages, b = schedule_of(args.path)
    last = stages[-1][0] // b
    steps = args.steps or max(1, last + max(1, last // 4))  # the last stage shows too
    rows = mix_by_steps(stages, names, b, steps)
    if args.plot is not None:
        if Path(args.plot).suffix.lower() != ".svg":
            raise ConfigError(f"--plot {args.plot}: a read config's chart is written as SVG "
                              "(no plotting library needed): give a FILE.svg")
        Path(args.plot).parent.mkdir(parents=True, exist_ok=True)
        Path(args.plot).write_text(chart.svg_chart(
            rows, names=names, title=f"planned mix of {args.path} over {steps:,} steps"),
            encoding="utf-8")
    if args.json:
        print(orjson.dumps(_json(names, stages, b, steps, rows),
                           option=orjson.OPT_INDENT_2).decode())
        return 0
    for k, (start, w) in enumerate(stages):
        mix = ", ".join(f"{n} {x:.3g}" for n, x in zip(names, w, strict=True) if x)
        print(f"stage {k} from step {start // b:,} (example {start:,}): {mix}")
    print(f"\nplanned mix over {steps:,} steps of {b:,} examples:")
    print(chart.terminal_chart(rows, names=names))
    if args.plot is not None:
        print(f"\nplot written to {args.plot}")
    return 0


def _json(names: list[str], stages: Stages, b: int, steps: int,
          rows: list[tuple[str, dict[str, float]]]) -> dict[str, Any]:
    return {"global_batch_size": b, "steps": steps,
            "stages": [{"step": s // b, "example": s,
                        "weights": dict(zip(names, w.tolist(), strict=True))}
                       for s, w in stages],
            "mix": [{"steps": label, "shares": shares} for label, shares in rows]}
