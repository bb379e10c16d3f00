"""One real Slurm cluster for the whole integration session (8 nodes × 8 fake GPUs, its own state dir and ports).

It is brought up fresh (any earlier test cluster in the same state dir is stopped and purged first) so job ids,
accounting and node states start clean, and stopped by PID at the end. Team members are real Unix users created
here with useradd, with Slurm associations, because jobs run as them.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from nuro.devcluster import manager, scenario
from nuro.devcluster.layout import Layout
from nuro.devcluster.users import POLICY_USERS, ensure_unix_users
from nuro.slurm import CliBackend

REPO = Path(__file__).resolve().parents[2]
TEST_STATE_DIR = Path(os.environ.get("NURO_TEST_CLUSTER_DIR", REPO / ".devcluster-test"))
TEST_PORT_BASE = int(os.environ.get("NURO_TEST_PORT_BASE", "22800"))
TEST_NODES = 8
# The test clusters' controllers declare a node lost after 8 silent beats (2 s), not the product's 4 (1 s): every
# agent of the three CI clusters shares 2 cores, and a few stalled together for ~1 s under load, taking a test's job
# down with their nodes. Behaviour is the same; speed is the benches' to measure (they use the product's settings).
os.environ.setdefault("NURO_DEVCLUSTER_MISS_LIMIT", "8")
# The session clusters run without MLflow (~500 MB and a few seconds each, three clusters in CI): the tracking test
# runs a server of its own, and the lifecycle test turns it on to prove up starts and down stops it.
os.environ.setdefault("NURO_DEVCLUSTER_MLFLOW", "0")
#: The Slurm version of the session's cluster (``make test SLURM=26.05`` sets it): the host's 22.05 by default.
TEST_SLURM = os.environ.get("NURO_TEST_SLURM", "22.05")
#: Its placement plugin: ``tree`` (topology/tree) by default, ``block`` (topology/block, 24.11+) when
#: NURO_TEST_TOPOLOGY says so (CI runs 26.05 with block, so the placement test proves both).
TEST_TOPOLOGY = os.environ.get("NURO_TEST_TOPOLOGY", "tree")
TEST_ACCOUNT = "nurotest"
TEST_USERS = ("nuro-alice", "nuro-bob")


@dataclass
class LiveCluster:
    layout: Layout
    backend: CliBackend
    env: dict[str, str]

    def run(self, argv: list[str], user: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
        """Run a plain Slurm client command against the cluster, optionally as another Unix user."""
        if user:
            argv = ["runuser", "-u", user, "--", "env", *(f"{k}={v}" for k, v in self.env.items()), *argv]
        return subprocess.run(
            argv, env={**os.environ, **self.env}, capture_output=True, text=True, timeout=60, check=check
        )

    def sbatch_as(self, user: str, args: list[str], script: str) -> int:
        """``sbatch --parsable <args>`` as ``user`` with the script on stdin; the new job's id."""
        argv = ["runuser", "-u", user, "--", "env", *(f"{k}={v}" for k, v in self.env.items()), "sbatch",
                "--parsable", *args]  # fmt: skip
        res = subprocess.run(argv, input=script, capture_output=True, text=True, timeout=30, check=True)
        return int(res.stdout.strip().split(";")[0])

    def wait_job_showing_output(self, job_id: int, output: Path, timeout_s: float):  # noqa: ANN201 - a JobInfo
        """Wait for a job to end; on timeout cancel it and fail with what it printed (the test may delete it)."""
        from nuro.slurm.errors import JobWaitTimeout

        try:
            return self.backend.wait_for_job(job_id, timeout_s=timeout_s)
        except JobWaitTimeout as exc:
            self.run(["scancel", str(job_id)], check=False)
            text = output.read_text(errors="replace")[-4000:] if output.exists() else "(no output file)"
            raise AssertionError(f"{exc}\n--- {output.name} ---\n{text}") from None


def wait_until(predicate: Callable[[], object], timeout_s: float, what: str, interval_s: float = 0.25):
    """Poll until ``predicate()`` is truthy; fail the test with ``what`` (what we waited for) on timeout."""
    try:
        return scenario.wait_for(what, predicate, timeout_s, interval_s)
    except scenario.ScenarioError as exc:
        raise AssertionError(str(exc)) from None


def apply_example_policy(
    cluster: LiveCluster, folder: Path, edit: Callable[[dict], None] | None = None, **top: object
) -> Path:
    """examples/policy/teams.yaml with ``top`` keys set (``grace_s=15``...) and ``edit`` applied to the raw mapping,
    written to ``folder/teams.yaml`` and applied with ``nuro-admin policy apply``; returns the file."""
    raw = yaml.safe_load((REPO / "examples" / "policy" / "teams.yaml").read_text())
    raw.update(top)
    if edit is not None:
        edit(raw)
    path = folder / "teams.yaml"
    path.write_text(yaml.safe_dump(raw))
    cluster.run([str(Path(sys.executable).parent / "nuro-admin"), "policy", "apply", str(path)])
    return path


@contextlib.contextmanager
def controller_process(
    cluster: LiveCluster, policy: Path, log_path: Path, *extra: str, stop_timeout_s: float = 20
) -> Iterator[subprocess.Popen]:
    """The real ``nuro-controller`` daemon as a child process (0.5 s cycles, the cluster's controller state dir: its
    preemption ledger, and the progress the cluster's detector hears from the node agents), logging to
    ``log_path``; stopped by PID with SIGTERM, which it must obey within
    ``stop_timeout_s``. One that does not is killed before the test fails: a leaked controller would go on acting on
    later tests' jobs with this test's policy."""
    miss = ["--miss-limit", os.environ["NURO_DEVCLUSTER_MISS_LIMIT"]] if "--miss-limit" not in extra else []
    argv = [str(Path(sys.executable).parent / "nuro-controller"), "--policy", str(policy), "--interval-s", "0.5",
            "--heartbeat-key", str(cluster.layout.heartbeat_key), "--state-dir", str(cluster.layout.controller_state),
            *miss, *extra]  # fmt: skip
    with open(log_path, "w") as log:
        proc = subprocess.Popen(argv, env={**os.environ, **cluster.env}, stdout=log, stderr=subprocess.STDOUT)
    try:
        yield proc
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            rc = proc.wait(timeout=stop_timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
            rc = None
        assert rc == 0, f"controller stopped with {rc} (None: ignored SIGTERM, killed)\n{log_path.read_text()[-3000:]}"


def controller_progress(cluster: LiveCluster, job_id: int):  # noqa: ANN201 - Progress | None
    """What the cluster's controller heard of ``job_id`` from the node agents (its ``progress.json``): the newest
    commit and ack, or None (issue 30: never from the job's comment)."""
    from nuro.slurm_plugins.controller.progress import ProgressFile

    return ProgressFile(cluster.layout.controller_state).view().get(job_id)


def in_flight(cluster: LiveCluster, job_id: int) -> float | None:
    """When the controller signalled ``job_id`` for a preemption still in flight (its ledger), or None."""
    from nuro.slurm_plugins.controller.ledger import Ledger

    entry = Ledger(cluster.layout.controller_state).load().get(job_id)
    return entry[0] if entry else None


def cancel_jobs_of(cluster: LiveCluster, users: tuple[str, ...], timeout_s: float = 60) -> None:
    """Cancel every job of these users and wait until slurmctld lists none of them as active.

    ``scancel -u`` takes one user, and accounting refuses to delete an association while a job of it is still
    active (completing counts), so clean-up must wait, not just signal.
    """
    for user in users:
        cluster.run(["scancel", "-u", user], check=False)
    # By phase, not the first word of the state: 24.11+ list a cancelled job still ending as
    # "CANCELLED+COMPLETING", which still holds its nodes (the adapter maps it to COMPLETING).
    wait_until(
        lambda: not [j for j in cluster.backend.jobs() if j.user in users and not j.phase.is_terminal],
        timeout_s,
        f"the jobs of {', '.join(users)} to end",
    )
    wait_accounting_ended(cluster, users, timeout_s)


def wait_accounted(cluster: LiveCluster, job_id: int | str, state: str = "RUNNING", timeout_s: float = 60) -> None:
    """Wait until slurmdbd's job table holds this job in ``state``, not only slurmctld.

    What accounting refuses or allows (``sacctmgr delete`` of an association with a job in flight) is decided on that
    table, which slurmctld's dbd agent fills seconds behind its own view on a loaded box."""
    _wait_sacct(cluster, ["-j", str(job_id), "-o", "State"], [state], f"accounting to hold job {job_id} as {state}",
                timeout_s)  # fmt: skip


def wait_accounting_ended(cluster: LiveCluster, users: tuple[str, ...], timeout_s: float = 60) -> None:
    """Wait until slurmdbd has recorded the end of every job of these users, not only slurmctld.

    ``sacctmgr delete`` refuses ("Job(s) active, cancel job(s) before remove") while a job of the association has no
    end time in the job table (``time_end=0 && state<JOB_COMPLETE``); slurmctld sends the end through its dbd agent
    queue, which lags the controller's own view by up to a few seconds on a loaded box.
    """
    _wait_sacct(cluster, ["-u", ",".join(users), "-s", "PD,R,S", "-o", "JobID"], [],
                f"accounting to record the end of the jobs of {', '.join(users)}", timeout_s)  # fmt: skip


def _wait_sacct(cluster: LiveCluster, query: list[str], expect: list[str], what: str, timeout_s: float) -> None:
    """Wait until ``sacct -X -n -P <query>`` answers and prints exactly the words ``expect``."""
    argv = ["sacct", "-X", "-n", "-P", *query]
    wait_until(lambda: (done := cluster.run(argv, check=False)).returncode == 0 and done.stdout.split() == expect,
               timeout_s, what)  # fmt: skip


def ensure_test_users(cluster: LiveCluster) -> None:
    ensure_unix_users(TEST_USERS + POLICY_USERS)
    cluster.run(
        ["sacctmgr", "-i", "add", "account", TEST_ACCOUNT, "Description=nuro test fixture", "Organization=nurotest"]
    )
    cluster.run(["sacctmgr", "-i", "add", "user", *TEST_USERS, f"Account={TEST_ACCOUNT}"])


@pytest.fixture
def restore(cluster: LiveCluster) -> Iterator[list[str]]:
    """Nodes a test touches (it appends their names): revived, their agents beating, resumed and back in service
    afterwards, whatever the test did to them."""
    touched: list[str] = []
    yield touched

    def node(name: str):  # noqa: ANN202 - a NodeInfo
        return next(n for n in cluster.backend.nodes() if n.name == name)

    status = manager.status(cluster.layout)
    revived_at: dict[str, float] = {}
    for name in touched:
        if name in status.get("killed_nodes", {}):
            revived_at[name] = time.time()
            manager.revive_node(cluster.layout, name)

    def agent_reports(name: str) -> bool:
        # a revived node's agent is back only once it writes its status again: the killed agent's file is still there
        path = cluster.layout.agents_dir / f"{name}.json"
        return path.exists() and path.stat().st_mtime >= revived_at.get(name, 0.0)

    for name in touched:
        wait_until(lambda n=name: agent_reports(n), 30, f"{name}'s agent reporting")
        if node(name).is_drained or "DOWN" in node(name).flags:
            cluster.run(["scontrol", "update", f"nodename={name}", "state=resume"], check=False)
    wait_until(
        lambda: all(node(n).state in ("IDLE", "MIXED", "ALLOCATED") for n in touched), 60, f"{touched} back in service"
    )
