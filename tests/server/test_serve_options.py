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
from ratewarden.server._serve_options import DEFAULT_GRPC, check_options

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
        if names == "--grpc":  # the default where the grpc extra is installed, else off
            assert cell == f"`{DEFAULT_GRPC}`", cell
        elif action.default is None:
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


@pytest.mark.parametrize(
    ("http", "grpc"),
    [
        ("27080", "27080"),
        ("0.0.0.0:27080", "127.0.0.1:27080"),
        ("[::]:27080", "127.0.0.1:27080"),
        ("localhost:27080", "127.0.0.1:27080"),
    ],
)
def test_both_listeners_on_one_port_is_said_to_be_our_own_clash(http: str, grpc: str) -> None:
    """Bound, the second would fail with the system's "address already in use",
    as if another program held the port."""
    with pytest.raises(ConfigurationError, match="ask for the same port: each listener needs"):
        check_options(options("--http", http, "--grpc", grpc))


def test_listeners_on_other_ports_or_hosts_are_no_clash() -> None:
    check_options(options("--http", "0", "--grpc", "0"))  # the system picks two ports
    check_options(options("--http", "127.0.0.1:27080", "--grpc", "127.0.0.2:27080"))
    check_options(options("--http", "27080", "--grpc", "27081"))
    # IPv4's wildcard and an IPv6 address bind apart
    check_options(options("--http", "0.0.0.0:27080", "--grpc", "[::1]:27080"))


def test_grpc_left_to_its_default_is_off_without_the_grpc_extra(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert options().grpc == DEFAULT_GRPC
    assert not options().grpc_missing
    monkeypatch.setattr("ratewarden.server._serve_options.grpc_installed", lambda: False)
    assert options().grpc is None
    assert options().grpc_missing
    assert not options("--grpc", "off").grpc_missing


def test_the_connection_caps_help_says_what_docs_service_md_says() -> None:
    """At the cap a newcomer closes the connection idle longest; refused only
    when none can go (docs/service.md), not "refused at once"."""
    (cap,) = [a for a in actions() if "--max-connections" in a.option_strings]
    assert cap.help is not None
    assert "refused at once" not in cap.help
    assert "idle" in cap.help
    assert "longest" in cap.help
