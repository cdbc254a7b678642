"""``shardwise bench`` from a built wheel in a fresh venv, run outside any checkout: the
bundled sample is package data, and bench children import the installed package.

The venv sees the running interpreter's site-packages for the heavy dependencies (numpy,
tokenizers, torch…) through a ``.pth`` file naming them (not ``--system-site-packages``:
run from a virtualenv, that would be the base interpreter's, which lacks them); its own
site-packages, holding the wheel, comes first on ``sys.path``, and a directory a ``.pth``
names has its own ``.pth`` files ignored, so the editable checkout cannot stand in for the
wheel (the test checks where ``shardwise`` is imported from)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def venv_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                    "-q", "-w", str(tmp / "dist"), str(REPO)], check=True)
    [wheel] = (tmp / "dist").glob("shardwise-*.whl")
    subprocess.run([sys.executable, "-m", "venv", str(tmp / "venv")], check=True)
    python = tmp / "venv" / "bin" / "python"
    inherit_site_packages(python)
    subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-deps", "--no-index",
                    "--ignore-installed",
                    str(wheel)], check=True)
    return python


def inherit_site_packages(python: Path) -> None:
    """Let the venv of ``python`` import what this interpreter has installed: a ``.pth``
    in its site-packages lists ours (after its own on ``sys.path``)."""
    ours = [p for p in sys.path if Path(p).name in ("site-packages", "dist-packages")]
    where = subprocess.run([str(python), "-c", "import sysconfig; "
                            "print(sysconfig.get_paths()['purelib'])"],
                           capture_output=True, text=True, check=True).stdout.strip()
    Path(where, "_shardwise_test_parent.pth").write_text("".join(p + "\n" for p in ours))


def _run(python: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run([str(python), *args], cwd=cwd, env=env, capture_output=True,
                          text=True, check=False)


def test_the_wheel_ships_the_sample_and_imports_itself(venv_python: Path,
                                                       tmp_path: Path) -> None:
    where = _run(venv_python, tmp_path, "-c", "import shardwise, shardwise.bench.text_corpus "
                 "as t; print(shardwise.__file__); print(t.sample_dir())")
    assert where.returncode == 0, where.stderr
    module, sample = where.stdout.split()
    venv = venv_python.parents[1]
    assert Path(module).is_relative_to(venv) and Path(sample).is_relative_to(venv)
    shipped = (Path(sample) / "corpus.jsonl").read_bytes()
    assert shipped == (REPO / "sample/corpus.jsonl").read_bytes()


def test_bench_build_runs_from_the_wheel(venv_python: Path, tmp_path: Path) -> None:
    """A bench that needs the sample corpus and tokenizer and starts child processes."""
    shardwise = venv_python.parent / "shardwise"
    proc = _run(venv_python, tmp_path, str(shardwise), "bench", "build", "--mb", "0.3",
                "--repeat", "1", "--workers", "1", "--json", "--tmp-dir", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["identical"] and report["tokenizer"]["tokens"] > 0
    assert report["tokenizer"]["vocab_size"] == 4096  # the bundled sample tokenizer


def test_bench_on_a_users_cache_from_the_wheel(venv_python: Path, tmp_path: Path) -> None:
    """What a user runs on their own data: build a cache with the wheel's CLI, then measure
    reading it with `bench stream --cache` (a bench over a given cache, not the repo's)."""
    shardwise = str(venv_python.parent / "shardwise")
    built = _run(venv_python, tmp_path, shardwise, "build", str(REPO / "sample/corpus.jsonl"),
                 "--out", str(tmp_path / "cache"), "--tokenizer",
                 str(REPO / "sample/tokenizer.json"), "--append-eod", "--chunk-docs", "64")
    assert built.returncode == 0, built.stderr
    proc = _run(venv_python, tmp_path, shardwise, "bench", "stream", "--cache",
                str(tmp_path / "cache"), "--seq-len", "128", "--streams", "2", "--seconds",
                "0.3", "--repeat", "1", "--no-follow", "--json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["tokens"] == 98186 and report["chunks"] == 9  # the sample, as built
    assert report["finished"]["global"]["examples"] > 0
