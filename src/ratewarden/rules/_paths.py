"""Path patterns and the index that matches a path against all of them at once.

A pattern starts with ``/`` and is split into ``/``-separated segments:

- ``/api/login``           exact;
- ``/api/v1/orders*``      prefix: a trailing ``*`` matches the rest of the path,
                           ``/`` included (``/api/v1/orders``, ``/api/v1/orders/7``,
                           ``/api/v1/orders-archive``);
- ``/users/{id}/posts``    a ``{name}`` segment matches exactly one non-empty segment;
- ``/api/*/health``        any other glob (``*``, ``?``, ``[abc]``) matches within
                           one segment, except that a trailing ``*`` matches the rest.

Matching cost must not grow with the number of patterns, so:

- exact patterns are one dict keyed by the whole path (one lookup);
- the others sit in a trie of segments: literal segments are dict children,
  ``{name}`` segments a single wildcard child, a prefix pattern's last
  segment-prefix a dict at its node (looked up once per distinct prefix length
  there), and globs a list of compiled regexes at the node of their last literal
  segment, matched against the rest of the path. The walk costs O(depth)
  dict lookups, plus the globs that share a literal stem with the path.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Generic, Literal, TypeVar
from urllib.parse import unquote

from ..primitives import ConfigurationError

__all__ = ["PathIndex", "Pattern", "parse_pattern", "walk"]

T = TypeVar("T")
Kind = Literal["exact", "param", "glob", "prefix"]

_PARAM = re.compile(r"^\{[A-Za-z_][A-Za-z0-9_]*\}$")
_GLOB_CHARS = frozenset("*?[")


@dataclass(frozen=True, slots=True)
class Pattern:
    text: str
    kind: Kind
    stem: tuple[str | None, ...]  # trie segments before the tail; None: a {param}
    tail: str  # prefix: the segment prefix; glob: the regex of the rest; else ""
    literal: int  # literal characters: the more, the more specific

    @property
    def regex(self) -> str:
        """The whole pattern as one regex over the path without its leading '/':
        the slow, obviously right matcher that explanations and tests use."""
        return _glob_regex(self.text[1:].split("/"), self.text)

    @property
    def specificity(self) -> tuple[int, int]:
        rank = {"exact": 4, "param": 3, "glob": 2, "prefix": 1}[self.kind]
        return rank, self.literal


def parse_pattern(text: str) -> Pattern:
    """Parse one path pattern; `ConfigurationError` says what is wrong with it."""
    if not text.startswith("/"):
        raise ConfigurationError(f"a path pattern starts with '/', got {text!r}")
    if "**" in text:
        raise ConfigurationError(
            f"'**' in {text!r}: a trailing '*' already matches the rest of the path"
        )
    segments = text[1:].split("/")
    literal = sum(len(s) for s in segments if not _PARAM.match(s)) + len(segments)
    stem: list[str | None] = []
    for i, segment in enumerate(segments):
        last = i == len(segments) - 1
        if _PARAM.match(segment):
            stem.append(None)
            continue
        if "{" in segment or "}" in segment:
            raise ConfigurationError(
                f"bad segment {segment!r} in {text!r}: a parameter is a whole segment, '{{name}}'"
            )
        if not _GLOB_CHARS & set(segment) and "]" not in segment:
            stem.append(segment)
            continue
        body = segment[:-1]
        if last and segment.endswith("*") and not (_GLOB_CHARS | {"]"}) & set(body):
            return Pattern(text, "prefix", tuple(stem), body, literal - 1)
        regex = _glob_regex(segments[i:], text)
        return Pattern(text, "glob", tuple(stem), regex, literal)
    kind: Kind = "param" if None in stem else "exact"
    return Pattern(text, kind, tuple(stem), "", literal)


def _glob_regex(segments: list[str], text: str) -> str:
    parts = []
    for i, segment in enumerate(segments):
        if _PARAM.match(segment):
            parts.append("[^/]+")
            continue
        out, j = [], 0
        while j < len(segment):
            char = segment[j]
            if char == "*":
                trailing = i == len(segments) - 1 and j == len(segment) - 1
                out.append(".*" if trailing else "[^/]*")
            elif char == "?":
                out.append("[^/]")
            elif char == "[":
                end = segment.find("]", j + 2)
                if end < 0:
                    raise ConfigurationError(f"unclosed '[' in path pattern {text!r}")
                inner = segment[j + 1 : end]
                if inner.startswith("!"):
                    inner = "^" + inner[1:]
                out.append("[" + inner.replace("\\", "\\\\") + "]")
                j = end
            elif char == "]":
                raise ConfigurationError(f"']' without '[' in path pattern {text!r}")
            else:
                out.append(re.escape(char))
            j += 1
        parts.append("".join(out))
    regex = "/".join(parts)
    try:
        re.compile(regex)
    except re.error as exc:
        raise ConfigurationError(f"bad glob in path pattern {text!r}: {exc}") from None
    return regex


class _Node(Generic[T]):
    __slots__ = ("children", "ends", "globs", "param", "plain", "prefix_lengths", "prefixes")

    def __init__(self) -> None:
        self.plain = True  # no prefixes, globs or param child: the walk only follows children
        self.children: dict[str, _Node[T]] = {}
        self.param: _Node[T] | None = None
        self.ends: list[T] = []
        self.prefixes: dict[str, list[T]] = {}
        self.prefix_lengths: tuple[int, ...] = ()
        self.globs: list[tuple[re.Pattern[str], list[T]]] = []


class PathIndex(Generic[T]):
    """Items (rules) filed under path patterns; ``lookup(path)`` returns the items
    of every pattern that matches, each once per matching pattern."""

    __slots__ = ("exact", "root", "trie_used")  # read directly by RuleSet.evaluate

    def __init__(self) -> None:
        self.exact: dict[str, list[T]] = {}
        self.root: _Node[T] = _Node()
        self.trie_used = False

    def add(self, pattern: Pattern, item: T) -> None:
        if pattern.kind == "exact":
            self.exact.setdefault(pattern.text, []).append(item)
            return
        self.trie_used = True
        node = self.root
        for segment in pattern.stem:
            if segment is None:
                if node.param is None:
                    node.param = _Node()
                    node.plain = False
                node = node.param
            else:
                node = node.children.setdefault(segment, _Node())
        if pattern.kind == "param":
            node.ends.append(item)
        elif pattern.kind == "prefix":
            node.prefixes.setdefault(pattern.tail, []).append(item)
            node.plain = False
            node.prefix_lengths = tuple(sorted({len(p) for p in node.prefixes}))
        else:
            regex = re.compile(pattern.tail)
            node.plain = False
            for existing, items in node.globs:
                if existing.pattern == pattern.tail:
                    items.append(item)
                    break
            else:
                node.globs.append((regex, [item]))

    def lookup(self, path: str) -> list[T]:
        out: list[T] = []
        self.collect(path, out)
        return out

    def collect(self, path: str, out: list[T]) -> None:
        """`lookup`, appending to ``out`` (the caller's list of candidates)."""
        found = self.exact.get(path)
        if found is not None:
            out += found
        if self.trie_used:
            segments = path[1:].split("/")
            walk(self.root, segments, 0, len(segments), out)


def normalize_path(path: str) -> str:
    """A request path as a server routes it, so that rules cannot be dodged by
    spelling: the query string dropped, percent-escapes decoded, ``//`` merged,
    ``.`` and ``..`` segments resolved (never above the root); a trailing slash
    kept. ``/%61pi//v1/./orders`` is ``/api/v1/orders``."""
    path = path.partition("?")[0]
    if "%" in path:
        path = unquote(path)
    if "//" not in path and "/." not in path:
        return path if path.startswith("/") else "/" + path
    segments: list[str] = []
    for segment in path.split("/"):
        if segment in ("", "."):
            continue
        if segment == "..":
            if segments:
                segments.pop()
            continue
        segments.append(segment)
    tail = "/" if segments and path.endswith(("/", "/.", "/..")) else ""
    return "/" + "/".join(segments) + tail


def walk(node: _Node[T], segments: list[str], i: int, count: int, out: list[T]) -> None:
    """Follow the literal children down the path, gathering the items of every
    pattern that matches; a ``{param}`` child is a second branch, walked by a
    recursive call (the only one: paths are short and params rare)."""
    while i < count:
        segment = segments[i]
        if not node.plain:
            if node.prefix_lengths:
                prefixes = node.prefixes
                for length in node.prefix_lengths:  # ascending
                    if length > len(segment):
                        break  # a shorter slice would match a shorter prefix twice
                    items = prefixes.get(segment[:length])
                    if items is not None:
                        out.extend(items)
            if node.globs:
                rest = "/".join(segments[i:])
                for regex, items in node.globs:
                    if regex.fullmatch(rest):
                        out.extend(items)
            if node.param is not None and segment:
                walk(node.param, segments, i + 1, count, out)
        i += 1
        child = node.children.get(segment)
        if child is None:
            return
        node = child
    out.extend(node.ends)
