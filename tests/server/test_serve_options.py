"""``ratewarden serve``'s options: each with help that shows its default, and
docs/service.md's table of them the same as the parser's, so neither drifts."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from ratewarden import ConfigurationError
from ratewarden.server import ServeOptions, add_arguments, options_from
from ratewarden.server._connection_limits import ConnectionLimits, ServerLimits

SERVICE_MD = Path(__file__).resolve().parents[2] / "docs" / "service.md"


def actions() -> list[argparse.Action]:
    parser = argparse.ArgumentParser(add_help=False)
    add_arguments(parser)
    return [a for a in parser._actions if a.option_strings]


def shown(default: object) -> str:
    """A default as the table writes it."""
    if default is False:
        return "off"
    if default is None or default == []:
        return "none"
    if isinstance(default, float):
        return f"{default:g}"
    return str(default)


def documented() -> dict[str, str]:
    """The options table of docs/service.md: the options of a row -> its default cell."""
    text = SERVICE_MD.read_text()
    table = text[text.index("## Options") :]
    rows: dict[str, str] = {}
    for line in table.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 3 or not cells[0].startswith("`--"):
            continue
        names = tuple(re.findall(r"`(--[a-z-]+)`", cells[0]))
        rows[", ".join(names)] = cells[1]
    return rows


def test_the_docs_table_lists_every_option_with_its_default() -> None:
    table = documented()
    parsed = {", ".join(a.option_strings): a for a in actions()}
    assert sorted(table) == sorted(parsed)
    for names, action in parsed.items():
        cell = table[names]
        if action.default is None:
            assert cell.startswith(("none", "`--")), (names, cell)  # what None means, said
        else:
            assert cell.strip("`") == shown(action.default), (names, cell, action.default)


@pytest.mark.parametrize("action", actions(), ids=lambda a: a.option_strings[0])
def test_every_option_has_help_showing_its_default(action: argparse.Action) -> None:
    assert action.help, f"{action.option_strings[0]} has no help"
    if action.default not in (None, False, []):
        value = shown(action.default)
        assert "default" in action.help or value in action.help, (action.help, value)


def options(*args: str) -> ServeOptions:
    parser = argparse.ArgumentParser(add_help=False)
    add_arguments(parser)
    return options_from(parser.parse_args(list(args)))


def test_the_server_limits_are_options_of_their_own() -> None:
    assert options().server_limits == ServerLimits()
    assert ServerLimits() == ServerLimits(32 * 2**20, 256 * 1024, 1_000)
    given = options("--max-buffered-bytes", "1048576", "--max-stream-bytes", "65536",
                    "--max-connections-per-peer", "7")  # fmt: skip
    assert given.server_limits == ServerLimits(2**20, 65536, 7)
    assert given.limits == ConnectionLimits()  # not taken for the per-connection ones


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--max-connections-per-peer", "0"], "--max-connections-per-peer must be an integer >= 1"),
        (["--max-stream-bytes", "100"], "--max-stream-bytes must be >= 16384 (a frame), got 100"),
        (["--max-buffered-bytes", "20000"],
         "--max-buffered-bytes (20000) must be at least --max-stream-bytes (262144)"),
    ],
)  # fmt: skip
def test_bad_server_limits_are_said_in_the_options_names(args: list[str], said: str) -> None:
    with pytest.raises(ConfigurationError) as raised:
        options(*args)
    assert str(raised.value) == said or str(raised.value).startswith(said), raised.value
