"""Talking to a running ``ratewarden serve`` from the command line: the options
every such command takes (``--url``, ``--token-file``, ``--token``) and one JSON
request, its failures turned into `CliError`\\ s with the exit code they mean.

Plain ``urllib``: the core package stays free of an HTTP client dependency, and
a command makes one or two requests.
"""

from __future__ import annotations

import argparse
import json
import os
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from ._common import UNREACHABLE, USAGE, CliError

__all__ = ["DEFAULT_URL", "ServiceClient", "add_service_arguments", "client_from"]

DEFAULT_URL = "http://127.0.0.1:8080"
# Seconds a request to the service may take (connecting included).
TIMEOUT = 10.0
# The most of an answer read: a ratewarden answer is far smaller; a larger one
# comes from something else, and is not read into memory whole.
MAX_ANSWER = 16 * 1024 * 1024


def add_service_arguments(parser: argparse.ArgumentParser) -> None:
    """``--url``, ``--token-file`` and ``--token``, as every command that talks to
    the service spells them."""
    parser.add_argument(
        "--url",
        metavar="URL",
        help=f"the service's HTTP API (default $RATEWARDEN_URL, else "
        f"{DEFAULT_URL} where a service is needed)",
    )
    parser.add_argument(
        "--token-file",
        metavar="FILE",
        help="the service's bearer token, read from FILE (default $RATEWARDEN_TOKEN)",
    )
    parser.add_argument(
        "--token",
        metavar="TOKEN",
        help="the token itself (visible to other users in ps: "
        "prefer --token-file or $RATEWARDEN_TOKEN)",
    )


def client_from(args: argparse.Namespace) -> ServiceClient:
    """The client the options (and the environment) describe."""
    url = args.url or os.environ.get("RATEWARDEN_URL") or DEFAULT_URL
    token = args.token
    if args.token_file is not None:
        try:
            token = Path(args.token_file).read_text().strip()
        except (OSError, UnicodeDecodeError) as exc:
            raise CliError(f"--token-file {args.token_file}: {exc}", USAGE) from None
        if not token:
            raise CliError(f"--token-file {args.token_file} holds no token", USAGE)
    if token is None:
        token = os.environ.get("RATEWARDEN_TOKEN") or None
    return ServiceClient(url, token)


class ServiceClient:
    """JSON requests to one service. ``request`` returns the decoded answer of a
    2xx, or raises `CliError`: 2 for an answer that says our request was wrong
    (4xx, a missing or wrong token), 3 for a service that cannot be reached, fails
    (5xx) or does not speak ratewarden's JSON."""

    def __init__(self, url: str, token: str | None, timeout: float = TIMEOUT) -> None:
        if not url.startswith(("http://", "https://")):
            raise CliError(f"--url takes http://HOST:PORT or https://..., got {url!r}", USAGE)
        self.url = url.rstrip("/")
        self.token = token
        self.timeout = timeout

    def request(self, method: str, path: str, body: Any = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.url + path, data=data, method=method)
        request.add_header("Accept", "application/json")
        if data is not None:
            request.add_header("Content-Type", "application/json")
        if self.token is not None:
            request.add_header("Authorization", f"Bearer {self.token}")
        where = f"{method} {self.url}{path}"
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as answer:
                raw = answer.read(MAX_ANSWER + 1)
        except urllib.error.HTTPError as exc:
            raise self._refused(exc, where) from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise CliError(f"{where}: cannot reach the service: {reason}", UNREACHABLE) from None
        return self._decode(raw, where)

    def _refused(self, exc: urllib.error.HTTPError, where: str) -> CliError:
        try:
            text = exc.read(MAX_ANSWER)
            message = str(json.loads(text)["error"])
        except (OSError, ValueError, KeyError, TypeError):
            message = str(exc.reason)
        finally:
            exc.close()
        if exc.code == 401:
            hint = "; give one with --token-file or $RATEWARDEN_TOKEN" if self.token is None else ""
            return CliError(f"{where}: {exc.code} {message}{hint}", USAGE)
        code = UNREACHABLE if exc.code >= 500 else USAGE
        return CliError(f"{where}: {exc.code} {message}", code)

    @staticmethod
    def _decode(raw: bytes, where: str) -> Any:
        if len(raw) > MAX_ANSWER:
            raise CliError(f"{where}: the answer is larger than {MAX_ANSWER} bytes", UNREACHABLE)
        try:
            return json.loads(raw)
        except ValueError:
            raise CliError(f"{where}: the answer is not JSON: is this a ratewarden service?",
                           UNREACHABLE) from None  # fmt: skip
