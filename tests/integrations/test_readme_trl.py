"""The README's TRL recipe runs as printed (one process), and its checkpoints hold the
reader's position."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def trl_recipe() -> str:
    text = (REPO / "README.md").read_text(encoding="utf-8")
    section = text.split("**TRL**", 1)[1]
    return re.findall(r"```python\n(.*?)```", section, re.S)[0]


# SFTConfig turns gradient checkpointing on by its own default, which transformers 5.24
# reports as deprecated (TRL's warning, not the recipe's)
@pytest.mark.filterwarnings("ignore:`gradient_checkpointing` is deprecated:FutureWarning")
def test_trl_recipe_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "sample").symlink_to(REPO / "sample")
    monkeypatch.chdir(tmp_path)
    code = trl_recipe()
    assert "ShardwiseTrainerMixin, SFTTrainer" in code
    exec(compile(code, "README TRL recipe", "exec"), {"__name__": "readme"})
    for step in (2, 4):
        saved = list((tmp_path / "out" / "trl" / f"checkpoint-{step}").glob("shardwise_*.json"))
        assert saved, f"checkpoint-{step} holds no shardwise position"
