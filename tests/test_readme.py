"""The README's Python examples run as tests, in order, sharing one namespace."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

README = Path(__file__).parent.parent / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.DOTALL)


def test_there_are_examples() -> None:
    assert len(BLOCKS) >= 2


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_example_runs(index: int, capsys: pytest.CaptureFixture[str]) -> None:
    exec(compile(BLOCKS[index], f"README.md block {index}", "exec"), {"__name__": "readme"})
    out = capsys.readouterr().out
    if index == 0:
        assert out.splitlines()[0].startswith("0 True 4")
        assert out.splitlines()[-1].startswith("5 False 0")
