"""Every script under examples/ runs, and says what it should."""

from __future__ import annotations

import re
import runpy
from pathlib import Path

import pytest

EXAMPLES = sorted((Path(__file__).parent.parent / "examples").glob("*.py"))


def test_there_are_examples() -> None:
    assert EXAMPLES


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_example_runs(path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    runpy.run_path(str(path), run_name="__main__")
    out = capsys.readouterr().out
    if path.name == "provider_budget.py":
        assert ": 40 answered 200, 0 429" in out.splitlines()[0], out
    if path.name == "llm_budget.py":
        rates = re.findall(r"([\d,]+) tokens/min sustained", out)
        static, learned = (int(rate.replace(",", "")) for rate in rates)
        assert out.count(" 0 answered 429") == 2, out
        assert learned > 2 * static, out
    if path.name == "login_and_partner_api.py":
        lines = out.splitlines()
        assert lines[4] == "login(alice, 'e') -> 401 wrong password"
        assert lines[5] == "login(alice, 'hunter2') -> 429 Too Many Requests, Retry-After: 100"
        assert lines[6:10] == [f"call {i} sent at t={i * 0.5:.1f}s" for i in range(4)]
        assert lines[10].startswith("gave up: 'api.partner.example': no permit within")
