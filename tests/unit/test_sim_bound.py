"""The goodput bound (bench/sim/bound.py): a max-flow no scheduler can beat, on cases small enough to solve by hand."""

from __future__ import annotations

import pytest

from bench.sim.bound import goodput_bound
from bench.sim.synth import JobSpec
from bench.sim.trace import NodeSpec


def job(job_id: int, gpn: int = 8, nodes: int = 1, submit: float = 0.0, run: float = 100.0) -> JobSpec:
    return JobSpec(job_id, f"j{job_id}", "a", "u", "normal", nodes, gpn, submit, run, False, 600.0, 10.0, True, 0.0, ())


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
