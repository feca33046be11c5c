"""What is wrong with a rule file, said so that an operator can fix it.

Reading a rule file without trusting it: size first, then bytes, then YAML.

What comes out is plain data (dicts, lists, scalars) plus a way back from a
position in that data (``$.rules[3].rate``, msgspec's notation) to the line of
the file it came from, so every later error can name the line.

Refused before any YAML is built: files over `MAX_BYTES` (checked on the size,
then again on what was read, in case the file grew), text that is not UTF-8,
NUL bytes. Refused while composing: aliases (``*name``; a "billion laughs" file
is nothing but aliases, and a rule file has no need of them), several documents
in one file, nesting deep enough to exhaust the parser, and duplicate keys in a
mapping (PyYAML would silently keep the last, hiding an operator's typo).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from ..primitives import ConfigurationError

__all__ = [
    "MAX_BYTES",
    "Document",
    "Problem",
    "RuleFileError",
    "parse_plain",
    "parse_text",
    "read_file",
]


@dataclass(frozen=True, slots=True)
class Problem:
    """One thing wrong (or, as a warning, suspicious) in a rule file.

    Any of ``line``, ``rule`` and ``field`` may be unknown (``None``): an empty
    file has no line, a bad top-level key no rule.
    """

    file: str
    line: int | None
    rule: str | None
    field: str | None
    reason: str

    def __str__(self) -> str:
        where = self.file if self.line is None else f"{self.file}:{self.line}"
        what = []
        if self.rule is not None:
            what.append(f"rule {self.rule!r}")
        if self.field is not None:
            what.append(f"field {self.field!r}")
        return f"{where}: " + (", ".join(what) + ": " if what else "") + self.reason


class RuleFileError(ConfigurationError):
    """A rule file that cannot be used; ``problems`` lists everything found wrong
    (at least one), each with its file, line, rule, field and reason."""

    def __init__(self, *problems: Problem) -> None:
        self.problems = problems
        if len(problems) == 1:
            message = str(problems[0])
        else:
            message = f"{len(problems)} problems:\n" + "\n".join(f"  {p}" for p in problems)
        super().__init__(message)


# 10,000 commented rules are about 3 MB of YAML; anything much larger is a mistake
# (or an attack) and is refused before a byte of it is parsed.
MAX_BYTES = 8 * 1024 * 1024

_PATH_PART = re.compile(r"\.([^.\[]+)|\[(\d+)\]")
_UNKNOWN_FIELD = re.compile(r"unknown field `([^`]+)`")


@dataclass(slots=True)
class Document:
    """A parsed rule file: its data and the node tree that remembers lines."""

    filename: str
    data: object
    root: yaml.Node | None = field(repr=False)

    def line_of(self, path: str, message: str = "") -> int | None:
        """The 1-based line of the value at ``path`` (``$.rules[2].match``), or of the
        nearest enclosing value that exists; for msgspec's "unknown field `x`"
        message, the line of the key ``x`` itself."""
        node = self._node(path)
        if node is None:
            return None
        unknown = _UNKNOWN_FIELD.search(message)
        if unknown and isinstance(node, yaml.MappingNode):
            for key, _ in node.value:
                if isinstance(key, yaml.ScalarNode) and key.value == unknown[1]:
                    return int(key.start_mark.line) + 1
        return int(node.start_mark.line) + 1

    def line_of_key(self, path: str, key: object) -> int | None:
        """The line of the key ``key`` in the mapping at ``path``; else that of the
        mapping (or the nearest enclosing value that exists)."""
        node = self._node(path)
        if node is None:
            return None
        if isinstance(node, yaml.MappingNode):
            for name, _ in node.value:
                if isinstance(name, yaml.ScalarNode) and _same_key(name, key):
                    return int(name.start_mark.line) + 1
        return int(node.start_mark.line) + 1

    def _node(self, path: str) -> yaml.Node | None:
        node = self.root
        if node is None:
            return None
        for name, index in _PATH_PART.findall(path.removeprefix("$")):
            child = _child(node, name if not index else int(index))
            if child is None:
                break
            node = child
        return node


def _same_key(node: yaml.ScalarNode, key: object) -> bool:
    """Whether a key node is the key ``key`` of the data: a string key is its text;
    any other (``1``, ``true``, ``on``) is compared as the loader would read it."""
    if isinstance(key, str):
        return node.tag == "tag:yaml.org,2002:str" and node.value == key
    construct = yaml.SafeLoader.yaml_constructors.get(node.tag)
    try:
        return construct is not None and bool(construct(_NUMBER_MAKER, node) == key)
    except (yaml.YAMLError, ValueError):
        return False


def _child(node: yaml.Node, part: str | int) -> yaml.Node | None:
    if isinstance(node, yaml.MappingNode) and isinstance(part, str):
        for key, value in node.value:
            if isinstance(key, yaml.ScalarNode) and key.value == part:
                return value  # type: ignore[no-any-return]
    if isinstance(node, yaml.SequenceNode) and isinstance(part, int) and part < len(node.value):
        return node.value[part]  # type: ignore[no-any-return]
    return None


def read_file(
    path: str | os.PathLike[str], *, max_bytes: int = MAX_BYTES, plain: bool = False
) -> Document:
    """Read and parse the rule file at ``path``; `RuleFileError` for anything wrong.
    ``plain``: see `parse_plain`."""
    filename = os.fspath(path)
    try:
        size = os.stat(filename).st_size
        if size > max_bytes:
            raise _refuse_size(filename, size, max_bytes)
        with Path(filename).open("rb") as f:
            raw = f.read(max_bytes + 1)
    except OSError as exc:
        reason = f"cannot read: {exc.strerror}"
        raise RuleFileError(Problem(filename, None, None, None, reason)) from None
    if len(raw) > max_bytes:
        raise _refuse_size(filename, len(raw), max_bytes)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        reason = f"not UTF-8 text (byte 0x{raw[exc.start]:02x}); is this a binary file?"
        raise RuleFileError(Problem(filename, line, None, None, reason)) from None
    return _parse(text, filename, max_bytes, plain=plain)


def _refuse_size(filename: str, size: int, max_bytes: int) -> RuleFileError:
    reason = (
        f"{size:,} bytes is more than a rule file may hold ({max_bytes:,} bytes);"
        " refusing to parse it"
    )
    return RuleFileError(Problem(filename, None, None, None, reason))


def parse_text(text: str, filename: str = "<string>", *, max_bytes: int = MAX_BYTES) -> Document:
    """Parse rule-file text (see the module docstring for what is refused)."""
    return _parse(text, filename, max_bytes, plain=False)


def parse_plain(text: str, filename: str = "<string>", *, max_bytes: int = MAX_BYTES) -> Document:
    """`parse_text` for files of plain data (mappings, lists, strings, numbers,
    booleans, null), built straight from the nodes: a third faster on large
    files, the same data (anything else falls back to PyYAML's constructor)."""
    return _parse(text, filename, max_bytes, plain=True)


def _parse(text: str, filename: str, max_bytes: int, *, plain: bool) -> Document:
    if len(text) > max_bytes:
        raise _refuse_size(filename, len(text), max_bytes)
    nul = text.find("\x00")
    if nul >= 0:
        line = text.count("\n", 0, nul) + 1
        reason = "contains a NUL byte; is this a binary file?"
        raise RuleFileError(Problem(filename, line, None, None, reason))
    # libyaml composes ten times faster than PyYAML's Python parser (10,000 rules:
    # 0.5 s instead of 5 s, a reload's whole cost), but cannot be told to refuse
    # aliases as it meets them. It does not expand them either (an alias is the
    # anchored node, shared), so a shared node found afterwards means an alias,
    # and the Python loader then parses again to say where it is.
    loader: yaml.SafeLoader | yaml.CSafeLoader = (
        _Loader(text) if _CLoader is None else _CLoader(text)
    )
    try:
        deep = _too_deep(text)
        if deep is not None:
            reason = f"nested more than {_MAX_DEPTH} levels deep: not a rule file"
            raise RuleFileError(Problem(filename, deep, None, None, reason))
        root = loader.get_single_node()
        if root is None:
            reason = "the file is empty: expected a mapping with a 'rules:' list"
            raise RuleFileError(Problem(filename, None, None, None, reason))
        if not _check_nodes(root, filename):
            _Loader(text).get_single_node()  # raises at the first alias
        data = _plain(root) if plain else _NOT_PLAIN
        if data is _NOT_PLAIN:
            data = loader.construct_document(root)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        at = None if mark is None else int(mark.line) + 1
        reason = " ".join(str(p) for p in (exc.context, exc.problem) if p) or "not valid YAML"
        raise RuleFileError(Problem(filename, at, None, None, reason)) from None
    except yaml.YAMLError as exc:
        raise RuleFileError(Problem(filename, None, None, None, f"not valid YAML: {exc}")) from None
    except RecursionError:
        reason = "nested too deeply to be a rule file"
        raise RuleFileError(Problem(filename, None, None, None, reason)) from None
    finally:
        loader.dispose()
    return Document(filename, data, root)


_NOT_PLAIN = object()
_STR, _NULL, _BOOL = "tag:yaml.org,2002:str", "tag:yaml.org,2002:null", "tag:yaml.org,2002:bool"
_MAP, _SEQ = "tag:yaml.org,2002:map", "tag:yaml.org,2002:seq"
_NUMBERS = {"tag:yaml.org,2002:int": "construct_yaml_int",
            "tag:yaml.org,2002:float": "construct_yaml_float"}  # fmt: skip
_NUMBER_MAKER = yaml.SafeLoader("")


def _plain(root: yaml.Node) -> object:
    """The data of a node tree whose tags are all plain ones, or `_NOT_PLAIN`.
    Iterative: a deep file cannot exhaust the stack here."""
    out: list[object] = [None]
    stack: list[tuple[yaml.Node, object, object]] = [(root, out, 0)]
    while stack:
        node, into, slot = stack.pop()
        tag = node.tag
        value: object
        if isinstance(node, yaml.ScalarNode):
            if tag == _STR:
                value = node.value
            elif tag == _NULL:
                value = None
            elif tag == _BOOL:
                value = yaml.constructor.SafeConstructor.bool_values[node.value.lower()]
            elif tag in _NUMBERS:
                value = getattr(_NUMBER_MAKER, _NUMBERS[tag])(node)
            else:
                return _NOT_PLAIN
        elif isinstance(node, yaml.MappingNode) and tag == _MAP:
            mapping: dict[object, object] = {}
            for key, item in node.value:
                if not isinstance(key, yaml.ScalarNode) or key.tag not in (_STR, *_NUMBERS):
                    return _NOT_PLAIN  # merge keys, complex keys: PyYAML's own way
                name = key.value
                if key.tag != _STR:
                    name = getattr(_NUMBER_MAKER, _NUMBERS[key.tag])(key)
                mapping[name] = None
                stack.append((item, mapping, name))
            value = mapping
        elif isinstance(node, yaml.SequenceNode) and tag == _SEQ:
            value = [None] * len(node.value)
            stack.extend((item, value, i) for i, item in enumerate(node.value))
        else:
            return _NOT_PLAIN
        into[slot] = value  # type: ignore[index]
    return out[0]


_MAX_DEPTH = 64  # a rule file nests about 5 deep
_SHALLOW = 16_384  # below this many characters no nesting can hurt the composer


def _too_deep(text: str) -> int | None:
    """The line where nesting passes `_MAX_DEPTH`, if it does. libyaml composes
    nodes recursively in C: some 50,000 levels (100 KB of ``[[[...``) crash the
    process, where no RecursionError can catch it. Its event parser is not
    recursive, so a pass over the events finds the depth first (on larger files
    only: a small one cannot nest that deep)."""
    if len(text) < _SHALLOW:
        return None
    depth = 0
    starts = (yaml.SequenceStartEvent, yaml.MappingStartEvent)
    ends = (yaml.SequenceEndEvent, yaml.MappingEndEvent)
    try:
        for event in yaml.parse(text, Loader=_CLoader or yaml.SafeLoader):
            if isinstance(event, starts):
                depth += 1
                if depth > _MAX_DEPTH:
                    mark = event.start_mark
                    return 1 if mark is None else int(mark.line) + 1
            elif isinstance(event, ends):
                depth -= 1
    except yaml.MarkedYAMLError as exc:
        # PyYAML >= 6.0.4 bounds nesting in its parser too (at 1,000 flow levels):
        # the same refusal, said in the same words as below that bound
        if "nesting depth" not in str(exc.problem):
            raise
        mark = exc.problem_mark
        return 1 if mark is None else int(mark.line) + 1
    return None


class _Loader(yaml.SafeLoader):
    """SafeLoader that refuses aliases while composing, before anything is expanded."""

    def compose_node(self, parent: yaml.Node | None, index: int) -> yaml.Node | None:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()  # type: ignore[no-untyped-call]
            raise yaml.composer.ComposerError(
                None,
                None,
                "aliases (*name) are not allowed in a rule file: write each value out",
                event.start_mark,
            )
        return super().compose_node(parent, index)


_CLoader = getattr(yaml, "CSafeLoader", None)


def _check_nodes(root: yaml.Node, filename: str) -> bool:
    """Refuse duplicate keys; False if some node is reached twice (an alias)."""
    seen: set[int] = set()
    stack = [root]
    while stack:
        node = stack.pop()
        if id(node) in seen:
            return False
        seen.add(id(node))
        if isinstance(node, yaml.MappingNode):
            keys: dict[str, int] = {}
            for key, value in node.value:
                if isinstance(key, yaml.ScalarNode):
                    line = int(key.start_mark.line) + 1
                    if key.value in keys:
                        reason = (
                            f"duplicate key {key.value!r} (first at line {keys[key.value]});"
                            " YAML would silently keep only the last"
                        )
                        raise RuleFileError(Problem(filename, line, None, None, reason))
                    keys[key.value] = line
                stack.append(key)
                stack.append(value)
        elif isinstance(node, yaml.SequenceNode):
            stack.extend(node.value)
    return True
