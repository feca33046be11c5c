"""What is wrong with a rule file, said so that an operator can fix it."""

from __future__ import annotations

from dataclasses import dataclass

from .._errors import ConfigurationError

__all__ = ["Problem", "RuleFileError"]


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
