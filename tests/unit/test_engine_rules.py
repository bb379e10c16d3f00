"""Table tests of the decision engine, one scenario per rule: borrow, lending, fair share, reclaim,
placeable victims, tiers, requeue on ack or at grace end."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import pytest

from nuro.policy.model import Policy
from nuro.slurm.models import ClusterSnapshot
from nuro.slurm_plugins.controller.capacity import settled
from nuro.slurm_plugins.controller.decisions import Code
from nuro.slurm_plugins.controller.engine import (
    Borrow,
    ControllerState,
    Decisions,
    Preempt,
    Requeue,
    Return,
    SetSiteFactor,
    classify,
)
from nuro.slurm_plugins.controller.victims import Candidate, victim_key
from tests.unit.test_engine_builders import NOW, a_cluster, a_job, a_policy, decide

# two teams of 16 on 4 × 8 GPUs; each may borrow 8 and lend 8
TWO_TEAMS = a_policy(32).team("a", quota=16, borrow=8, lend=8).team("b", quota=16, borrow=8, lend=8).build()


@dataclass
class Case:
    policy: Policy
    snapshot: ClusterSnapshot
    want: list[tuple]  # summarize() of the decisions, SetSiteFactor left out
    want_waits: dict[int, str] = field(default_factory=dict)  # job id -> Wait code (subset)
    state: ControllerState = field(default_factory=ControllerState)


def summarize(decisions: Decisions) -> list[tuple]:
    out: list[tuple] = []
    for d in decisions:
        if isinstance(d, Borrow | Return):
            out.append((type(d).__name__, d.job_id, d.to_qos))
        elif isinstance(d, Preempt):
            out.append(("Preempt", d.job_id, "for", d.for_job_id))
        elif isinstance(d, Requeue):
            out.append(("Requeue", d.job_id, "acked" if d.acked else "grace over"))
    return out


CASES: dict[str, Case] = {
    # -- borrowing ---------------------------------------------------------------------------------------------------
    "borrow: team at quota, idle GPUs, within limits": Case(
        TWO_TEAMS,
        a_cluster()
        .nodes(4)
        .jobs(a_job(1).running_on("n01"), a_job(2).running_on("n02"), a_job(10).over_quota())
        .build(),
        want=[("Borrow", 10, "b-a")],
    ),
    "borrow refused: borrow limit reached": Case(
        TWO_TEAMS,
        a_cluster()
        .nodes(4)
        .jobs(
            a_job(1).running_on("n01"),
            a_job(2).running_on("n02"),
            a_job(3).borrowed().running_on("n03"),
            a_job(10).over_quota(),
        )
        .build(),
        want=[],
        want_waits={10: Code.WAIT_BORROW_LIMIT},
    ),
    "borrow refused: pending borrowed jobs count against the limit too": Case(
        TWO_TEAMS,
        a_cluster()
        .nodes(4)
        .jobs(a_job(1).running_on("n01"), a_job(2).running_on("n02"), a_job(3).borrowed().gpus(4).pending())
        .jobs(a_job(10).over_quota())
        .build(),
        want=[],
        want_waits={10: Code.WAIT_BORROW_LIMIT},
    ),
    "borrow refused: lender's lending limit": Case(
        a_policy(32).team("a", quota=16, borrow=16, lend=8).team("b", quota=16, borrow=8, lend=4).build(),
        a_cluster()
        .nodes(4)
        .jobs(a_job(1).running_on("n01"), a_job(2).running_on("n02"), a_job(10).over_quota())
        .build(),
        want=[],
        want_waits={10: Code.WAIT_LEND_POOL},
    ),
    "borrow refused: lender's own pending work is not lent": Case(
        TWO_TEAMS,
        a_cluster()
        .nodes(4)
        .jobs(a_job(1).running_on("n01"), a_job(2).running_on("n02"), a_job(10).over_quota())
        .jobs(a_job(20).team("b").gpus(8, nodes=2).pending("Dependency"))  # not waiting for GPUs: lent
        .jobs(a_job(21).team("b").gpus(4).pending(), a_job(22).team("b").gpus(8).pending())  # 12 of 16 wanted
        .build(),
        want=[],
        want_waits={10: Code.WAIT_LEND_POOL},
    ),
    "borrow: unassigned GPUs are lendable without any lender": Case(
        a_policy(32).team("a", quota=8, borrow=16).team("b", quota=8).build(),
        a_cluster()
        .nodes(4)
        .jobs(a_job(1).running_on("n01"), a_job(2).team("b").running_on("n02"), a_job(10).gpus(8, 2).over_quota())
        .build(),
        want=[("Borrow", 10, "b-a")],
    ),
    "borrow refused: no placeable block on idle GPUs": Case(
        TWO_TEAMS,
        a_cluster()
        .nodes(4)
        .jobs(a_job(1).running_on("n01"), a_job(2).running_on("n02"))
        .jobs(a_job(3).unmanaged().gpus(4).running_on("n03"), a_job(4).unmanaged().gpus(4).running_on("n04"))
        .jobs(a_job(10).over_quota())
        .build(),
        want=[],
        want_waits={10: Code.WAIT_CAPACITY},
    ),
    "borrow refused: team's borrowed jobs are being reclaimed": Case(
        TWO_TEAMS,
        a_cluster()
        .nodes(4)
        .jobs(a_job(1).running_on("n01"), a_job(2).running_on("n02"))
        .jobs(a_job(3).gpus(4).borrowed().running_on("n03").signalled_s_ago(10), a_job(10).gpus(4).over_quota())
        .build(),
        want=[],
        want_waits={10: Code.WAIT_RECLAIMED, 3: Code.WAIT_ACK},
    ),
    "borrow skipped: stale QOSGrpGRES, the job fits the quota": Case(
        TWO_TEAMS,
        a_cluster().nodes(4).jobs(a_job(1).running_on("n01"), a_job(10).over_quota()).build(),
        want=[],
        want_waits={10: Code.WAIT_FITS_QUOTA},
    ),
    "fair share: the least-served team borrows the last idle node": Case(
        a_policy(32)
        .team("a", 8, borrow=16, shares=8)
        .team("c", 8, borrow=16, shares=24)
        .team("b", 16, lend=16)
        .build(),
        a_cluster()
        .nodes(4)
        .jobs(a_job(1).running_on("n01"), a_job(2).team("c").running_on("n02"), a_job(3).unmanaged().running_on("n04"))
        .jobs(a_job(10).over_quota().priority(9999), a_job(11).team("c").over_quota())
        .build(),
        want=[("Borrow", 11, "b-c")],
        want_waits={10: Code.WAIT_CAPACITY},
    ),
    "fair share re-evaluated after each borrow: teams alternate": Case(
        a_policy(48)
        .team("a", 8, borrow=24, shares=8)
        .team("c", 8, borrow=24, shares=16)
        .team("b", 32, lend=32)
        .build(),
        a_cluster()
        .nodes(6)
        .jobs(a_job(1).running_on("n01"), a_job(2).team("c").running_on("n02"))
        .jobs(a_job(10).over_quota(), a_job(11).over_quota(), a_job(12).over_quota())
        .jobs(a_job(20).team("c").over_quota(), a_job(21).team("c").over_quota(), a_job(22).team("c").over_quota())
        .build(),
        # load = (decayed + held + pending borrowed) / (2 × entitlement); entitlements a 12, c 24; no history, so
        # decayed = held: c 16/48 first, then c 24/48 < a 16/24, then c 32/48 ties a and loses by name, then c
        want=[("Borrow", 20, "b-c"), ("Borrow", 21, "b-c"), ("Borrow", 10, "b-a"), ("Borrow", 22, "b-c")],
    ),
    "return: a pending borrowed job that fits the quota again": Case(
        TWO_TEAMS,
        a_cluster().nodes(4).jobs(a_job(1).running_on("n01"), a_job(10).borrowed().pending()).build(),
        want=[("Return", 10, "g-a")],
    ),
    # -- reclaim -----------------------------------------------------------------------------------------------------
    "reclaim picks the borrower with the freshest checkpoint": Case(
        a_policy(32).team("a", 16).team("b", 16, borrow=16).build(),
        a_cluster()
        .nodes(4)
        .jobs(a_job(1).running_on("n01"), a_job(2).team("b").running_on("n04"))
        .jobs(a_job(3).team("b").borrowed().running_on("n02").ckpt_age_s(600))
        .jobs(a_job(4).team("b").borrowed().running_on("n03").ckpt_age_s(60))
        .jobs(a_job(10).pending())
        .build(),
        want=[("Preempt", 4, "for", 10)],
    ),
    "reclaim: no checkpoint means the whole run is lost": Case(
        a_policy(32).team("a", 16).team("b", 16, borrow=16).build(),
        a_cluster()
        .nodes(4)
        .jobs(a_job(1).running_on("n01"), a_job(2).team("b").running_on("n04"))
        .jobs(a_job(3).team("b").borrowed().running_on("n02", started_s_ago=700))
        .jobs(a_job(4).team("b").borrowed().running_on("n03", started_s_ago=9000).ckpt_age_s(900))
        .jobs(a_job(10).pending())
        .build(),
        want=[("Preempt", 3, "for", 10)],
    ),
    "reclaim: a run inside its minimum run time is no victim, an older one with more loss is": Case(
        a_policy(32).team("a", 16).team("b", 16, borrow=16).build(),
        a_cluster()
        .nodes(4)
        .jobs(a_job(1).running_on("n01"), a_job(2).team("b").running_on("n04"))
        .jobs(a_job(3).team("b").borrowed().running_on("n02", started_s_ago=300))
        .jobs(a_job(4).team("b").borrowed().running_on("n03", started_s_ago=9000).ckpt_age_s(900))
        .jobs(a_job(10).pending())
        .build(),
        want=[("Preempt", 4, "for", 10)],
    ),
    "reclaim waits while every borrower that could make room is inside its minimum run time": Case(
        a_policy(32).team("a", 16).team("b", 16, borrow=16).build(),
        a_cluster()
        .nodes(4)
        .jobs(a_job(1).running_on("n01"), a_job(2).team("b").running_on("n04"))
        .jobs(a_job(3).team("b").borrowed().running_on("n02", started_s_ago=300))
        .jobs(a_job(4).team("b").borrowed().running_on("n03", started_s_ago=599))
        .jobs(a_job(10).pending())
        .build(),
        want=[],
        want_waits={10: Code.WAIT_MIN_RUN},
    ),
    "reclaim frees a placeable block: a 2-node job gets 2 whole nodes, not 16 GPUs scattered": Case(
        a_policy(48).team("a", 16).team("b", 16).team("c", 16, borrow=32).build(),
        a_cluster()
        .nodes(6)
        .jobs(*[a_job(100 + 10 * n + i).team("b").gpus(1).running_on(f"n0{n}") for n in range(1, 5) for i in range(4)])
        .jobs(
            *[
                a_job(200 + 10 * n + i).team("c").borrowed().gpus(1).running_on(f"n0{n}").ckpt_age_s(5)
                for n in range(1, 5)
                for i in range(4)
            ]
        )
        .jobs(a_job(5).team("c").borrowed().running_on("n05").ckpt_age_s(900))
        .jobs(a_job(6).team("c").borrowed().running_on("n06").ckpt_age_s(800))
        .jobs(a_job(10).gpus(8, nodes=2).pending())
        .build(),
        want=[("Preempt", 6, "for", 10), ("Preempt", 5, "for", 10)],
    ),
    "reclaim preempts no more than needed": Case(
        a_policy(16).team("a", 8).team("b", 8, borrow=8).build(),
        a_cluster()
        .nodes(2)
        .jobs(a_job(1).team("b").running_on("n02"))
        .jobs(a_job(3).team("b").borrowed().gpus(4).running_on("n01").ckpt_age_s(100))
        .jobs(a_job(4).team("b").borrowed().gpus(4).running_on("n01").ckpt_age_s(50))
        .jobs(a_job(10).gpus(4).pending())
        .build(),
        want=[("Preempt", 4, "for", 10)],
    ),
    "reclaim: a multi-node borrower frees both nodes at once": Case(
        a_policy(32).team("a", 16).team("b", 16, borrow=16).build(),
        a_cluster()
        .nodes(4)
        .jobs(a_job(1).team("b").gpus(8, 2).running_on("n03", "n04"))
        .jobs(a_job(3).team("b").borrowed().gpus(8, 2).running_on("n01", "n02").ckpt_age_s(100))
        .jobs(a_job(10).gpus(8, nodes=2).pending())
        .build(),
        want=[("Preempt", 3, "for", 10)],
    ),
    "reclaim: never a guaranteed job": Case(
        a_policy(16).team("a", 8).team("b", 8).build(),
        a_cluster()
        .nodes(2)
        .jobs(a_job(1).team("b").running_on("n01"), a_job(2).unmanaged().gpus(4).running_on("n02"))
        .jobs(a_job(10).pending())
        .build(),
        want=[],
        want_waits={10: Code.WAIT_NO_VICTIMS},
    ),
    "reclaim: not for a job beyond its team's quota": Case(
        TWO_TEAMS,
        a_cluster()
        .nodes(4)
        .jobs(a_job(1).running_on("n01"), a_job(2).gpus(4).running_on("n02"))
        .jobs(*[a_job(3 + i).team("b").borrowed().gpus(4).running_on(f"n0{3 + i // 2}") for i in range(4)])
        .jobs(a_job(10).pending())
        .build(),
        want=[],
        want_waits={10: Code.WAIT_OVER_QUOTA},
    ),
    "reclaim: jobs not waiting for GPUs (held, dependency) are left alone": Case(
        a_policy(16).team("a", 8).team("b", 8, borrow=8).build(),
        a_cluster()
        .nodes(2)
        .jobs(a_job(1).team("b").running_on("n01"), a_job(2).team("b").borrowed().running_on("n02"))
        .jobs(a_job(10).pending("Dependency"), a_job(11).pending("JobHeldUser"))
        .build(),
        want=[],
    ),
    "reclaim: two jobs of a team cannot claim the same last quota GPUs": Case(
        a_policy(32).team("a", 16).team("b", 16, borrow=16).build(),
        a_cluster()
        .nodes(4)
        .jobs(a_job(1).running_on("n01"), a_job(2).team("b").running_on("n04"))
        .jobs(a_job(3).team("b").borrowed().running_on("n02"), a_job(4).team("b").borrowed().running_on("n03"))
        .jobs(a_job(10).pending().priority(2000), a_job(11).pending())
        .build(),
        want=[("Preempt", 3, "for", 10)],  # equal loss and start: the lower job id (last tie-break)
        want_waits={11: Code.WAIT_OVER_QUOTA},
    ),
    "in flight: GPUs being freed are waited for, not preempted again": Case(
        a_policy(32).team("a", 16).team("b", 16, borrow=16).build(),
        a_cluster()
        .nodes(4)
        .jobs(a_job(1).team("b").running_on("n04"))
        .jobs(a_job(3).team("b").borrowed().running_on("n02").signalled_s_ago(10, for_job=10))
        .jobs(a_job(4).team("b").borrowed().running_on("n03"), a_job(5).team("b").borrowed().running_on("n01"))
        .jobs(a_job(10).pending().priority(2000), a_job(11).pending())
        .build(),
        # job 10 takes what job 3 frees; job 11 needs a new victim, and job 3 is never chosen twice
        want=[("Preempt", 4, "for", 11)],
        want_waits={10: Code.WAIT_IN_FLIGHT, 3: Code.WAIT_ACK},
    ),
    "reclaim: a borrower on a drained node frees nothing usable": Case(
        a_policy(16).team("a", 8).team("b", 8, borrow=8).build(),
        a_cluster()
        .nodes(2)
        .drained("n02")
        .jobs(a_job(1).team("b").running_on("n01"), a_job(2).team("b").borrowed().running_on("n02"))
        .jobs(a_job(10).pending())
        .build(),
        want=[],
        want_waits={10: Code.WAIT_NO_VICTIMS},
    ),
    # -- tiers -------------------------------------------------------------------------------------------------------
    "urgent preempts a borrower before a guaranteed job, even one losing more work": Case(
        a_policy(16).team("a", 8).team("b", 8, borrow=8).team("c", 0).tier("urgent", ["c"]).build(),
        a_cluster()
        .nodes(2)
        .jobs(
            a_job(1).running_on("n01").ckpt_age_s(10), a_job(2).team("b").borrowed().running_on("n02").ckpt_age_s(3000)
        )
        .jobs(a_job(10).team("c").tier("urgent").pending())
        .build(),
        want=[("Preempt", 2, "for", 10)],
    ),
    "urgent preempts the cheapest guaranteed job of another team when no borrower is left": Case(
        a_policy(16).team("a", 8).team("b", 8).team("c", 0).tier("urgent", ["c"]).build(),
        a_cluster()
        .nodes(2)
        .jobs(a_job(1).running_on("n01").ckpt_age_s(300), a_job(2).team("b").running_on("n02").ckpt_age_s(30))
        .jobs(a_job(10).team("c").tier("urgent").pending())
        .build(),
        want=[("Preempt", 2, "for", 10)],
    ),
    "urgent never preempts its own team's guaranteed jobs": Case(
        a_policy(16).team("a", 8).team("b", 8).tier("urgent", ["a"]).build(),
        a_cluster()
        .nodes(2)
        .jobs(a_job(1).running_on("n01").ckpt_age_s(5), a_job(2).team("b").running_on("n02").ckpt_age_s(3000))
        .jobs(a_job(10).tier("urgent").pending())
        .build(),
        want=[("Preempt", 2, "for", 10)],
    ),
    "a tier that may not preempt guaranteed jobs waits when only guaranteed jobs run": Case(
        a_policy(16).team("a", 8).team("b", 8).team("c", 0).tier("urgent", ["c"], guaranteed=False).build(),
        a_cluster()
        .nodes(2)
        .jobs(a_job(1).running_on("n01"), a_job(2).team("b").running_on("n02"))
        .jobs(a_job(10).team("c").tier("urgent").pending())
        .build(),
        want=[],
        want_waits={10: Code.WAIT_NO_VICTIMS},
    ),
    "tiers: a lower tier is a victim, an equal or higher tier never": Case(
        a_policy(24).team("a", 24).tier("urgent", ["a"]).tier("prod", ["a"], priority=50_000).build(),
        a_cluster()
        .nodes(3)
        .jobs(a_job(1).tier("urgent").running_on("n01"), a_job(2).tier("prod").running_on("n02"))
        .jobs(a_job(3).tier("urgent").running_on("n03"))
        .jobs(a_job(10).tier("urgent").pending(), a_job(11).tier("prod").pending())
        .build(),
        want=[("Preempt", 2, "for", 10)],
        want_waits={11: Code.WAIT_NO_VICTIMS},
    ),
    "tiers come first: the urgent job takes the borrower, the guaranteed job waits": Case(
        a_policy(16).team("a", 8).team("b", 8, borrow=8).team("c", 0).tier("urgent", ["c"], guaranteed=False).build(),
        a_cluster()
        .nodes(2)
        .jobs(a_job(1).team("b").running_on("n01"), a_job(2).team("b").borrowed().running_on("n02"))
        .jobs(a_job(10).pending().priority(5000), a_job(11).team("c").tier("urgent").pending())
        .build(),
        want=[("Preempt", 2, "for", 11)],
        want_waits={10: Code.WAIT_NO_VICTIMS},
    ),
    # -- finishing preemptions ---------------------------------------------------------------------------------------
    "requeue at once on ack": Case(
        TWO_TEAMS,
        a_cluster().nodes(4).jobs(a_job(3).borrowed().running_on("n01").signalled_s_ago(20).acked_s_ago(5)).build(),
        want=[("Requeue", 3, "acked")],
    ),
    "requeue at grace end without ack": Case(
        TWO_TEAMS,
        a_cluster().nodes(4).jobs(a_job(3).borrowed().running_on("n01").signalled_s_ago(61)).build(),
        want=[("Requeue", 3, "grace over")],
    ),
    "no requeue before grace end without ack; an ack older than the signal does not count": Case(
        TWO_TEAMS,
        a_cluster().nodes(4).jobs(a_job(3).borrowed().running_on("n01").signalled_s_ago(30).acked_s_ago(40)).build(),
        want=[],
        want_waits={3: Code.WAIT_ACK},
    ),
    "state wins over the comment for the signal time": Case(
        TWO_TEAMS,
        a_cluster().nodes(4).jobs(a_job(3).borrowed().running_on("n01").signalled_s_ago(5)).build(),
        state=ControllerState(preempting={3: NOW - 100}),
        want=[("Requeue", 3, "grace over")],
    ),
    "a victim that restarted after the signal is no longer in flight": Case(
        TWO_TEAMS,
        a_cluster().nodes(4).jobs(a_job(3).borrowed().running_on("n01", started_s_ago=10).signalled_s_ago(500)).build(),
        want=[],
    ),
}


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_rule(case: Case) -> None:
    d = decide(case.snapshot, case.policy, case.state, NOW)
    assert summarize(d) == case.want
    waits = {w.job_id: w.code for w in d.waiting}
    assert {k: waits.get(k) for k in case.want_waits} == case.want_waits


def test_decisions_come_in_apply_order_with_reasons_and_codes() -> None:
    snap = (
        a_cluster()
        .nodes(4)
        .jobs(a_job(1).running_on("n01"), a_job(2).running_on("n02"), a_job(10).over_quota())
        .jobs(a_job(3).team("b").borrowed().running_on("n03").signalled_s_ago(100))
        .jobs(a_job(4).team("b").borrowed().running_on("n04"), a_job(20).team("b").pending())
        .build()
    )
    d = decide(snap, TWO_TEAMS, ControllerState(), NOW)
    kinds = [type(x).__name__ for x in d]
    assert kinds == sorted(kinds, key=["Requeue", "Preempt", "Return", "Borrow", "SetSiteFactor"].index)
    assert all(x.reason and x.code for x in d)
    assert all(w.reason and w.code for w in d.waiting)
    assert {name for name, _ in d.cycle_stats.phase_s} == {
        "classify",
        "finish",
        "tiers",
        "reclaim",
        "borrow",
        "fairshare",
    }
    assert "n.requeue=1" in d.cycle_stats.log_fields()


def test_a_job_started_between_the_node_and_job_reads_is_no_claimant() -> None:
    """The CI failure of stop 27: sinfo saw team b's job 20 already on n04 while squeue still listed it pending, so
    n04 looked full and b's borrower 3 was reclaimed for a job Slurm had just started. A node counts as free when
    either read says so (``capacity.settled``): no preemption on one read alone."""
    snap = (
        a_cluster()
        .nodes(4)
        .jobs(a_job(1).running_on("n01"), a_job(2).running_on("n02"), a_job(3).borrowed().running_on("n03"))
        .jobs(a_job(20).team("b").pending())
        .build()
    )
    raced = replace(snap, nodes=tuple(replace(n, gpus_alloc=8) if n.name == "n04" else n for n in snap.nodes))
    policy = a_policy(32).team("a", 16, borrow=8, lend=8).team("b", 16, borrow=8, lend=8).build()
    assert summarize(decide(snap, policy, ControllerState(), NOW)) == []
    d = decide(raced, policy, ControllerState(), NOW)
    assert summarize(d) == [] and d.cycle_stats.counts["nodes.settled"] == 1  # logged: n.nodes.settled=1
    assert "nodes.settled" not in decide(snap, policy, ControllerState(), NOW).cycle_stats.counts
    # a job gone from the job list while its node still shows it: its GPUs count as free too
    ended = replace(snap, jobs=tuple(j for j in snap.jobs if j.job_id != 2))
    assert settled(ended).node("n02").gpus_free == 8
    assert settled(snap) is snap  # consistent reads are passed through untouched


def test_next_state_tracks_new_victims_and_forgets_ended_ones() -> None:
    snap = (
        a_cluster()
        .nodes(2)
        .jobs(a_job(1).team("b").borrowed().running_on("n01"), a_job(10).pending())
        .jobs(a_job(2).team("b").running_on("n02"))
        .build()
    )
    policy = a_policy(16).team("a", 8).team("b", 8, borrow=8).build()
    state = ControllerState(preempting={99: NOW - 10})  # job 99 is gone
    d = decide(snap, policy, state, NOW)
    assert [(p.job_id, p.for_job_id) for p in d.of(Preempt)] == [(1, 10)]
    assert dict(d.next_state.preempting) == {1: NOW}
    assert d.next_state.site_factors.keys() == {10}


def test_site_factor_favours_the_underserved_team_and_is_not_repeated() -> None:
    snap = (
        a_cluster()
        .nodes(4)
        .jobs(a_job(1).running_on("n01"), a_job(2).running_on("n02"))
        .jobs(a_job(10).over_quota(), a_job(20).team("b").pending("Priority"))
        .build()
    )
    policy = a_policy(32).team("a", 16).team("b", 16).build()
    d = decide(snap, policy, ControllerState(), NOW)
    values = {s.job_id: s.value for s in d.of(SetSiteFactor)}
    assert values == {10: 5000, 20: 10000}  # a holds its entitlement (16 of 32 by shares), b nothing
    again = decide(snap, policy, d.next_state, NOW)
    assert again.of(SetSiteFactor) == ()
    moved = decide(snap, policy, ControllerState(site_factors={10: 5050, 20: 9000}), NOW)
    assert [(s.job_id, s.value) for s in moved.of(SetSiteFactor)] == [(20, 10000)]


CLASSIFY_POLICY = a_policy(32).team("a", 16).team("b", 16).tier("urgent", ["a"]).build()


@pytest.mark.parametrize(
    ("job", "want"),
    [
        (a_job(1).team("a"), ("a", "guaranteed")),
        (a_job(1).team("b").borrowed(), ("b", "borrowed")),
        (a_job(1).team("a").tier("urgent"), ("a", "tier:urgent")),
        (a_job(1).unmanaged("a"), ("a", "unmanaged")),
        (a_job(1).unmanaged("ops"), (None, "unmanaged")),
        (a_job(1).unmanaged("ops").tier("urgent"), (None, "tier:urgent")),
    ],
    ids=["g-team", "b-team", "tier", "team account, other qos", "unknown account", "tier without a team"],
)
def test_classify(job, want) -> None:  # noqa: ANN001
    c = classify(job.build(), CLASSIFY_POLICY)
    assert (c.team, c.kind) == want


def _cand(job_id: int, rank: int = 0, lost: float = 100.0, started: float = 0.0, tier: int = 0) -> Candidate:
    return Candidate(job_id, "t", rank, tier, 8, lost, started, ((0, 8),))


@pytest.mark.parametrize(
    ("first", "second"),
    [
        (_cand(9, rank=0, lost=9e9), _cand(1, rank=1, lost=1)),  # 1. borrowed before guaranteed, whatever the loss
        (_cand(9, rank=1, lost=9e9), _cand(1, rank=2, lost=1)),  # 1. guaranteed before tier jobs
        (_cand(9, rank=2, tier=10), _cand(1, rank=2, tier=20)),  # 2. the lower tier first
        (_cand(9, lost=10), _cand(1, lost=20)),  # 3. less work lost
        (_cand(9, started=200), _cand(1, started=100)),  # 4. most recently started
        (_cand(1), _cand(2)),  # 5. job id
    ],
    ids=["class", "class tier", "lower tier", "work lost", "recent start", "job id"],
)
def test_victim_key_criteria_in_order(first: Candidate, second: Candidate) -> None:
    assert victim_key(first) < victim_key(second)
