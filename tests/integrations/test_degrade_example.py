"""examples/degrade runs and serves smaller pictures as the caller goes over."""

from __future__ import annotations

import runpy
from pathlib import Path

import pytest

APP = Path(__file__).parents[2] / "examples" / "degrade" / "app.py"


def test_the_degrade_example_serves_less_the_further_over(
    capsys: pytest.CaptureFixture[str],
) -> None:
    runpy.run_path(str(APP), run_name="__main__")
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 32
    heights = [int(line.split("height")[1].split()[0]) for line in lines]
    assert heights[:10] == [1080] * 10  # within the limit: full size
    assert heights[10] == 900
    assert heights[-1] == 240
    assert heights == sorted(heights, reverse=True)  # never larger as it goes further over
    assert lines[10].endswith("X-RateLimit-Degraded: 0.05")
    assert lines[29].endswith("X-RateLimit-Degraded: 1")
    assert all(" 200 " in line for line in lines)  # degraded, never refused
