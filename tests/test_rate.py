from __future__ import annotations

import pytest

from ratewarden import ConfigurationError, Rate, RatewardenError, parse_rate


@pytest.mark.parametrize(
    ("text", "limit", "period"),
    [
        ("100/minute", 100, 60),
        ("10 per second", 10, 1),
        ("5/2hours", 5, 7200),
        ("1000/day", 1000, 86400),
        ("3 per 2 minutes", 3, 120),
        ("7/week", 7, 604800),
        ("1/month", 1, 30 * 86400),
        ("2/year", 2, 365 * 86400),
        ("1/0.5s", 1, 0.5),
        (" 10 / Minute ", 10, 60),
        ("20/1.0hours", 20, 3600),
    ],
)
def test_parses(text: str, limit: int, period: float) -> None:
    rate = parse_rate(text)
    assert rate == Rate(limit, period)
    assert parse_rate(str(rate)) == rate  # round-trips through its string


@pytest.mark.parametrize(
    ("text", "names"),
    [
        ("x/minute", "'x'"),
        ("0/minute", "'0'"),
        ("-1/minute", "'-1'"),
        ("10/fortnight", "'fortnight'"),
        ("10/0hours", "'0'"),
        ("10 minutes", "expected"),
        ("", "expected"),
        ("1.5/second", "'1.5'"),
        ("\u00b2/minute", "'\u00b2'"),  # a digit to str.isdigit(), not to int()
        ("\u0661\u0660/minute", "'\u0661\u0660'"),  # Arabic-Indic 10: not read as 10
        ("10/\u0662minutes", "expected"),
    ],
)
def test_bad_strings_name_the_bad_part(text: str, names: str) -> None:
    with pytest.raises(ConfigurationError, match=names) as info:
        parse_rate(text)
    assert isinstance(info.value, RatewardenError)
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize(
    ("limit", "period"), [(0, 1), (1.5, 1), (True, 1), (1, 0), (1, -1), (1, float("inf")),
                          (1, "60"), (1, 1e-12)],
)  # fmt: skip
def test_bad_rate_objects(limit: object, period: object) -> None:
    with pytest.raises(ConfigurationError):
        Rate(limit, period)  # type: ignore[arg-type]


def test_not_a_string() -> None:
    with pytest.raises(ConfigurationError, match="int"):
        parse_rate(100)  # type: ignore[arg-type]


def test_period_in_nanoseconds_is_exact() -> None:
    assert Rate(1, 0.1).period_ns == 100_000_000
    assert Rate(5, 7200).period_ns == 7_200_000_000_000
