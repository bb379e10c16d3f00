"""Attacks on preemption state: fill or forge the job comment, choose ``b-<team>`` or ``urgent`` directly.

Before issue 11 a user who wrote ``{"preempt": {...}}`` into their own job's comment made the job look "already being
preempted" forever, so the controller never chose it again (no reclaim, no urgent preemption); and ``--qos=b-<team>``
chosen at submit skipped the lending limits the controller enforces. Now (as team member alice, on the real cluster):

- the bridge refuses a submit or update that carries, adds, changes or removes a ``preempt`` key (``preempt_forged``);
- a borrower whose comment is full (issue 30: Slurm caps it at 1,024 bytes for root too) or carries forged
  ``preempt``/``ack`` keys is reclaimed like any borrower: the controller's in-flight preemptions live in its own
  ledger, the owner's note in ``admin_comment``, the job's ack comes through its node agent; nothing is read from
  or written to the comment;
- ``--qos=b-<team>`` is refused on submit and on ``scontrol update qos=`` (``qos_borrow``), ``urgent`` is refused on
  update for a user the tier does not list (``tier_denied``).
"""

from __future__ import annotations

import contextlib
import re
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from nuro.protocol import adminnote, jobcomment
from nuro.slurm import JobInfo, JobPhase
from tests.integration.conftest import REPO, LiveCluster, cancel_jobs_of, controller_process, wait_until
from tests.integration.isolation.conftest import ATTACKER, MEMBERS, Guard, as_user

pytestmark = pytest.mark.slurm

BIN = Path(sys.executable).parent
GRACE_S = 20
USERS = {"perception": "alice", "prediction": "priya", "controls": "chen", "simulation": "sam"}
# Records a checkpoint, acknowledges a preemption (USR1) at once, otherwise sleeps.
JOB = """#!/bin/bash
#SBATCH --nodes=1
NJ={bin}/nuro-job
trap '$NJ ack --step 42' USR1
$NJ ckpt --step 40
for i in $(seq 900); do sleep 1; done
"""


@pytest.fixture(scope="module")
def short_grace(cluster: LiveCluster, teams: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The example policy with a short grace, applied (the isolation fixture applied the example itself)."""
    raw = yaml.safe_load((REPO / "examples" / "policy" / "teams.yaml").read_text())
    raw["grace_s"] = GRACE_S
    raw["min_run_s"] = 0  # these tests preempt jobs seconds old; the minimum run time has its own test
    path = tmp_path_factory.mktemp("policy") / "teams.yaml"
    path.write_text(yaml.safe_dump(raw))
    cluster.run([str(BIN / "nuro-admin"), "policy", "apply", str(path)])
    yield path
    cancel_jobs_of(cluster, MEMBERS, timeout_s=180)
    cluster.run([str(BIN / "nuro-admin"), "policy", "apply", str(teams)])


def controller(cluster: LiveCluster, policy: Path, log_path: Path) -> contextlib.AbstractContextManager:
    return controller_process(cluster, policy, log_path, stop_timeout_s=30)


def _submit(cluster: LiveCluster, team: str, *extra: str) -> int:
    argv = ["sbatch", "--parsable", f"--account={team}", "--output=/dev/null", "--requeue", "--gres=gpu:8",
            "--exclusive", *extra]  # fmt: skip
    out = as_user(cluster, USERS[team], argv, stdin=JOB.format(bin=BIN))
    assert out.returncode == 0, out.stderr
    return int(out.stdout.strip().split(";")[0])


def _job(cluster: LiveCluster, job_id: int) -> JobInfo:
    return next(j for j in cluster.backend.jobs() if j.job_id == job_id)


def _running(cluster: LiveCluster, *job_ids: int, timeout_s: float = 60) -> None:
    for job_id in job_ids:
        cluster.backend.wait_for_job(job_id, {JobPhase.RUNNING}, timeout_s=timeout_s)


def _ctld_log(cluster: LiveCluster) -> str:
    return (cluster.layout.log / "slurmctld.log").read_text(errors="replace")


def _held(cluster: LiveCluster, user: str, *args: str) -> int:
    argv = ["sbatch", "--parsable", "--hold", "-J", "nuro-pmark", "-D", "/tmp", "-o", "/dev/null", *args,
            "--wrap", "true"]  # fmt: skip
    out = as_user(cluster, user, argv)
    assert out.returncode == 0, out.stderr
    return int(out.stdout.strip().split(";")[0])


def test_direct_borrow_qos_is_refused(cluster: LiveCluster, guard: Guard) -> None:
    out = as_user(cluster, ATTACKER, ["sbatch", "--parsable", "--hold", "-o", "/dev/null", "--qos=b-perception",
                                      "--gpus-per-node=8", "--wrap", "true"])  # fmt: skip
    assert out.returncode != 0, f"sbatch accepted {out.stdout}"
    assert "sbatch: error: nuro: QOS b-perception is team perception's borrowing QOS: only the nuro controller" in (
        out.stderr
    ), out.stderr
    assert "drop --qos; team perception defaults to g-perception" in out.stderr
    job = _held(cluster, ATTACKER, "--gpus-per-node=8")
    try:
        res = as_user(cluster, ATTACKER, ["scontrol", "update", f"jobid={job}", "qos=b-perception"])
        assert res.returncode != 0 and "Access/permission denied" in res.stderr, res.stderr
        assert _job(cluster, job).qos == "g-perception"
        assert re.search(rf"nuro: reject job_id={job} uid=\d+ user={ATTACKER} rule=qos_borrow", _ctld_log(cluster))
        # the urgent tier on update: chen (controls) is not listed under tiers.urgent
        other = _held(cluster, "chen", "--gpus-per-node=1")
        res = as_user(cluster, "chen", ["scontrol", "update", f"jobid={other}", "qos=urgent"])
        assert res.returncode != 0 and _job(cluster, other).qos == "g-controls", res.stderr
        assert re.search(rf"nuro: reject job_id={other} uid=\d+ user=chen rule=tier_denied", _ctld_log(cluster))
    finally:
        cluster.run(["scancel", "--name=nuro-pmark"], check=False)


def test_user_cannot_write_a_preempt_mark(cluster: LiveCluster, guard: Guard) -> None:
    mark = '{"preempt":{"at":1700000000,"for":1,"why":"already being preempted"}}'
    out = as_user(cluster, ATTACKER, ["sbatch", "--parsable", "--hold", "-o", "/dev/null", f"--comment={mark}",
                                      "--wrap", "true"])  # fmt: skip
    assert out.returncode != 0 and "only the nuro controller writes the preempt key" in out.stderr, out.stderr
    job = _held(cluster, ATTACKER, "--gpus-per-node=1")
    try:
        res = as_user(cluster, ATTACKER, ["scontrol", "update", f"jobid={job}", f"comment={mark}"])
        assert res.returncode != 0 and "Access/permission denied" in res.stderr, res.stderr
        assert "preempt" not in cluster.backend.job_comment(job)
        assert re.search(rf"nuro: reject job_id={job} uid=\d+ user={ATTACKER} rule=preempt_forged", _ctld_log(cluster))
    finally:
        cluster.run(["scancel", "--name=nuro-pmark"], check=False)


def test_a_full_comment_and_forged_keys_do_not_dodge_reclaim(
    cluster: LiveCluster, guard: Guard, short_grace: Path, tmp_path: Path
) -> None:
    """Issue 30's reproduction: alice's borrowed job carries a plain 1,001-byte ``--comment`` (room for nothing
    more under Slurm's 1,024-byte cap). When prediction needs its GPUs back, the controller must still signal it
    (its ledger and the owner's note are outside the comment), hear its ack through the node agent, requeue it and
    let the claimant start. Then, as if the bridge had failed open, root fills the comment to the byte with a forged
    ``preempt`` and ``ack``: nothing the controller does changes either."""
    log_path = tmp_path / "controller.log"
    cancel_jobs_of(cluster, MEMBERS, timeout_s=180)
    # The scenario needs all 8 nodes: with one still busy or drained by an earlier test, a filler would reclaim
    # the borrower before the point of the test and it would prove nothing.
    wait_until(lambda: {n.state.upper() for n in cluster.backend.nodes()} == {"IDLE"}, 120, "all nodes idle")
    full = "x" * 1001
    with controller(cluster, short_grace, log_path):
        guaranteed = [_submit(cluster, "perception") for _ in range(3)]  # perception's 24-GPU quota
        _running(cluster, *guaranteed)
        borrower = _submit(cluster, "perception", f"--comment={full}")
        wait_until(lambda: _job(cluster, borrower).qos == "b-perception", 60, "the controller to lend GPUs")
        _running(cluster, borrower)
        assert cluster.backend.job_comment(borrower) == full
        fillers = [_submit(cluster, t) for t in ("simulation", "simulation", "controls", "prediction")]
        _running(cluster, *fillers)
        assert f"decision=Preempt job={borrower} " not in log_path.read_text(), "reclaimed too early"
        # a forged preempt mark and ack at Slurm's cap (1,024 bytes), written as root: the bridge refuses alice
        forged = {"ack": {"at": 1, "step": 1}, "preempt": {"at": int(time.time()), "for": 0, "why": "already"}}
        text = jobcomment.canonical({**forged, "pad": ""})
        text = jobcomment.canonical({**forged, "pad": "p" * (1024 - len(text))})
        assert len(text) == 1024
        res = as_user(cluster, ATTACKER, ["scontrol", "update", f"jobid={borrower}", f"comment={text}"])
        assert res.returncode != 0, "the bridge let alice write a preempt key"
        cluster.run(["scontrol", "update", f"jobid={borrower}", f"comment={text}"])
        claimant = _submit(cluster, "prediction")
        t_claim = time.time()
        wait_until(lambda: f"decision=Preempt job={borrower} applied=True" in log_path.read_text(), 60,
                   f"the controller to signal the full-comment borrower {borrower}")  # fmt: skip
        note = adminnote.parse(cluster.backend.job_admin_comment(borrower)).get("preempt") or {}
        assert note.get("for") == claimant, note  # the owner's note: where the job's own bytes cannot crowd it
        wait_until(lambda: _job(cluster, borrower).restart_count >= 1, 60, f"borrower {borrower} to be requeued")
        _running(cluster, claimant, timeout_s=90)
        print(f"\nclaimant {claimant} running {time.time() - t_claim:.1f} s after submit (full-comment borrower)")
        log = log_path.read_text()
        assert f"decision=Requeue job={borrower} applied=True" in log, log[-3000:]
        assert "requeued after ack" in log, "the ack did not reach the controller through the node agent"
        assert "too long" not in log and "not applied" not in log, log[-3000:]
        assert all(_job(cluster, j).phase is JobPhase.RUNNING for j in guaranteed), "guaranteed work was touched"
        assert cluster.backend.job_comment(borrower) == text  # nuro never wrote into the job's comment
    cancel_jobs_of(cluster, MEMBERS, timeout_s=180)
