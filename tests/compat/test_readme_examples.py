"""The README's porting examples run as printed (one per origin)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[2] / "README.md"


def porting_examples() -> list[str]:
    text = README.read_text(encoding="utf-8")
    section = text.split("## Porting from a seed system", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```python\n(.*?)```", section, re.S)


def test_there_is_one_example_per_origin() -> None:
    examples = porting_examples()
    assert any("compat.swift" in e for e in examples)
    assert any("compat.llm" in e for e in examples)
    assert any("compat.slime" in e for e in examples)


@pytest.mark.parametrize("index", range(len(porting_examples())))
def test_example_runs(index: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                      capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    exec(compile(porting_examples()[index], f"README example {index}", "exec"), {})
    assert capsys.readouterr().out.strip()
