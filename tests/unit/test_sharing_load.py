"""Sharing under heavy load (issue 13), the pure parts: minimum run time, restart cost, requeue into g-, decayed
usage, lending hysteresis, jobs ending within the grace, one-leaf gangs, the SiteFactor head, batched apply and the
parser of scontrol's per-job refusals (from real captured stderr)."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime
from pathlib import Path

from nuro.policy.classify import TeamUsage
from nuro.slurm.actions import UpdateJobs, render_argv
from nuro.slurm.parse import parse_per_job_errors
from nuro.slurm_plugins.controller.apply import BATCH_MAX, groups
from nuro.slurm_plugins.controller.borrowing import demand_peaks
from nuro.slurm_plugins.controller.decisions import Borrow, Code, Preempt, Requeue, Return, SetSiteFactor
from nuro.slurm_plugins.controller.engine import ControllerState, decide
from nuro.slurm_plugins.controller.fairshare import decayed_usage
from tests.unit.test_engine_builders import NOW, a_cluster, a_job, a_policy

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "slurm"


def test_per_job_refusals_parsed_from_real_scontrol_stderr() -> None:
    text = (FIXTURES / "scontrol_update_list_stderr.txt").read_text()
    assert parse_per_job_errors(text) == {
        4: "Job is no longer pending execution",
        5: "Job has already finished",
        99999: "Invalid job id specified",
        1: "Invalid user id",
        6: "Access/permission denied",
    }
    assert parse_per_job_errors("scontrol: error: Unable to contact slurm controller") == {}


def test_update_jobs_renders_one_list_command() -> None:
    assert render_argv(UpdateJobs((3, 4, "5"), qos="b-a")) == ["scontrol", "update", "jobid=3,4,5", "qos=b-a"]
    assert render_argv(UpdateJobs((7,), site_factor=5000)) == ["scontrol", "update", "jobid=7", "sitefactor=5000"]


def test_groups_batch_by_target_and_value_and_keep_kind_order() -> None:
    ds = [
        Requeue(1, True, "r"),
        Preempt(2, "a", 8, 0.0, 9, "p"),
        Return(3, "a", "g-a", 8, "x"),
        Borrow(4, "a", "b-a", 8, "x"),
        Borrow(5, "c", "b-c", 8, "x"),
        Borrow(6, "a", "b-a", 8, "x"),
        SetSiteFactor(99, 2500, "s"),
        *(SetSiteFactor(100 + i, 5000, "s") for i in range(BATCH_MAX + 3)),
    ]
    out = groups(ds)
    assert [tuple(d.job_id for d in g) for g in out[:6]] == [(1,), (2,), (3,), (4, 6), (5,), (99,)]
    assert [len(g) for g in out[6:]] == [BATCH_MAX, 3]


POLICY = a_policy(32).team("a", 16).team("b", 16, borrow=16).build()


def test_preempted_borrower_is_requeued_into_its_guaranteed_qos() -> None:
    snap = (
        a_cluster()
        .nodes(4)
        .jobs(a_job(1).running_on("n01"), a_job(2).team("b").running_on("n04"))
        .jobs(a_job(3).team("b").borrowed().running_on("n02").signalled_s_ago(10).acked_s_ago(2))
        .jobs(a_job(4).team("b").running_on("n03"), a_job(10).pending())
        .build()
    )
    (req,) = decide(snap, POLICY, ControllerState(), NOW).of(Requeue)
    assert (req.job_id, req.acked, req.to_qos) == (3, True, "g-b")


def test_restart_cost_makes_the_smaller_victim_cheaper() -> None:
    # same fresh checkpoint: the 4-GPU borrower costs less to restart than the 8-GPU one, and 4 GPUs are enough
    policy = a_policy(32).team("a", 16).team("b", 16, borrow=16).build()
    snap = (
        a_cluster()
        .nodes(4)
        .jobs(a_job(1).running_on("n01"), a_job(2).team("b").running_on("n04"), a_job(5).gpus(4).running_on("n03"))
        .jobs(a_job(3).team("b").borrowed().running_on("n02").ckpt_age_s(0))
        .jobs(a_job(4).team("b").borrowed().gpus(4).running_on("n03").ckpt_age_s(0))
        .jobs(a_job(10).gpus(4).pending())
        .build()
    )
    assert [p.job_id for p in decide(snap, policy, ControllerState(), NOW).of(Preempt)] == [4]


def test_a_job_ending_within_the_grace_is_waited_for_not_preempted() -> None:
    snap = (
        a_cluster()
        .nodes(4)
        .jobs(a_job(1).running_on("n01"), a_job(2).team("b").running_on("n04"))
        .jobs(a_job(3).team("b").borrowed().running_on("n02"), a_job(4).team("b").borrowed().running_on("n03"))
        .jobs(a_job(10).pending())
        .build()
    )
    ends = datetime.fromtimestamp(NOW + 30, UTC)
    jobs = tuple(dataclasses.replace(j, end_time=ends) if j.job_id == 3 else j for j in snap.jobs)
    d = decide(dataclasses.replace(snap, jobs=jobs), POLICY, ControllerState(), NOW)
    assert d.of(Preempt) == ()
    assert {w.job_id: w.code for w in d.waiting}[10] == Code.WAIT_IN_FLIGHT


def test_a_team_holding_its_quota_with_its_own_borrowers_does_not_reclaim() -> None:
    policy = a_policy(32).team("a", 16, borrow=16).team("b", 16, borrow=16).build()
    snap = (
        a_cluster()
        .nodes(4)
        .jobs(a_job(1).running_on("n01"), a_job(2).borrowed().running_on("n02"))
        .jobs(a_job(3).team("b").borrowed().running_on("n03"), a_job(4).team("b").running_on("n04"))
        .jobs(a_job(10).pending())
        .build()
    )
    d = decide(snap, policy, ControllerState(), NOW)
    assert d.of(Preempt) == ()
    assert {w.job_id: w.code for w in d.waiting}[10] == Code.WAIT_OWN_BORROWED


def test_a_two_node_gang_gets_its_room_inside_one_leaf() -> None:
    # leaves of 4: n01-n04, n05-n08; borrowers on n02, n04 (leaf 1, fresh checkpoints) and n06, n07 (leaf 2, old
    # ones); n05 is idle. Without the hint the cheapest block is n05 + n02: one victim, across leaves. With it: the
    # cheapest block inside one leaf, here both fresh victims of leaf 1 (2 × 1,760 GPU·s < 8,160 for one in leaf 2)
    policy = a_policy(64).team("a", 32).team("b", 32, borrow=32).build()
    snap = (
        a_cluster()
        .nodes(8)
        .jobs(a_job(1).running_on("n01"), a_job(2).team("b").running_on("n03"), a_job(5).team("b").running_on("n08"))
        .jobs(a_job(3).team("b").borrowed().running_on("n02").ckpt_age_s(100))
        .jobs(a_job(4).team("b").borrowed().running_on("n04").ckpt_age_s(100))
        .jobs(a_job(6).team("b").borrowed().running_on("n06").ckpt_age_s(900))
        .jobs(a_job(7).team("b").borrowed().running_on("n07").ckpt_age_s(900))
        .jobs(a_job(10).gpus(8, nodes=2).pending())
        .build()
    )
    assert sorted(p.job_id for p in decide(snap, policy, ControllerState(), NOW).of(Preempt)) == [3, 4]


def test_decayed_usage_halves_towards_what_is_held_now() -> None:
    u = {"a": TeamUsage(held=0), "b": TeamUsage(held=40)}
    first = decayed_usage({}, None, u, 3600, NOW)
    assert first == {"a": 0.0, "b": 40.0}
    later = decayed_usage({"a": 80.0, "b": 0.0}, NOW - 3600, u, 3600, NOW)
    assert later == {"a": 40.0, "b": 20.0}


def test_a_lenders_peak_demand_decays_with_the_hysteresis_half_life() -> None:
    u = {"a": TeamUsage(g_running=4, g_waiting=0)}
    assert demand_peaks({"a": 16.0}, NOW - 900, u, 900, NOW) == {"a": 8.0}
    assert demand_peaks({"a": 16.0}, NOW - 900, u, 0, NOW) == {"a": 4.0}


def test_lending_keeps_back_what_a_lender_used_at_its_recent_peak() -> None:
    policy = a_policy(32).team("a", 16, borrow=16).team("b", 16, lend=16).build()
    snap = (
        a_cluster()
        .nodes(4)
        .jobs(a_job(1).running_on("n01"), a_job(2).running_on("n02"), a_job(10).over_quota())
        .build()
    )
    assert len(decide(snap, policy, ControllerState(), NOW).of(Borrow)) == 1
    busy_lately = ControllerState(demand_peak={"a": 16.0, "b": 16.0}, usage_at=NOW - 60)
    d = decide(snap, policy, busy_lately, NOW)
    assert d.of(Borrow) == () and {w.job_id: w.code for w in d.waiting}[10] == Code.WAIT_LEND_POOL


def test_only_the_head_of_a_teams_queue_gets_a_site_factor() -> None:
    policy = a_policy(32).team("a", 16, borrow=8).team("b", 16).build()
    snap = a_cluster().nodes(4).jobs(*(a_job(10 + i).pending() for i in range(20))).build()
    d = decide(snap, policy, ControllerState(), NOW)
    # team a may add 16 + 8 GPUs: three 8-GPU jobs of its queue, in queue order
    assert [s.job_id for s in d.of(SetSiteFactor)] == [10, 11, 12]


def test_apply_budget_sizes_batches_to_what_is_left_and_never_defers_requeues_or_signals() -> None:
    from nuro.slurm_plugins.controller.apply import ApplyBudget

    borrows = tuple(Borrow(i, "a", "b-a", 1, "x") for i in range(40))
    budget = ApplyBudget(1.0, per_id_s=0.1)
    assert [len(g) for g in budget.chunk(borrows)] == [10, 10, 10, 10]
    budget.spend(1.0, 10)  # 0.1 s per job measured: the budget is spent
    assert not budget.allows(borrows[10:20]) and budget.allows((Requeue(1, True, "r"),))
    assert budget.allows((Preempt(2, "a", 8, 0.0, 9, "p"),))
    unlimited = ApplyBudget(None)
    assert unlimited.allows(borrows) and unlimited.chunk(borrows) == [borrows]


def test_an_ack_in_the_same_second_as_the_signal_counts() -> None:
    # the signal went out at NOW - 0.4 s (state keeps whole seconds), the job acked 0.2 s later: same second
    snap = (
        a_cluster()
        .nodes(4)
        .jobs(a_job(1).running_on("n01"), a_job(2).team("b").running_on("n04"), a_job(10).pending())
        .jobs(a_job(3).team("b").borrowed().running_on("n02").signalled_s_ago(0).acked_s_ago(0))
        .build()
    )
    d = decide(snap, POLICY, ControllerState(preempting={3: NOW - 0.4}), NOW)
    assert [(r.job_id, r.acked) for r in d.of(Requeue)] == [(3, True)]
    fresh = a_cluster().nodes(4).jobs(a_job(1).running_on("n01"), a_job(2).team("b").running_on("n04"))
    fresh = fresh.jobs(a_job(3).team("b").borrowed().running_on("n02"), a_job(5).team("b").running_on("n03"))
    fresh = fresh.jobs(a_job(10).pending()).build()
    assert decide(fresh, POLICY, ControllerState(), NOW + 0.4).next_state.preempting == {3: float(round(NOW + 0.4))}


def test_a_claimant_gets_no_second_victim_while_the_first_gives_its_gpus_back() -> None:
    # job 3 was requeued for job 10 a moment ago: squeue says it is COMPLETING with its start time "now", then
    # PENDING, while its node still looks busy; job 4 is old enough to be a victim, but job 10 has one already
    base = (
        a_cluster()
        .nodes(4)
        .jobs(a_job(1).running_on("n01"), a_job(2).team("b").running_on("n04"), a_job(10).pending())
        .jobs(a_job(4).team("b").borrowed().running_on("n03"))
    )
    completing = a_job(3).team("b").borrowed().running_on("n02", started_s_ago=0).completing().signalled_s_ago(5)
    d = decide(base.jobs(completing).build(), POLICY, ControllerState(preempting={3: NOW - 5}), NOW)
    assert d.of(Preempt) == () and {w.job_id: w.code for w in d.waiting}[10] == Code.WAIT_IN_FLIGHT
    gone = base.jobs(a_job(3).team("b").pending()).build()
    snap = dataclasses.replace(
        gone, nodes=tuple(dataclasses.replace(n, gpus_alloc=8) if n.name == "n02" else n for n in gone.nodes)
    )
    d = decide(snap, POLICY, ControllerState(claims={10: NOW - 8}), NOW)
    assert d.of(Preempt) == () and {w.job_id: w.code for w in d.waiting}[10] == Code.WAIT_IN_FLIGHT
    later = decide(snap, POLICY, ControllerState(claims={10: NOW - 200}), NOW)
    assert [p.job_id for p in later.of(Preempt)] == [4]
