"""The README's Python examples run as tests, in order, sharing one namespace."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.redis_server import RedisServer

README = Path(__file__).parent.parent / "README.md"
# ```python blocks run as they are; ```python notest blocks need a server (below)
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.DOTALL)
SHOWN = re.findall(r"```python notest\n(.*?)```", README.read_text(), flags=re.DOTALL)


def test_there_are_examples() -> None:
    assert len(BLOCKS) >= 2


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_example_runs(index: int, capsys: pytest.CaptureFixture[str]) -> None:
    exec(compile(BLOCKS[index], f"README.md block {index}", "exec"), {"__name__": "readme"})
    out = capsys.readouterr().out
    if index == 0:
        assert out.splitlines()[0].startswith("0 True 4")
        assert out.splitlines()[-1].startswith("5 False 0")


def test_the_redis_example_runs_against_our_own_server(redis_single: RedisServer) -> None:
    """The README points at localhost:6379; the test swaps in a server of its own."""
    (block,) = [b for b in SHOWN if "RedisStore(" in b]
    assert "redis://localhost:6379/0" in block
    code = block.replace("redis://localhost:6379/0", redis_single.url)
    namespace: dict[str, object] = {"__name__": "readme"}
    exec(compile(code, "README.md redis block", "exec"), namespace)
    store = namespace["store"]
    assert namespace["api"].hit("{user-42}").remaining == 998  # type: ignore[attr-defined]
    store.close()  # type: ignore[attr-defined]


def test_the_fleet_example_runs_against_our_own_server(redis_single: RedisServer) -> None:
    (block,) = [b for b in SHOWN if "FleetQuota(" in b]
    assert "redis://localhost:6379/0" in block
    code = block.replace("redis://localhost:6379/0", redis_single.url)
    code = code.replace('"push-api"', '"readme-push-api"')
    namespace: dict[str, object] = {"__name__": "readme"}
    exec(compile(code, "README.md fleet block", "exec"), namespace)
    assert namespace["granted"] == 2000.0


def test_every_relative_link_stays_in_the_repository_and_exists() -> None:
    """A link in the README or the docs that leaves the repository, or names a file
    that is not there, is a dead link for every reader of a clone."""
    root = README.parent.resolve()
    pages = [README, *sorted((root / "docs").glob("*.md"))]
    for page in pages:
        text = page.read_text()
        links = re.findall(r"\]\(([^)\s]+)\)", text) + re.findall(r"`(\.\./[^`]+)`", text)
        for link in links:
            if re.match(r"[a-z]+:", link) or link.startswith("#"):
                continue  # a URL or an anchor
            target = (page.parent / link.split("#")[0]).resolve()
            assert target.is_relative_to(root), f"{page.name}: {link} leaves the repository"
            assert target.exists(), f"{page.name}: {link} does not exist"
