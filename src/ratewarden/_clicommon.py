"""What every ``ratewarden`` subcommand shares: the exit codes, the parser that
reports a usage error on one line, ``NAME=VALUE`` pairs, JSON and table output.

The exit codes are one table for every command, `EXIT_CODES`: ``ratewarden
--help`` prints it and docs/cli.md has it; a command returns the constants below.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, NoReturn

if TYPE_CHECKING:
    from .rules import RuleSet

__all__ = [
    "EXIT_CODES",
    "MISSING",
    "NO",
    "OK",
    "UNREACHABLE",
    "USAGE",
    "CliError",
    "Parser",
    "load_rule_file",
    "parse_pairs",
    "print_json",
    "table",
]

OK = 0
NO = 1
USAGE = 2
UNREACHABLE = 3
MISSING = 4
INTERRUPTED = 130

EXIT_CODES = """\
exit codes:
  0    done; check: the request is allowed
  1    the answer is no: check denied the request, check-config or explain found
       problems in the file, simulate --scenarios missed a figure
  2    usage: an unknown option, a malformed value or NAME=VALUE, a rule file that
       does not load where a command needs it (check, bench), no such quota
  3    unreachable: the store (Redis) or the service did not answer, or failed
  4    a package the command needs is not installed (the message names the extra)
  130  interrupted (Ctrl-C)"""


class CliError(Exception):
    """An error a command reports as one line on stderr, and the exit code it ends with."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


class _Formatter(argparse.HelpFormatter):
    """Descriptions wrapped to the terminal; texts of several lines (the examples,
    the exit codes) kept as they are written."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        if "\n" in text:
            return "".join(indent + line for line in text.splitlines(keepends=True))
        return super()._fill_text(text, width, indent)


class Parser(argparse.ArgumentParser):
    """An `argparse.ArgumentParser` whose usage errors are one line on stderr
    (which command, what is wrong, where the help is), exit code 2. Subcommands'
    parsers are of this class too: ``add_subparsers`` copies the parent's class."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", _Formatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        sys.stderr.write(f"{self.prog}: {message} (see {self.prog} --help)\n")
        sys.exit(USAGE)


def examples(*lines: str) -> str:
    """The ``examples:`` section that ends a command's help. Every line is run by
    tests/test_cli_examples.py, with the conventions that cli.py's docstring
    states; a comment ``# exits N`` says the example ends with exit code N."""
    return "examples:\n" + "\n".join(f"  {line}" for line in lines)


def load_rule_file(path: str) -> RuleSet:
    """A rule file a command runs (check, bench): each problem on stderr, then a
    usage error; a missing extra is exit code 4."""
    try:
        from .rules import RuleFileError, load  # noqa: PLC0415 - PyYAML
    except ImportError:
        raise CliError("a rule file needs: pip install 'ratewarden[rules]'", MISSING) from None
    try:
        return load(path)
    except RuleFileError as exc:
        for problem in exc.problems:
            print(f"error: {problem}", file=sys.stderr)
        raise CliError(f"{path}: not loaded ({len(exc.problems)} problem(s))", USAGE) from None


def parse_pairs(pairs: Sequence[str], what: str) -> dict[str, str]:
    """``NAME=VALUE`` words as a dict; the later of two equal names wins."""
    parsed: dict[str, str] = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name:
            raise CliError(f"{what} takes NAME=VALUE, got {pair!r}", USAGE)
        parsed[name] = value
    return parsed


def print_json(value: Any) -> None:
    print(json.dumps(value, indent=2, sort_keys=False))


def table(rows: Sequence[Sequence[str]]) -> str:
    """Rows as columns padded to their widest cell, two spaces apart."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
        for row in rows
    )
