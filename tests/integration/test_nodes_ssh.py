"""``nuro-admin nodes`` against real sshd: network-namespace hosts (``nuro.devcluster.sshhosts``) reached over
paramiko with host-key checking on, and ``collect-logs`` for a real job on the session's Slurm cluster.

The shared ``ssh_hosts`` fixture is only read here; tests that stop a server or change a host key use their own
``SSHHosts`` so other test modules (the Ansible roles) never see a broken host.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from nuro.admin.nodes_cli import nodes, prolog_epilog_lines
from nuro.devcluster.sshhosts import SSHHosts, write_inventory
from nuro.remote import Host
from nuro.slurm import JobPhase
from tests.integration.conftest import TEST_ACCOUNT, LiveCluster


def _exec(inv: Path, *args: str, env: dict[str, str] | None = None) -> tuple[Result, dict]:
    res = CliRunner().invoke(nodes, ["exec", "--inventory", str(inv), "--json", *args], env=env)
    assert res.exit_code in (0, 1), res.output
    return res, json.loads(res.stdout)


@pytest.fixture(scope="module")
def private_hosts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SSHHosts]:
    """Two hosts of our own, for the tests that stop sshd or change a host key."""
    with SSHHosts.running(2, tmp_path_factory.mktemp("private-sshhosts")) as hosts:
        yield hosts


def test_exec_runs_on_every_host_with_bounded_parallelism(ssh_hosts: SSHHosts, tmp_path: Path) -> None:
    inv = write_inventory(tmp_path / "inv.yml", ssh_hosts.hosts)
    res, payload = _exec(inv, "--parallel", "2", "--", "hostname;", "id", "-u;", "ip", "-o", "-4", "addr")
    assert res.exit_code == 0 and payload["ok"], res.output
    assert [h["host"] for h in payload["hosts"]] == [h.name for h in ssh_hosts.hosts]
    for host, got in zip(ssh_hosts.hosts, payload["hosts"], strict=True):
        lines = got["stdout"].splitlines()
        assert got["status"] == "ok" and lines[1] == "0"  # root on the host
        assert f"inet {host.address}/30" in got["stdout"]  # the command really ran inside that host's namespace


def test_per_host_timeout_is_honoured(ssh_hosts: SSHHosts, tmp_path: Path) -> None:
    inv = write_inventory(tmp_path / "inv.yml", ssh_hosts.hosts)
    t0 = time.monotonic()
    res, payload = _exec(inv, "--timeout", "2", "--", "sleep", "30")
    wall_s = time.monotonic() - t0
    assert res.exit_code == 1
    assert {h["status"] for h in payload["hosts"]} == {"timeout"}
    assert all(1.9 <= h["duration_s"] < 15 for h in payload["hosts"])  # cut at 2 s, not the command's 30 s
    serial_s = sum(h["duration_s"] for h in payload["hosts"])
    assert wall_s < 0.75 * serial_s, f"4 hosts took {wall_s:.1f} s, one after another would be {serial_s:.1f} s"
    assert "did not finish in 2 s" in payload["hosts"][0]["error"]


def test_dead_hosts_are_reported_unreachable_and_others_succeed(private_hosts: SSHHosts, tmp_path: Path) -> None:
    alive, dead = private_hosts.hosts
    nowhere = Host("nowhere", f"10.231.{private_hosts.subnet}.250", key_file=alive.key_file,
                   known_hosts=alive.known_hosts)  # fmt: skip  # an address of the range with no namespace
    inv = write_inventory(tmp_path / "inv.yml", [alive, dead, nowhere])
    private_hosts.stop_sshd(dead.name)
    try:
        t0 = time.monotonic()
        res, payload = _exec(inv, "--timeout", "3", "--", "true")
        wall_s = time.monotonic() - t0
    finally:
        private_hosts.start_sshd(dead.name)
    by_host = {h["host"]: h for h in payload["hosts"]}
    assert res.exit_code == 1
    assert by_host[alive.name]["status"] == "ok"
    assert by_host[dead.name]["status"] == "unreachable" and "Connection refused" in by_host[dead.name]["error"]
    assert by_host["nowhere"]["status"] == "unreachable"
    assert wall_s < 3 + 15  # the unroutable address is cut at the 3 s timeout, not TCP's two-minute connect
    assert f"FAILED {dead.name} ({dead.address}): unreachable" in res.stderr


def test_changed_host_key_is_refused(private_hosts: SSHHosts, tmp_path: Path) -> None:
    first, second = private_hosts.hosts
    inv = write_inventory(tmp_path / "inv.yml", [first, second])
    private_hosts.regenerate_host_key(first.name)  # known_hosts keeps the old key
    res, payload = _exec(inv, "--", "true")
    by_host = {h["host"]: h for h in payload["hosts"]}
    assert res.exit_code == 1
    assert by_host[first.name]["status"] == "host_key_changed"
    assert "host key changed" in by_host[first.name]["error"] and "Refused" in by_host[first.name]["error"]
    assert by_host[second.name]["status"] == "ok"


def test_unknown_host_key_and_wrong_client_key(private_hosts: SSHHosts, tmp_path: Path) -> None:
    _, host = private_hosts.hosts
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    other_key = tmp_path / "other_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other_key)], check=True)
    inv = write_inventory(
        tmp_path / "inv.yml",
        [dataclasses.replace(host, name="unknown-key", known_hosts=empty),
         dataclasses.replace(host, name="wrong-client-key", key_file=other_key)],
    )  # fmt: skip
    res, payload = _exec(inv, "--", "true")
    by_host = {h["host"]: h for h in payload["hosts"]}
    assert res.exit_code == 1
    assert by_host["unknown-key"]["status"] == "host_key_unknown"
    assert "is not in" in by_host["unknown-key"]["error"]
    assert by_host["wrong-client-key"]["status"] == "auth_failed"


@pytest.mark.slurm
def test_collect_logs_for_a_real_job(
    cluster: LiveCluster, ssh_hosts: SSHHosts, shared_tmp: Path, tmp_path: Path
) -> None:
    """All emulated nodes live on this machine, so each node maps to a netns host and the dev cluster's log files
    are fetched over SFTP (namespaces share the filesystem)."""
    out = shared_tmp / "job.out"
    res = cluster.run(
        ["sbatch", "--parsable", "--nodes=2", f"--account={TEST_ACCOUNT}", f"--output={out}",
         "--wrap", "srun hostname"],
        user="nuro-alice",
    )  # fmt: skip
    job_id = int(res.stdout.strip().split(";")[0])
    job = cluster.backend.wait_for_job(job_id, timeout_s=90)
    assert job.phase is JobPhase.COMPLETED, job
    job_nodes = list(job.nodes)
    assert len(job_nodes) == 2
    inv = write_inventory(tmp_path / "inv.yml", ssh_hosts.hosts)
    host_map = ",".join(f"{n}={h.name}" for n, h in zip(job_nodes, ssh_hosts.hosts, strict=False))
    dest = tmp_path / "logs"
    res = CliRunner().invoke(
        nodes,
        ["collect-logs", str(job_id), "--out", str(dest), "--inventory", str(inv), "--host-map", host_map, "--json"],
        env=cluster.env,
    )
    assert res.exit_code == 0, res.output
    payload = json.loads(res.stdout)
    assert [n["node"] for n in payload["nodes"]] == job_nodes
    log_dir = cluster.layout.log
    launched = 0
    for node, host in zip(job_nodes, ssh_hosts.hosts, strict=False):
        entry = next(n for n in payload["nodes"] if n["node"] == node)
        assert entry["status"] == "ok" and entry["host"] == host.name
        assert {f["name"]: f["error"] for f in entry["files"]} == {"slurmd.log": None, "agent.log": None,
                                                                    "hooks.log": None}  # fmt: skip
        fetched = (dest / node / "slurmd.log").read_text()
        assert (log_dir / f"slurmd-{node}.log").read_text().startswith(fetched)  # the same file, via SFTP
        assert (dest / node / "agent.log").stat().st_size > 0
        job_text = (dest / node / f"slurmd-job{job_id}.log").read_text()
        assert job_text and all(str(job_id) in line for line in job_text.splitlines())
        launched += f"Launching batch job {job_id}" in job_text
        pe = (dest / node / f"prolog-epilog-job{job_id}.log").read_text()
        assert pe.splitlines() == prolog_epilog_lines(fetched, job_id)
        hooks = (dest / node / f"hooks-job{job_id}.log").read_text()  # nuro's hooks' own log (slurmd drops stderr)
        assert f"nuro-prolog INFO job={job_id} prolog done in" in hooks and f"nuro-epilog INFO job={job_id}" in hooks
        assert entry["hook_lines"] == len(hooks.splitlines())
    assert launched == 1  # the batch step ran on exactly one of the job's nodes
    assert json.loads((dest / "summary.json").read_text())["ok"] is True


@pytest.mark.slurm
def test_collect_logs_reports_an_unreachable_node(cluster: LiveCluster, ssh_hosts: SSHHosts, tmp_path: Path) -> None:
    """A node whose host cannot be reached fails that node, clearly, with exit 1. The address is in the session's
    claimed /24 with no namespace behind it (the unreachable route answers at once; nothing leaves the machine)."""
    nowhere = f"10.231.{ssh_hosts.subnet}.250"
    res = cluster.run(
        ["sbatch", "--parsable", "--nodes=1", f"--account={TEST_ACCOUNT}", "--output=/dev/null", "--wrap", "true"],
        user="nuro-alice",
    )
    job_id = int(res.stdout.strip().split(";")[0])
    job = cluster.backend.wait_for_job(job_id, timeout_s=90)
    node = job.nodes[0]
    res = CliRunner().invoke(
        nodes,
        ["collect-logs", str(job_id), "--out", str(tmp_path), "--host-map", f"{node}={nowhere}", "--timeout", "2"],
        env=cluster.env,
    )  # fmt: skip
    assert res.exit_code == 1, res.output
    assert f"FAILED {node} via {nowhere} ({nowhere}): unreachable" in res.stderr


def test_teardown_from_the_record_removes_exactly_what_was_made(tmp_path: Path) -> None:
    """Another process (after a crash) tears a session down from ``sshhosts.json``: sshd stopped by PID, the
    namespace, the veth and the claimed route gone."""
    made = SSHHosts()
    (host,) = made.up(1, tmp_path)
    record = SSHHosts.load(tmp_path)
    assert record.hosts == [host] and record.subnet == made.subnet
    pid = int((tmp_path / "sshhosts" / host.name / "sshd.pid").read_text())
    record.down()
    assert host.name not in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    routes = subprocess.run(["ip", "route", "show", "type", "unreachable"], capture_output=True, text=True).stdout
    assert f"10.231.{made.subnet}.0/24" not in routes
    assert not Path(f"/proc/{pid}").exists() or "sshd" not in Path(f"/proc/{pid}/cmdline").read_text()
    assert not (tmp_path / "sshhosts" / "sshhosts.json").exists()
