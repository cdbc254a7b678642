"""The README's torchtitan and Lightning Fabric recipes run as printed after its ten lines
(one process), each printing the resumed position; the litgpt one is marked not-run
(test_litgpt.py runs litgpt's pretrain)."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
SECTION = "## torchtitan, Lightning Fabric, litgpt"


def _blocks(section: str, *, run_only: bool = True) -> list[str]:
    body = README.read_text(encoding="utf-8").split(section, 1)[1].split("\n## ", 1)[0]
    found = re.findall(r"(<!-- not-run:[^>]*-->\n)?```python\n(.*?)```", body, re.S)
    return [code for marked, code in found if not (run_only and marked)]


def test_one_recipe_per_framework() -> None:
    recipes = _blocks(SECTION, run_only=False)
    for name in ("shardwise.torchtitan", "L.Fabric", "shardwise.litgpt"):
        assert sum(name in r for r in recipes) == 1, name
    assert len(_blocks(SECTION)) == 2  # the litgpt one is marked not-run


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The ten lines' cache, once."""
    root = tmp_path_factory.mktemp("readme-titan")
    (root / "sample").symlink_to(REPO / "sample")
    here = os.getcwd()
    os.chdir(root)
    try:
        exec(compile(_blocks("## Ten lines")[0], "README ten lines", "exec"), {})
    finally:
        os.chdir(here)
    return root


# DCP on one process without a process group says it saves as a single process
@pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")
@pytest.mark.filterwarnings("ignore::UserWarning:lightning")  # Fabric's hints for a CPU run
@pytest.mark.parametrize(("index", "printed"), [(0, "2"), (1, "8")])
def test_recipe_runs(index: int, printed: str, workdir: Path, monkeypatch: pytest.MonkeyPatch,
                     capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(workdir)
    exec(compile(_blocks(SECTION)[index], f"README recipe {index}", "exec"), {})
    assert capsys.readouterr().out.split()[-1] == printed
