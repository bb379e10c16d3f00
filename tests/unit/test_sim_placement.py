"""The replay's Slurm-like scheduler on tiny hand-made clusters: gang, whole GPUs, topology leaves, QOS limits,
priority and backfill-lite (bench/sim/slurm.py)."""

from __future__ import annotations

import pytest

from bench.sim.slurm import PENDING, RUNNING, SchedParams, SimJob, SlurmSim
from bench.sim.synth import JobSpec
from bench.sim.trace import NodeSpec


def nodes(n: int = 8, gpus: int = 8, leaf_size: int = 4) -> list[NodeSpec]:
    return [NodeSpec(f"n{i:02d}", gpus, f"leaf{i // leaf_size}") for i in range(n)]


def spec(
    job_id: int, team: str = "a", nodes: int = 1, gpn: int = 8, submit: float = 0.0, run: float = 100.0
) -> JobSpec:
    return JobSpec(
        job_id, f"j{job_id}", team, "u", "normal", nodes, gpn, submit, run, False, 600.0, 10.0, True, 0.0, ()
    )


def sim(ns: list[NodeSpec] | None = None, quota: int = 1000) -> SlurmSim:
    limits = {"g-a": quota, "g-b": quota, "b-a": 1000, "b-b": 1000}
    return SlurmSim(ns or nodes(), limits, {}, {"a": 1, "b": 1})


def submit(s: SlurmSim, *specs: JobSpec, qos: str | None = None) -> list[SimJob]:
    jobs = [SimJob(sp, qos or f"g-{sp.team}") for sp in specs]
    for j in jobs:
        s.submit(j, 0.0)
    return jobs


def test_gang_starts_all_nodes_at_once_or_not_at_all() -> None:
    s = sim(nodes(4))
    (small,) = submit(s, spec(1, gpn=1))
    s.schedule(0.0)
    (gang,) = submit(s, spec(2, nodes=4, gpn=8))
    assert s.schedule(0.0) == []
    assert gang.state == PENDING and gang.reason == "Resources"
    assert s.free == [7, 8, 8, 8], "a gang that cannot start takes nothing"
    s.release(small, 10.0)
    assert s.schedule(10.0) == [gang]
    assert len(gang.nodes) == 4 and s.free == [0, 0, 0, 0]


def test_whole_gpus_per_node_never_overcommitted() -> None:
    s = sim(nodes(2, gpus=4, leaf_size=2))
    jobs = submit(s, *(spec(i, gpn=3) for i in range(1, 4)))
    started = s.schedule(0.0)
    assert len(started) == 2, "3 GPUs fit once per 4-GPU node; the third waits"
    assert s.free == [1, 1]
    assert jobs[2].reason == "Resources"


def test_multi_node_job_prefers_one_leaf() -> None:
    s = sim(nodes(8))
    submit(s, spec(1, gpn=1))  # n00 (leaf0) partly used: leaf0 keeps 3 whole nodes, leaf1 has 4
    s.schedule(0.0)
    (gang,) = submit(s, spec(2, nodes=3, gpn=8))
    s.schedule(0.0)
    assert s.leaves_spanned(gang.nodes) == 1
    assert set(gang.nodes) == {1, 2, 3}, "best fit: the leaf with just enough whole nodes"


def test_gang_spans_fewest_leaves_when_no_leaf_fits() -> None:
    s = sim(nodes(12))
    (gang,) = submit(s, spec(1, nodes=6, gpn=8))
    s.schedule(0.0)
    assert gang.state == RUNNING and s.leaves_spanned(gang.nodes) == 2


def test_single_node_job_takes_slurms_first_node_not_the_best_fit() -> None:
    """Slurm ranks usable nodes by weight, leaf and name, never by leftover GPUs: the 1-GPU job lands on the idle
    8-GPU node ("big" sorts first); with packing weights (free GPUs + 1) it fills the small node instead."""
    ns = [NodeSpec("big", 8, "l0"), NodeSpec("small", 2, "l0")]
    s = sim(ns)
    (job,) = submit(s, spec(1, gpn=1))
    s.schedule(0.0)
    assert job.nodes == (0,)
    s = sim(ns)
    s.weight = [9, 3]
    (job,) = submit(s, spec(1, gpn=1))
    s.schedule(0.0)
    assert job.nodes == (1,), "the lowest weight that fits wins"


def test_tree_single_node_goes_to_the_tightest_leaf_in_name_order() -> None:
    """22.05's _eval_nodes_topo for one node: of the lowest weight's usable nodes, the leaf with the fewest, then
    its first node in natural name order (n2 before n10)."""
    ns = [NodeSpec("n10", 8, "l0"), NodeSpec("n2", 8, "l0"), NodeSpec("n3", 8, "l1"), NodeSpec("n4", 8, "l1"),
          NodeSpec("n5", 8, "l1")]  # fmt: skip
    s = sim(ns)
    (job,) = submit(s, spec(1, gpn=1))
    s.schedule(0.0)
    assert job.nodes == (1,), "leaf l0 has 2 usable nodes, l1 has 3; in l0 n2 sorts before n10"


def test_block_single_node_is_first_fit_by_weight_then_name() -> None:
    """26.05's one-node path: the first usable node by (weight, name), whatever its leaf."""
    ns = [NodeSpec("n1", 8, "l0"), NodeSpec("n2", 8, "l1"), NodeSpec("n3", 8, "l1"), NodeSpec("n4", 8, "l1")]
    s = SlurmSim(ns, {"g-a": 100}, {}, {"a": 1}, SchedParams(placement="block"))
    (job,) = submit(s, spec(1, gpn=1))
    s.schedule(0.0)
    assert job.nodes == (0,)
    s.weight = [5, 5, 2, 5]
    (job,) = submit(s, spec(2, gpn=1))
    s.schedule(0.0)
    assert job.nodes == (2,)


def test_lower_weight_nodes_are_forced_into_a_gang() -> None:
    """Weights beat topology: with too few nodes of the lowest weight for the gang, all of them are taken and the
    rest comes first from their leaves."""
    s = sim(nodes(8))
    s.weight = [1, 1, 1, 1, 1, 1, 1, 0]  # n07 (leaf1) alone at the lowest weight
    (gang,) = submit(s, spec(1, nodes=3, gpn=8))
    s.schedule(0.0)
    assert gang.nodes == (4, 5, 7), "n07 forced in, then its leaf's first nodes"


def test_block_gang_never_spans_blocks_and_ties_go_to_the_last_block() -> None:
    s = SlurmSim(nodes(8), {"g-a": 1000}, {}, {"a": 1}, SchedParams(placement="block"))
    (gang,) = submit(s, spec(1, nodes=2, gpn=8))
    s.schedule(0.0)
    assert gang.nodes == (4, 5), "two equal blocks of 4: the last one, its first nodes"
    (wide,) = submit(s, spec(2, nodes=7, gpn=8))
    s.schedule(0.0)
    assert wide.state == PENDING, "7 nodes need the 8-node block, which has only 6 usable: it waits"
    (five,) = submit(s, spec(3, nodes=5, gpn=8))
    s.schedule(0.0)
    assert five.nodes == (0, 1, 2, 3, 6), "leaf0 fits nothing whole beyond 4: taken whole, then the rest"


def test_unknown_placement_is_refused() -> None:
    with pytest.raises(ValueError, match="placement"):
        SlurmSim(nodes(2), {}, {}, {}, SchedParams(placement="random"))


def test_qos_limit_blocks_without_blocking_others() -> None:
    s = sim(nodes(4), quota=8)
    a1, a2, b1 = submit(s, spec(1, "a"), spec(2, "a"), spec(3, "b"))
    started = s.schedule(0.0)
    assert a1 in started and b1 in started
    assert a2.state == PENDING and a2.reason == "QOSGrpGRES"
    assert s.qos_used["g-a"] == 8 and s.qos_over_limit() == []


def test_qos_move_lets_the_job_start_within_the_borrow_limit() -> None:
    s = sim(nodes(4), quota=8)
    _, a2 = submit(s, spec(1, "a"), spec(2, "a"))
    s.schedule(0.0)
    assert a2.reason == "QOSGrpGRES"
    a2.qos = "b-a"
    assert s.schedule(1.0) == [a2]
    assert s.qos_used == {"g-a": 8, "g-b": 0, "b-a": 8, "b-b": 0}


@pytest.mark.parametrize(("run_s", "backfills"), [(50.0, True), (5000.0, False)], ids=["short", "long"])
def test_backfill_respects_the_top_jobs_reservation(run_s: float, backfills: bool) -> None:
    s = sim(nodes(2, leaf_size=2))
    (first,) = submit(s, spec(1, gpn=8, run=100.0))
    s.schedule(0.0)
    first.train_start_s = 0.0
    big, small = submit(s, spec(2, nodes=2, gpn=8, run=100.0), spec(3, gpn=8, run=run_s))
    big.priority, small.priority = 10, 0
    s.update_priorities = lambda now: None  # fixed priorities for this case
    s.schedule(0.0)
    assert big.reason == "Resources"
    assert (small.state == RUNNING) is backfills, "a backfilled job must end before the reservation (t=100)"
    if not backfills:
        assert small.reason == "Priority"


def test_fair_share_orders_the_less_served_team_first() -> None:
    s = sim(nodes(1))
    (hog,) = submit(s, spec(1, "a", gpn=8, run=10_000))
    s.schedule(0.0)
    a2, b1 = submit(s, spec(2, "a", gpn=8), spec(3, "b", gpn=8))
    s.update_priorities(3600.0)
    assert b1.priority > a2.priority
    assert s.queue_order()[0] is b1
    assert hog.state == RUNNING
