"""Contract 12 (a run that finishes exits 0 on every rank), the long loop: the 2-rank
torchrun DDP job of ``tests/distributed/_exit_job.py`` (gloo, CPU, 16 steps on
``shardwise.torch.loader``) run ``--runs`` times while ``--load`` busy loops take cores;
counts the runs that did not exit 0, those that aborted ("terminate called without an
active exception", SIGABRT) and those that hung (the job's faulthandler watchdog: a stack
dump, exit 1). The suite runs the same job a few times (tests/distributed/test_clean_exit.py).

    python scripts/exit_loop.py --runs 20 --per-torchrun 10 --load 1 [--out DIR]

``--per-torchrun K``: each torchrun runs the job K times per rank (K-1 in forked children
that exit through the interpreter's normal finalisation, then the rank process itself):
K jobs for one start of torch. Prints one line per torchrun and a summary; exits 1 if any
run failed.

The cause this loop found, torch's (gdb and faulthandler on hung runs, as often with a
plain generator as with the loader; see ``shardwise.world``
``keep_torch_groups``): freeing the DDP model frees its Reducer's ProcessGroupGloo with
the GIL held, whose destructor joins the ``pt_gloo_runloop`` threads while one of them,
dropping a finished all-reduce whose thread-local state holds autograd's context object,
waits for the GIL: a deadlock; during finalisation, a SIGABRT. The loader keeps the group
until shardwise's exit hook drops it (with the GIL released): 0 in this loop since.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.distributed.harness import torchrun  # noqa: E402

JOB = REPO / "tests/distributed/_exit_job.py"


def build_cache(out: Path) -> Path:
    import shardwise as sw

    sw.build([str(REPO / "sample/corpus.jsonl")], out, tokenizer=REPO / "sample/tokenizer.json",
             chunk_docs=8, append_eod=True, progress=False, workers=1)
    return out


def one(cache: Path, out: Path, per: int) -> tuple[int, int, int, int]:
    """(rank exits, failed, aborted, hung) of one torchrun."""
    done = torchrun(JOB, str(cache), str(out), str(per), timeout=900)
    logs = "".join(p.read_text(errors="replace") for p in out.glob("run*/log.r*"))
    children = [c for r in range(2) if (out / f"exits.r{r}.json").exists()
                for c in json.loads((out / f"exits.r{r}.json").read_text())]
    failed = sum(c != 0 for c in children) + (done.returncode != 0)
    aborted = (done.stderr + logs).count("terminate called")
    hung = (done.stderr + logs).count("Timeout (")
    if failed or aborted or hung:
        (out / "torchrun.log").write_text(done.stdout + done.stderr)
    else:
        shutil.rmtree(out)
    return 2 * per, failed, aborted, hung


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=200, help="torchrun jobs")
    p.add_argument("--per-torchrun", type=int, default=1)
    p.add_argument("--load", type=int, default=1, help="busy-loop processes")
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="shardwise-exit-loop-"))
    cache = build_cache(out / "cache")
    load = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
            for _ in range(args.load)]
    totals = [0, 0, 0, 0]
    started = time.monotonic()
    try:
        for i in range(args.runs):
            got = one(cache, out / f"torchrun{i}", args.per_torchrun)
            totals = [t + g for t, g in zip(totals, got, strict=True)]
            print(f"torchrun {i + 1}/{args.runs}: rank exits {got[0]}, failed {got[1]}, "
                  f"aborted {got[2]}, hung {got[3]} ({time.monotonic() - started:.0f} s)",
                  flush=True)
    finally:
        for proc in load:
            proc.kill()
            proc.wait()
    print(f"{args.runs} torchruns x {args.per_torchrun} jobs = {args.runs * args.per_torchrun} "
          f"2-rank jobs under {args.load} busy loop(s): {totals[0]} rank exits, {totals[1]} "
          f"failed, {totals[2]} aborted, {totals[3]} hung; logs of failed ones under {out}")
    return 1 if any(totals[1:]) else 0


if __name__ == "__main__":
    sys.exit(main())
