"""The Ansible roles against real SSH hosts (network namespaces with sshd) and the real dev cluster as Slurm.

Mapping: two of the session's SSH hosts (``ssh_hosts``, ``nuro.devcluster.sshhosts``) play compute nodes
gpu001 and gpu002 of the dev cluster; gpu001 is also the login node. The controller is this machine
(``ansible_connection: local``), where scontrol/squeue reach the dev cluster; the inventory is built from the dev
cluster's own description (``nuro.cluster.inventory.inventory_from_description``) so the Slurm files the play renders
must
equal the dev cluster's byte for byte. The other nodes are in the inventory (slurm.conf lists every node) but
outside ``--limit``.

Namespaces share the filesystem: each host writes under its own ``nuro_root`` in the test's temp dir, and all use
the checkout's venv (``nuro_venv`` = this venv, ``nuro_install_venv: false``). systemd is not PID 1 here, so units
are installed but not started (``nuro_manage_services: false``).

Run with NURO_TEST_PORT_BASE=12800 NURO_TEST_CLUSTER_DIR=.devcluster-test-12800 to keep clear of CI's cluster.
"""

from __future__ import annotations

import grp
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

import pytest
import yaml

from nuro.cluster.inventory import inventory_from_description
from nuro.devcluster.layout import describe
from nuro.devcluster.sshhosts import SSHHosts, write_inventory
from tests.integration.conftest import TEST_ACCOUNT, TEST_NODES, TEST_PORT_BASE, LiveCluster, wait_until

pytestmark = pytest.mark.slurm

REPO = Path(__file__).resolve().parents[2]
ANSIBLE_DIR = REPO / "ansible"
VENV_BIN = Path(sys.executable).parent
ROLLED = ("gpu001", "gpu002")  # two batches of one: the batch logic is the same as for 500 nodes, at CI cost
BATCH = 1
BYSTANDER = "gpu005"  # runs a job through every rollout; never in the play's --limit
LIMIT = ",".join(("ctl", *ROLLED))
NO_SLURM = {"SLURM_CONF": "/nonexistent/slurm.conf"}
RECAP = re.compile(r"^(\S+)\s+: ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)", re.M)


@dataclass
class Run:
    """An ansible-playbook started in the background (``Deploy.start``); ``Deploy.finish`` waits for it."""

    proc: subprocess.Popen
    out: TextIO  # the run's stdout and stderr
    label: str
    t0: float
    args: tuple[str, ...]


@dataclass
class Deploy:
    """One test deployment: inventory, per-host roots and a way to run the playbook."""

    root: Path
    inventory: Path
    cluster: LiveCluster
    timings: dict[str, float] = field(default_factory=dict)
    converged: bool = False
    # A run one test starts for a later test to judge, with what that test compares against (see CHECK_DIFF).
    started: dict[str, tuple[Run, str]] = field(default_factory=dict)

    def host_root(self, host: str) -> Path:
        return self.root / "roots" / host

    def ensure_converged(self) -> None:
        """The first run's state, for a test run on its own (in module order the first-run test made it)."""
        if not self.converged:
            self.play(label="converge")
            self.converged = True

    def start(self, *extra: str, label: str = "", limit: str = LIMIT) -> Run:
        """Start ansible-playbook site.yml with this inventory, without waiting (stdout goes to a file)."""
        env = {
            **os.environ,
            "ANSIBLE_CONFIG": str(ANSIBLE_DIR / "ansible.cfg"),
            "ANSIBLE_HOME": str(self.root / "ansible-home"),
            "ANSIBLE_NOCOLOR": "1",
            "ANSIBLE_FORCE_COLOR": "0",
            "PATH": f"{VENV_BIN}:{os.environ.get('PATH', '/usr/bin:/bin')}",
        }
        argv = [str(VENV_BIN / "ansible-playbook"), "-i", str(self.inventory), "site.yml", "--limit", limit, *extra]
        out = (self.root / f"play-{label or 'run'}-{time.monotonic_ns()}.log").open("w+")
        proc = subprocess.Popen(argv, cwd=ANSIBLE_DIR, env=env, stdout=out, stderr=subprocess.STDOUT, text=True)
        return Run(proc=proc, out=out, label=label, t0=time.monotonic(), args=extra)

    def finish(self, run: Run, check: bool = True) -> subprocess.CompletedProcess:
        """Wait for a started run; returns the process (stdout holds the recap)."""
        try:
            run.proc.wait(timeout=max(1.0, 300 - (time.monotonic() - run.t0)))
        except subprocess.TimeoutExpired:
            run.proc.kill()
            run.proc.wait()
            raise
        if run.label:
            self.timings[run.label] = time.monotonic() - run.t0
        run.out.seek(0)
        stdout = run.out.read()
        run.out.close()
        proc = subprocess.CompletedProcess(run.proc.args, run.proc.returncode, stdout, "")
        if check and proc.returncode != 0:
            raise AssertionError(f"ansible-playbook {' '.join(run.args)} failed ({proc.returncode}):\n{stdout[-6000:]}")
        return proc

    def play(self, *extra: str, check: bool = True, label: str = "", limit: str = LIMIT) -> subprocess.CompletedProcess:
        """ansible-playbook site.yml with this inventory; returns the process (stdout holds the recap)."""
        return self.finish(self.start(*extra, label=label, limit=limit), check=check)


def recap(proc: subprocess.CompletedProcess) -> dict[str, dict[str, int]]:
    """PLAY RECAP → host → {ok, changed, unreachable, failed}."""
    return {
        m[0]: {"ok": int(m[1]), "changed": int(m[2]), "unreachable": int(m[3]), "failed": int(m[4])}
        for m in RECAP.findall(proc.stdout)
    }


def _test_inventory(root: Path, ssh_hosts: SSHHosts, cluster: LiveCluster) -> Path:
    """The dev cluster's description as an inventory, gpu001…4 reached over SSH, test settings as group vars."""
    desc = describe(cluster.layout, TEST_NODES, TEST_PORT_BASE)
    inv = inventory_from_description(desc, controller="ctl")
    ssh_inv = yaml.safe_load(write_inventory(root / "ssh-hosts.yml", ssh_hosts.hosts).read_text())
    conn = list(ssh_inv["all"]["hosts"].values())
    if len(conn) < len(ROLLED):
        pytest.fail(f"need {len(ROLLED)} SSH hosts, the session has {len(conn)}")
    children = inv["all"]["children"]
    for name, conn_vars in zip(ROLLED, conn, strict=False):
        children["compute"]["hosts"][name].update(conn_vars)
    children["slurm_controller"]["hosts"]["ctl"].update(
        {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
    )
    children["login"] = {"hosts": {"gpu001": None}}
    env = cluster.env
    inv["all"]["vars"] = {
        "nuro_root": str(root / "roots" / "{{ inventory_hostname }}"),
        "nuro_venv": str(VENV_BIN.parent),
        "nuro_install_venv": False,
        "nuro_manage_services": False,
        "nuro_slurm_conf": str(cluster.layout.slurm_conf),
        "nuro_slurm_admin_env": {**env, "PATH": f"{VENV_BIN}:/usr/sbin:/usr/bin:/sbin:/bin"},
        "nuro_s3_endpoint": env.get("NURO_S3_ENDPOINT", "http://127.0.0.1:1"),
        "nuro_metrics_url": env.get("NURO_METRICS_URL", "influx1://127.0.0.1:1/nuro"),
        # Test stand-ins for the vault (the real ones are ansible-vault encrypted in the site's inventory).
        "vault_nuro_s3_access_key": "test-access",
        "vault_nuro_s3_secret_key": "test-secret",
        "vault_nuro_metrics_token": "test-token",
        "vault_nuro_s3_team_keys": {"perception": {"access_key": "team-p", "secret_key": "team-p-secret"}},
        "vault_nuro_metrics_team_logins": {"perception": {"user": "team_perception", "token": "team-p-metrics"}},
        "nuro_team_members": {"perception": ["alice"]},
        "vault_nuro_heartbeat_key": "00" * 32,
        # The controller host's MLflow with basic-auth (its venv is not installed: only the files are checked).
        "nuro_mlflow_url": "http://127.0.0.1:1",
        "nuro_mlflow_install": True,
        "nuro_mlflow_install_venv": False,
        "nuro_mlflow_basic_auth": True,
        "vault_nuro_mlflow_admin_password": "test-mlflow-admin",
        "vault_nuro_mlflow_secret_key": "ab" * 32,
        # No GPUs in the namespaces: no probe, no expected count (an empty value leaves the key out).
        "nuro_node_env_extra": {"NURO_HEALTH_PROBE": "none", "NURO_EXPECT_GPUS": ""},
        # slurmctld listens on the root namespace's loopback, which a namespace cannot reach: the dry-run health
        # check's read of the node state would only add a 4 s connect failure, so it gets no Slurm config.
        "nuro_healthcheck_env": NO_SLURM,
        "nuro_agent_status_dir": "",  # no agents in the namespaces: do not judge their liveness
        "nuro_staging_min_free_gb": 1,
        "nuro_rollout_poll_s": 1,
        "nuro_rollout_drain_timeout_s": 60,
    }
    path = root / "inventory.yml"
    path.write_text(yaml.safe_dump(inv, sort_keys=False))
    return path


@pytest.fixture(scope="module")
def deploy(cluster: LiveCluster, ssh_hosts: SSHHosts, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deploy]:
    root = tmp_path_factory.mktemp("ansible")
    d = Deploy(root=root, inventory=_test_inventory(root, ssh_hosts, cluster), cluster=cluster)
    yield d
    for run, _ in d.started.values():  # started for a test that did not run (-k)
        run.proc.kill()
        d.finish(run, check=False)
    for node in ROLLED:  # leave the shared cluster as we found it
        cluster.run(["scontrol", "update", f"nodename={node}", "state=resume"], check=False)
    print(f"\nansible timings (s): {', '.join(f'{k}={v:.1f}' for k, v in d.timings.items())}")


@pytest.fixture(scope="module", autouse=True)
def lint() -> Iterator[Run]:
    """ansible-lint, started when the module starts and judged by its own test at the end: it needs no cluster and
    is pure CPU, so it runs beside the first play (which mostly waits on one host at a time) instead of after it."""
    with tempfile.TemporaryFile("w+") as out:
        proc = subprocess.Popen(
            [str(VENV_BIN / "ansible-lint"), "--offline", "--profile", "production", "--nocolor"],
            cwd=ANSIBLE_DIR, stdout=out, stderr=subprocess.STDOUT, text=True,
            env={**os.environ, "PATH": f"{VENV_BIN}:{os.environ.get('PATH', '/usr/bin:/bin')}"},
        )  # fmt: skip
        yield Run(proc=proc, out=out, label="lint", t0=time.monotonic(), args=())
        if proc.poll() is None:  # its test was deselected
            proc.kill()
        proc.wait()


class NodeWatch:
    """Polls sinfo in a thread: when each node was drained, and the most nodes drained at once."""

    def __init__(self, cluster: LiveCluster, nodes: tuple[str, ...]) -> None:
        self.cluster, self.nodes = cluster, nodes
        self.drained_at: dict[str, float] = {}
        self.resumed_at: dict[str, float] = {}
        self.max_drained = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> NodeWatch:
        self._t0 = time.monotonic()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        self._sample()  # the last resume may land after the thread's last look

    def _sample(self) -> None:
        out = self.cluster.run(["sinfo", "-h", "-N", "-o", "%N|%T"], check=False).stdout
        states = dict(line.split("|", 1) for line in out.split() if "|" in line)
        now = time.monotonic() - self._t0
        drained = {n for n in self.nodes if "drain" in states.get(n, "")}
        self.max_drained = max(self.max_drained, len(drained))
        for n in drained:
            self.drained_at.setdefault(n, now)
        for n in self.nodes:
            if n in self.drained_at and n not in drained:
                self.resumed_at.setdefault(n, now)

    def _run(self) -> None:
        while not self._stop.is_set():
            self._sample()
            self._stop.wait(0.2)


def _node_state(cluster: LiveCluster, node: str) -> tuple[str, str]:
    out = cluster.run(["sinfo", "-h", "-n", node, "-o", "%T|%E"]).stdout.strip()
    state, _, reason = out.partition("|")
    return state, reason


def _bystander_job(cluster: LiveCluster) -> int:
    res = cluster.run(
        ["sbatch", "--parsable", f"--account={TEST_ACCOUNT}", "-w", BYSTANDER, "--output=/dev/null",
         "--job-name=bystander", "--wrap", "sleep 600"],
        user="nuro-alice",
    )  # fmt: skip
    job_id = int(res.stdout.strip().split(";")[0])
    wait_until(lambda: _job(cluster, job_id)[0] == "RUNNING", 30, f"bystander job {job_id} RUNNING on {BYSTANDER}")
    return job_id


def _job(cluster: LiveCluster, job_id: int) -> tuple[str, int]:
    """(state, restart count) of a job from scontrol."""
    out = cluster.run(["scontrol", "show", "job", "-o", str(job_id)], check=False).stdout
    state = re.search(r"JobState=(\S+)", out)
    restarts = re.search(r"Restarts=(\d+)", out)
    return (state[1] if state else "GONE", int(restarts[1]) if restarts else -1)


# ---- tests ---------------------------------------------------------------------------------------------------


def test_first_run_rolls_out_in_batches_and_spares_other_jobs(deploy: Deploy) -> None:
    """A fresh deployment is already a rolling update: no node has a rollout digest, so every node is drained
    (BATCH at a time), configured, health-checked and resumed, while a job on a node outside the play keeps running."""
    job_id = _bystander_job(deploy.cluster)
    try:
        with NodeWatch(deploy.cluster, ROLLED) as watch:
            proc = deploy.play("-e", f"nuro_rollout_batch={BATCH}", label="first_run")
        deploy.converged = True
        first = recap(proc)
        assert set(first) == {"ctl", *ROLLED}
        assert all(r["changed"] > 0 and r["failed"] == 0 for r in first.values()), first
        assert set(watch.drained_at) == set(ROLLED), watch.drained_at
        assert watch.max_drained <= BATCH, f"more than one batch drained at once: {watch.max_drained}"
        first_batch_back = max(watch.resumed_at[n] for n in ROLLED[:BATCH])
        second_batch_drained = min(watch.drained_at[n] for n in ROLLED[BATCH:])
        assert second_batch_drained >= first_batch_back - 0.5, (watch.drained_at, watch.resumed_at)
        for n in ROLLED:
            deploy.timings[f"{n}_drained_s"] = watch.resumed_at[n] - watch.drained_at[n]
        assert all("drain" not in _node_state(deploy.cluster, n)[0] for n in ROLLED)
        assert _job(deploy.cluster, job_id) == ("RUNNING", 0), "the bystander job was disturbed"
    finally:
        deploy.cluster.run(["scancel", str(job_id)], check=False)


# The check-mode run of test_check_diff_shows_the_change_and_changes_nothing: a changed setting on the last node.
CHECK_DIFF = ("--check", "--diff", "-e", "nuro_staging_min_free_gb=2")


def _start_check_diff(deploy: Deploy) -> tuple[Run, str]:
    """Start the check-diff run; returns it with the node env file's text before it."""
    before = (deploy.host_root(ROLLED[-1]) / "etc" / "nuro" / "nodeagent.env").read_text()
    return deploy.start(*CHECK_DIFF, label="check_diff", limit=ROLLED[-1]), before


def test_second_run_changes_nothing(deploy: Deploy) -> None:
    deploy.ensure_converged()
    # The next test's check-mode run starts now and runs beside this one: neither may change anything, and each
    # play mostly waits on one host at a time, so on 2 cores the two take little longer than one.
    deploy.started["check_diff"] = _start_check_diff(deploy)
    # Both compute nodes in one batch: nothing drains when nothing changes, so they converge side by side.
    second = recap(deploy.play("-e", "nuro_rollout_batch=2", label="second_run"))
    assert set(second) == {"ctl", *ROLLED}
    assert all(r["changed"] == 0 and r["failed"] == 0 for r in second.values()), second
    assert all("drain" not in _node_state(deploy.cluster, n)[0] for n in ROLLED)  # no drain when nothing changes


def test_rendered_slurm_files_equal_the_dev_clusters(deploy: Deploy) -> None:
    deploy.ensure_converged()
    etc = deploy.host_root("ctl") / "etc" / "slurm"
    for name in ("slurm.conf", "topology.conf", "gres.conf", "job_submit.lua"):
        assert (etc / name).read_bytes() == (deploy.cluster.layout.etc / name).read_bytes(), name
    node_etc = deploy.host_root(ROLLED[-1]) / "etc" / "slurm"  # slurmd's copies on a compute node
    for name in ("slurm.conf", "topology.conf", "gres.conf"):
        assert (node_etc / name).read_bytes() == (deploy.cluster.layout.etc / name).read_bytes(), name


def test_files_modes_and_no_secret_in_world_readable_files(deploy: Deploy) -> None:
    deploy.ensure_converged()
    node = deploy.host_root("gpu002")
    env_file = node / "etc" / "nuro" / "nodeagent.env"
    assert env_file.stat().st_mode & 0o777 == 0o600
    assert "AWS_SECRET_ACCESS_KEY=test-secret" in env_file.read_text()
    prolog = node / "usr" / "local" / "bin" / "nuro-prolog"
    assert prolog.read_text() == f'#!/bin/sh\nNURO_ENV_FILE={env_file} exec {VENV_BIN}/nuro-prolog "$@"\n'
    # the shipped unit, pointed at this deployment's venv and settings dir (the test's are not /opt, /etc)
    shipped = (REPO / "healthcheck" / "systemd" / "nuro-nodeagent.service").read_text()
    unit = (node / "etc" / "systemd" / "system" / "nuro-nodeagent.service").read_text()
    assert unit == shipped.replace("/opt/nuro/venv/", f"{VENV_BIN.parent}/").replace("/etc/nuro/", f"{node}/etc/nuro/")
    assert f"ExecStart={VENV_BIN}/nuro-nodeagent " in unit and f"EnvironmentFile={env_file}\n" in unit
    # slurmd forgets the jobs of before a crash (nuro.healthcheck.slurmdspool) before it starts
    dropin = (node / "etc" / "systemd" / "system" / "slurmd.service.d" / "nuro.conf").read_text()
    assert f"\nExecStartPre=-{VENV_BIN}/python -m nuro.healthcheck.slurmdspool --spool /" in dropin, dropin
    ctl_unit = (deploy.host_root("ctl") / "etc" / "systemd" / "system" / "nuro-controller.service").read_text()
    ctl_etc = deploy.host_root("ctl") / "etc" / "nuro"
    assert f"ExecStart={VENV_BIN}/nuro-controller --config {ctl_etc}/controller.yaml\n" in ctl_unit
    staging = node / "var" / "tmp" / "nuro-staging"
    assert staging.is_dir() and staging.stat().st_mode & 0o777 == 0o755
    login = deploy.host_root("gpu001")
    profile = (login / "etc" / "profile.d" / "nuro.sh").read_text()
    assert "NURO_S3_ENDPOINT" in profile and "NURO_METRICS_URL" in profile
    assert "test-secret" not in profile and "test-token" not in profile
    assert (login / "etc" / "nuro" / "credentials.env").stat().st_mode & 0o777 == 0o640
    assert "test-secret" not in (login / "etc" / "nuro" / "credentials.env").read_text()  # no node key for users
    assert f"NURO_S3_CREDENTIALS={login}/etc/nuro/s3" in profile
    for host in (login, node):  # jobs on compute nodes use their team's key too
        team_file = host / "etc" / "nuro" / "s3" / "perception.env"
        st = team_file.stat()
        assert (st.st_mode & 0o777, grp.getgrgid(st.st_gid).gr_name) == (0o640, "nuro-perception")
        assert team_file.read_text().endswith("AWS_ACCESS_KEY_ID=team-p\nAWS_SECRET_ACCESS_KEY=team-p-secret\n")
        metrics_file = host / "etc" / "nuro" / "metrics" / "perception.env"
        st = metrics_file.stat()
        assert (st.st_mode & 0o777, grp.getgrgid(st.st_gid).gr_name) == (0o640, "nuro-perception")
        assert "NURO_METRICS_USER=team_perception\nNURO_METRICS_TOKEN=team-p-metrics\n" in metrics_file.read_text()
        assert "/nuro_perception\n" in metrics_file.read_text()
    assert f"NURO_METRICS_CREDENTIALS={login}/etc/nuro/metrics" in profile
    assert "test-token" not in (login / "etc" / "nuro" / "credentials.env").read_text()  # no shared token
    assert "team-p-secret" not in env_file.read_text() and "alice" in grp.getgrnam("nuro-perception").gr_mem
    # MLflow with basic-auth on the controller host: the admin password and CSRF key only in root's 0600 files
    mlflow_env, bridge_env = ctl_etc / "mlflow.env", ctl_etc / "mlflow-bridge.env"
    ini = deploy.host_root("ctl") / "var" / "lib" / "nuro" / "mlflow" / "basic_auth.ini"
    for f in (mlflow_env, bridge_env, ini):
        assert f.stat().st_mode & 0o777 == 0o600 and f.stat().st_uid == 0, f
    assert "NURO_MLFLOW_APP_ARGS=--app-name basic-auth\n" in mlflow_env.read_text()
    assert f"MLFLOW_AUTH_CONFIG_PATH={ini}\nMLFLOW_AUTH_ADMIN_PASSWORD=test-mlflow-admin\n" in mlflow_env.read_text()
    assert "MLFLOW_TRACKING_USERNAME=admin\nMLFLOW_TRACKING_PASSWORD=test-mlflow-admin\n" in bridge_env.read_text()
    assert "default_permission = NO_PERMISSIONS\n" in ini.read_text()
    mlflow_unit = (deploy.host_root("ctl") / "etc" / "systemd" / "system" / "nuro-mlflow.service").read_text()
    assert "--workers 1 $NURO_MLFLOW_APP_ARGS\n" in mlflow_unit and "test-mlflow-admin" not in mlflow_unit
    # the backend store URI (a database password in production) reaches mlflow by environment, never by argv
    assert "--backend-store-uri" not in mlflow_unit
    assert "\nMLFLOW_BACKEND_STORE_URI=sqlite:///" in mlflow_env.read_text()
    assert "MLFLOW_TRACKING_URI=http://127.0.0.1:1" in profile and "test-mlflow-admin" not in profile


def test_check_diff_shows_the_change_and_changes_nothing(deploy: Deploy) -> None:
    deploy.ensure_converged()
    env_file = deploy.host_root(ROLLED[-1]) / "etc" / "nuro" / "nodeagent.env"
    run, before = deploy.started.pop("check_diff", None) or _start_check_diff(deploy)  # started by the second run
    proc = deploy.finish(run)
    assert "-NURO_STAGING_MIN_FREE_GB=1" in proc.stdout and "+NURO_STAGING_MIN_FREE_GB=2" in proc.stdout
    assert recap(proc)[ROLLED[-1]]["changed"] > 0
    assert env_file.read_text() == before
    assert "drain" not in _node_state(deploy.cluster, ROLLED[-1])[0]  # check mode never drains


def test_failing_health_check_stops_the_rollout_with_the_node_drained(deploy: Deploy) -> None:
    """A release bump rolls (digest differs); the first batch fails its health check, so the play stops there."""
    deploy.ensure_converged()
    proc = deploy.play(
        "-e", "nuro_release=rollout-bad", "-e", f"nuro_rollout_batch={BATCH}",
        "-e", json.dumps({"nuro_healthcheck_env": {**NO_SLURM, "NURO_STAGING_MIN_FREE_GB": "1000000"}}),
        check=False, label="failing_rollout", limit=",".join(ROLLED),
    )  # fmt: skip
    assert proc.returncode != 0, proc.stdout[-3000:]
    assert "staging disk" in proc.stdout  # nuro-healthcheck's own reason reaches the operator
    for node in ROLLED[:BATCH]:
        assert _node_state(deploy.cluster, node) == ("drained", "nuro-rollout"), node
    for node in ROLLED[BATCH:]:  # the next batch was never started
        assert "drain" not in _node_state(deploy.cluster, node)[0], node
    # Fixing the cause and re-running resumes them (their digest still differs and the drain is ours).
    deploy.play("-e", "nuro_release=rollout-bad", label="recovery", limit=",".join(ROLLED[:BATCH]))
    assert all("drain" not in _node_state(deploy.cluster, n)[0] for n in ROLLED)


def test_ansible_lint_production_profile_is_clean(lint: Run) -> None:
    """Last in the module: ansible-lint has run in the background since the module started (the ``lint`` fixture)."""
    lint.proc.wait(timeout=180)
    lint.out.seek(0)
    assert lint.proc.returncode == 0, lint.out.read()[-6000:]
