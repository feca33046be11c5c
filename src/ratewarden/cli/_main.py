"""The ``ratewarden`` command: ``serve``, ``check``, ``check-config``, ``explain``,
``override``, ``quota``, ``simulate``, ``bench`` and ``demo``.

Each subcommand imports what it needs when it runs: the rule commands
``ratewarden.rules`` (and so PyYAML), ``serve`` the server packages, ``quota``
and ``simulate`` the fleet quotas (and so the Redis client).

Errors are one line on stderr, ``ratewarden COMMAND: what went wrong``, and
an exit code from one table (`ratewarden.cli._common.EXIT_CODES`, printed by
``ratewarden --help``); never a traceback for bad input, a store or a service
that does not answer.

Every subcommand's help ends with an ``examples:`` section, and
tests/cli/test_examples.py runs every line of it that starts with
``ratewarden``. The conventions those lines follow, so that the test can run
them as they are written:

- They run in a directory holding ``rules.yaml`` (a rule file),
  ``ratelimit-config.yaml`` (an envoyproxy/ratelimit file) and ``token`` (the
  service's bearer token): the names tests/test_docs.py gives them too.
- ``http://127.0.0.1:8080`` is a running service, started with
  ``--token-file token --open-checks`` (checks need no token, admin calls
  do); the test writes its own service's host:port in place of
  ``127.0.0.1:8080``.
- ``redis://127.0.0.1:6379/0`` is a Redis holding the quotas ``partner-api``
  and ``retired-api`` (which the ``quota delete`` example removes): the test
  writes its own server's port in place of 6379, so no example touches a Redis
  the test did not start.
- Each subcommand's examples run that subcommand alone: what one needs set up
  first is set up by the test, never by an example of another command.
- A ``serve`` example spells ``--http 127.0.0.1:8080`` and ``--grpc
  127.0.0.1:8081`` and ends with ``# runs until stopped``: the test gives it two
  free ports instead, waits until ``/healthz`` answers 200, stops it with
  SIGTERM and expects exit code 0.
- ``# exits N`` at the end of a line: the example ends with exit code N (0
  when not said), as in the docs' shell blocks.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterator, Sequence
from typing import Any, TextIO

from .. import __version__
from ..primitives import ConfigurationError, RatewardenError, StoreError
from . import _override as _clioverride
from ._bench import add_bench, bench
from ._check import add_check, check
from ._common import (
    EXIT_CODES,
    INTERRUPTED,
    MISSING,
    NO,
    UNREACHABLE,
    USAGE,
    CliError,
    Parser,
    examples,
)
from ._quota_command import add_quota, quota
from ._rules import check_config, explain

__all__ = ["build_parser", "help_texts", "main"]

# 128 + SIGPIPE: what a shell reports for a command whose reader closed the pipe
# (`yes | head -1`), so `set -o pipefail` sees ratewarden as it sees any other
CLOSED_PIPE = 141

DESCRIPTION = "Rate limiting: a service, rule files, fleet quotas, and the tools around them."

TOP_EXAMPLES = examples(
    "ratewarden check-config rules.yaml",
    "ratewarden check rules.yaml method=POST path=/api/login ip=10.0.0.5",
    "ratewarden check --url http://127.0.0.1:8080 method=GET path=/api/v1/orders user=u1",
    "ratewarden serve --config rules.yaml --http 127.0.0.1:8080 --grpc 127.0.0.1:8081"
    "  # runs until stopped",
    "ratewarden bench --algorithm gcra --seconds 0.2",
)

SERVE_EXAMPLES = examples(
    "ratewarden serve --config rules.yaml --http 127.0.0.1:8080 --grpc 127.0.0.1:8081"
    "  # runs until stopped",
    "ratewarden serve --config rules.yaml --store redis://127.0.0.1:6379/0"
    " --http 127.0.0.1:8080 --grpc 127.0.0.1:8081 --log-format text  # runs until stopped",
    "ratewarden serve --config rules.yaml --envoy-config ratelimit-config.yaml"
    " --http 127.0.0.1:8080 --grpc 127.0.0.1:8081 --token-file token  # runs until stopped",
)

CHECK_EXAMPLES = examples(
    "ratewarden check rules.yaml method=GET path=/api/v1/orders user=u1",
    "ratewarden check rules.yaml method=POST path=/api/login ip=10.0.0.5 --times 6  # exits 1",
    "ratewarden check rules.yaml method=GET path=/api/v1/orders ip=10.0.0.5 --json",
    "ratewarden check rules.yaml method=GET path=/api/v1/orders user=u1"
    " --store redis://127.0.0.1:6379/0",
    "ratewarden check --url http://127.0.0.1:8080 method=GET path=/api/v1/orders user=u1",
    "ratewarden check --url http://127.0.0.1:8080 --token-file token method=POST"
    " path=/api/login ip=10.0.0.7 --times 6 --json  # exits 1",
)

CHECK_CONFIG_EXAMPLES = examples(
    "ratewarden check-config rules.yaml",
    "ratewarden check-config rules.yaml --strict --json",
    "ratewarden check-config ratelimit-config.yaml",
)

EXPLAIN_EXAMPLES = examples(
    "ratewarden explain rules.yaml method=POST path=/api/login ip=10.0.0.5",
    "ratewarden explain rules.yaml method=GET path=/api/v1/orders --attr user=u1"
    " --header X-Forwarded-For=198.51.100.4 --json",
)

BENCH_EXAMPLES = examples(
    "ratewarden bench --seconds 0.2",
    "ratewarden bench --algorithm sliding_window_counter --rate 100/second --keys 10"
    " --seconds 0.2 --json",
    "ratewarden bench rules.yaml method=GET path=/api/v1/orders user=u1 --vary user --seconds 0.2",
    "ratewarden bench --algorithm gcra --store redis://127.0.0.1:6379/0 --seconds 0.2",
)

SIMULATE_EXAMPLES = examples(
    "ratewarden simulate --members 4 --seconds 10",
    "ratewarden simulate --pattern churn --algorithm all --seconds 10 --json",
    "ratewarden simulate --pattern total-change --members 8 --seconds 10"
    " --store redis://127.0.0.1:6379/0",
)

DEMO_EXAMPLES = examples("ratewarden demo")

# A command's help where its extra is not installed: its options come with it.
_NOT_INSTALLED = (
    "Its options come with its extra, which is not installed here: "
    "pip install 'ratewarden[{extra}]'."
)


def build_parser(*, simulate_options: bool = True) -> argparse.ArgumentParser:
    """The whole command line. ``simulate_options``: add simulate's own options,
    which import the fleet package (and so the Redis client)."""
    parser = Parser(
        prog="ratewarden", description=DESCRIPTION, epilog=f"{TOP_EXAMPLES}\n\n{EXIT_CODES}"
    )
    parser.add_argument("--version", action="version", version=f"ratewarden {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    serve = sub.add_parser(
        "serve",
        help="run the service: HTTP API, Envoy RLS gRPC, /auth",
        epilog=SERVE_EXAMPLES,
        description="Run the service until SIGTERM or Ctrl-C: the HTTP API (/v1/check, /auth "
        "for gateways, /metrics, ...) and Envoy's rate limit service over gRPC, on one store.",
    )
    try:
        from ..server import add_arguments  # noqa: PLC0415 - the server extra, if installed
    except ModuleNotFoundError as exc:
        if _missing_module(exc, "serve") is None:
            raise  # not a package an extra brings: a broken install, shown as one
        serve.set_defaults(missing="server")
        serve.description = f"{serve.description} {_NOT_INSTALLED.format(extra='server')}"
    else:
        add_arguments(serve)

    add_check(sub, CHECK_EXAMPLES)

    config = sub.add_parser(
        "check-config",
        help="check a rule file (or envoyproxy/ratelimit config); print its rules",
        description="Load a rule file, or envoyproxy/ratelimit configuration (a file or a "
        "directory of them), as the service would, and print what it holds; every problem "
        "with its file and line.",
        epilog=CHECK_CONFIG_EXAMPLES,
    )
    config.add_argument("file", metavar="FILE")
    config.add_argument("--strict", action="store_true", help="warnings fail the check too")
    config.add_argument("--json", action="store_true", help="print the rules as JSON")

    why = sub.add_parser(
        "explain",
        help="show which rules apply to a request, and why",
        description="Show what every rule of a rule file makes of one request (applies, no "
        "match, skipped, lost to a rule of its group) and which limits apply; nothing counts.",
        epilog=EXPLAIN_EXAMPLES,
    )
    why.add_argument("file", metavar="RULES.yaml")
    why.add_argument(
        "words",
        nargs="*",
        metavar="NAME=VALUE",
        help="the request's attributes (method, path, ip, user, plan, ...)",
    )
    why.add_argument(
        "--attr",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="an attribute, as the positional NAME=VALUE",
    )
    why.add_argument(
        "--header", action="append", default=[], metavar="NAME=VALUE", help="a request header"
    )
    why.add_argument("--json", action="store_true", help="print the verdicts as JSON")
    why.add_argument(
        "--load", action="append", default=[], metavar="SIGNAL=VALUE",
        help="an adaptive rule's load signal, to show the limit it leaves",
    )  # fmt: skip

    add_quota(sub)

    _clioverride.add_parser(sub)

    simulate = sub.add_parser(
        "simulate",
        help="a fleet quota's members on a virtual clock: figures and plots",
        epilog=SIMULATE_EXAMPLES,
    )
    simulate.set_defaults(missing="fleet")  # the plots are the simulate extra's, and optional
    simulate.description = (
        "Run a fleet quota's members on a virtual clock, against the model or a Redis, and "
        "show what each member and the provider see."
    )
    if simulate_options:
        try:
            from .. import sim  # noqa: PLC0415 - the Redis client, if installed
        except ImportError:
            pass
        else:
            sim.add_arguments(simulate)
            simulate.set_defaults(missing=None)
        if simulate.get_default("missing"):
            simulate.description += " " + _NOT_INSTALLED.format(extra="fleet")

    add_bench(sub, BENCH_EXAMPLES)
    sub.add_parser(
        "demo",
        help="show every algorithm and acquire() at work",
        description="Show every algorithm on a simulated clock, then acquire() "
        "sharing one limit between async workers (about a second).",
        epilog=DEMO_EXAMPLES,
    )
    return parser


def _subcommands(parser: argparse.ArgumentParser) -> Iterator[argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in dict.fromkeys(action.choices.values()):  # once each, aliases aside
                yield child
                yield from _subcommands(child)


def _chosen(parser: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.ArgumentParser:
    """The parser of the command ``args`` runs (``ratewarden quota set``'s for
    ``quota set``): the one to report an option no parser on the way knew, so
    that the error names the command and the help that lists its options."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            child = action.choices.get(getattr(args, action.dest, None) or "")
            if isinstance(child, argparse.ArgumentParser):
                return _chosen(child, args)
    return parser


def help_texts() -> dict[str, str]:
    """Every command's ``--help``, by its name (``ratewarden``, ``ratewarden quota
    set``, ...), each as its parser prints it."""
    parser = build_parser()
    texts = {parser.prog: parser.format_help()}
    texts.update((child.prog, child.format_help()) for child in _subcommands(parser))
    return texts


class _NoTerminal:
    """A stream that says it is no terminal: no progress bar around JSON output."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream

    def isatty(self) -> bool:
        return False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


# The extra that brings each third-party module the commands import, for the
# one line that replaces a ModuleNotFoundError's traceback; a command whose own
# extra brings the module names that one instead (`serve` gets PyYAML from server).
_EXTRA_OF_MODULE = {
    "yaml": "rules", "redis": "redis", "hiredis": "redis", "matplotlib": "simulate",
    "google": "grpc", "grpc_tools": "grpc", "grpc": "grpc", "hpack": "grpc",
    "httptools": "server", "uvloop": "server", "prometheus_client": "server",
}  # fmt: skip
_EXTRA_OF_COMMAND = {"serve": "server", "quota": "fleet", "simulate": "fleet"}
_COMMAND_BRINGS = {
    "server": {"yaml", "httptools", "uvloop", "prometheus_client"},
    "fleet": {"redis", "hiredis"},
}


def _missing(extra: str) -> CliError:
    return CliError(f"needs: pip install 'ratewarden[{extra}]'", MISSING)


def _missing_module(exc: ModuleNotFoundError, command: str) -> CliError | None:
    """The one-line error for a dependency an extra brings, or None for any
    other missing module (a defect: its traceback is kept)."""
    module = (exc.name or "").partition(".")[0]
    extra = _EXTRA_OF_MODULE.get(module)
    if extra is None:
        return None
    own = _EXTRA_OF_COMMAND.get(command)
    if own is not None and module in _COMMAND_BRINGS.get(own, ()):
        extra = own
    return CliError(f"needs: pip install 'ratewarden[{extra}]' (no module named {module!r})",
                    MISSING)  # fmt: skip


def _run(args: argparse.Namespace) -> int:
    command = args.command  # a command whose extra is missing never gets here (_main)
    if command == "serve":
        from ..server import options_from, otel_available, run  # noqa: PLC0415

        if args.otel and not otel_available():
            raise CliError("--otel needs: pip install 'ratewarden[otel]'", MISSING)

        return run(options_from(args))
    if command == "check":
        return check(args)
    if command == "check-config":
        return check_config(args.file, strict=args.strict, as_json=args.json)
    if command == "explain":
        return explain(
            args.file, [*args.words, *args.attr], args.header, as_json=args.json, signals=args.load
        )
    if command == "quota":
        return quota(args)
    if command == "override":
        return _clioverride.run(args)
    if command == "simulate":
        from .. import sim  # noqa: PLC0415

        err: Any = _NoTerminal(sys.stderr) if args.json else sys.stderr
        return sim.run(args, sys.stdout, err)
    if command == "bench":
        return bench(args)
    from ._demo import demo  # noqa: PLC0415

    demo()
    return 0


def _unreachable() -> tuple[type[BaseException], ...]:
    """The errors of a store that does not answer: ours, and redis-py's where a
    command calls Redis without a store in between (quota, simulate)."""
    try:
        from ..stores.redis.connection import FAILURES  # noqa: PLC0415 - the redis extra
    except ImportError:
        return (StoreError,)
    return (StoreError, *FAILURES)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; its exit code. Output cut short by its reader
    (``ratewarden quota list | head -1``) ends the command quietly with
    `CLOSED_PIPE`, as a command killed by SIGPIPE would in a shell."""
    try:
        code = _main(argv)
        # what is still buffered reaches a closed pipe here, not at exit
        sys.stdout.flush()
    except BrokenPipeError:
        _discard_output()
        return CLOSED_PIPE
    return code


def _discard_output() -> None:
    """Point stdout and stderr at devnull where their reader has gone: the
    interpreter flushes them at exit, and a flush into a closed pipe would print
    one more error."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BrokenPipeError:
            try:
                devnull = os.open(os.devnull, os.O_WRONLY)
                os.dup2(devnull, stream.fileno())
                os.close(devnull)
            except (OSError, ValueError):  # no file descriptor behind it (a test's capture)
                pass
        except (OSError, ValueError):  # closed, or not a file: nothing to flush at exit
            pass


def _main(argv: Sequence[str] | None) -> int:
    words = sys.argv[1:] if argv is None else list(argv)
    # simulate's options import the fleet package: only when the command is simulate
    parser = build_parser(simulate_options=words[:1] == ["simulate"])
    args, extra = parser.parse_known_args(words)
    where = _chosen(parser, args).prog  # with its verb: "ratewarden quota set"
    if getattr(args, "missing", None):
        # the command's options come with its extra: name the extra, not the
        # options this install cannot know
        print(f"{where}: {_missing(args.missing)}", file=sys.stderr)
        return MISSING
    # NAME=VALUE words after an option (`check FILE --times 6 user=u1`): argparse
    # has closed the positional list by then and hands them back as unknown
    if (
        extra
        and isinstance(getattr(args, "words", None), list)
        and not any(word.startswith("-") for word in extra)
    ):
        args.words.extend(extra)
    elif extra:
        _chosen(parser, args).error(f"unrecognized arguments: {' '.join(extra)}")
    try:
        return _run(args)
    except BrokenPipeError:  # our reader went away: main() ends quietly
        raise
    except CliError as exc:
        print(f"{where}: {exc}", file=sys.stderr)
        return exc.code
    except ConfigurationError as exc:
        print(f"{where}: {exc}", file=sys.stderr)
        return USAGE
    except _unreachable() as exc:
        print(f"{where}: {exc}", file=sys.stderr)
        return UNREACHABLE
    except RatewardenError as exc:
        print(f"{where}: {exc}", file=sys.stderr)
        return NO
    except OSError as exc:  # a file that cannot be read or written
        print(f"{where}: {exc}", file=sys.stderr)
        return USAGE
    except KeyboardInterrupt:
        return INTERRUPTED
    except ModuleNotFoundError as exc:
        missing = _missing_module(exc, args.command)
        if missing is None:
            raise
        print(f"{where}: {missing}", file=sys.stderr)
        return MISSING


if __name__ == "__main__":
    sys.exit(main())
