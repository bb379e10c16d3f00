"""Tiny replays through the real controller cycle (engine.decide + apply): borrowing raises utilisation over the
hard-quota baseline, reclaim preempts the borrower with checkpoint-confirmed requeue, quotas always hold."""

from __future__ import annotations

import math

import pytest

from bench.sim import metrics
from bench.sim.replay import ReplayLog, RunRecord, Variant, run_replay
from bench.sim.slurm import SimJob
from bench.sim.synth import JobSpec
from bench.sim.trace import NodeSpec
from nuro.policy.model import parse_policy

NODES = [NodeSpec(f"n{i}", 8, "leaf0") for i in range(2)]
POLICY = parse_policy(
    {
        "cluster_gpus": 16,
        "grace_s": 60,
        "teams": {
            "alpha": {"members": ["ann"], "quota_gpus": 8, "borrow_limit_gpus": 8, "lend_limit_gpus": 8},
            "beta": {"members": ["bo"], "quota_gpus": 8, "borrow_limit_gpus": 8, "lend_limit_gpus": 8},
        },
    }
)
QUOTAS = {"alpha": 8, "beta": 8}


def job(job_id: int, team: str, submit: float, run: float, acks: bool = True, ckpt_s: float = 600.0) -> JobSpec:
    user = {"alpha": "ann", "beta": "bo"}[team]
    return JobSpec(job_id, f"j{job_id}", team, user, "normal", 1, 8, submit, run, False, ckpt_s, 20.0, acks, 30.0, ())


def replay(jobs: list[JobSpec], variant: Variant, horizon: float) -> tuple[object, dict]:
    log = run_replay(jobs, NODES, POLICY, variant, interval_s=30.0, horizon_s=horizon)
    return log, metrics.compute(log, QUOTAS, 0.0, window_s=600.0)


def test_borrowing_raises_utilisation_over_the_baseline() -> None:
    jobs = [job(1, "alpha", 0.0, 3000.0), job(2, "alpha", 0.0, 3000.0)]
    base_log, base = replay(jobs, Variant.BASELINE, 3000.0)
    nuro_log, nuro = replay(jobs, Variant.NURO, 3000.0)
    assert base["utilisation"] == pytest.approx(0.5)
    assert nuro["utilisation"] >= base["utilisation"]
    assert nuro["utilisation"] > 0.95, "the second job borrows beta's idle quota within the first cycle"
    assert nuro["decisions"].get("Borrow") == 1
    assert base["quota_violation_samples"] == nuro["quota_violation_samples"] == 0
    assert nuro["borrow_limit_violation_samples"] == 0
    assert base["queue_wait"]["alpha"]["mean_s"] == 1500.0, "under the hard quota the second job waits for the first"
    assert nuro["queue_wait"]["alpha"]["mean_s"] <= 15.0, "it borrows at the first tick (30 s)"


def test_reclaim_preempts_the_borrower_and_requeues_on_ack() -> None:
    jobs = [job(1, "alpha", 0.0, 5000.0), job(2, "alpha", 0.0, 5000.0), job(3, "beta", 1000.0, 1000.0)]
    log, m = replay(jobs, Variant.NURO, 6000.0)
    assert m["preemptions"] == 1 and m["requeues_acked"] == 1
    beta = next(j for j in log.jobs if j.job_id == 3)
    # signalled at the first tick ≥ 1000 s, acked 20 s later, requeued on the next tick
    assert beta.first_start_s is not None and beta.first_start_s - 1000.0 <= 2 * 30.0 + 20.0
    requeued = [r for r in log.runs if r.outcome == "requeued"]
    assert len(requeued) == 1 and requeued[0].qos == "b-alpha"
    assert requeued[0].lost_gpu_s <= 8 * 30.0, "an acking victim loses only the wait between ack and requeue"
    assert m["quota_violation_samples"] == 0


def test_unacked_victim_loses_work_since_its_last_checkpoint() -> None:
    jobs = [job(1, "alpha", 0.0, 5000.0), job(2, "alpha", 0.0, 5000.0, acks=False, ckpt_s=300.0)]
    jobs.append(job(3, "beta", 1000.0, 1000.0))
    log, m = replay(jobs, Variant.NURO, 8000.0)
    assert m["requeues_unacked"] == 1
    (run,) = [r for r in log.runs if r.outcome == "requeued"]
    trained = run.end_s - run.train_start_s
    assert run.kept_gpu_s == 8 * 300.0 * math.floor(trained / 300.0)
    assert run.lost_gpu_s == pytest.approx(8 * trained - run.kept_gpu_s)
    done = next(j for j in log.jobs if j.job_id == 2)
    assert done.state == "DONE" and done.restarts == 1


def test_baseline_never_preempts_or_moves_qos() -> None:
    jobs = [job(1, "alpha", 0.0, 5000.0), job(2, "alpha", 0.0, 5000.0), job(3, "beta", 1000.0, 1000.0)]
    _, m = replay(jobs, Variant.BASELINE, 6000.0)
    assert m["preemptions"] == 0 and m["decisions"] == {} and m["controller_cycles"] == 0


def test_jain_and_water_fill() -> None:
    assert metrics.jain([1.0, 1.0, 1.0]) == pytest.approx(1.0)
    assert metrics.jain([1.0, 0.0]) == pytest.approx(0.5)
    fair = metrics.water_fill(16, {"a": 2.0, "b": 40.0}, {"a": 8, "b": 8})
    assert fair == {"a": 2.0, "b": 14.0}, "what a does not need goes to b"


def test_idle_while_waiting_tells_single_node_headroom_from_a_gangs() -> None:
    """Half the cluster idles beside a waiting 2-node gang (beyond beta's quota): all of that headroom is the gang's,
    none of it is single-node work that idle GPUs could have served; a waiting 1-node job's is."""
    gang = JobSpec(2, "j2", "beta", "bo", "normal", 2, 8, 0.0, 3000.0, False, 600.0, 20.0, True, 30.0, ())
    _, m = replay([job(1, "alpha", 0.0, 3000.0), gang], Variant.BASELINE, 3000.0)
    assert (m["utilisation"], m["idle_while_waiting"], m["idle_while_waiting_single_node"]) == (0.5, 0.5, 0.0)
    _, m = replay([job(1, "alpha", 0.0, 3000.0), job(2, "alpha", 0.0, 3000.0)], Variant.BASELINE, 3000.0)
    assert m["idle_while_waiting"] == m["idle_while_waiting_single_node"] == 0.5


def test_scavenger_runs_over_quota_work_and_slurm_preempts_it_blind_to_checkpoints() -> None:
    """Slurm's own soft sharing: alpha's second job goes to the scavenger QOS at submission and runs on beta's idle
    GPUs; beta's job preempts it at once (it is past PreemptExemptTime, the policy's 600 s), whatever its
    checkpoint; the victim commits on the signal and is requeued then, and waits in the scavenger QOS for room."""
    jobs = [job(1, "alpha", 0.0, 5000.0), job(2, "alpha", 0.0, 5000.0), job(3, "beta", 1000.0, 1000.0)]
    log, m = replay(jobs, Variant.SCAVENGER, 6000.0)
    assert m["decisions"] == {} and m["controller_cycles"] == 0, "no nuro controller in this variant"
    assert m["preemptions"] == 1 and m["requeues_acked"] == 1
    beta = next(j for j in log.jobs if j.job_id == 3)
    assert beta.first_start_s == pytest.approx(1000.0 + 20.0), "it starts once the victim committed (20 s)"
    (run,) = [r for r in log.runs if r.outcome == "requeued"]
    assert run.qos == "s-alpha" and run.start_s == 0.0
    assert m["quota_violation_samples"] == m["borrow_limit_violation_samples"] == 0


def test_scavenger_victim_without_ack_is_requeued_at_grace_end() -> None:
    jobs = [job(1, "alpha", 0.0, 5000.0), job(2, "alpha", 0.0, 5000.0, acks=False), job(3, "beta", 1000.0, 1000.0)]
    log, m = replay(jobs, Variant.SCAVENGER, 6000.0)
    assert m["requeues_unacked"] == 1
    beta = next(j for j in log.jobs if j.job_id == 3)
    assert beta.first_start_s == pytest.approx(1000.0 + POLICY.grace_s)


def test_idle_while_waiting_by_cause() -> None:
    """The baseline's idle half beside alpha's second job (over its quota) is the QOS limit's; beside beta's gang of
    2 × 4 GPUs (within its quota) with one node free, it is fragmentation: 8 GPUs idle, but on one node."""
    _, m = replay([job(1, "alpha", 0.0, 3000.0), job(2, "alpha", 0.0, 3000.0)], Variant.BASELINE, 3000.0)
    assert m["idle_while_waiting_by_cause"]["qos_limit"] == pytest.approx(0.5)
    gang = JobSpec(2, "j2", "beta", "bo", "normal", 2, 4, 0.0, 3000.0, False, 600.0, 20.0, True, 30.0, ())
    _, m = replay([job(1, "alpha", 0.0, 3000.0), gang], Variant.BASELINE, 3000.0)
    assert m["idle_while_waiting_by_cause"]["fragmentation"] == pytest.approx(0.5)
    assert sum(m["idle_while_waiting_by_cause"].values()) == pytest.approx(m["idle_while_waiting"])


def _run(job_id: int, team: str, qos: str, gpus: int, start: float, end: float) -> RunRecord:
    return RunRecord(job_id, team, qos, gpus, start, end, start, None, "done", 0.0, 0.0, 0.0, 1, 1)


def _waiting(spec: JobSpec, first_start: float | None) -> SimJob:
    return SimJob(spec, qos=f"g-{spec.team}", first_start_s=first_start)


def test_lent_wait_counts_only_the_wait_a_due_job_spent_behind_other_teams_borrowers() -> None:
    # alpha (quota 8) runs a 4-GPU job; beta borrows 8 GPUs from 0 to 500. Alpha's 8-GPU job 3 (submitted at 50) is
    # not due while job 1 runs (4 + 8 > 8): its wait is alpha's own work, until job 1 ends at 600. Alpha's 4-GPU job 2
    # (submitted at 100, behind it) fits what is left (4 + 4 ≤ 8), is due and waits for beta's borrower: 400 s lent.
    def spec(i: int, submit: float, gpus: int) -> JobSpec:
        return JobSpec(i, f"j{i}", "alpha", "ann", "normal", 1, gpus, submit, 900.0, False, 600.0, 20.0, True, 30.0, ())

    jobs = [_waiting(spec(1, 0.0, 4), 0.0), _waiting(spec(2, 100.0, 4), 500.0), _waiting(spec(3, 50.0, 8), 600.0)]
    runs = [_run(1, "alpha", "g-alpha", 4, 0.0, 600.0), _run(9, "beta", "b-beta", 8, 0.0, 500.0),
            _run(2, "alpha", "g-alpha", 4, 500.0, 1400.0)]  # fmt: skip
    log = ReplayLog(Variant.NURO, 2000.0, 16, jobs, runs)
    lent = metrics.lent(log, {"alpha": 8, "beta": 8}, 0.0, 2000.0)
    assert lent["alpha"].waits == [0.0, 0.0, 400.0], "jobs 1, 3, 2 in submission order"
    assert lent["alpha"].gpu_s == 4 * 400.0, "alpha was 4 GPUs short of its quota from 100 to 500, with work waiting"
    assert lent["beta"] == metrics.Lent([], 0.0), "beta submitted nothing of its own in the window"


def test_a_scavenger_job_counts_as_borrowed_and_nobody_borrows_in_the_baseline() -> None:
    jobs = [job(1, "alpha", 0.0, 3000.0), job(2, "alpha", 0.0, 3000.0), job(3, "beta", 1000.0, 1000.0)]
    _, base = replay(jobs, Variant.BASELINE, 6000.0)
    log, nuro = replay(jobs, Variant.NURO, 6000.0)
    assert base["team_lent_wait_p95_s"] == {"alpha": 0.0, "beta": 0.0}
    beta = next(j for j in log.jobs if j.job_id == 3)
    assert metrics.lent(log, QUOTAS, 0.0, 6000.0)["beta"].waits == [beta.first_start_s - 1000.0] != [0.0]
    scav = [_run(9, "beta", "s-beta", 8, 0.0, 100.0)]
    spec = JobSpec(1, "j1", "alpha", "ann", "normal", 1, 8, 0.0, 900.0, False, 600.0, 20.0, True, 30.0, ())
    lent = metrics.lent(ReplayLog(Variant.SCAVENGER, 1000.0, 16, [_waiting(spec, 100.0)], scav), QUOTAS, 0, 1e3)
    assert lent["alpha"] == metrics.Lent([100.0], 8 * 100.0)
