"""Reading envoyproxy/ratelimit configuration files into typed objects.

The file format is that service's: a ``domain`` and a tree of ``descriptors``,
each with ``key``, ``value``, ``rate_limit`` (``unit``, ``requests_per_unit``,
``unlimited``, ``name``, ``replaces``), ``shadow_mode``, ``quota_mode``,
``detailed_metric``, ``value_to_metric``, ``share_threshold``, ``metadata`` and
nested ``descriptors``. What it accepts is accepted here, read the same way:

- a value is the text the file spells (``01234`` stays "01234", ``yes`` "yes"),
  since that service reads values into a string; an empty value is no value;
- ``descriptors:`` with nothing after it is an empty list;
- ``requests_per_unit`` beside ``unlimited: true`` is allowed (and ignored);
- ``metadata`` is any mapping, handed back with the limit.

Each field belongs to its own level (``unit`` inside ``rate_limit``, not beside
``key``); that service's key check is flat and lets a misplaced field through
unread, which here is an error naming the line, since such a field is always a
mistake that silently changes nothing.

Where envoy configuration files come from: files named one by one, or a
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

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import yaml

from ..primitives import ConfigurationError
from ..rules.source import Document, Problem, RuleFileError, parse_plain, read_file

__all__ = [
    "MAX_FILES",
    "EnvoyDescriptor",
    "EnvoyFile",
    "EnvoyFiles",
    "EnvoyRateLimit",
    "envoy_files",
    "fingerprint",
    "parse_files",
]


class _Base(msgspec.Struct, forbid_unknown_fields=True, frozen=True, omit_defaults=True):
    pass


class _Replace(_Base, frozen=True):
    name: str | None = None


class EnvoyRateLimit(_Base, frozen=True):
    unit: str | None = None
    requests_per_unit: int | None = None
    unlimited: bool = False
    name: str | None = None
    replaces: list[_Replace] | None = None


class EnvoyDescriptor(_Base, frozen=True):
    key: str | None = None
    value: str | None = None
    rate_limit: EnvoyRateLimit | None = None
    descriptors: list[EnvoyDescriptor] | None = None
    shadow_mode: bool = False
    quota_mode: bool = False
    detailed_metric: bool = False
    value_to_metric: bool = False
    share_threshold: bool = False
    metadata: dict[str, Any] | None = None


class EnvoyFile(_Base, frozen=True):
    domain: str | None = None
    descriptors: list[EnvoyDescriptor] | None = None


_LEVELS: dict[str, frozenset[str]] = {
    "file": frozenset(EnvoyFile.__struct_fields__),
    "descriptor": frozenset(EnvoyDescriptor.__struct_fields__),
    "rate_limit": frozenset(EnvoyRateLimit.__struct_fields__),
    "replaces": frozenset(_Replace.__struct_fields__),
}
_CHILD = {"descriptors": "descriptor", "rate_limit": "rate_limit", "replaces": "replaces"}


def _check_keys(document: Document, data: object, level: str, at: str) -> None:
    """That service's key checks, with its words: a key that is not a string, an
    unknown key, a list of something other than mappings; each with its line."""

    def bad(where: str, reason: str) -> RuleFileError:
        line = document.line_of(where)
        return RuleFileError(Problem(document.filename, line, None, where.lstrip("$."), reason))

    if not isinstance(data, dict):
        raise bad(at, f"config error, expected a mapping, got {_show(data)}")
    for key, value in data.items():
        if not isinstance(key, str):
            raise bad(at, f"config error, key is not of type string: {_show(key)}")
        if key not in _LEVELS[level]:
            raise bad(f"{at}.{key}", f"config error, unknown key {key!r}")
        child = _CHILD.get(key)
        if child is None or value is None:
            continue
        here = f"{at}.{key}"
        if isinstance(value, list):
            for i, item in enumerate(value):
                if not isinstance(item, dict):
                    raise bad(
                        f"{here}[{i}]",
                        "config error, yaml file contains list of type other than map: "
                        + _show(item),
                    )
                _check_keys(document, item, child, f"{here}[{i}]")
        elif isinstance(value, dict):
            _check_keys(document, value, child, here)


def _show(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and math.isfinite(value):
        return repr(value)
    return str(value)


def _raw_values(node: yaml.Node | None, data: object) -> None:
    """Every descriptor ``key`` and ``value`` as the file spells it. That service
    reads them into string fields, so an unquoted ``01234`` is "01234", ``yes``
    "yes", ``12:30`` "12:30"; YAML 1.1 resolution would make them 668, True and
    750, and the limit would never match. An empty value means no value."""
    if isinstance(node, yaml.MappingNode) and isinstance(data, dict):
        for key_node, value_node in node.value:
            key = key_node.value
            if key not in data or key == "metadata":
                continue
            if key in ("value", "key", "domain", "unit", "name") and isinstance(
                value_node, yaml.ScalarNode
            ):
                if data[key] is not None and not isinstance(data[key], str):
                    data[key] = value_node.value
                if key == "value" and data[key] == "":
                    data[key] = None
            else:
                _raw_values(value_node, data[key])
    elif isinstance(node, yaml.SequenceNode) and isinstance(data, list):
        for item_node, item in zip(node.value, data, strict=False):
            _raw_values(item_node, item)


def _convert(document: Document) -> EnvoyFile:
    data = document.data
    if data is None:
        data = {}
    _check_keys(document, data, "file", "$")
    _raw_values(document.root, data)
    try:
        return msgspec.convert(data, EnvoyFile)
    except msgspec.ValidationError as exc:
        text, _, at = str(exc).partition(" - at `")
        path = at.rstrip("`") if at else "$"
        line = document.line_of(path, text)
        raise RuleFileError(Problem(document.filename, line, None, path, text)) from None


def parse_files(
    paths: Sequence[str | os.PathLike[str]], texts: Sequence[str] = ()
) -> list[tuple[EnvoyFile, Document]]:
    """Each file read, checked and typed, in the order given (which is the order
    a merged domain's descriptors are tried in)."""
    documents = [read_file(p, plain=True) for p in paths]
    documents += [parse_plain(t, "<string>") for t in texts]
    return [(_convert(d), d) for d in documents]


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
