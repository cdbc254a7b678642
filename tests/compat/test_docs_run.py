"""Every fenced ``python`` and ``bash`` block of README.md and docs/**/*.md runs as printed:
python blocks each in a process of its own (forked from one that imported torch, shardwise
and transformers once: tests/compat/_docs_fork.py), bash blocks in bash, all in one working
directory holding the repository's ``sample/`` and the caches the README's first lines
build (``out/cache``, ``out/sample-cache``), in document order. A new doc section is picked
up as it is written.

A block that cannot run here says so by name, in an HTML comment on the line before its
fence (the reason is listed by :func:`test_every_block_runs_or_says_why`)::

    <!-- not-run: needs a bucket (s3://b) and a Ray cluster -->
    <!-- run-by: tests/compat/test_readme_frameworks.py (it checks what each prints) -->

A block without one must run (exit 0)."""

from __future__ import annotations

import json
import os
import re
import select
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

import shardwise as sw

REPO = Path(__file__).resolve().parents[2]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
LANGS = ("python", "bash", "sh")
_FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
_MARK = re.compile(r"<!--\s*(not-run|run-by):\s*(.+?)\s*-->\s*$")


@dataclass(frozen=True)
class Block:
    where: str  # file:line of the fence
    lang: str
    code: str
    mark: tuple[str, str] | None  # (not-run | run-by, the reason or the test)


def blocks() -> list[Block]:
    found = []
    for path in DOCS:
        text = path.read_text(encoding="utf-8")
        for m in _FENCE.finditer(text):
            if m.group(1) not in LANGS:
                continue
            before = text[:m.start()].rstrip("\n").rsplit("\n", 1)[-1]
            mark = _MARK.search(before)
            line = text[:m.start()].count("\n") + 1
            found.append(Block(f"{path.relative_to(REPO)}:{line}", m.group(1), m.group(2),
                               (mark.group(1), mark.group(2)) if mark else None))
    return found


RUN = [b for b in blocks() if b.mark is None]


def test_every_block_runs_or_says_why() -> None:
    marked = [b for b in blocks() if b.mark is not None]
    print("\n".join(f"{b.where}: {b.mark[0]}: {b.mark[1]}" for b in marked if b.mark))
    assert RUN, "no doc block runs"
    for b in marked:
        assert b.mark is not None and b.mark[1], f"{b.where}: a marker without its reason"
        if b.mark[0] == "run-by":
            assert (REPO / b.mark[1].split()[0]).is_file(), f"{b.where}: no {b.mark[1]}"


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``sample/`` and the caches the README's first lines build, once."""
    root = tmp_path_factory.mktemp("docs")
    (root / "sample").symlink_to(REPO / "sample")
    here = os.getcwd()
    os.chdir(root)  # the sources by the names the README gives them
    try:
        sw.build(["sample/corpus.jsonl"], "out/cache", tokenizer="sample/tokenizer.json",
                 append_eod=True, workers=2, progress=False)
        sw.build(["sample/corpus.jsonl"], "out/sample-cache", tokenizer="sample/tokenizer.json",
                 append_eod=True, chunk_docs=64, progress=False)
    finally:
        os.chdir(here)
    return root


TIMEOUT = 600


def _env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1",
            "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ["PATH"]]),
            "PYTHONPATH": os.pathsep.join([str(REPO / "src"),
                                           os.environ.get("PYTHONPATH", "")])}


@pytest.fixture(scope="module")
def forks(workdir: Path) -> Iterator[subprocess.Popen[str]]:
    """The process python blocks are forked from (its imports made once)."""
    script = Path(__file__).resolve().with_name("_docs_fork.py")
    with subprocess.Popen([sys.executable, str(script)], cwd=workdir, env=_env(), text=True,
                          stdin=subprocess.PIPE, stdout=subprocess.PIPE) as proc:
        yield proc
        assert proc.stdin is not None
        proc.stdin.close()
        proc.wait(timeout=TIMEOUT)


def _run_python(forks: subprocess.Popen[str], block: Block, out: Path) -> int:
    assert forks.stdin is not None and forks.stdout is not None
    forks.stdin.write(json.dumps({"code": block.code, "where": block.where,
                                  "out": str(out)}) + "\n")
    forks.stdin.flush()
    ready, _, _ = select.select([forks.stdout], [], [], TIMEOUT)
    assert ready, f"{block.where}: did not end within {TIMEOUT} s"
    answer = forks.stdout.readline()
    assert answer, f"{block.where}: the process blocks are forked from ended"
    return int(json.loads(answer)["returncode"])


@pytest.mark.parametrize("block", RUN, ids=[b.where for b in RUN])
def test_block_runs(block: Block, workdir: Path, forks: subprocess.Popen[str],
                    tmp_path: Path) -> None:
    if block.lang == "python":
        code = _run_python(forks, block, tmp_path / "output.txt")
        said = (tmp_path / "output.txt").read_text(errors="replace")
        assert code == 0, f"{block.where}:\n{said[-5000:]}"
        return
    done = subprocess.run(["bash", "-euo", "pipefail", "-c", block.code], cwd=workdir,
                          env=_env(), capture_output=True, text=True, timeout=TIMEOUT)
    assert done.returncode == 0, f"{block.where}:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
