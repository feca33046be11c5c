"""``ratewarden quota set|show|list|delete`` through main(), on a Redis of the tests' own."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import redis

from ratewarden.cli import main
from ratewarden.fleet import (
    Coordinator,
    MemberStatus,
    QuotaConfig,
    QuotaStatus,
    set_quota,
    show_quota,
)
from ratewarden.fleet.coordinator import keys
from tests.redis_server import RedisServer, free_port

Capture = pytest.CaptureFixture[str]


def run(redis_single: RedisServer, *args: str) -> int:
    return main(["quota", *args, "--redis", redis_single.url])


def members(client: redis.Redis, name: str) -> None:
    """Two members of an ``equal`` 2000/second quota: a wants 1200, holds 1000
    and used 990; b wants 300, holds nothing yet and used 250."""
    coordinator = Coordinator(client, name)
    coordinator.refresh("host-a", wants=1_200_000, has=0, used=0)
    coordinator.refresh("host-b", wants=300_000, has=0, used=250_000)
    coordinator.refresh("host-a", wants=1_200_000, has=1_000_000, used=990_000)


def test_set_creates_a_quota(
    redis_single: RedisServer, client: redis.Redis, name: str, capsys: Capture
) -> None:
    assert run(redis_single, "set", name, "2000/second", "--algorithm", "equal",
               "--lease", "10", "--safe", "50") == 0  # fmt: skip
    out, err = capsys.readouterr()
    assert err == ""
    lines = out.splitlines()
    assert lines[0] == f"created quota {name}, version 1"
    assert [line.split(maxsplit=1) for line in lines[1:-1]] == [
        ["rate", "2000/second"], ["algorithm", "equal"], ["refresh", "1s"], ["lease", "10s"],
        ["safe", "50 permits"], ["cap", "0"], ["adaptive", "no"], ["floor", "1"],
        ["sliding", "no"],
    ]  # fmt: skip
    assert lines[-1] == f"redis: {redis_single.url} (--redis)"
    status = show_quota(client, name)
    assert status is not None
    assert status.config == QuotaConfig("2000/second", "equal", lease=10.0, safe=50)
    assert status.version == 1


def test_a_change_keeps_what_is_not_given(
    redis_single: RedisServer, client: redis.Redis, name: str, capsys: Capture
) -> None:
    set_quota(client, name, QuotaConfig("100/second", "equal", refresh=2, lease=10, safe=5))
    assert run(redis_single, "set", name, "--algorithm", "fair_share", "--adaptive",
               "--floor", "20") == 0  # fmt: skip
    out, err = capsys.readouterr()
    assert err == ""
    assert out.splitlines()[:-1] == [
        f"changed quota {name}, version 1 -> 2",
        "  algorithm  equal -> fair_share",
        "  adaptive   no -> yes",
        "  floor      1 -> 20",
    ]
    status = show_quota(client, name)
    assert status is not None
    assert status.config == QuotaConfig(
        "100/second", "fair_share", refresh=2, lease=10, safe=5, adaptive=True, floor=20
    )
    # the rate alone, then the adaptive flag off: the rest stays again
    assert run(redis_single, "set", name, "300/second", "--no-adaptive") == 0
    out, _ = capsys.readouterr()
    assert out.splitlines()[1:-1] == ["  rate       100/second -> 300/second",
                                      "  adaptive   yes -> no"]  # fmt: skip
    status = show_quota(client, name)
    assert status is not None
    assert status.config == QuotaConfig(
        "300/second", "fair_share", refresh=2, lease=10, safe=5, floor=20
    )
    assert status.version == 3
    # the sliding mode, for providers that count rolling windows
    assert run(redis_single, "set", name, "--sliding") == 0
    out, _ = capsys.readouterr()
    assert out.splitlines()[1:-1] == ["  sliding    no -> yes"]
    status = show_quota(client, name)
    assert status is not None
    assert status.config.sliding


def test_setting_what_is_there_changes_nothing(
    redis_single: RedisServer, client: redis.Redis, name: str, capsys: Capture
) -> None:
    set_quota(client, name, QuotaConfig("100/second", "equal"))
    assert run(redis_single, "set", name, "100/second", "--algorithm", "equal") == 0
    assert capsys.readouterr().out.splitlines()[0] == f"quota {name} unchanged, version 1"
    status = show_quota(client, name)
    assert status is not None
    assert status.version == 1


def test_show_prints_the_resource_its_members_and_totals(
    redis_single: RedisServer, client: redis.Redis, name: str, capsys: Capture
) -> None:
    set_quota(client, name, QuotaConfig("2000/second", "equal", lease=10))
    members(client, name)
    assert run(redis_single, "show", name) == 0
    out, err = capsys.readouterr()
    assert err == ""
    lines = out.splitlines()
    assert lines[0] == (
        f"quota {name}: 2000/second, effective total 2000, equal, refresh 1s, lease 10s,"
        " safe equal, version 1"
    )
    assert lines[1].startswith("permits per 1s window")
    table = [line.split() for line in lines[2:-1]]
    assert table[0] == ["member", "wants", "has", "used", "utilisation", "demand", "served",
                        "lease", "left"]  # fmt: skip
    # the largest holder first; utilisation is of the member's grant, demand
    # served of what it wants
    assert table[1][:6] == ["host-a", "1200", "1000", "990", "99%", "82%"]
    assert table[2][:6] == ["host-b", "300", "0", "250", "-", "83%"]
    assert 9.0 < float(table[1][6].rstrip("s")) <= 10.0
    # 1240 used: 62% of the 2000, 83% of min(2000, 1500) wanted
    assert table[3] == ["total", "(2)", "1500", "1000", "1240", "62%", "83%"]
    assert lines[-1] == f"redis: {redis_single.url} (--redis)"


def test_show_orders_members_by_id_when_asked(
    redis_single: RedisServer, client: redis.Redis, name: str, capsys: Capture
) -> None:
    set_quota(client, name, QuotaConfig("10/second", "static", cap=5))
    coordinator = Coordinator(client, name)
    for member, wants in (("m-1", 1000), ("m-3", 5000), ("m-2", 3000)):
        coordinator.refresh(member, wants=wants, has=0, used=0)  # static: granted what it wants
    assert run(redis_single, "show", name) == 0
    rows = capsys.readouterr().out.splitlines()[3:6]
    assert [row.split()[0] for row in rows] == ["m-3", "m-2", "m-1"]
    assert run(redis_single, "show", name, "--members-by-id") == 0
    out = capsys.readouterr().out
    assert "static (cap 5)" in out.splitlines()[0]
    assert [row.split()[0] for row in out.splitlines()[3:6]] == ["m-1", "m-2", "m-3"]


def test_show_without_members(
    redis_single: RedisServer, client: redis.Redis, name: str, capsys: Capture
) -> None:
    set_quota(client, name, QuotaConfig("7/minute", "equal", adaptive=True, floor=2))
    assert run(redis_single, "show", name) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "adaptive (floor 2)" in lines[0]
    assert lines[1].startswith("permits per 60s window")
    assert lines[2:] == ["no live members", f"redis: {redis_single.url} (--redis)"]


def test_show_json_is_the_status_as_a_dict(
    redis_single: RedisServer, client: redis.Redis, name: str, capsys: Capture
) -> None:
    set_quota(client, name, QuotaConfig("2000/second", "equal", lease=10))
    members(client, name)
    assert run(redis_single, "show", name, "--json") == 0
    printed = json.loads(capsys.readouterr().out)
    status = show_quota(client, name)
    assert status is not None
    expected = status.as_dict()
    for member in (*printed["members"], *expected["members"]):
        assert 0 < member.pop("expires_in") <= 10
    assert printed == expected
    assert printed["used_of_total"] == pytest.approx(1240 / 2000)
    assert printed["demand_served"] == pytest.approx(1240 / 1500)
    assert printed["utilisation"] == pytest.approx(1240 / 1500)  # as the first readers had it
    assert [m["id"] for m in printed["members"]] == ["host-a", "host-b"]
    assert [m["used_of_grant"] for m in printed["members"]] == [pytest.approx(0.99), None]
    served = [m["demand_served"] for m in printed["members"]]
    assert served == [pytest.approx(990 / 1200), pytest.approx(250 / 300)]


def test_list(redis_single: RedisServer, client: redis.Redis, name: str, capsys: Capture) -> None:
    set_quota(client, name, QuotaConfig("2000/second", "equal", lease=10))
    members(client, name)
    other = name + "-b"
    set_quota(client, other, QuotaConfig("5/second"))
    assert run(redis_single, "list") == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["name", "rate", "effective", "algorithm", "members", "wants",
                                "granted", "used", "utilisation", "demand", "served",
                                "version"]  # fmt: skip
    assert lines[-1] == f"redis: {redis_single.url} (--redis)"
    rows = {line.split()[0]: line.split() for line in lines[1:-1]}
    assert rows[name] == [name, "2000/second", "2000", "equal", "2", "1500", "1000", "1240",
                          "62%", "83%", "1"]  # fmt: skip
    # nobody wants anything: no demand to serve
    assert rows[other] == [other, "5/second", "5", "fair_share", "0", "0", "0", "0", "0%", "-",
                           "1"]  # fmt: skip
    assert run(redis_single, "list", "--json") == 0
    out, err = capsys.readouterr()
    listed = json.loads(out)  # the JSON alone on stdout; the Redis asked on stderr
    assert err == f"redis: {redis_single.url} (--redis)\n"  # the option as spelled
    assert listed["truncated"] is False
    by_name = {q["name"]: q for q in listed["quotas"]}
    assert by_name[name]["members"] == 2
    assert by_name[name]["granted"] == 1000
    assert by_name[name]["used_of_total"] == pytest.approx(0.62)
    assert by_name[name]["demand_served"] == pytest.approx(1240 / 1500)
    assert by_name[other]["demand_served"] is None
    assert by_name[other]["members"] == 0
    assert by_name[other]["algorithm"] == "fair_share"


def test_the_redis_url_comes_from_the_environment(
    redis_single: RedisServer,
    client: redis.Redis,
    name: str,
    capsys: Capture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("RATEWARDEN_REDIS", redis_single.url)
    assert main(["quota", "set", name, "9/second"]) == 0
    assert show_quota(client, name) is not None
    assert main(["quota", "show", name]) == 0
    out = capsys.readouterr().out
    assert f"quota {name}: 9/second" in out
    assert out.splitlines()[-1] == f"redis: {redis_single.url} ($RATEWARDEN_REDIS)"


def error(capsys: Capture) -> str:
    """The one line of an error; nothing on stdout, no traceback."""
    out, err = capsys.readouterr()
    assert out == ""
    assert len(err.splitlines()) == 1, err
    assert "Traceback" not in err
    return err.strip()


def test_an_unknown_quota(redis_single: RedisServer, name: str, capsys: Capture) -> None:
    """Said with the command's verb and the Redis asked: the wrong Redis is the
    likeliest reason."""
    assert run(redis_single, "show", name) == 2
    assert (
        error(capsys)
        == f"ratewarden quota show: no quota named {name!r}; asked {redis_single.url} (--redis)"
    )
    assert run(redis_single, "show", name, "--json") == 2
    assert (
        error(capsys)
        == f"ratewarden quota show: no quota named {name!r}; asked {redis_single.url} (--redis)"
    )
    # changing one needs it to exist; creating one needs a rate
    assert run(redis_single, "set", name, "--algorithm", "equal") == 2
    assert error(capsys) == (
        f"ratewarden quota set: no quota named {name!r}: give a RATE to create it;"
        f" asked {redis_single.url} (--redis)"
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["10/parsec"], "unknown unit 'parsec' in rate '10/parsec'"),
        (["ten/second"], "bad limit 'ten' in rate 'ten/second'"),
        (["10/second", "--algorithm", "round_robin"],
         "unknown algorithm 'round_robin'; expected one of equal, proportional_share,"
         " fair_share, static"),
        (["10/second", "--algorithm", "fair"],
         "unknown algorithm 'fair'; expected one of equal, proportional_share, fair_share,"
         " static; did you mean 'fair_share'?"),
        (["10/second", "--algorithm", "proportional"], "did you mean 'proportional_share'?"),
        (["10/second", "--refresh", "3"], "lease (5.0 s) must be at least twice refresh (3.0 s)"),
        (["10/second", "--safe", "half"], "--safe takes 'equal' or a number of permits"),
        (["10/second", "--algorithm", "static"], "the static algorithm needs cap"),
    ],
)  # fmt: skip
def test_a_bad_setting(
    redis_single: RedisServer, name: str, args: list[str], message: str, capsys: Capture
) -> None:
    assert run(redis_single, "set", name, *args) == 2
    said = error(capsys)
    assert said.startswith(f"ratewarden quota set: {message}") or message in said, said
    with redis_single.client() as client:
        assert show_quota(client, name) is None


def test_a_bad_change_leaves_the_quota_as_it_was(
    redis_single: RedisServer, client: redis.Redis, name: str, capsys: Capture
) -> None:
    set_quota(client, name, QuotaConfig("10/second", "equal"))
    assert run(redis_single, "set", name, "--algorithm", "lottery") == 2
    assert error(capsys) == (
        "ratewarden quota set: unknown algorithm 'lottery'; expected one of equal,"
        " proportional_share, fair_share, static"
    )  # nothing close: no guess
    status = show_quota(client, name)
    assert status is not None
    assert (status.config.algorithm, status.version) == ("equal", 1)


def test_a_bad_name(redis_single: RedisServer, capsys: Capture) -> None:
    assert run(redis_single, "set", "a b", "10/second") == 2
    assert error(capsys).startswith("ratewarden quota set: a quota name is 1-200 characters")


@pytest.mark.parametrize("args", [["list"], ["show", "q"], ["set", "q", "10/second"]])
def test_redis_unreachable(args: list[str], capsys: Capture) -> None:
    url = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there
    assert main(["quota", *args, "--redis", url]) == 3  # unreachable
    message = error(capsys)
    assert message.startswith(f"ratewarden quota {args[0]}: redis: ")
    assert "Connection refused" in message


def test_a_bad_redis_url(capsys: Capture) -> None:
    assert main(["quota", "list", "--redis", "http://127.0.0.1:1/"]) == 2
    assert error(capsys).startswith("ratewarden quota list: bad Redis URL 'http://127.0.0.1:1/'")


def test_redis_and_the_fleet_are_imported_only_when_the_command_runs() -> None:
    code = (
        "import sys\n"
        "from ratewarden.cli import main\n"
        "try:\n"
        "    main(['quota', 'set', '--help'])\n"
        "except SystemExit:\n"
        "    pass\n"
        "fleet = ('redis', 'ratewarden.fleet')\n"
        "print(sorted(m for m in sys.modules if m.partition('.')[0] == 'redis' or m in fleet))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, check=True)  # fmt: skip
    assert "--adaptive, --no-adaptive" in done.stdout
    assert done.stdout.splitlines()[-1] == "[]"


def test_no_percentage_passes_100(
    redis_single: RedisServer, client: redis.Redis, name: str, capsys: Capture
) -> None:
    """Reports from different moments can add up past the grant, the demand or
    the total; the shares are held to 100% and the permits shown as reported."""
    set_quota(client, name, QuotaConfig("100/second", "equal", lease=10))
    coordinator = Coordinator(client, name)
    coordinator.refresh("host-a", wants=20_000, has=0, used=0)
    coordinator.refresh("host-a", wants=20_000, has=100_000, used=130_000)
    assert run(redis_single, "show", name) == 0
    lines = capsys.readouterr().out.splitlines()
    member, total = lines[3].split(), lines[4].split()
    # 130 used of a grant and a total of 100, 20 wanted
    assert member[:6] == ["host-a", "20", "100", "130", "100%", "100%"]
    assert total == ["total", "(1)", "20", "100", "130", "100%", "100%"]
    assert run(redis_single, "list") == 0
    (row,) = [line.split() for line in capsys.readouterr().out.splitlines() if name in line]
    assert row[8:10] == ["100%", "100%"]


def test_a_little_used_of_a_large_total_is_not_full_use() -> None:
    """20.5 of 500 used, all that was wanted: 4% of the total, all demand served."""
    member = MemberStatus("a", wants=20.5, has=20.5, used=20.5, expires_in=3.0)
    status = QuotaStatus("q", QuotaConfig("500/second"), 500.0, 1, (member,))
    assert status.used_of_total == pytest.approx(0.041)
    assert status.demand_served == 1.0
    assert (member.used_of_grant, member.demand_served) == (1.0, 1.0)
    over = QuotaStatus("q", QuotaConfig("500/second"), 500.0, 1,
                       (MemberStatus("a", 100, 50, 600, 3.0),))  # fmt: skip
    assert (over.used_of_total, over.demand_served) == (1.0, 1.0)
    assert over.utilisation == 6.0  # the old figure, unclamped
    idle = QuotaStatus("q", QuotaConfig("500/second"), 500.0, 1, ())
    assert (idle.used_of_total, idle.demand_served, idle.utilisation) == (0.0, None, 0.0)


def test_the_default_redis_is_named(
    redis_single: RedisServer,
    name: str,
    capsys: Capture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Without --store nor $RATEWARDEN_REDIS, the default is asked and named so
    (pointed at the tests' Redis here: never the machine's 6379)."""
    monkeypatch.delenv("RATEWARDEN_REDIS", raising=False)
    monkeypatch.setattr("ratewarden.cli._quota_command.DEFAULT_REDIS", redis_single.url)
    assert main(["quota", "list"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[-1] == f"redis: {redis_single.url} (the default; --store URL to choose)"
    # and when it does not answer, the error says which Redis that was
    url = f"redis://127.0.0.1:{free_port()}/0"
    monkeypatch.setattr("ratewarden.cli._quota_command.DEFAULT_REDIS", url)
    assert main(["quota", "show", name]) == 3
    assert error(capsys).endswith(f"; asked {url} (the default; --store URL to choose)")


def test_the_redis_named_hides_its_password(capsys: Capture) -> None:
    url = f"redis://:hunter2@127.0.0.1:{free_port()}/0"  # nothing listens there
    assert main(["quota", "list", "--store", url]) == 3
    message = error(capsys)
    assert "hunter2" not in message
    assert message.endswith(f"; asked redis://***@{url.rpartition('@')[2]} (--store)")


def test_delete_removes_the_configuration_and_the_member_records(
    redis_single: RedisServer, client: redis.Redis, name: str, capsys: Capture
) -> None:
    set_quota(client, name, QuotaConfig("2000/second", "equal", lease=10))
    members(client, name)
    set_quota(client, name, QuotaConfig("2000/second", "fair_share", lease=10))
    other = name + "-kept"
    set_quota(client, other, QuotaConfig("5/second"))
    assert run(redis_single, "delete", name) == 0
    out, err = capsys.readouterr()
    assert out.splitlines() == [
        f"deleted quota {name}: its configuration (2000/second, version 2) and 2 member records",
        f"redis: {redis_single.url} (--redis)",
    ]
    # a running member would bring it back: said, with who they are
    assert err == (
        "warning: 2 live members (host-a, host-b) will create the quota again from what they"
        " know at their next refresh: stop them first\n"
    )
    assert client.exists(*keys(name)) == 0
    assert show_quota(client, name) is None
    assert show_quota(client, other) is not None  # only the quota named
    # gone: a second delete is an unknown quota
    assert run(redis_single, "delete", name) == 2
    assert (
        error(capsys)
        == f"ratewarden quota delete: no quota named {name!r}; asked {redis_single.url} (--redis)"
    )


def test_delete_json_and_a_quota_without_members(
    redis_single: RedisServer, client: redis.Redis, name: str, capsys: Capture
) -> None:
    set_quota(client, name, QuotaConfig("7/minute"))
    assert run(redis_single, "delete", name, "--json") == 0
    out, err = capsys.readouterr()
    assert json.loads(out) == {"deleted": name, "keys": keys(name), "member_records": 0,
                               "live_members": []}  # fmt: skip
    assert err == f"redis: {redis_single.url} (--redis)\n"  # the option as spelled
    assert client.exists(*keys(name)) == 0


def test_delete_removes_a_configuration_that_cannot_be_read(
    redis_single: RedisServer, client: redis.Redis, name: str, capsys: Capture
) -> None:
    config_key, members_key = keys(name)
    client.hset(config_key, mapping={"algorithm": "lottery", "limit": "x"})
    assert run(redis_single, "show", name) == 2  # cannot be shown...
    capsys.readouterr()
    client.hset(members_key, "ghost", b"\x00")
    assert run(redis_single, "delete", name) == 0  # ...but can be deleted
    out = capsys.readouterr().out
    assert out.splitlines()[0] == (
        f"deleted quota {name}: its configuration (unreadable) and 1 member record"
    )
    assert client.exists(config_key, members_key) == 0


def test_delete_an_unknown_or_impossible_name(
    redis_single: RedisServer, name: str, capsys: Capture
) -> None:
    assert run(redis_single, "delete", name) == 2
    assert (
        error(capsys)
        == f"ratewarden quota delete: no quota named {name!r}; asked {redis_single.url} (--redis)"
    )
    assert run(redis_single, "delete", "a b") == 2
    assert error(capsys).startswith("ratewarden quota delete: a quota name is 1-200 characters")
    url = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there
    assert main(["quota", "delete", name, "--store", url]) == 3
    assert "Connection refused" in error(capsys)
