"""Sharing under heavy load (issue 13), the pure parts: minimum run time, restart cost, requeue into g-, decayed
usage, lending hysteresis, jobs that end sooner than preempting them pays (``ending_soon_s``), one-leaf gangs,
draining whole nodes for a gang, the SiteFactor head, batched apply and the parser of scontrol's per-job refusals
(from real captured stderr), and the SiteFactors a restarted controller reads back (real sprio output)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from nuro.policy.classify import TeamUsage
from nuro.slurm.actions import UpdateJobs, render_argv
from nuro.slurm.parse import parse_per_job_errors, parse_sprio_site_factors
from nuro.slurm_plugins.controller.apply import BATCH_MAX, groups
from nuro.slurm_plugins.controller.borrowing import demand_peaks
from nuro.slurm_plugins.controller.decisions import Borrow, Code, Preempt, Requeue, Return, SetSiteFactor
from nuro.slurm_plugins.controller.engine import ControllerState
from nuro.slurm_plugins.controller.fairshare import DRAIN_SITE_FACTOR, decayed_usage
from tests.unit.test_engine_builders import NOW, a_cluster, a_job, a_policy, decide

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


def test_site_factors_parsed_from_real_sprio_output() -> None:
    # nuro-big got sitefactor=5000 from scontrol update, nuro-nofactor none (the array had no line yet)
    text = (FIXTURES / "sprio_site_factors.txt").read_text()
    assert sorted(parse_sprio_site_factors(text).values()) == [0, 5000]
    # an array task or any other shape is skipped (that job's value is set again: one update, never a wrong one)
    assert parse_sprio_site_factors("12_[0-2]|100\nJOBID|SITE\n13|-5\n14|x\n") == {13: -5}


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


def _two_borrowers(job3_ends_in_s: float, job3_ckpt_age_s: float = 0) -> object:
    """Team a's job 10 is within its quota; b's borrowers 3 and 4 hold the GPUs it needs; job 3 ends when given and
    committed its last checkpoint that long ago (job 4, the other victim, checkpointed just now)."""
    return (
        a_cluster()
        .nodes(4)
        .jobs(a_job(1).running_on("n01"), a_job(2).team("b").running_on("n04"))
        .jobs(a_job(3).team("b").borrowed().running_on("n02").ends_in(job3_ends_in_s).ckpt_age_s(job3_ckpt_age_s))
        .jobs(a_job(4).team("b").borrowed().running_on("n03").ckpt_age_s(0), a_job(10).pending())
        .build()
    )


def test_a_job_that_ends_sooner_than_preempting_it_pays_off_is_waited_for() -> None:
    # grace 60 s + restart cost 120 s + the seconds since its checkpoint, never past ending_soon_s (600 s)
    def waits(ends_in: float, ckpt_age: float, policy: object = POLICY) -> bool:
        d = decide(_two_borrowers(ends_in, ckpt_age), policy, ControllerState(), NOW)
        return not d.of(Preempt) and {w.job_id: w.code for w in d.waiting}[10] == Code.WAIT_IN_FLIGHT

    assert POLICY.ending_soon_s == 600
    assert waits(30, 0) and waits(170, 0)  # within grace + restart cost: preempting could not be faster
    assert not waits(300, 0)  # fresh checkpoint: preempting loses 180 s of restart, waiting costs the claimant 300 s
    assert waits(300, 200)  # a 200 s old checkpoint: preempting would lose 380 s, more than the 300 s wait
    assert not waits(700, 3000)  # however stale its checkpoint, no claimant waits longer than ending_soon_s
    eager = POLICY.model_copy(update={"ending_soon_s": 0})  # an admin who wants reclaim at once
    assert not waits(30, 0, eager)


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


def test_a_lenders_buffer_is_never_lent() -> None:
    # b's 16 GPUs sit idle; with an 8-GPU buffer only 8 are lent: a's second 8-GPU job waits for the lend pool
    snap = a_cluster().nodes(4).jobs(a_job(1).running_on("n01"), a_job(2).running_on("n02"),
                                     a_job(10).over_quota(), a_job(11).over_quota()).build()  # fmt: skip
    lend_all = a_policy(32).team("a", 16, borrow=16).team("b", 16, lend=16).build()
    assert [b.job_id for b in decide(snap, lend_all, ControllerState(), NOW).of(Borrow)] == [10, 11]
    keep_8 = a_policy(32).team("a", 16, borrow=16).team("b", 16, lend=16, buffer=8).build()
    d = decide(snap, keep_8, ControllerState(), NOW)
    assert [b.job_id for b in d.of(Borrow)] == [10] and {w.job_id: w.code for w in d.waiting}[11] == Code.WAIT_LEND_POOL


def test_a_buffer_above_the_quota_is_refused_with_the_fix() -> None:
    with pytest.raises(ValueError, match="lend_buffer_gpus=17 is above quota_gpus=16.*lower lend_buffer_gpus"):
        a_policy(32).team("b", 16, buffer=17)


def test_only_the_head_of_a_teams_queue_gets_a_site_factor() -> None:
    policy = a_policy(32).team("a", 16, borrow=8).team("b", 16).build()
    snap = a_cluster().nodes(4).jobs(*(a_job(10 + i).pending() for i in range(20))).build()
    d = decide(snap, policy, ControllerState(), NOW)
    # team a may add 16 + 8 GPUs: three 8-GPU jobs of its queue, in queue order
    assert [s.job_id for s in d.of(SetSiteFactor)] == [10, 11, 12]


@pytest.mark.parametrize("reason", ["JobHeldUser", "JobHeldAdmin", "BeginTime", "Dependency"])
def test_a_held_or_dependent_job_is_no_queue_head(reason: str) -> None:
    # a's oldest jobs wait on a hold or a dependency: the head's places go to the jobs Slurm could start
    policy = a_policy(32).team("a", 16, borrow=8).team("b", 16).build()
    held = [a_job(10 + i).pending(reason) for i in range(2)]
    snap = a_cluster().nodes(4).jobs(*held, *(a_job(20 + i).pending() for i in range(20))).build()
    assert [s.job_id for s in decide(snap, policy, ControllerState(), NOW).of(SetSiteFactor)] == [20, 21, 22]


def test_on_a_full_cluster_only_what_can_start_before_the_next_cycle_gets_a_site_factor() -> None:
    # 3 of 4 nodes busy with b's jobs, one ending within the horizon: 8 idle + 8 ending = two of a's 8-GPU jobs
    policy = a_policy(32).team("a", 16, borrow=16).team("b", 16).build()
    busy = [a_job(1).team("b").running_on("n01").ends_in(100), a_job(2).team("b").running_on("n02")]
    busy.append(a_job(3).team("b").running_on("n03"))
    snap = a_cluster().nodes(4).jobs(*busy, *(a_job(10 + i).pending() for i in range(20))).build()
    assert [s.job_id for s in decide(snap, policy, ControllerState(), NOW).of(SetSiteFactor)] == [10, 11]
    # nothing opens up at all: still the first job of the queue, so the team's order is in Slurm when GPUs free
    busy[0] = a_job(1).team("b").running_on("n01").ends_in(10_000)
    full = a_cluster().nodes(4).jobs(*busy, a_job(4).team("b").running_on("n04"))
    snap = full.jobs(*(a_job(10 + i).pending() for i in range(20))).build()
    assert [s.job_id for s in decide(snap, policy, ControllerState(), NOW).of(SetSiteFactor)] == [10]


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


def test_the_budget_is_the_cycles_the_snapshot_spends_part_and_the_apply_keeps_a_quarter() -> None:
    from nuro.slurm_plugins.controller.apply import APPLY_SHARE_MIN, CALL_CUT_S, CALL_MIN_S, ApplyBudget

    borrows = tuple(Borrow(i, "a", "b-a", 1, "x") for i in range(4))
    after_quick_read = ApplyBudget.for_cycle(1.0, 0.3, per_id_s=0.01)
    # a call's limit leaves room for cutting it: a cut call still ends within the cycle's budget
    assert after_quick_read.budget_s == 0.7 and after_quick_read.call_limit_s(borrows) == 0.7 - CALL_CUT_S
    after_slow_read = ApplyBudget.for_cycle(1.0, 1.4, per_id_s=0.01)  # the reads alone took the budget
    assert after_slow_read.budget_s == APPLY_SHARE_MIN and after_slow_read.allows(borrows)
    after_slow_read.spend(APPLY_SHARE_MIN - CALL_CUT_S - CALL_MIN_S / 2, 1)  # too little left to start a call
    assert not after_slow_read.allows(borrows) and after_slow_read.allows((Requeue(1, True, "r"),))
    assert ApplyBudget.for_cycle(None, 3.0, per_id_s=0.01).budget_s is None
    small = ApplyBudget.for_cycle(0.3, 0.5, per_id_s=0.01)  # a small budget still pays for one call a cycle
    assert small.allows(borrows) and small.call_limit_s(borrows) == pytest.approx(CALL_MIN_S)


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


# -- draining whole nodes for a gang that no victim set can place (drain.py) ----------------------------------------

DRAIN_POLICY = a_policy(32).team("a", 16).team("b", 16, borrow=16).build()


def _mixed_nodes(first_ends_s: float, second_ends_s: float, gone: tuple[int, ...] = ()) -> object:
    """Four 8-GPU nodes, each half b's guaranteed job (may not be preempted) and half b's borrowed job; team a's
    2-node gang (job 50) is within its quota but no set of borrowers frees two whole nodes. ``gone``: jobs left out."""
    ends = {"n01": first_ends_s, "n02": second_ends_s, "n03": 20_000, "n04": 30_000}
    jobs = [a_job(50).gpus(8, nodes=2).pending()]
    for i, (node, end) in enumerate(ends.items()):
        jobs.append(a_job(1 + i).team("b").gpus(4).running_on(node).ends_in(end))
        jobs.append(a_job(11 + i).team("b").borrowed().gpus(4).running_on(node).ckpt_age_s(60))
    return a_cluster().nodes(4).jobs(*(j for j in jobs if j.build().job_id not in gone)).build()


def test_a_gang_no_victim_set_can_place_gets_the_soonest_whole_nodes_drained() -> None:
    d = decide(_mixed_nodes(1_000, 2_000), DRAIN_POLICY, ControllerState(), NOW)
    # the borrowers on n01 and n02 (whole by +2,000 s) are preempted now; n03/n04's borrowers are left running
    assert sorted(p.job_id for p in d.of(Preempt)) == [11, 12]
    assert all(p.for_job_id == 50 and "draining n01,n02" in p.reason for p in d.of(Preempt))
    # the gang heads Slurm's queue so backfill keeps the drained nodes for it
    (sf,) = [s for s in d.of(SetSiteFactor) if s.job_id == 50]
    assert sf.value == DRAIN_SITE_FACTOR
    assert d.next_state.site_factors[50] == DRAIN_SITE_FACTOR
    # nothing of the drained nodes is lent meanwhile (a borrower of team b is QOS-blocked and would fit 4 GPUs)


def test_no_drain_when_the_nodes_are_whole_only_past_the_horizon() -> None:
    d = decide(_mixed_nodes(5_000, 9_000), DRAIN_POLICY, ControllerState(), NOW)  # horizon: 3,600 s by default
    assert d.of(Preempt) == ()
    assert {w.job_id: w.code for w in d.waiting}[50] == Code.WAIT_NO_VICTIMS
    off = DRAIN_POLICY.model_copy(update={"drain_horizon_s": 0})
    assert decide(_mixed_nodes(1_000, 2_000), off, ControllerState(), NOW).of(Preempt) == ()


def test_a_drained_gang_waits_for_its_nodes_and_loses_its_boost_when_it_no_longer_needs_them() -> None:
    first = decide(_mixed_nodes(1_000, 2_000), DRAIN_POLICY, ControllerState(), NOW)
    # a later cycle: the borrowers are gone, the guaranteed jobs still run; the gang waits, nothing more preempted
    snap = _mixed_nodes(1_000, 2_000, gone=(11, 12))
    state = dataclasses.replace(first.next_state, preempting={}, claims={})
    d = decide(snap, DRAIN_POLICY, state, NOW + 120)
    assert d.of(Preempt) == ()
    assert {w.job_id: w.code for w in d.waiting}[50] == Code.WAIT_DRAIN
    assert 50 not in {s.job_id for s in d.of(SetSiteFactor)}  # keeps its boost: nothing to send
    # the gang is gone from the queue (it started): no boost is left behind for anyone
    started = _mixed_nodes(1_000, 2_000, gone=(11, 12, 50))
    after = decide(started, DRAIN_POLICY, d.next_state, NOW + 150).next_state.site_factors
    assert DRAIN_SITE_FACTOR not in after.values()
    # still pending but no longer drained for (here: the admin turned draining off): its boost goes back to its team's
    off = DRAIN_POLICY.model_copy(update={"drain_horizon_s": 0})
    reset = decide(snap, off, d.next_state, NOW + 150)
    (sf,) = [s for s in reset.of(SetSiteFactor) if s.job_id == 50]
    assert sf.value < DRAIN_SITE_FACTOR


# -- a restarted controller reads the SiteFactors Slurm holds (sprio) instead of setting them all again -------------


class _Held:
    """A backend for ``Controller.cycle``: a fixed snapshot, the SiteFactors ``sprio`` would show, applied actions."""

    def __init__(self, snapshot: object, held: dict[int, int]) -> None:
        self.snapshot, self.held, self.applied = snapshot, held, []

    def read_snapshot(self) -> object:
        return self.snapshot

    def site_factors(self) -> dict[int, int]:
        return self.held

    def __getattr__(self, name: str) -> object:  # the update calls apply makes: recorded, all succeed
        return lambda *args, **kwargs: self.applied.append((name, args, kwargs))


def test_a_restarted_controller_sends_only_the_site_factors_slurm_does_not_hold_yet() -> None:
    from nuro.slurm_plugins.controller.daemon import Controller

    policy = a_policy(32).team("a", 16, borrow=16).team("b", 16).build()
    snap = a_cluster().nodes(4).jobs(*(a_job(10 + i).pending() for i in range(4))).build()
    fresh = decide(snap, policy, ControllerState(), NOW).of(SetSiteFactor)
    assert [s.job_id for s in fresh] == [10, 11, 12, 13]
    held = {s.job_id: s.value for s in fresh[:3]}  # Slurm already holds 10-12's values from the last run
    backend = _Held(snap, {**held, 99: 7000})  # 99: a job that has left the queue since
    ctl = Controller(backend, policy, clock=lambda: NOW)  # type: ignore[arg-type]
    ctl.cycle()
    assert backend.applied == [("update_site_factor", (13, fresh[3].value), {})]
    assert dict(ctl.state.site_factors) == {s.job_id: s.value for s in fresh}


def test_a_restarted_controllers_sprio_read_goes_side_by_side_with_its_first_snapshot() -> None:
    # the first cycle's reads count in its 1 s budget: sprio must not come after the snapshot's reads
    import threading

    from nuro.slurm_plugins.controller.daemon import Controller

    class SideBySide(_Held):
        sprio_started = threading.Event()

        def read_snapshot(self) -> object:
            assert self.sprio_started.wait(5), "the snapshot was read before sprio started"
            return self.snapshot

        def site_factors(self) -> dict[int, int]:
            self.sprio_started.set()
            return self.held

        def update_jobs(self, *args: object, **kwargs: object) -> dict:
            return {}

    policy = a_policy(32).team("a", 16, borrow=16).team("b", 16).build()
    snap = a_cluster().nodes(4).jobs(*(a_job(10 + i).pending() for i in range(4))).build()
    backend = SideBySide(snap, {10: 123})
    ctl = Controller(backend, policy, clock=lambda: NOW)  # type: ignore[arg-type]
    report = ctl.cycle()
    assert report.error == "" and set(ctl.state.site_factors) == {10, 11, 12, 13}


def test_an_update_slurmctld_does_not_answer_within_the_budget_is_decided_again_not_waited_for() -> None:
    import contextlib

    from nuro.slurm.errors import SlurmTimeout
    from nuro.slurm_plugins.controller.daemon import Controller

    class Swamped(_Held):
        limits: list[float] = []

        @contextlib.contextmanager
        def call_timeout(self, seconds: float):  # noqa: ANN202 - a context manager, as the backend's
            self.limits.append(seconds)
            yield

        def update_jobs(self, *args: object, **kwargs: object) -> dict:
            raise SlurmTimeout("no answer within timeout_s=1.0", argv=("scontrol", "update"))

    policy = a_policy(32).team("a", 16, borrow=16).team("b", 16).build()
    snap = a_cluster().nodes(4).jobs(*(a_job(10 + i).pending() for i in range(4))).build()
    backend = Swamped(snap, {})
    ctl = Controller(backend, policy, clock=lambda: NOW, apply_budget_s=1.0)  # type: ignore[arg-type]
    report = ctl.cycle()
    # what the snapshot left of the cycle's budget, for the one batch of four SiteFactors
    assert len(backend.limits) == 1 and 0.8 < backend.limits[0] <= 0.9
    assert report.error == "" and report.deferred == 4
    assert dict(ctl.state.site_factors) == {}  # not in force: the next cycle sets them again
