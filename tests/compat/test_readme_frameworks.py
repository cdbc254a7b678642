"""The README's resume recipes inside the frameworks (Lightning, DCP, accelerate) run as
printed after its ten lines, each asserting (or printing) the resumed position."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
SECTION = "## Resuming inside the frameworks"


def _blocks(section: str) -> list[str]:
    text = README.read_text(encoding="utf-8")
    body = text.split(section, 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```python\n(.*?)```", body, re.S)


def test_one_recipe_per_framework() -> None:
    recipes = _blocks(SECTION)
    for name in ("shardwise.lightning", "torch.distributed.checkpoint", "accelerate"):
        assert sum(name in r for r in recipes) == 1, name


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The ten lines' cache, once."""
    root = tmp_path_factory.mktemp("readme-frameworks")
    (root / "sample").symlink_to(REPO / "sample")
    ten = _blocks("## Ten lines")[0]
    import os
    here = os.getcwd()
    os.chdir(root)
    try:
        exec(compile(ten, "README ten lines", "exec"), {})
    finally:
        os.chdir(here)
    return root


# Lightning 2.6 under torch 2.13 (its own pytree call), and its hints for a CPU run
@pytest.mark.filterwarnings("ignore:.*LeafSpec.*:FutureWarning")
@pytest.mark.filterwarnings("ignore::UserWarning:lightning")
# DCP on one process without a process group says it saves as a single process
@pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")
@pytest.mark.parametrize(("index", "printed"), [(0, "16"), (1, "8"), (2, "16")])
def test_recipe_runs(index: int, printed: str, workdir: Path,
                     monkeypatch: pytest.MonkeyPatch,
                     capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(workdir)
    exec(compile(_blocks(SECTION)[index], f"README recipe {index}", "exec"), {})
    assert capsys.readouterr().out.split()[-1] == printed
