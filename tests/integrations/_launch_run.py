"""The rank side of several framework tests in ONE torchrun launch (gloo, CPU), for
``launches`` (tests/integrations/conftest.py): Python, torch, transformers, Lightning,
torchtitan… start and import once per rank for all of them, not once per test.

argv: spec.json, ``{"jobs": [{"name", "script", "spec"}, …]}``. Each job's script module
(a ``_<framework>_run.py`` beside this file) has ``job(spec)``: what its own launch ran, in
a process group that may already exist (kept for the next job; on one process each job
starts without one, as its own launch did). The jobs run in turn, each in its record
directory, each ending with a barrier and a ``done.r<rank>`` file there. A job that raises
writes its traceback there (``error.r<rank>.txt``) and ends the launch: its peer may be
waiting in a collective that will never come.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import traceback
from pathlib import Path
from typing import Any

import torch.distributed as dist


def _group() -> None:
    """The launch's process group (a job such as Lightning's may have torn it down)."""
    if int(os.environ["WORLD_SIZE"]) > 1 and not dist.is_initialized():
        dist.init_process_group("gloo")


def run(job: dict[str, Any], rank: int) -> None:
    record = Path(job["spec"]["record"])
    os.chdir(record)  # what a framework writes beside its run stays in the test's directory
    try:
        _group()
        importlib.import_module(Path(job["script"]).stem).job(job["spec"])
        _group()
        if dist.is_initialized():
            dist.barrier()
        if int(os.environ["WORLD_SIZE"]) == 1 and dist.is_initialized():
            dist.destroy_process_group()  # one process: each job as its own launch left it
    except BaseException:  # noqa: BLE001 - recorded for the test, then the launch ends
        (record / f"error.r{rank}.txt").write_text(traceback.format_exc())
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)
    (record / f"done.r{rank}").touch()


if __name__ == "__main__":
    rank = int(os.environ["RANK"])
    for one in json.loads(Path(sys.argv[1]).read_text())["jobs"]:
        run(one, rank)
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
