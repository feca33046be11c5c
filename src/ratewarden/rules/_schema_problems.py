"""How a rule file's problems of shape are found and said.

msgspec checks the shape (unknown fields, wrong types, bad enum values) in one
call, which stops at the first mismatch; when there is one, `Shape` walks the
file field by field to find them all (an unknown field names the closest known
one, a bad enum value lists the valid ones) and keeps what has the right shape,
so that the checks of meaning (`_schema_checks`) can look at that too.
"""

from __future__ import annotations

import difflib
import functools
import re
import typing
from typing import Any, Literal

import msgspec

from ._schema import Rule, RuleFile
from .source import Document, Problem, RuleFileError

__all__ = ["Shape", "in_order", "nearest", "type_problem"]


def in_order(problems: list[Problem]) -> list[Problem]:
    """As an operator reads the file: top to bottom (those without a line first)."""
    return sorted(problems, key=lambda p: p.line or 0)


def nearest(word: object, choices: typing.Iterable[object]) -> str | None:
    return _closest_of(str(word), tuple(str(c) for c in choices))


@functools.lru_cache(maxsize=1024)  # a file misspells the same few names again and again
def _closest_of(word: str, choices: tuple[str, ...]) -> str | None:
    found = difflib.get_close_matches(word, choices, n=1, cutoff=0.6)
    return found[0] if found else None


@functools.cache
def _fields(struct: type[msgspec.Struct]) -> dict[str, msgspec.structs.FieldInfo]:
    """A Struct's fields by their names in the file (msgspec resolves the
    annotations anew on every call)."""
    return {f.encode_name: f for f in msgspec.structs.fields(struct)}


def _struct_in(kind: Any) -> type[msgspec.Struct] | None:
    """The Struct a field's type holds (``Match | None``, ``int | CostFrom``), if any."""
    if isinstance(kind, type) and issubclass(kind, msgspec.Struct):
        return kind
    for arg in typing.get_args(kind):
        if isinstance(arg, type) and issubclass(arg, msgspec.Struct):
            return arg
    return None


def _literals(kind: Any) -> list[object]:
    """The values a field's ``Literal`` type (maybe within ``| None``) allows."""
    if typing.get_origin(kind) is Literal:
        return list(typing.get_args(kind))
    return [value for arg in typing.get_args(kind) for value in _literals(arg)]


class Shape:
    """Every shape problem of a file msgspec refused, and the part of it that has
    the right shape, so that `_check` can look at that too.

    A mapping's fields are taken one at a time: an unknown field is reported
    (with the closest known name) and left out, a value of the wrong type is
    reported and left out, a missing required field is reported unless an unknown
    one is its misspelling. A rule that lacks a required field cannot be checked
    further and is left out whole; ``kept`` holds the file index of each rule that
    stays. ``dropped`` holds, per kept rule, the fields that were left out or
    misspelt: what the file meant for them is unknown, so `_check` does not judge
    the fields that go with them. ``partial``: the fields whose own mapping lost
    a part."""

    def __init__(self, document: Document) -> None:
        self.document = document
        self.problems: list[Problem] = []
        self.kept: list[int] = []
        self.dropped: list[set[str]] = []
        self.partial: list[set[str]] = []
        self.file_dropped: set[str] = set()
        self.rules_given = False  # the file has a list of rules, not empty
        self.defaults_unsure = False  # the defaults that rules go by lost a part

    def _problem(self, path: str, rule: str | None, field: str | None, reason: str) -> None:
        line = self.document.line_of(path)
        self.problems.append(Problem(self.document.filename, line, rule, field, reason))

    def file(self, data: object) -> dict[str, object]:
        if not isinstance(data, dict):
            reason = "the file must be a mapping with a 'rules:' list, e.g. 'rules: [...]'"
            self._problem("$", None, None, reason)
            self.file_dropped.add("rules")
            return {"rules": []}
        clean, self.file_dropped, partial = self._mapping(
            data, RuleFile, "$", "", rule=None, skip={"rules"}
        )
        self.defaults_unsure = bool(partial.get("defaults", set()) & {"algorithm", "store"})
        rules = data.get("rules")
        kept: list[dict[str, object]] = []
        if isinstance(rules, list):
            self.rules_given = bool(rules)
            for i, item in enumerate(rules):
                at = f"$.rules[{i}]"
                rule = _rule_name(item, i)
                if not isinstance(item, dict):
                    self._type(item, Rule, at, rule, None)
                    continue
                fields, dropped, lost = self._mapping(item, Rule, at, "", rule=rule)
                if fields is not None:
                    kept.append(fields)
                    self.kept.append(i)
                    self.dropped.append(dropped)
                    self.partial.append(set(lost))
        elif "rules" in data:
            self._type(rules, list[Rule], "$.rules", None, "rules")
            self.file_dropped.add("rules")
        else:
            # a misspelling says it, or the file is an rlqs section alone
            if "rules" not in self.file_dropped and "rlqs" not in data:
                self._problem("$", None, "rules", "missing required field 'rules'")
            self.file_dropped.add("rules")
        return {**(clean or {}), "rules": kept}

    def _mapping(
        self, data: dict[Any, Any], struct: type[msgspec.Struct], at: str, prefix: str, *,
        rule: str | None, skip: frozenset[str] | set[str] = frozenset(),
    ) -> tuple[dict[str, object] | None, set[str], dict[str, set[str]]]:  # fmt: skip
        """The fields of ``data`` that have the right shape (None if a required one
        is missing or wrong), the fields left out or misspelt, and for each field
        whose own mapping lost a part, the parts it lost."""
        fields = _fields(struct)
        clean: dict[str, object] = {}
        dropped: set[str] = set()
        partial: dict[str, set[str]] = {}
        for key, value in data.items():
            field = fields.get(key) if isinstance(key, str) else None
            if field is None:
                closest = nearest(key, fields)
                if closest is not None:
                    dropped.add(closest)
                    hint = f": did you mean {closest!r}?"
                else:
                    hint = f" (the fields here: {', '.join(fields)})"
                line = self.document.line_of_key(at, key)
                reason = f"unknown field {key!r}{hint}"
                self.problems.append(Problem(self.document.filename, line, rule, f"{prefix}{key}",
                                             reason))  # fmt: skip
                continue
            if key in skip:
                continue
            inner = _struct_in(field.type)
            if inner is not None and isinstance(value, dict):
                here = f"{at}.{key}"
                nested, lost, _ = self._mapping(value, inner, here, f"{prefix}{key}.", rule=rule)
                if nested is None:
                    dropped.add(key)
                else:
                    clean[key] = nested
                    if lost or len(nested) < len(value):
                        partial[key] = lost
            elif self._type(value, field.type, f"{at}.{key}", rule, f"{prefix}{key}"):
                clean[key] = value
            else:
                dropped.add(key)
        whole = True
        for field in fields.values():
            name = field.encode_name
            if field.required and name not in clean and name not in skip:
                whole = False
                if name not in data and name not in dropped and name not in skip:
                    self._problem(at, rule, f"{prefix}{name}", f"missing required field {name!r}")
        return (clean if whole else None), dropped, partial

    def _type(self, value: object, kind: Any, at: str, rule: str | None, field: str | None) -> bool:
        """Whether ``value`` is a ``kind``; if not, the problem is reported."""
        try:
            msgspec.convert(value, kind)
        except msgspec.ValidationError as exc:
            text, _, inside = str(exc).partition(" - at `")
            # "$[1]": an item of a list; "$[...]": a value of a mapping, no line of its own
            where = at + inside.rstrip("`").removeprefix("$").replace("[...]", "")
            choices = _literals(kind)
            if text.startswith("Invalid enum value") and choices:
                text += f": expected one of {', '.join(map(str, choices))}"
                closest = nearest(value, choices)
                if closest is not None:
                    text += f"; did you mean {closest!r}?"
            self._problem(where, rule, field, text)
            return False
        return True


def _rule_name(item: object, index: int) -> str:
    """How a problem names a rule: its name, else its place (``#3``)."""
    name = item.get("name") if isinstance(item, dict) else None
    return name if isinstance(name, str) else f"#{index + 1}"


def type_problem(document: Document, message: str) -> RuleFileError:
    text, _, at = message.partition(" - at `")
    path = at.rstrip("`") if at else "$"
    if path == "$" and "Expected `object`" in text:
        text = "the file must be a mapping with a 'rules:' list, e.g. 'rules: [...]'"
    line = document.line_of(path, text)
    rule, field = _rule_and_field(document.data, path, text)
    return RuleFileError(Problem(document.filename, line, rule, field, text))


def _rule_and_field(data: object, path: str, text: str) -> tuple[str | None, str | None]:
    """The rule name (if the path is inside ``rules[i]``) and field the path names."""
    match = re.match(r"^\$\.rules\[(\d+)\](.*)$", path)
    unknown = re.search(r"unknown field `([^`]+)`", text)
    missing = re.search(r"missing required field `([^`]+)`", text)
    named = unknown or missing
    if match is None:
        field = path.removeprefix("$").lstrip(".") or None
        if named:
            field = f"{field}.{named[1]}" if field else named[1]
        return None, field
    index, rest = int(match[1]), match[2].lstrip(".")
    rule = f"#{index + 1}"
    if isinstance(data, dict):
        rules = data.get("rules")
        if isinstance(rules, list) and index < len(rules) and isinstance(rules[index], dict):
            name = rules[index].get("name")
            if isinstance(name, str):
                rule = name
    field = re.sub(r"\[\d+\]$", "", rest) or None
    if named:
        field = f"{field}.{named[1]}" if field else named[1]
    return rule, field
