"""The goodput bound (bench/sim/bound.py): a max-flow no scheduler can beat, on cases small enough to solve by hand."""

from __future__ import annotations

import pytest

from bench.sim.bound import TeamLimits, goodput_bound, policy_bound
from bench.sim.synth import JobSpec
from bench.sim.trace import NodeSpec


def job(job_id: int, gpn: int = 8, nodes: int = 1, submit: float = 0.0, run: float = 100.0, team: str = "a",
        tier: str = "normal") -> JobSpec:  # fmt: skip
    return JobSpec(job_id, f"j{job_id}", team, "u", tier, nodes, gpn, submit, run, False, 600.0, 10.0, True, 0.0, ())


def test_capacity_caps_the_work() -> None:
    """Two whole-node jobs of 100 s on one 8-GPU node over 150 s: the node is the limit (8 × 150 GPU·s)."""
    b = goodput_bound([job(1), job(2)], [NodeSpec("n1", 8, "l0")], 0.0, 150.0, slot_s=50.0)
    assert b.gpu_s == pytest.approx(1200) and b.fraction == pytest.approx(1.0)


def test_a_job_runs_no_wider_than_it_asked_and_not_before_it_arrived() -> None:
    """One 1-GPU job arriving at 30 s on an idle 8-GPU node: at most 1 GPU × (100 − 30) s, whatever the slots."""
    b = goodput_bound([job(1, gpn=1, submit=30.0, run=500.0)], [NodeSpec("n1", 8, "l0")], 0.0, 100.0, slot_s=40.0)
    assert b.gpu_s == pytest.approx(70)


def test_whole_node_work_cannot_use_small_nodes() -> None:
    """An 8-GPU job cannot use a 2-GPU node's GPUs; 1-GPU work can, and a 3-GPU part fits twice on an 8-GPU node."""
    nodes = [NodeSpec("big", 8, "l0"), NodeSpec("small", 2, "l0")]
    b = goodput_bound([job(1), job(2)], nodes, 0.0, 100.0)
    assert b.gpu_s == pytest.approx(800), "the two 8-GPU jobs share the one 8-GPU node"
    b = goodput_bound([job(1), job(2, gpn=1, run=1000.0)], nodes, 0.0, 100.0)
    assert b.gpu_s == pytest.approx(900), "the 1-GPU job runs beside on the small node"
    b = goodput_bound([job(i, gpn=3, run=1000.0) for i in range(4)], nodes, 0.0, 100.0)
    assert b.gpu_s == pytest.approx(600), "floor(8 / 3) = 2 parts of 3 GPUs on the big node, none on the small one"


def test_work_is_bounded_by_the_run_time_even_when_it_arrived_before_the_window() -> None:
    b = goodput_bound([job(1, gpn=1, submit=-500.0, run=40.0)], [NodeSpec("n1", 8, "l0")], 0.0, 100.0)
    assert b.gpu_s == pytest.approx(40)


NODE16 = [NodeSpec("n1", 8, "l0"), NodeSpec("n2", 8, "l0")]


def test_the_policy_bound_keeps_quota_and_borrow_limit() -> None:
    """Team a (quota 8, may borrow 4) alone with 16 GPUs of work on a 16-GPU cluster whose other 8 are b's, lent
    whole: a runs 8 + 4 GPUs, never more, however idle b's GPUs are."""
    teams = {"a": TeamLimits(8, 4, 8), "b": TeamLimits(8, 8, 8)}
    work = [job(i, gpn=1, run=1000.0) for i in range(16)]
    assert policy_bound(work, NODE16, teams, {"urgent"}, 0.0, 100.0).gpu_s == pytest.approx(1200)
    assert goodput_bound(work, NODE16, 0.0, 100.0).gpu_s == pytest.approx(1600), "the plain bound ignores the limits"


def test_the_policy_bound_lends_only_what_the_lender_leaves_idle_up_to_its_lend_limit() -> None:
    """b lends at most 2 GPUs, and only those its own 7 running GPUs leave idle (1): a borrows 1; unassigned GPUs
    (a cluster larger than the quotas) are lent without a limit."""
    teams = {"a": TeamLimits(8, 8, 8), "b": TeamLimits(8, 8, 2)}
    work = [job(i, gpn=1, run=1000.0) for i in range(16)] + [job(100 + i, gpn=1, team="b") for i in range(7)]
    assert policy_bound(work, NODE16, teams, (), 0.0, 100.0).gpu_s == pytest.approx(800 + 100 + 700)
    bigger = [*NODE16, NodeSpec("n3", 8, "l0")]
    assert policy_bound(work, bigger, teams, (), 0.0, 100.0).gpu_s == pytest.approx(800 + 100 + 700 + 700), (
        "8 unassigned GPUs, a's borrow limit 8: 1 from b + 7 unassigned"
    )


def test_a_tiers_jobs_run_outside_every_quota() -> None:
    """An urgent job of team a (quota 0) runs on whatever the cluster has; a team's normal job with quota 0 and no
    borrowing does not run at all."""
    teams = {"a": TeamLimits(0, 0, 0), "b": TeamLimits(16, 0, 0)}
    assert policy_bound([job(1, team="a", tier="urgent")], NODE16, teams, {"urgent"}, 0.0, 100.0).gpu_s == 800
    assert policy_bound([job(1, team="a")], NODE16, teams, {"urgent"}, 0.0, 100.0).gpu_s == 0


def test_the_bound_says_how_much_of_it_is_gang_work() -> None:
    """A 2-node gang and a 1-GPU job on two 8-GPU nodes for 100 s: the gang runs 15 GPUs' worth beside the single
    GPU job (divisible), so gangs hold 1500 of the 1600 GPU·s."""
    work = [job(1, nodes=2, run=1000.0), job(2, gpn=1, run=1000.0)]
    b = goodput_bound(work, NODE16, 0.0, 100.0)
    assert b.gpu_s == pytest.approx(1600) and b.gang_fraction == pytest.approx(1500 / 1600)
