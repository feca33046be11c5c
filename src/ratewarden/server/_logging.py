"""``ratewarden serve``'s logs: JSON or text lines on stderr, libraries that log
headers kept at warning, and secrets blanked out of every line."""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Sequence
from typing import Any

__all__ = ["HEADER_LOGGERS", "JSONFormatter", "Redacting", "setup_logging"]

# Libraries that log header values at debug, bearer tokens included (hpack each
# header block it decodes, h2 each event): never below warning.
HEADER_LOGGERS = ("hpack", "h2")


class JSONFormatter(logging.Formatter):
    """One JSON object a line: time, level, logger, message, the exception, and
    a record's own ``fields`` (``extra={"fields": {...}}``, as the rule engine's
    log_only lines carry), which never replace the ones above."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
            "pid": record.process,
        }
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            entry.update((k, v) for k, v in fields.items() if k not in entry)
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


class Redacting(logging.Formatter):
    """Another formatter's lines with the secrets (the bearer token) blanked out:
    a second line of defence, should a library log a header after all."""

    def __init__(self, inner: logging.Formatter, secrets: Sequence[str]) -> None:
        super().__init__()
        self.inner = inner
        # as written, and as JSON escapes it
        self.secrets = sorted({form for s in secrets for form in (s, json.dumps(s)[1:-1])},
                              key=len, reverse=True)  # fmt: skip

    def format(self, record: logging.LogRecord) -> str:
        text = self.inner.format(record)
        for secret in self.secrets:
            text = text.replace(secret, "[redacted]")
        return text


def setup_logging(fmt: str, level: str, secrets: Sequence[str] = ()) -> None:
    """JSON or text lines on stderr. ``level`` is ratewarden's; the libraries log
    at info or above, and those that log headers at warning or above, so that
    ``--log-level debug`` never writes a bearer token. ``secrets`` (8 characters
    or more: a shorter one would blank out words) are blanked out besides."""
    handler = logging.StreamHandler(sys.stderr)
    formatter: logging.Formatter
    if fmt == "json":
        formatter = JSONFormatter()
    else:
        formatter = logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
    secrets = [s for s in secrets if len(s) >= 8]
    handler.setFormatter(Redacting(formatter, secrets) if secrets else formatter)
    root = logging.getLogger()
    root.handlers[:] = [handler]
    ours = logging.getLevelName(level.upper())
    root.setLevel(max(ours, logging.INFO))
    logging.getLogger("ratewarden").setLevel(ours)
    for name in HEADER_LOGGERS:
        logging.getLogger(name).setLevel(max(ours, logging.WARNING))
