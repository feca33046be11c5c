"""What every ``ratewarden`` subcommand shares: the exit codes, the parser that
reports a usage error on one line, ``NAME=VALUE`` pairs, JSON and table output.

The exit codes are one table for every command, `EXIT_CODES`: ``ratewarden
--help`` prints it and docs/cli.md has it; a command returns the constants below.

A progress bar for the commands that may take more than a second.

Drawn on stderr, only when stderr is a terminal and the command does not print
JSON: a script reading stdout, or a log collecting stderr, never sees it.
Redrawn at most ten times a second, so that advancing it once per step of a
tight loop costs a clock read. ``spinning`` shows the time spent on one long
call that reports no progress (loading a large configuration), and only once
the call has lasted half a second.

``--store URL`` for the commands that count (``check``, ``bench``): the memory
store, or a Redis one that is known to answer before the command starts.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, NoReturn

if TYPE_CHECKING:
    from ..rules import RuleSet
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TextIO

from ..stores import MemoryStore, Store

__all__ = [
    "EXIT_CODES",
    "MISSING",
    "NO",
    "OK",
    "STORE_HELP",
    "TIMEOUT",
    "UNREACHABLE",
    "USAGE",
    "CliError",
    "Parser",
    "Progress",
    "load_rule_file",
    "opened_store",
    "parse_pairs",
    "print_json",
    "redact",
    "spinning",
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
  130  interrupted (Ctrl-C)
  141  the reader of the output went away (| head): stopped quietly"""


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
    tests/cli/test_examples.py, with the conventions that cli/_main.py's docstring
    states; a comment ``# exits N`` says the example ends with exit code N."""
    return "examples:\n" + "\n".join(f"  {line}" for line in lines)


def load_rule_file(path: str) -> RuleSet:
    """A rule file a command runs (check, bench): each problem on stderr, then a
    usage error; a missing extra is exit code 4."""
    try:
        from ..rules import RuleFileError, load  # noqa: PLC0415 - PyYAML
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


WIDTH = 30
# Seconds before `spinning` draws anything: a quick call shows nothing.
SPIN_AFTER = 0.5


def _enabled(stream: TextIO, json: bool) -> bool:
    isatty = getattr(stream, "isatty", None)
    return not json and isatty is not None and bool(isatty())


class Progress:
    """``total`` units of work (checks, simulated seconds); `advance` by the units
    done, `close` to erase the bar. ``label`` is shown beside it."""

    def __init__(
        self, total: float, *, stream: TextIO | None = None, json: bool = False, label: str = ""
    ) -> None:
        self.total = max(total, 1e-9)
        self.stream = sys.stderr if stream is None else stream
        self.enabled = _enabled(self.stream, json)
        self.done = 0.0
        self.label = label
        self._drawn = 0.0
        self._width = 0

    def advance(self, amount: float) -> None:
        self.update(self.done + amount)

    def update(self, done: float) -> None:
        self.done = done
        if not self.enabled:
            return
        now = time.monotonic()
        if now - self._drawn >= 0.1:
            self._drawn = now
            self._draw()

    def _draw(self) -> None:
        share = min(1.0, self.done / self.total)
        filled = int(WIDTH * share)
        text = f"\r[{'#' * filled}{'.' * (WIDTH - filled)}] {100 * share:3.0f}% {self.label[:40]}"
        self._width = max(self._width, len(text))
        self.stream.write(text.ljust(self._width))
        self.stream.flush()

    def close(self) -> None:
        if self.enabled and self._width:
            self.stream.write("\r" + " " * self._width + "\r")
            self.stream.flush()
            self._width = 0

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@contextmanager
def spinning(
    label: str, *, stream: TextIO | None = None, json: bool = False, after: float = SPIN_AFTER
) -> Iterator[None]:
    """While the block runs: ``label`` and the seconds spent, redrawn by a thread
    of its own, from ``after`` seconds on; erased when the block ends."""
    out = sys.stderr if stream is None else stream
    if not _enabled(out, json):
        yield
        return
    done = threading.Event()
    started = time.monotonic()
    drawn = [0]

    def draw() -> None:
        if done.wait(after):
            return
        while True:
            text = f"\r{label[:60]} {time.monotonic() - started:4.1f}s"
            drawn[0] = max(drawn[0], len(text))
            out.write(text)
            out.flush()
            if done.wait(0.1):
                return

    thread = threading.Thread(target=draw, name="ratewarden-progress", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()
        if drawn[0]:
            out.write("\r" + " " * drawn[0] + "\r")
            out.flush()


# Seconds a Redis command of the CLI may take: a person waits for the answer, a
# service's per-request bound (50 ms) would fail on a slow link for nothing.
TIMEOUT = 2.0
STORE_HELP = "memory (the default) or a Redis URL: redis://, rediss://, unix://, "
STORE_HELP += "redis+cluster://h:p,h:p, redis+sentinel://h:p/service"


def redact(url: str) -> str:
    scheme, sep, rest = url.partition("://")
    if sep and "@" in rest:
        return f"{scheme}://***@{rest.rpartition('@')[2]}"
    return url


@contextmanager
def opened_store(url: str) -> Iterator[Store]:
    """The store ``url`` names, closed after the block. A Redis store answers a
    PING first: a store that cannot be reached is exit code 3 at once, not a
    failure policy's answer to every check."""
    if url in ("memory", "memory://"):
        yield MemoryStore()
        return
    try:
        from ..stores.redis import RedisStore  # noqa: PLC0415
        from ..stores.redis.connection import FAILURES, SCHEMES  # noqa: PLC0415 - the redis extra
    except ImportError:
        raise CliError("--store with Redis needs: pip install 'ratewarden[redis]'",
                       MISSING) from None  # fmt: skip
    if not url.startswith(SCHEMES):
        raise CliError(f"--store takes 'memory' or a Redis URL, got {url!r}", USAGE)
    try:
        store = RedisStore(url, timeout=TIMEOUT)
        store.client.ping()
    except FAILURES as exc:
        raise CliError(f"cannot reach the store {redact(url)}: {exc}", UNREACHABLE) from None
    try:
        yield store
    finally:
        store.close()
