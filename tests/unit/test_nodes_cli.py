"""Pure parts of ``nuro-admin nodes``: inventory and hostlist selection, host maps, result aggregation and exit
codes, and picking one job's lines out of a slurmd log."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from nuro.admin import nodes_cli
from nuro.admin.nodes_cli import (
    HostDefaults,
    HostOutcome,
    UsageError,
    exit_code,
    fan_out,
    hosts_for_nodes,
    job_lines,
    parse_host_map,
    parse_inventory,
    prolog_epilog_lines,
    select_hosts,
    summarize,
)
from nuro.devcluster.sshhosts import write_inventory
from nuro.remote import Host, HostUnreachable, RemoteTimeout, RunResult

DEFAULTS = HostDefaults(user="admin", key_file=Path("/k"), known_hosts=Path("/kh"))


def _hosts() -> list[Host]:
    return [Host(f"h{i}", f"10.9.0.{i}", 22, "root", Path("/keys/id"), Path("/keys/known_hosts")) for i in range(1, 4)]


def test_yaml_inventory_round_trips_from_write_inventory(tmp_path: Path) -> None:
    path = write_inventory(tmp_path / "inv.yml", _hosts(), groups={"gpu": ["h1", "h2"]})
    inv = parse_inventory(path.read_text(), DEFAULTS)
    assert list(inv.hosts) == ["h1", "h2", "h3"]
    assert inv.hosts["h2"] == _hosts()[1]
    assert inv.groups["gpu"] == ["h1", "h2"]
    assert set(inv.groups["all"]) == {"h1", "h2", "h3"}


def test_yaml_inventory_nested_children_and_slurm_node_var() -> None:
    text = """
all:
  children:
    rack1:
      children:
        gpu:
          hosts:
            n1: {ansible_host: 10.0.0.1, nuro_slurm_node: gpu001}
            n2: {ansible_host: 10.0.0.2, ansible_port: 2222, ansible_user: ops}
"""
    inv = parse_inventory(text, DEFAULTS)
    assert inv.groups["rack1"] == ["n1", "n2"]
    assert inv.hosts["n2"] == Host("n2", "10.0.0.2", 2222, "ops", Path("/k"), Path("/kh"))
    assert inv.node_to_host == {"gpu001": "n1", "n2": "n2"}


def test_ini_inventory() -> None:
    text = "# comment\n[gpu]\nn1 ansible_host=10.0.0.1 ansible_user=ops\nn2\n[login]\nl1 ansible_port=2200\n"
    inv = parse_inventory(text, DEFAULTS)
    assert inv.groups["gpu"] == ["n1", "n2"]
    assert inv.hosts["n1"].address == "10.0.0.1" and inv.hosts["n1"].user == "ops"
    assert inv.hosts["n2"].address == "n2" and inv.hosts["n2"].user == "admin"
    assert inv.hosts["l1"].port == 2200


def test_ini_inventory_refuses_vars_sections() -> None:
    with pytest.raises(UsageError, match="not supported"):
        parse_inventory("[gpu:vars]\nx=1\n", DEFAULTS)


@pytest.mark.parametrize(
    ("expr", "want"),
    [
        (None, ["h1", "h2", "h3"]),
        ("h[1-2]", ["h1", "h2"]),
        ("gpu", ["h1", "h2"]),
        ("gpu,h1,h3", ["h1", "h2", "h3"]),
        ("h3,10.1.1.1", ["h3", "10.1.1.1"]),
    ],
    ids=["all", "hostlist", "group", "dedup", "unknown-is-address"],
)
def test_select_hosts(tmp_path: Path, expr: str | None, want: list[str]) -> None:
    inv = parse_inventory(write_inventory(tmp_path / "i.yml", _hosts(), {"gpu": ["h1", "h2"]}).read_text())
    got = select_hosts(inv, expr, DEFAULTS)
    assert [h.name for h in got] == want
    if "10.1.1.1" in want:
        assert got[-1] == Host("10.1.1.1", "10.1.1.1", 22, "admin", Path("/k"), Path("/kh"))


def test_select_hosts_needs_something() -> None:
    with pytest.raises(UsageError, match="-w HOSTLIST"):
        select_hosts(None, None, DEFAULTS)
    with pytest.raises(UsageError, match="bad hostlist"):
        select_hosts(None, "gpu[001-", DEFAULTS)


def test_host_map_and_node_resolution(tmp_path: Path) -> None:
    assert parse_host_map("gpu[001-002]=h[1-2],gpu003=10.0.0.9") == {
        "gpu001": "h1",
        "gpu002": "h2",
        "gpu003": "10.0.0.9",
    }
    with pytest.raises(UsageError, match="2 nodes but 1 hosts"):
        parse_host_map("gpu[001-002]=h1")
    with pytest.raises(UsageError, match="expected NODE=HOST"):
        parse_host_map("gpu001")
    inv = parse_inventory(write_inventory(tmp_path / "i.yml", _hosts()).read_text())
    got = hosts_for_nodes(["gpu001", "gpu003", "h3"], inv, parse_host_map("gpu001=h1,gpu003=10.0.0.9"), DEFAULTS)
    assert got["gpu001"] == _hosts()[0]
    assert got["gpu003"].address == "10.0.0.9" and got["gpu003"].user == "admin"
    assert got["h3"] == _hosts()[2]  # inventory host named like the node


def _fake_run(host: Host) -> RunResult:
    if host.name == "h1":
        return RunResult("h1", 0, "ok\n", "", 0.01)
    if host.name == "h2":
        return RunResult("h2", 3, "", "boom\n", 0.01)
    if host.name == "h3":
        raise HostUnreachable("h3", "cannot connect: Connection refused")
    raise RemoteTimeout(host.name, "command did not finish in 2 s")


def test_fan_out_turns_every_failure_into_a_per_host_outcome() -> None:
    hosts = [*_hosts(), Host("h4", "10.9.0.4")]
    outcomes = fan_out(hosts, _fake_run, parallel=2)
    assert [(o.host, o.status, o.exit_status) for o in outcomes] == [
        ("h1", "ok", 0),
        ("h2", "exit_status", 3),
        ("h3", "unreachable", None),
        ("h4", "timeout", None),
    ]
    assert outcomes[2].error == "cannot connect: Connection refused"
    assert summarize(outcomes) == {"total": 4, "ok": 1, "exit_status": 1, "unreachable": 1, "timeout": 1}
    assert exit_code(outcomes) == 1
    assert exit_code(outcomes[:1]) == 0
    assert exit_code([]) == 1  # nothing ran: not a success


def test_fan_out_bounds_parallelism() -> None:
    import threading
    import time

    lock, running, peak = threading.Lock(), [0], [0]

    def slow(host: Host) -> RunResult:
        with lock:
            running[0] += 1
            peak[0] = max(peak[0], running[0])
        time.sleep(0.05)
        with lock:
            running[0] -= 1
        return RunResult(host.name, 0, "", "", 0.05)

    hosts = [Host(f"h{i}", f"10.0.0.{i}") for i in range(10)]
    assert all(o.ok for o in fan_out(hosts, slow, parallel=3))
    assert peak[0] == 3


def test_unexpected_exception_is_reported_not_raised() -> None:
    def bug(host: Host) -> RunResult:
        raise KeyError("x")

    (o,) = fan_out([Host("h1", "a")], bug, parallel=1)
    assert o.status == "error" and "KeyError" in o.error and not o.ok


SLURMD_LOG = """\
[2026-11-30T08:17:05.000] Launching batch job 42 for UID 1003
[2026-11-30T08:17:06.000] prolog for job 42 ran for 2 seconds
[2026-11-30T08:17:06.100] prolog for job 420 ran for 2 seconds
[2026-11-30T08:17:06.200] prolog for job 142 ran for 2 seconds
[2026-11-30T08:17:07.000] [42.batch] done with job
[2026-11-30T08:17:07.100] [42.0] done with job
[2026-11-30T08:17:07.200] [420.batch] done with job
[2026-11-30T08:17:08.000] error: [job 42] epilog failed status=1:0
[2026-11-30T08:17:08.100] nuro-epilog: job=42 node=gpu001 flushed uploads
[2026-11-30T08:17:09.000] epilog for job 42 ran for 2 seconds
[2026-11-30T08:17:10.000] Registered node gpu001
"""


def test_job_lines_match_the_job_exactly() -> None:
    got = job_lines(SLURMD_LOG, 42)
    assert len(got) == 7
    assert not any("job 420" in x or "job 142" in x or "[420." in x for x in got)
    assert all("Registered" not in x for x in got)


def test_prolog_epilog_lines() -> None:
    got = prolog_epilog_lines(SLURMD_LOG, 42)
    assert got == [
        "[2026-11-30T08:17:06.000] prolog for job 42 ran for 2 seconds",
        "[2026-11-30T08:17:08.000] error: [job 42] epilog failed status=1:0",
        "[2026-11-30T08:17:08.100] nuro-epilog: job=42 node=gpu001 flushed uploads",
        "[2026-11-30T08:17:09.000] epilog for job 42 ran for 2 seconds",
    ]


def test_exec_cli_json_and_exit_code(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    inv = write_inventory(tmp_path / "i.yml", [*_hosts(), Host("h4", "10.9.0.4")])
    seen: list[str] = []

    def fake(host: Host, command: str, timeout_s: float) -> RunResult:
        seen.append(command)
        return _fake_run(host)

    monkeypatch.setattr(nodes_cli.remote, "run", fake)
    res = CliRunner().invoke(nodes_cli.nodes, ["exec", "--inventory", str(inv), "--json", "--", "echo", "-n", "x"])
    assert res.exit_code == 1, res.output
    payload = json.loads(res.stdout)
    assert payload["summary"] == {"total": 4, "ok": 1, "exit_status": 1, "unreachable": 1, "timeout": 1}
    assert [h["status"] for h in payload["hosts"]] == ["ok", "exit_status", "unreachable", "timeout"]
    assert set(seen) == {"echo -n x"}  # words joined like ssh, options after -- are the command's

    res = CliRunner().invoke(nodes_cli.nodes, ["exec", "--inventory", str(inv), "-w", "h1", "--", "true"])
    assert res.exit_code == 0, res.output
    assert "1 hosts, 1 ok, 0 failed" in res.stdout


def test_exec_cli_table_lists_each_failure(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    inv = write_inventory(tmp_path / "i.yml", _hosts())
    monkeypatch.setattr(nodes_cli.remote, "run", lambda host, command, timeout_s: _fake_run(host))
    res = CliRunner().invoke(nodes_cli.nodes, ["exec", "--inventory", str(inv), "--", "x"])
    assert res.exit_code == 1
    assert "FAILED h2 (10.9.0.2): exit_status" in res.stderr
    assert "FAILED h3 (10.9.0.3): unreachable: cannot connect: Connection refused" in res.stderr


def test_exec_cli_usage_errors() -> None:
    res = CliRunner().invoke(nodes_cli.nodes, ["exec", "--", "true"])
    assert res.exit_code == 2 and "-w HOSTLIST" in res.stderr
    res = CliRunner().invoke(nodes_cli.nodes, ["exec", "-w", "h1"])
    assert res.exit_code == 2


def test_outcome_ok_property() -> None:
    assert HostOutcome("h", "a", "ok").ok
    assert not HostOutcome("h", "a", "timeout").ok
