"""nuro-controller on the real cluster: hard quotas without it, borrowing within lending limits, checkpoint-confirmed
reclaim, urgent preemption, restart, and no team above its quota at any sampled moment.

The policy is examples/policy/teams.yaml (64 GPUs: perception 24, prediction 16, controls 8, simulation 16) with a
short grace so the no-ack case is quick. Every job takes one whole node (8 GPUs) so capacity is easy to reason about.
The controller runs as the real daemon (``nuro-controller``), a child process stopped by PID.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from nuro.policy import load_policy
from nuro.slurm import JobInfo, JobPhase, SlurmError
from tests.integration.conftest import (
    LiveCluster,
    apply_example_policy,
    cancel_jobs_of,
    controller_process,
    controller_progress,
    in_flight,
    wait_until,
)

pytestmark = [pytest.mark.slurm, pytest.mark.every_slurm]

BIN = Path(sys.executable).parent
GRACE_S = 15
MEMBERS = {"perception": "alice", "prediction": "priya", "controls": "chen", "simulation": "sam"}

# A job that records a checkpoint (when told to), acknowledges a preemption request, and otherwise sleeps.
JOB = """#!/bin/bash
#SBATCH --nodes=1
NJ={bin}/nuro-job
on_preempt() {{ [ "$ACK" = yes ] && $NJ ack --step 42; }}
trap on_preempt USR1
[ "$CKPT" = yes ] && $NJ ckpt --step 40
for i in $(seq 900); do sleep 1; done
"""


@pytest.fixture(scope="module")
def policy_file(cluster: LiveCluster, tmp_path_factory: pytest.TempPathFactory) -> Path:
    # min_run_s 0: these tests preempt jobs seconds old; the minimum run time has its own test (test_sharing_thrash)
    return apply_example_policy(cluster, tmp_path_factory.mktemp("policy"), grace_s=GRACE_S, min_run_s=0)


@pytest.fixture
def clean(cluster: LiveCluster, policy_file: Path) -> Iterator[None]:
    """Every test starts and ends with no job of the policy's members."""
    cancel_jobs_of(cluster, tuple(MEMBERS.values()))
    yield
    cancel_jobs_of(cluster, tuple(MEMBERS.values()))


def _submit(
    cluster: LiveCluster, team: str, *, qos: str | None = None, ckpt: bool = False, ack: bool = True, gpus: int = 8
) -> int:
    args = [f"--account={team}", "--output=/dev/null", "--requeue", f"--gres=gpu:{gpus}"]
    if gpus == 8:
        args.append("--exclusive")
    if qos:
        args.append(f"--qos={qos}")
    args.append(f"--export=ALL,CKPT={'yes' if ckpt else 'no'},ACK={'yes' if ack else 'no'}")
    return cluster.sbatch_as(MEMBERS[team], args, JOB.format(bin=BIN))


def _fill_the_rest(cluster: LiveCluster) -> list[int]:
    """With perception on 4 nodes (3 guaranteed + 1 borrowed), guaranteed work of others fills the other 4."""
    return [_submit(cluster, t) for t in ("simulation", "simulation", "controls", "prediction")]


def _job(cluster: LiveCluster, job_id: int) -> JobInfo:
    return next(j for j in cluster.backend.jobs() if j.job_id == job_id)


def _running(cluster: LiveCluster, *job_ids: int, timeout_s: float = 40) -> None:
    for job_id in job_ids:
        cluster.backend.wait_for_job(job_id, {JobPhase.RUNNING}, timeout_s=timeout_s)


def controller(cluster: LiveCluster, policy_file: Path, log_path: Path) -> contextlib.AbstractContextManager:
    return controller_process(cluster, policy_file, log_path)


def _env(cluster: LiveCluster) -> dict[str, str]:
    return {**os.environ, **cluster.env}


def _preempted(log_path: Path, *job_ids: int) -> list[int]:
    """Which of ``job_ids`` the controller has decided to preempt so far, in decision order (its log)."""
    found = []
    for line in log_path.read_text().splitlines():
        for job_id in job_ids:
            if f"decision=Preempt job={job_id} " in line and job_id not in found:
                found.append(job_id)
    return found


def _why(cluster: LiveCluster, log_path: Path) -> str:
    """What to look at when a victim choice surprises: the controller's decisions and the node event log."""
    decisions = [line for line in log_path.read_text().splitlines() if "decision=" in line]
    events = cluster.layout.events_log.read_text().splitlines() if cluster.layout.events_log.exists() else []
    jobs = [f"{j.job_id} {j.state} {j.qos} start={j.start_time} {j.comment}" for j in cluster.backend.jobs()]
    return "\n".join(["decisions:", *decisions[-20:], "node events:", *events[-10:], "jobs:", *jobs])


class QuotaSampler(threading.Thread):
    """Samples guaranteed GPUs per team every 0.5 s for the whole test: no team may ever exceed its quota."""

    def __init__(self, cluster: LiveCluster, quotas: dict[str, int]) -> None:
        super().__init__(daemon=True)
        self.cluster, self.quotas = cluster, quotas
        self.stop = threading.Event()
        self.samples = 0
        self.violations: list[str] = []

    def run(self) -> None:
        while not self.stop.is_set():
            with contextlib.suppress(SlurmError):
                used: dict[str, int] = {}
                for j in self.cluster.backend.jobs():
                    if j.phase is JobPhase.RUNNING and j.qos == f"g-{j.account}":
                        used[j.account] = used.get(j.account, 0) + j.gpus_total
                for team, gpus in used.items():
                    if gpus > self.quotas.get(team, 0):
                        self.violations.append(f"{team} runs {gpus} guaranteed GPUs > quota {self.quotas[team]}")
                self.samples += 1
            self.stop.wait(0.5)


@pytest.fixture
def sampler(cluster: LiveCluster, policy_file: Path) -> Iterator[QuotaSampler]:
    quotas = {t.name: t.quota_gpus for t in load_policy(policy_file).teams}
    s = QuotaSampler(cluster, quotas)
    s.start()
    yield s
    s.stop.set()
    s.join()
    assert s.samples > 0 and not s.violations, s.violations[:5]


def test_hard_quota_holds_with_no_controller(cluster: LiveCluster, clean: None, sampler: QuotaSampler) -> None:
    jobs = [_submit(cluster, "perception") for _ in range(4)]
    _running(cluster, *jobs[:3])
    blocked = wait_until(
        lambda: (j := _job(cluster, jobs[3])).reason == "QOSGrpGRES" and j,
        30,
        "the 4th perception job (24 GPUs already running) to pend on its QOS limit",
    )
    assert blocked.phase is JobPhase.PENDING and blocked.qos == "g-perception"
    time.sleep(2)
    assert _job(cluster, jobs[3]).phase is JobPhase.PENDING


def test_borrow_then_reclaim_with_checkpoint_ack(
    cluster: LiveCluster, clean: None, sampler: QuotaSampler, policy_file: Path, tmp_path: Path
) -> None:
    """Perception borrows 2 idle nodes; prediction then needs one back: the borrower with the freshest checkpoint
    is chosen, acknowledges, and is requeued right after its ack, well before the grace ends."""
    with controller(cluster, policy_file, tmp_path / "controller.log"):
        guaranteed = [_submit(cluster, "perception") for _ in range(3)]
        stale = _submit(cluster, "perception", ckpt=False)
        _running(cluster, *guaranteed)
        _running(cluster, stale)  # borrowed: moved to b-perception by the controller
        fresh = _submit(cluster, "perception", ckpt=True)
        _running(cluster, fresh)
        assert _job(cluster, stale).qos == _job(cluster, fresh).qos == "b-perception"
        # Fill the rest with guaranteed work of others so nothing is free.
        fillers = [_submit(cluster, "simulation"), _submit(cluster, "simulation"), _submit(cluster, "controls")]
        _running(cluster, *fillers)
        wait_until(lambda: controller_progress(cluster, fresh), 20, "the fresh checkpoint's report at the controller")
        claimant = _submit(cluster, "prediction")
        log_path = tmp_path / "controller.log"
        preempted = wait_until(
            lambda: _preempted(log_path, stale, fresh), 40, f"the controller to preempt borrower {stale} or {fresh}"
        )
        assert preempted == [fresh], f"expected only the fresh-checkpoint borrower {fresh}; {_why(cluster, log_path)}"
        wait_until(lambda: _job(cluster, fresh).restart_count >= 1, 40, f"borrower {fresh} to be requeued")
        _running(cluster, claimant)
        heard = controller_progress(cluster, fresh)
        assert heard is not None and heard.ack_step == 42, heard
        requeued = _job(cluster, fresh)
        assert requeued.restart_count == 1, _why(cluster, log_path)
        assert _job(cluster, stale).phase is JobPhase.RUNNING, _why(cluster, log_path)
        log = log_path.read_text()
        assert f"decision=Requeue job={fresh} applied=True" in log and "requeued after ack" in log, log[-3000:]


def test_victim_without_ack_is_requeued_at_grace_end(
    cluster: LiveCluster, clean: None, policy_file: Path, tmp_path: Path
) -> None:
    with controller(cluster, policy_file, tmp_path / "controller.log"):
        for _ in range(3):
            _submit(cluster, "perception")
        borrower = _submit(cluster, "perception", ack=False)
        _running(cluster, borrower)
        _running(cluster, *_fill_the_rest(cluster))
        claimant = _submit(cluster, "prediction")
        signalled_at = wait_until(lambda: in_flight(cluster, borrower), 30, "the borrower to be signalled")
        cluster.backend.wait_for_job(borrower, {JobPhase.PENDING}, timeout_s=GRACE_S + 15)
        waited = time.time() - signalled_at
        assert waited >= GRACE_S - 1, f"requeued {waited:.1f} s after the signal, before the {GRACE_S} s grace"
        _running(cluster, claimant)


def test_urgent_preempts_a_borrower_before_guaranteed_work(
    cluster: LiveCluster, clean: None, sampler: QuotaSampler, policy_file: Path, tmp_path: Path
) -> None:
    with controller(cluster, policy_file, tmp_path / "controller.log"):
        guaranteed = [_submit(cluster, "perception") for _ in range(3)]
        borrower = _submit(cluster, "perception")
        others = [_submit(cluster, "simulation"), _submit(cluster, "simulation"), _submit(cluster, "controls")]
        others.append(_submit(cluster, "prediction"))
        _running(cluster, *guaranteed, borrower, *others[:3])
        urgent = _submit(cluster, "prediction", qos="urgent")
        _running(cluster, urgent, timeout_s=60)
        assert _job(cluster, borrower).phase is not JobPhase.RUNNING
        assert all(_job(cluster, j).phase is JobPhase.RUNNING for j in guaranteed + others[:3]), _why(
            cluster, tmp_path / "controller.log"
        )


def test_lending_limits_hold_even_with_free_gpus(
    cluster: LiveCluster, clean: None, policy_file: Path, tmp_path: Path
) -> None:
    """Prediction and simulation use their whole quotas; controls is idle but lends at most 4 GPUs, so an 8-GPU
    borrow by perception is refused although a node is free."""
    with controller(cluster, policy_file, tmp_path / "controller.log"):
        busy = [_submit(cluster, "prediction") for _ in range(2)] + [_submit(cluster, "simulation") for _ in range(2)]
        guaranteed = [_submit(cluster, "perception") for _ in range(3)]
        _running(cluster, *busy, *guaranteed)
        hopeful = _submit(cluster, "perception")
        time.sleep(5)  # ten controller cycles
        job = _job(cluster, hopeful)
        assert job.phase is JobPhase.PENDING and job.qos == "g-perception", job
        free = [n for n in cluster.backend.nodes() if n.gpus_alloc == 0]
        assert len(free) == 1
        # why it waits, as its owner sees it: Slurm's reason, the controller's own, its place in the queue (issue 18)
        res = subprocess.run([str(BIN / "nuro-train"), "status", str(hopeful), "--json"], capture_output=True,
                             text=True, timeout=60, env={**os.environ, **cluster.env})  # fmt: skip
        assert res.returncode == 0, res.stderr
        waiting = json.loads(res.stdout)["waiting"]
        assert waiting["slurm_reason"] == "QOSGrpGRES" and waiting["queue_position"] >= 1, waiting
        assert waiting["controller"]["code"] in ("wait_lend_pool", "wait_capacity"), waiting
        assert "lend" in waiting["controller"]["reason"] or "idle" in waiting["controller"]["reason"], waiting


def test_restarted_controller_rebuilds_in_flight_preemptions(
    cluster: LiveCluster, clean: None, policy_file: Path, tmp_path: Path
) -> None:
    """Stop the controller right after it signalled a victim that acks late; a new controller finds the request in
    its ledger and requeues on the ack (through the node agent) without signalling again.

    Both controllers get a 60 s grace, not the module's 15 s: the first one's stop, the ack and the second one's
    start must all fit inside it, or the second requeues at grace end and proves nothing (CI, on a box ~1.6x slower
    than usual, saw no requeue within the 12 s the test then allowed). Slurm's QOS GraceTime stays as applied: only
    Slurm's own preemption reads it, and nothing here preempts by QOS."""
    raw = yaml.safe_load(policy_file.read_text())
    policy_file = tmp_path / "teams.yaml"
    policy_file.write_text(yaml.safe_dump({**raw, "grace_s": 60}))
    with controller(cluster, policy_file, tmp_path / "c1.log"):
        for _ in range(3):
            _submit(cluster, "perception")
        borrower = _submit(cluster, "perception", ack=False)
        _running(cluster, borrower)
        _running(cluster, *_fill_the_rest(cluster))
        _submit(cluster, "prediction")
        wait_until(lambda: in_flight(cluster, borrower), 30, "the preemption in the controller's ledger")
    # Controller down. The job acks now (as rank 0 would after its checkpoint commits).
    cluster.run([str(BIN / "nuro-job"), "ack", "--step", "50", "--job-id", str(borrower)])
    with controller(cluster, policy_file, tmp_path / "c2.log"):
        # requeued: PENDING, or PENDING+COMPLETING while its node's epilog still runs (seen on a loaded 24.11)
        try:
            wait_until(lambda: _job(cluster, borrower).state.startswith("PENDING"), 45, f"job {borrower} requeued")
        except AssertionError as exc:
            tail = (tmp_path / "c2.log").read_text()[-3000:]
            raise AssertionError(f"{exc}: {_job(cluster, borrower)}\n{tail}") from None
    log = (tmp_path / "c2.log").read_text()
    assert "in-flight preemptions from the ledger" in log and f"decision=Preempt job={borrower}" not in log, log[-2000:]
    assert f"decision=Requeue job={borrower} applied=True" in log and "requeued after ack" in log, log[-2000:]


def test_borrowing_order_follows_fair_share(
    cluster: LiveCluster, clean: None, policy_file: Path, tmp_path: Path
) -> None:
    """Two teams at quota want to borrow 4 GPUs and the lending pool has 4 left: the team holding less per share
    (controls, 8 of 8) gets them before the one already borrowing (perception, 28 of 24)."""
    four = {"gpus": 4}
    base = [_submit(cluster, "perception", **four) for _ in range(6)]  # 24: perception's quota
    base += [_submit(cluster, "prediction", **four) for _ in range(4)]  # 16: quota
    base += [_submit(cluster, "controls", **four) for _ in range(2)]  # 8: quota
    base += [_submit(cluster, "simulation", **four) for _ in range(2)]  # 8 of 16: lends up to 8
    _running(cluster, *base)
    first_borrow = _submit(cluster, "perception", **four)
    with controller(cluster, policy_file, tmp_path / "c1.log"):
        _running(cluster, first_borrow)  # pool 8 -> 4 left; 4 GPUs idle
    assert _job(cluster, first_borrow).qos == "b-perception"
    controls = _submit(cluster, "controls", **four)
    perception = _submit(cluster, "perception", **four)
    for job_id in (controls, perception):
        wait_until(lambda j=job_id: _job(cluster, j).reason == "QOSGrpGRES", 30, f"job {job_id} to pend on quota")
    with controller(cluster, policy_file, tmp_path / "c2.log"):
        _running(cluster, controls)
        time.sleep(3)  # several more cycles: perception must still wait (pool exhausted)
    assert _job(cluster, controls).qos == "b-controls"
    waiting = _job(cluster, perception)
    assert waiting.phase is JobPhase.PENDING and waiting.qos == "g-perception", waiting


def _floor(cluster: LiveCluster, qos: str) -> str:
    """The QOS's ``MinTRESPerJob`` as slurmctld holds it (``MinTRESPJ`` of ``scontrol show assoc_mgr``; "" for none):
    what jobs are judged by. sacctmgr shows slurmdbd's copy, which slurmctld receives a moment later (a job
    submitted in between is judged without the floor)."""
    res = cluster.run(["scontrol", "show", "assoc_mgr", "flags=qos", f"qos={qos}"])
    line = next((w for w in res.stdout.split() if w.startswith("MinTRESPJ=")), "MinTRESPJ=")
    return line.partition("=")[2]


def test_gang_first_keeps_the_teams_freed_quota_for_its_waiting_gang(
    cluster: LiveCluster, clean: None, policy_file: Path, sampler: QuotaSampler, tmp_path: Path
) -> None:
    """Prediction (quota 16, ``gang_first``) runs one 8-GPU job and waits with a 2-node gang on its quota (others
    lend only 8 GPUs: the gang cannot borrow). Without gang first its next 8-GPU job would start in the 8 free GPUs
    of the quota and the gang would wait on. With it the controller puts a floor of 16 GPUs on g-prediction: the
    small job waits (QOSMinGRES) and borrows the 8 lendable GPUs instead; when the first job ends, the gang starts
    in the quota and the floor is cleared, also on stop."""
    raw = yaml.safe_load(policy_file.read_text())
    raw["teams"]["prediction"]["gang_first"] = True
    for team, lend in (("perception", 0), ("controls", 0), ("simulation", 8)):  # 8 lendable: the gang cannot borrow
        raw["teams"][team]["lend_limit_gpus"] = lend
    gang_policy = tmp_path / "teams.yaml"
    gang_policy.write_text(yaml.safe_dump(raw))  # controller only: nothing in sacctmgr changes
    script = JOB.format(bin=BIN)
    whole = ["--account=prediction", "--output=/dev/null", "--gres=gpu:8", "--exclusive", "--time=10"]
    try:
        with controller(cluster, gang_policy, tmp_path / "controller.log"):
            first = cluster.sbatch_as("priya", whole, script)
            _running(cluster, first)
            gang = cluster.sbatch_as("priya", [*whole, "--nodes=2"], script)
            wait_until(lambda: _floor(cluster, "g-prediction") == "gres/gpu=16", 30, "the floor for the gang")
            small = cluster.sbatch_as("priya", whole, script)
            wait_until(lambda: _job(cluster, small).phase is JobPhase.RUNNING, 40, "the small job to borrow")
            assert _job(cluster, small).qos == "b-prediction", _why(cluster, tmp_path / "controller.log")
            assert _job(cluster, gang).phase is JobPhase.PENDING
            cluster.run(["scancel", str(first)])
            _running(cluster, gang)
            assert _job(cluster, gang).qos == "g-prediction"
            wait_until(lambda: _floor(cluster, "g-prediction") == "", 30, "the floor to be cleared once the gang runs")
        assert _floor(cluster, "g-prediction") == ""
    finally:
        cluster.run(["sacctmgr", "-i", "modify", "qos", "g-prediction", "set", "MinTRESPerJob=gres/gpu=-1"])
