"""The command line as a whole: one-line errors, the exit code table, the service
client's answers to what a service can say, the progress bar."""

from __future__ import annotations

import argparse
import http.server
import io
import json
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import ClassVar

import pytest

from ratewarden.cli import main
from ratewarden.cli._common import EXIT_CODES, CliError, Progress, spinning
from ratewarden.cli._remote import ServiceClient
from tests.redis_server import free_port
from tests.server.process import RATEWARDEN

ROOT = Path(__file__).resolve().parents[2]
Capture = pytest.CaptureFixture[str]


def one_line(capsys: Capture) -> str:
    out, err = capsys.readouterr()
    assert out == ""
    assert len(err.splitlines()) == 1, err
    assert "Traceback" not in err
    return err.strip()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["check", "--times", "x"], "ratewarden check: argument --times: invalid int value: 'x'"),
        (["nosuch"], "ratewarden: argument COMMAND: invalid choice: 'nosuch'"),
        (["bench", "--algorithm", "lottery"], "ratewarden bench: argument --algorithm"),
        (["quota"], "ratewarden quota: the following arguments are required: VERB"),
        # an option no parser knows: the command's parser says so, not the top level's
        (["check", "rules.yaml", "--bogus"], "ratewarden check: unrecognized arguments: --bogus"),
        (["quota", "set", "q", "--bogus"], "ratewarden quota set: unrecognized arguments: --bogus"),
        (["demo", "extra"], "ratewarden demo: unrecognized arguments: extra"),
    ],
)
def test_a_usage_error_is_one_line_and_exit_code_2(
    argv: list[str], message: str, capsys: Capture
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2
    line = one_line(capsys)
    assert line.startswith(message)
    assert line.endswith("(see " + line.partition(":")[0] + " --help)")


def test_the_exit_codes_are_in_the_help_and_the_docs() -> None:
    done = subprocess.run([str(RATEWARDEN), "--help"], capture_output=True, text=True,
                          check=True, timeout=60)  # fmt: skip
    assert EXIT_CODES in done.stdout
    docs = (ROOT / "docs" / "cli.md").read_text()
    codes = re.findall(r"^  (\d+) ", EXIT_CODES, re.M)
    assert codes == ["0", "1", "2", "3", "4", "130", "141"]
    for code in codes:
        assert re.search(rf"^\| {code} \|", docs, re.M), f"exit code {code} not in docs/cli.md"


def test_a_missing_extra_is_exit_code_4(monkeypatch: pytest.MonkeyPatch, capsys: Capture) -> None:
    monkeypatch.setitem(sys.modules, "ratewarden.stores.redis.connection", None)  # import fails
    assert main(["quota", "list"]) == 4
    assert one_line(capsys) == "ratewarden quota list: needs: pip install 'ratewarden[fleet]'"
    assert main(["bench", "--store", "redis://127.0.0.1:1/0"]) == 4
    assert "pip install 'ratewarden[redis]'" in one_line(capsys)


@pytest.mark.parametrize(
    ("words", "module", "said"),
    [
        (["check-config", "rules.yaml"], "yaml", "ratewarden[rules]"),
        (["explain", "rules.yaml", "ip=1"], "yaml", "ratewarden[rules]"),
        (["check", "rules.yaml", "--store", "redis://127.0.0.1:1/0"], "redis", "ratewarden[redis]"),
    ],
)
def test_a_module_an_extra_brings_is_named_by_its_extra(
    words: list[str], module: str, said: str, monkeypatch: pytest.MonkeyPatch, capsys: Capture
) -> None:
    """Wherever the import happens, a missing dependency is one line naming the
    extra (scripts/check_wheels.py tries it in a venv without the extras)."""

    def missing(*args: object, **kwargs: object) -> int:
        raise ModuleNotFoundError(f"No module named {module!r}", name=module)

    for name in ("check", "check_config", "explain"):
        monkeypatch.setattr(f"ratewarden.cli._main.{name}", missing)
    assert main(words) == 4
    assert one_line(capsys) == (
        f"ratewarden {words[0]}: needs: pip install '{said}' (no module named {module!r})"
    )


def test_a_missing_module_no_extra_brings_keeps_its_traceback(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def missing(*args: object, **kwargs: object) -> int:
        raise ModuleNotFoundError("No module named 'ratewarden.nothing'", name="ratewarden.nothing")

    monkeypatch.setattr("ratewarden.cli._main.check_config", missing)
    with pytest.raises(ModuleNotFoundError):
        main(["check-config", "rules.yaml"])


@pytest.mark.parametrize(
    ("error", "said"),
    [
        (ModuleNotFoundError("No module named 'yaml'", name="yaml"), None),
        (ImportError("cannot import name 'add_arguments'"), "cannot import name"),
        (ModuleNotFoundError("No module named 'rw.x'", name="rw.x"), "rw.x"),
    ],
)
def test_serve_blames_its_extra_only_for_a_module_the_extra_brings(
    error: ImportError, said: str | None, monkeypatch: pytest.MonkeyPatch, capsys: Capture
) -> None:
    """A broken install (modules of two versions) is not a missing extra."""
    import ratewarden.server  # noqa: PLC0415

    def lookup(name: str) -> object:
        raise error

    monkeypatch.setattr(ratewarden.server, "__getattr__", lookup)
    if said is None:
        assert main(["serve"]) == 4
        assert one_line(capsys) == "ratewarden serve: needs: pip install 'ratewarden[server]'"
    else:
        with pytest.raises(ImportError, match=said):
            main(["serve"])


def test_an_unreachable_store_is_exit_code_3(capsys: Capture) -> None:
    url = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there
    assert main(["bench", "--store", url, "--seconds", "0.01"]) == 3
    assert one_line(capsys).startswith(f"ratewarden bench: cannot reach the store {url}")
    assert main(["quota", "list", "--store", url]) == 3
    assert "Connection refused" in one_line(capsys)


# -- the service client ---------------------------------------------------------------


class _Handler(http.server.BaseHTTPRequestHandler):
    answers: ClassVar[dict[str, tuple[int, bytes]]] = {}
    seen: ClassVar[list[tuple[str, str | None, bytes]]] = []

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("content-length", 0)))
        self.seen.append((self.path, self.headers.get("authorization"), body))
        status, answer = self.answers[self.path]
        self.send_response(status)
        self.send_header("content-length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def fake_service() -> Iterator[str]:
    """An HTTP server answering each path as `_Handler.answers` says."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    _Handler.seen.clear()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


@pytest.mark.parametrize(
    ("status", "answer", "code", "message"),
    [
        (401, b'{"error": "a valid bearer token is needed"}', 2,
         "401 a valid bearer token is needed; give one with --token-file or $RATEWARDEN_TOKEN"),
        (422, b'{"error": "cost: expected >= 1"}', 2, "422 cost: expected >= 1"),
        (503, b'{"error": "store unavailable: down"}', 3, "503 store unavailable: down"),
        (502, b"<html>bad gateway</html>", 3, "502 Bad Gateway"),
        (200, b"<html>hello</html>", 3, "the answer is not JSON: is this a ratewarden service?"),
    ],
)  # fmt: skip
def test_what_the_service_says_is_an_exit_code(
    fake_service: str, status: int, answer: bytes, code: int, message: str
) -> None:
    _Handler.answers = {"/v1/check": (status, answer)}
    with pytest.raises(CliError) as raised:
        ServiceClient(fake_service, None).request("POST", "/v1/check", {"attributes": {}})
    assert raised.value.code == code
    assert str(raised.value) == f"POST {fake_service}/v1/check: {message}"


def test_check_asks_the_service(
    fake_service: str, tmp_path: Path, capsys: Capture, monkeypatch: pytest.MonkeyPatch
) -> None:
    denied = {"allowed": False, "action": "reject", "status": 429, "rule": "r", "limit": 1,
              "remaining": 0, "reset_after": 1.5, "retry_after": 1.5, "wait": 0.0,
              "degraded": False, "headers": {"Retry-After": "2"}}  # fmt: skip
    batch = json.dumps({"results": [denied] * 3}).encode()
    _Handler.answers = {"/v1/check": (200, json.dumps(denied).encode()),
                        "/v1/check/batch": (200, batch)}  # fmt: skip
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    monkeypatch.setenv("RATEWARDEN_TOKEN", "from-the-environment")
    argv = ["check", "--url", fake_service, "path=/x", "user=u", "--header", "X-Api-Key=k"]
    assert main([*argv, "--json", "--token-file", str(token)]) == 1
    assert json.loads(capsys.readouterr().out) == denied
    path, authorization, body = _Handler.seen[-1]
    assert (path, authorization) == ("/v1/check", "Bearer s3cret")
    assert json.loads(body) == {
        "attributes": {"path": "/x", "user": "u", "headers": {"x-api-key": "k"}},
        "cost": 1,
    }
    assert main([*argv, "--times", "3", "--cost", "2"]) == 1
    out = capsys.readouterr().out
    assert [line.split()[:4] for line in out.splitlines()[1:4]] == [
        [str(n), "no", "reject", "429"] for n in (1, 2, 3)
    ]
    assert "  Retry-After: 2" in out
    path, authorization, body = _Handler.seen[-1]
    assert (path, authorization) == ("/v1/check/batch", "Bearer from-the-environment")
    request = {"attributes": {"path": "/x", "user": "u", "headers": {"x-api-key": "k"}}}
    assert json.loads(body)["checks"] == [{**request, "cost": 2}] * 3


def test_an_unreachable_service_is_exit_code_3(capsys: Capture) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    assert main(["check", "--url", url, "path=/x"]) == 3
    assert one_line(capsys).startswith(
        f"ratewarden check: POST {url}/v1/check: cannot reach the service:"
    )
    assert main(["check", "--url", "ftp://x", "path=/x"]) == 2
    assert "--url takes http://HOST:PORT" in one_line(capsys)


# -- the progress bar -----------------------------------------------------------------


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_the_bar_is_drawn_on_a_terminal_only() -> None:
    terminal = Terminal()
    with Progress(10, stream=terminal, label="gcra") as bar:
        bar.update(5)
    drawn = terminal.getvalue()
    assert "[###############...............]  50% gcra" in drawn
    assert drawn.endswith("\r")  # erased when done
    for stream, as_json in ((io.StringIO(), False), (Terminal(), True)):
        with Progress(10, stream=stream, json=as_json) as bar:
            bar.update(5)
        assert stream.getvalue() == ""


def test_spinning_shows_a_long_call_only() -> None:
    terminal = Terminal()
    with spinning("loading big.yaml", stream=terminal, after=60):
        pass  # done long before it would draw
    assert terminal.getvalue() == ""
    shown = threading.Event()

    class Watched(Terminal):
        def write(self, text: str) -> int:
            shown.set()
            return super().write(text)

    watched = Watched()
    with spinning("loading big.yaml", stream=watched, after=0):
        assert shown.wait(10)
    assert "loading big.yaml" in watched.getvalue()
    assert watched.getvalue().endswith("\r")


@pytest.mark.parametrize(
    "argv",
    [
        ["bench", "--algorithm", "gcra", "--seconds", "0.3"],
        ["simulate", "--members", "2", "--seconds", "30"],
    ],
)
def test_long_commands_show_progress_on_a_terminal_but_not_with_json(
    argv: list[str], monkeypatch: pytest.MonkeyPatch, capsys: Capture
) -> None:
    for as_json in (False, True):
        terminal = Terminal()
        monkeypatch.setattr(sys, "stderr", terminal)
        assert main([*argv, "--json"] if as_json else argv) == 0
        out = capsys.readouterr().out
        if as_json:
            json.loads(out)
            assert terminal.getvalue() == ""
        else:
            assert re.search(r"\[#*\.*\] +\d+%", terminal.getvalue())


def test_every_command_says_what_it_does_and_every_option_has_help() -> None:
    from ratewarden.cli._main import _subcommands, build_parser  # noqa: PLC0415

    for parser in _subcommands(build_parser()):
        if any(isinstance(a, argparse._SubParsersAction) for a in parser._actions):
            continue  # `quota`, `override`: their verbs say it
        assert parser.description, f"{parser.prog} --help has no description"
        for action in parser._actions:
            if action.option_strings and action.dest != "help":
                assert action.help, f"{parser.prog} {action.option_strings[0]} has no help"
