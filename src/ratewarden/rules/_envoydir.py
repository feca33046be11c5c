"""Where envoy configuration files come from: files named one by one, or a
runtime directory of them, as envoyproxy/ratelimit reads its runtime directory.

A directory gives every ``.yaml`` and ``.yml`` file in it and below it, in name
order. Names starting with a dot are passed over: editors' temporaries, and a
Kubernetes ConfigMap's own plumbing (its ``..data`` symlink and the
``..<timestamp>`` directory it points to, whose files the ConfigMap's visible
symlinks already name, so reading both would load every file twice). Any other
file is listed in `EnvoyFiles.ignored` for the caller to report.

`fingerprint` says when to reload: it changes when a file is added, removed,
renamed or rewritten, and when a ConfigMap swaps its ``..data`` symlink (the
visible names stay, the files they lead to are new ones).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from .._errors import ConfigurationError

__all__ = ["MAX_FILES", "EnvoyFiles", "envoy_files", "fingerprint"]

MAX_FILES = 10_000  # a directory with more is a mistake (a mount of the wrong tree)
_SUFFIXES = (".yaml", ".yml")


@dataclass(frozen=True, slots=True)
class EnvoyFiles:
    files: tuple[Path, ...]
    ignored: tuple[Path, ...]


def envoy_files(paths: Sequence[str | os.PathLike[str]]) -> EnvoyFiles:
    """The configuration files ``paths`` name, each a file or a directory."""
    files: list[Path] = []
    ignored: list[Path] = []
    for given in paths:
        path = Path(given)
        if path.is_dir():
            _walk(path, files, ignored)
        elif path.exists():
            files.append(path)
        else:
            raise ConfigurationError(f"envoy config {path}: no such file or directory")
        if len(files) > MAX_FILES:
            raise ConfigurationError(f"envoy config {path}: more than {MAX_FILES} files")
    return EnvoyFiles(tuple(files), tuple(ignored))


def _walk(directory: Path, files: list[Path], ignored: list[Path]) -> None:
    try:
        entries = sorted(os.scandir(directory), key=lambda e: e.name)
    except OSError as exc:
        raise ConfigurationError(f"envoy config {directory}: {exc.strerror}") from None
    for entry in entries:
        if entry.name.startswith("."):
            continue
        path = Path(entry.path)
        try:
            is_dir = entry.is_dir(follow_symlinks=False)
            is_file = entry.is_file()  # a symlink to a file counts as the file
        except OSError:
            continue  # gone since listed: the next fingerprint sees it
        if is_dir:
            _walk(path, files, ignored)
        elif is_file and entry.name.endswith(_SUFFIXES):
            files.append(path)
        else:
            ignored.append(path)
        if len(files) > MAX_FILES:
            return


def fingerprint(paths: Sequence[str | os.PathLike[str]]) -> tuple[object, ...]:
    """What the files are now: their names and, through any symlinks, their
    identity and size and modification time. Unreadable paths are part of it."""
    try:
        found = envoy_files(paths)
    except ConfigurationError as exc:
        return (str(exc),)
    out: list[object] = []
    for path in found.files:
        try:
            st = os.stat(path)
        except OSError:
            out.append((str(path), None))
            continue
        out.append((str(path), st.st_ino, st.st_dev, st.st_size, st.st_mtime_ns))
    return tuple(out)
