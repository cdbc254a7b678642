"""A run that finishes exits 0 on every rank (docs/DESIGN.md, contract 12): the 2-rank
torchrun DDP job of ``_exit_job.py`` (gloo, CPU, 16 steps on ``shardwise.torch.loader``;
the model freed as ``train()`` returns, as a script's ``main()`` does) run twice per rank
while a busy loop takes a core; a hang is a failed run with its stack (the job's
watchdog), not a timeout here.

What it guards: torch frees a DDP model's gloo group with the GIL held while a run-loop
thread waits for the GIL to drop a finished all-reduce (``shardwise.world``,
``keep_torch_groups``): before the loader kept the group until shardwise's exit hook,
the same job hung at that point in 6 of 20 rank runs on the 2-core machine under a load of
~18 (a plain generator: 6 of 20 too), and this test failed 2 of 3 times (a rank's
watchdog: exit 1); after, 0 of 200 jobs, 400 rank exits
(``scripts/exit_loop.py --runs 20 --per-torchrun 10 --load 1``, the long loop)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.distributed.harness import said, torchrun

SCRIPT = Path(__file__).resolve().with_name("_exit_job.py")
RUNS = 2  # per rank: a forked child and the rank process itself


def test_a_ddp_job_on_the_loader_exits_0_on_every_rank_every_time(
        small_chunk_cache: Path, tmp_path: Path) -> None:
    load = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        done = torchrun(SCRIPT, str(small_chunk_cache), str(tmp_path), str(RUNS), timeout=600)
    finally:
        load.kill()
        load.wait()
    logs = "".join(f"{p}:\n{p.read_text()[-3000:]}\n" for p in sorted(tmp_path.glob("run*/log.r*")))
    told = said(done) + logs
    assert done.returncode == 0, told
    assert "terminate called" not in done.stderr + logs, told
    assert "Timeout (" not in done.stderr + logs, told  # the job's watchdog: a hang
    exits = [json.loads((tmp_path / f"exits.r{r}.json").read_text()) for r in range(2)]
    assert exits == [[0] * (RUNS - 1)] * 2, told
