"""Shared torchrun launches for the framework tests (the ``launches`` session fixture).

A test module that runs a framework on real ranks declares its runs with
``launch_jobs(root) -> list[Job]`` (making its data under ``root``); the session runs every
selected module's jobs of a phase in ONE launch (``_launch_run.py``), phase after phase:

- ``FIRST``: 2 ranks, the uninterrupted runs (each saving its checkpoints);
- ``RESUME``: 2 fresh ranks resuming from those checkpoints;
- ``ONE``: 1 fresh process resuming the same checkpoints on one rank.

``RESUME`` and ``ONE`` run side by side after ``FIRST``. Starting Python and importing torch
and the frameworks was most of each test's time: it is now paid three times a session.

Under pytest-xdist (the README's test command runs two workers) every worker collects every
test, so each would launch every job: the first worker to need the launches runs them and
writes their jobs beside them (``jobs.json``, under a lock in the workers' shared temporary
directory); another finds them there (:func:`shared`).
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
RUNNER = Path(__file__).resolve().with_name("_launch_run.py")
TIMEOUT = 1800  # every framework's runs, one after the other, on a loaded 2-core machine

FIRST, RESUME, ONE = "first", "resume", "one"
PHASES = {FIRST: 2, RESUME: 2, ONE: 1}  # processes


@dataclass(frozen=True)
class Job:
    """``script``'s ``job(spec)`` in the launch of ``phase``; ``env``: what its processes
    need in their environment (it holds for the whole launch)."""

    name: str
    phase: str
    script: Path
    spec: dict[str, Any]
    env: dict[str, str] = field(default_factory=dict)


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _start(root: Path, phase: str, jobs: list[Job]) -> subprocess.Popen[bytes]:
    spec = {"jobs": [{"name": j.name, "script": str(j.script), "spec": j.spec} for j in jobs]}
    (root / f"{phase}.json").write_text(json.dumps(spec))
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    for j in jobs:
        env.update(j.env)
    env.update(OMP_NUM_THREADS="1", PYTHONHASHSEED="0", TOKENIZERS_PARALLELISM="false",
               PYTHONPATH=os.pathsep.join([str(REPO / "src"), str(REPO / "tests"), str(REPO),
                                           env.get("PYTHONPATH", "")]))
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={PHASES[phase]}",
           "--master-addr=127.0.0.1", f"--master-port={_port()}", str(RUNNER),
           str(root / f"{phase}.json")]
    with open(root / f"{phase}.log", "wb") as log:  # the launch writes its own copy
        return subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)


class Launches:
    """The session's launches: each module's jobs, by module and job name (``run``: False for
    launches another process ran, read back with :meth:`load`)."""

    def __init__(self, root: Path, jobs: dict[str, list[Job]], run: bool = True) -> None:
        self.root, self.jobs = root, {m: {j.name: j for j in js} for m, js in jobs.items()}
        if not run:
            return
        (root / "jobs.json").write_text(json.dumps(
            {m: [dict(vars(j), script=str(j.script)) for j in js] for m, js in jobs.items()}))
        for js in jobs.values():
            for j in js:
                Path(j.spec["record"]).mkdir(parents=True, exist_ok=True)
        by_phase = {p: [j for js in jobs.values() for j in js if j.phase == p] for p in PHASES}
        self._wait(self._start_all(by_phase, [FIRST]))
        self._wait(self._start_all(by_phase, [RESUME, ONE]))

    def _start_all(self, by_phase: dict[str, list[Job]], phases: list[str]
                   ) -> list[subprocess.Popen[bytes]]:
        return [_start(self.root, p, by_phase[p]) for p in phases if by_phase[p]]

    @staticmethod
    def _wait(procs: list[subprocess.Popen[bytes]]) -> None:
        for p in procs:
            try:
                p.wait(timeout=TIMEOUT)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()

    @classmethod
    def load(cls, root: Path) -> Launches:
        """Launches another worker ran under ``root`` (their ``jobs.json``)."""
        saved = json.loads((root / "jobs.json").read_text())
        return cls(root, {m: [Job(**dict(j, script=Path(j["script"]))) for j in js]
                          for m, js in saved.items()}, run=False)

    def record(self, module: str, name: str) -> Path:
        """The record directory of a job that ran to its end on every rank; a test of a
        job that raised (or did not run) fails with the traceback or the launch's log."""
        job = self.jobs[module][name]
        record = Path(job.spec["record"])
        ranks = range(PHASES[job.phase])
        if all((record / f"done.r{r}").exists() for r in ranks):
            return record
        errors = [(record / f"error.r{r}.txt") for r in ranks]
        said = "\n".join(e.read_text() for e in errors if e.exists())
        if not said:
            log = (self.root / f"{job.phase}.log").read_bytes().decode(errors="replace")
            said = f"(it did not end; the {job.phase} launch's log:)\n{log[-6000:]}"
        pytest.fail(f"{module}: job {name} ({job.phase} launch) failed:\n{said}")


def collect(request: pytest.FixtureRequest, root: Path) -> Launches:
    """Every selected test module's ``launch_jobs``, run."""
    modules = {}
    for item in request.session.items:
        module = getattr(item, "module", None)
        if module is not None and hasattr(module, "launch_jobs"):
            modules[Path(module.__file__).stem] = module
    jobs = {}
    for name, m in sorted(modules.items()):
        (root / name).mkdir()
        jobs[name] = m.launch_jobs(root / name)
    return Launches(root, jobs)


def shared(request: pytest.FixtureRequest, factory: pytest.TempPathFactory) -> Launches:
    """The session's launches, run once for all xdist workers (see the module docs): in the
    workers' shared temporary directory, under a lock; without xdist, in this session's."""
    base = factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent  # pytest-N/, holding each worker's popen-gwK/
    root = base / "launches"
    with open(base / "launches.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # the other worker waits here while they run
        if (root / "jobs.json").exists():
            return Launches.load(root)
        root.mkdir(exist_ok=True)
        return collect(request, root)
