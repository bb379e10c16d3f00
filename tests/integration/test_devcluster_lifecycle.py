"""devcluster up/down as a user meets them: a second up works, down leaves nothing, refusals say what to do.

Uses its own 2-node cluster (own state dir and ports) so stopping it cannot disturb the session cluster.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from nuro.devcluster import manager
from nuro.devcluster.layout import Layout
from nuro.devcluster.procs import ProcRef
from nuro.devcluster.record import Phase, RunRecord, read_record, write_record
from nuro.slurm import CliBackend, JobPhase
from tests.integration.conftest import wait_until

pytestmark = pytest.mark.slurm

PORT_BASE = int(os.environ.get("NURO_TEST_LIFECYCLE_PORT_BASE", "24800"))


def _cmd(proc: psutil.Process) -> str:
    """A process's command line, "" once it has exited (the tree now holds nuro-controller and node agents,
    whose short-lived sinfo/squeue children are briefly zombies)."""
    try:
        return " ".join(proc.cmdline())
    except psutil.Error:
        return ""


def _tree(pid: int) -> list[psutil.Process]:
    root = psutil.Process(pid)
    return [root, *root.children(recursive=True)]


def _up_run_a_job_then_down(layout: Layout, tmp_path: Path) -> None:
    manager.up(layout, 2, PORT_BASE)
    try:
        _run_a_job_then_down(layout, tmp_path)
    finally:  # pass or fail, nothing of this cluster outlives the test (a no-op when down already ran)
        manager.down(layout)


def _run_a_job_then_down(layout: Layout, tmp_path: Path) -> None:
    record = read_record(layout.record)
    assert record is not None and record.phase == Phase.RUNNING and record.supervisor is not None
    supervisor_pid = record.supervisor.pid
    backend = CliBackend(env=manager.env_exports(layout))
    assert sorted(n.name for n in backend.nodes()) == ["gpu001", "gpu002"]
    # A running job adds slurmstepd and job processes that slurmd double-forked: down must stop them too.
    job_id = backend.submit("#!/bin/bash\nsrun sleep 600\n", "--nodes=2", f"--output={tmp_path}/j.out")
    wait_until(
        lambda: any(j.job_id == job_id and j.phase == JobPhase.RUNNING for j in backend.jobs()),
        30,
        "the sleep job to run",
    )
    wait_until(
        lambda: sum("sleep" in _cmd(p) for p in _tree(supervisor_pid)[1:]) >= 2,
        15,
        "the job's sleep processes to exist on both nodes",
    )
    started = _tree(supervisor_pid)
    assert len(started) >= 1 + 4 + 2 + 2  # supervisor, 4 core daemons, 2 slurmd, job processes
    env = manager.env_exports(layout)
    assert env["MLFLOW_TRACKING_URI"] == f"http://127.0.0.1:{PORT_BASE + 92}"
    assert any("mlflow_bridge" in _cmd(p) for p in started) and any("mlflow" in _cmd(p) for p in started)
    stopped = manager.down(layout)
    assert "supervisor" in stopped and "slurmctld" in stopped and "mlflow" in stopped
    still = [p for p in started if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    assert not still, f"left behind: {[(p.pid, p.cmdline()) for p in still]}"
    assert manager.status(layout)["phase"] == "down"


def test_down_stops_everything_up_started_and_up_works_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NURO_DEVCLUSTER_MLFLOW", "1")  # the tracking server and its bridge too (issue 18)
    # A state dir far deeper than sun_path's 108 bytes: every socket lives in the short runtime dir instead.
    layout = Layout(tmp_path / ("deep-checkout-" + "x" * 150) / "cluster")
    assert len(str(layout.root)) > 200
    try:
        _up_run_a_job_then_down(layout, tmp_path)
        _up_run_a_job_then_down(layout, tmp_path)  # a second up on the same state dir works
    finally:
        manager.down(layout, purge=True)
    assert not layout.sockets.exists() and not layout.root.exists()  # --purge removes the socket dir too


def test_up_that_fails_half_way_stops_what_it_started(tmp_path: Path) -> None:
    """An up that gives up (here: a timeout far too short to start anything) leaves no daemon and no busy port."""
    layout = Layout(tmp_path / "cluster")
    base = PORT_BASE + 300
    try:
        with pytest.raises(manager.DevClusterError, match="has been stopped|failed to start|did not"):
            manager.up(layout, 2, base, timeout_s=0.5)
        assert manager.status(layout)["phase"] == "down"
        assert manager.busy_ports(manager.PortPlan(base), 2) == []
        assert not manager.udp_port_busy(manager.PortPlan(base).heartbeat)
    finally:
        manager.down(layout, purge=True)


def test_busy_port_is_refused_with_the_fix(tmp_path: Path) -> None:
    layout = Layout(tmp_path / "cluster")
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", PORT_BASE + 100 + 17))  # where this cluster's slurmctld would listen
        holder.listen()
        with pytest.raises(manager.DevClusterError) as err:
            manager.up(layout, 2, PORT_BASE + 100)
    msg = str(err.value)
    assert f"{PORT_BASE + 117} (slurmctld" in msg and "--port-base" in msg, msg
    assert f"pid {os.getpid()}" in msg, msg
    assert not layout.record.exists()


def test_half_started_cluster_is_refused_and_down_stops_only_its_pids(tmp_path: Path) -> None:
    layout = Layout(tmp_path / "cluster")
    gone = subprocess.Popen(["true"])
    gone.wait()
    orphan = subprocess.Popen(["sleep", "300"])  # stands for a daemon whose supervisor died
    bystander = subprocess.Popen(["sleep", "300"])  # same command line, not ours: must survive
    try:
        time.sleep(0.05)
        write_record(
            layout.record,
            RunRecord(
                state_dir=str(layout.root), nodes=2, port_base=PORT_BASE + 200, phase=Phase.STARTING,
                supervisor=ProcRef(name="supervisor", pid=gone.pid, create_time=0.0),
                daemons=[ProcRef.of("slurmctld", orphan.pid)],
            ),
        )  # fmt: skip
        with pytest.raises(manager.DevClusterError) as err:
            manager.up(layout, 2, PORT_BASE + 200)
        msg = str(err.value)
        assert "half-started" in msg and f"slurmctld={orphan.pid}" in msg and "devcluster down" in msg, msg
        assert manager.down(layout) == ["slurmctld"]
        assert orphan.wait(timeout=15) is not None
        assert bystander.poll() is None
    finally:
        for proc in (orphan, bystander):
            proc.kill()
            proc.wait()


def test_up_without_root_says_so(tmp_path: Path) -> None:
    admin = Path(sys.executable).parent / "nuro-admin"
    res = subprocess.run(
        ["runuser", "-u", "nobody", "--", str(admin), "devcluster", "up", "--state-dir", str(tmp_path / "c")],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert res.returncode == 1, res
    assert "needs root" in res.stderr, res.stderr
