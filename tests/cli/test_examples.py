"""Every example in every ``ratewarden ... --help`` runs, as written, with the
exit code it says.

The examples follow the conventions of ratewarden/cli/_main.py's docstring: they run
in a directory holding ``rules.yaml``, ``ratelimit-config.yaml`` and ``token``; the
service at ``http://127.0.0.1:8080`` is one this module starts (on a free port,
written in place of 8080); ``redis://127.0.0.1:6379/0`` is a redis-server of
this module's own (its port written in place of 6379; the Redis holds the
quotas ``partner-api`` and ``retired-api``, the one the ``delete`` example
removes); a ``serve`` example is started on free ports, probed on ``/healthz``
and stopped; ``# exits N`` is the exit code expected.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from ratewarden.cli import help_texts, main
from ratewarden.fleet import QuotaConfig, set_quota
from ratewarden.rules import load
from tests.redis_server import free_port, redis_server
from tests.server.conftest import ENVOY
from tests.server.process import RATEWARDEN, serving

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "example-token-0123456789"
SERVICE = "127.0.0.1:8080"
GRPC = "127.0.0.1:8081"
REDIS = "127.0.0.1:6379"
# Variables that would point an example elsewhere than the fixtures
FOREIGN = ("RATEWARDEN_URL", "RATEWARDEN_TOKEN", "RATEWARDEN_REDIS")


@dataclass(frozen=True)
class Example:
    command: str  # the help text's name for it: "ratewarden quota set"
    line: str  # as the help prints it, comment and all
    words: tuple[str, ...]
    exit_code: int
    serves: bool  # "# runs until stopped"

    def __str__(self) -> str:
        return self.line


def examples_of(help_text: str) -> list[str]:
    """The lines of the ``examples:`` section that ends a help text."""
    _, found, section = help_text.partition("\nexamples:\n")
    assert found, "no examples: section"
    lines = []
    for line in section.splitlines():
        if not line.startswith("  "):
            break  # the next section (exit codes)
        lines.append(line.strip())
    return lines


def parse(command: str, line: str) -> Example:
    text, _, comment = line.partition("  # ")
    words = tuple(shlex.split(text))
    assert words[0] == "ratewarden", line
    match = re.fullmatch(r"(?:.*\b)?exits (\d+)", comment.strip())
    serves = comment.strip() == "runs until stopped"
    assert not comment or match or serves, f"a comment the test does not understand: {line}"
    return Example(command, line, words, int(match.group(1)) if match else 0, serves)


def collect() -> list[Example]:
    return [parse(command, line) for command, text in help_texts().items()
            for line in examples_of(text)]  # fmt: skip


EXAMPLES = collect()
Capture = pytest.CaptureFixture[str]


def test_every_command_has_examples_that_it_runs() -> None:
    texts = help_texts()
    for command, text in texts.items():
        lines = examples_of(text)
        assert lines, command
        # each example runs the command whose help shows it (the top level: any)
        if command != "ratewarden":
            assert all(f"{line} ".startswith(f"{command} ") for line in lines), (command, lines)
    commands = {e.command for e in EXAMPLES}
    assert commands == set(texts)
    assert {"ratewarden check", "ratewarden bench", "ratewarden serve",
            "ratewarden quota set", "ratewarden simulate"} <= commands  # fmt: skip


def request_of(example: Example) -> dict[str, str]:
    """The attributes an example gives a request: its ``NAME=VALUE`` words and
    ``--attr``s, not its ``--header``s or ``--load``s."""
    attributes = {}
    for before, word in zip(example.words, example.words[1:], strict=False):
        name, equals, value = word.partition("=")
        if equals and name.isidentifier() and before not in ("--header", "--load"):
            attributes[name] = value
    return attributes


def test_an_example_request_meets_the_rules_written_for_it() -> None:
    # Any path meets the catch-all rules (per-user, service-wide): an example
    # shows a path that a rule names, as a reader would send it (the rule may
    # still skip an anonymous request, for want of its `by`)
    rules = load(ROOT / "examples" / "rules.yaml")
    seen = 0
    for example in EXAMPLES:
        request = request_of(example)
        if "path" in request:
            seen += 1
            met = [e.rule.name for e in rules.explain(request)
                   if e.rule.paths and e.verdict != "no match"]  # fmt: skip
            assert met, f"no rule names the path of: {example}"
    assert seen >= 8


def header_commands(path: Path) -> list[str]:
    """The ``ratewarden ...`` commands of a file's opening comment, each joined
    across its ``\\`` continuations."""
    commands: list[str] = []
    for line in path.read_text().splitlines():
        if not line.startswith("#"):
            break
        text = line.lstrip("# ")
        if commands and commands[-1].endswith("\\"):
            commands[-1] = f"{commands[-1][:-1].rstrip()} {text}"
        elif found := re.search(r":\s+(ratewarden .*)", text):  # "See ...: ratewarden ..."
            commands.append(found.group(1))
    return commands


def test_the_commands_of_the_example_rule_file_run_as_written(
    capsys: Capture, monkeypatch: pytest.MonkeyPatch
) -> None:
    commands = header_commands(ROOT / "examples" / "rules.yaml")
    assert [c.split()[1] for c in commands] == ["check-config", "explain"]
    monkeypatch.chdir(ROOT)  # they name examples/rules.yaml from the repository's root
    for command in commands:
        words = shlex.split(command)[1:]
        # a request is NAME=VALUE words, as in every --help example
        assert "--attr" not in words, command
        assert main(words) == 0, command
        assert "login-per-ip" in capsys.readouterr().out


def test_the_parser_understands_a_comment() -> None:
    assert parse("c", "ratewarden check x=1  # the 6th is denied: exits 1").exit_code == 1
    assert parse("c", "ratewarden serve  # runs until stopped").serves
    with pytest.raises(AssertionError, match="does not understand"):
        parse("c", "ratewarden check x=1  # something else")


@dataclass
class Fixtures:
    workdir: Path
    service: str
    redis_port: int


@pytest.fixture(scope="module")
def fixtures(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fixtures]:
    workdir = tmp_path_factory.mktemp("cli-examples")
    shutil.copy(ROOT / "examples" / "rules.yaml", workdir / "rules.yaml")
    (workdir / "ratelimit-config.yaml").write_text(ENVOY)
    (workdir / "token").write_text(TOKEN + "\n")
    with redis_server() as redis:
        with redis.client() as client:
            set_quota(client, "partner-api", QuotaConfig("1000/second"))
            set_quota(client, "retired-api", QuotaConfig("10/second"))
        with serving("--config", str(workdir / "rules.yaml"), "--token-file",
                     str(workdir / "token"), "--open-checks", tmp=workdir) as served:  # fmt: skip
            yield Fixtures(workdir, f"127.0.0.1:{served.http}", redis.port)


def environment() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in FOREIGN}


def rewrite(example: Example, fixtures: Fixtures) -> list[str]:
    words = [w.replace(REDIS, f"127.0.0.1:{fixtures.redis_port}") for w in example.words]
    if example.serves:
        assert SERVICE in words, f"a serve example names --http {SERVICE}: {example}"
        assert GRPC in words, f"a serve example names --grpc {GRPC}: {example}"
        http, grpc = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
        words = [http if w == SERVICE else grpc if w == GRPC else w for w in words]
    else:
        words = [w.replace(SERVICE, fixtures.service) for w in words]
    assert not any(":6379" in w or ":8080" in w for w in words), words
    return [str(RATEWARDEN), *words[1:]]


def healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1) as answer:
            return int(answer.status) == 200
    except (urllib.error.URLError, OSError):
        return False


def run_server(argv: list[str], fixtures: Fixtures) -> None:
    http = argv[argv.index("--http") + 1]
    log = fixtures.workdir / f"serve-example-{http.rpartition(':')[2]}.log"
    with log.open("w") as err:
        process = subprocess.Popen(argv, cwd=fixtures.workdir, env=environment(),
                                   stdout=subprocess.DEVNULL, stderr=err)  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while not healthy(f"http://{http}/healthz"):
            if process.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"{argv} did not answer /healthz:\n{log.read_text()[-3000:]}")
            time.sleep(0.05)
        process.send_signal(signal.SIGTERM)
        try:
            status = process.wait(30)
        except subprocess.TimeoutExpired:
            pytest.fail(f"{argv} did not stop within 30 s of SIGTERM:\n{log.read_text()[-3000:]}")
        assert status == 0, log.read_text()[-3000:]
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


@pytest.mark.parametrize("example", EXAMPLES, ids=str)
def test_the_example_runs(
    example: Example, fixtures: Fixtures, capfd: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    argv = rewrite(example, fixtures)
    if example.serves:
        run_server(argv, fixtures)
        return
    # the command's own main, in this process: what the installed script runs, at a
    # tenth of the cost of a process each (the script itself is run by test_cli)
    monkeypatch.chdir(fixtures.workdir)
    for name in FOREIGN:
        monkeypatch.delenv(name, raising=False)
    try:
        code = main(argv[1:])
    except SystemExit as exc:  # argparse's way out
        code = exc.code if isinstance(exc.code, int) else 1
    out, err = capfd.readouterr()
    said = f"{example}\n--- stdout\n{out[-3000:]}\n--- stderr\n{err[-3000:]}"
    assert code == example.exit_code, said
    assert "Traceback" not in err, said
    if example.exit_code >= 2:  # an error: one line on stderr, nothing else
        assert out == "", said
        assert len(err.splitlines()) == 1, said
    else:
        assert out.strip(), said  # every example shows something
    if "--json" in example.words:
        json.loads(out)
