"""Trace synthesis is deterministic for a seed and does what the benchmark prints (bench/sim/synth.py, trace.py)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from bench.sim.synth import SynthParams, select_tasks, synthesise
from bench.sim.trace import TraceNode, TraceTask, scale_policy, shape_cluster

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "policy" / "teams.yaml"


def task(
    i: int, gpus: int = 1, milli: int = 1000, qos: str = "LS", phase: str = "Succeeded", run: int = 600
) -> TraceTask:
    created = 100 * i
    return TraceTask(f"pod-{i:04d}", gpus, milli, qos, phase, created, created + 5 + run, created + 5)


def tasks() -> list[TraceTask]:
    out = [task(i, milli=(1000 if i % 3 else 460), qos=("LS" if i % 2 else "BE")) for i in range(200)]
    out += [task(200 + i, gpus=8) for i in range(40)]
    out.append(TraceTask("cpu-only", 0, 0, "BE", "Succeeded", 5, 50, 6))
    out.append(TraceTask("never-ran", 1, 1000, "LS", "Pending", 7, 90, None))
    out.append(task(999, phase="Running", run=10_000))
    return out


@pytest.fixture(scope="module")
def policy():
    return scale_policy(EXAMPLE, 256)


def test_same_seed_same_workload(policy) -> None:
    a = synthesise(tasks(), SynthParams(seed=3), policy, max_gang_nodes=16)
    b = synthesise(list(reversed(tasks())), SynthParams(seed=3), policy, max_gang_nodes=16)
    assert a == b


def test_other_seed_other_teams(policy) -> None:
    a = synthesise(tasks(), SynthParams(seed=3), policy, max_gang_nodes=16)
    b = synthesise(tasks(), SynthParams(seed=4), policy, max_gang_nodes=16)
    assert [j.team for j in a.jobs] != [j.team for j in b.jobs]


def test_a_tasks_draws_do_not_depend_on_the_others(policy) -> None:
    full = synthesise(tasks(), SynthParams(seed=3), policy, max_gang_nodes=16)
    cut = synthesise(tasks(), SynthParams(seed=3), policy, max_gang_nodes=16, max_tasks=100)
    by_name = {j.name: j for j in full.jobs}
    for j in cut.jobs:
        if j.node_count == 1:
            assert replace(j, job_id=0) == replace(by_name[j.name], job_id=0)


def test_drops_and_rounding_are_counted(policy) -> None:
    w = synthesise(tasks(), SynthParams(), policy, max_gang_nodes=16)
    assert w.counts["dropped_no_gpu"] == 1
    assert w.counts["dropped_never_scheduled"] == 1
    assert w.counts["fractional_rounded_up"] == sum(1 for i in range(200) if i % 3 == 0)
    assert all(j.gpus_per_node >= 1 for j in w.jobs), "fractional GPUs round up to one whole GPU"
    assert w.counts["censored_jobs"] == 1


def test_gangs_group_eight_gpu_tasks_and_keep_their_gpu_seconds(policy) -> None:
    w = synthesise(tasks(), SynthParams(), policy, max_gang_nodes=16)
    eights = [j for j in w.jobs if j.gpus_per_node == 8]
    assert sum(j.node_count for j in eights) == 40, "every 8-GPU task is in exactly one job"
    assert all(1 <= j.node_count <= 16 for j in eights)
    assert any(j.node_count >= 2 for j in eights)
    assert sum(j.gpus * j.runtime_s for j in eights) == pytest.approx(40 * 8 * 600)
    assert sum(k * n for k, n in w.gang_sizes.items()) == 40
    for j in eights:
        assert j.gpus <= policy.team(j.team).quota_gpus, "a gang never exceeds its team's quota"


def test_gang_size_capped_by_cluster(policy) -> None:
    w = synthesise(tasks(), SynthParams(), policy, max_gang_nodes=3)
    assert max(j.node_count for j in w.jobs) <= 3


def test_compress_divides_arrivals_only(policy) -> None:
    a = synthesise(tasks(), SynthParams(compress=1), policy, max_gang_nodes=16)
    b = synthesise(tasks(), SynthParams(compress=10), policy, max_gang_nodes=16)
    assert [j.submit_s / 10 for j in a.jobs] == pytest.approx([j.submit_s for j in b.jobs])
    assert [j.runtime_s for j in a.jobs] == [j.runtime_s for j in b.jobs]


def test_urgent_only_for_allowed_teams(policy) -> None:
    w = synthesise(tasks(), SynthParams(urgent_share_of_ls=1.0), policy, max_gang_nodes=16)
    urgent = policy.tier("urgent")
    assert w.counts["urgent_jobs"] > 0
    for j in w.jobs:
        if j.tier == "urgent":
            assert j.team in urgent.allowed_accounts or j.user in urgent.allowed_users


def test_select_tasks_orders_by_creation() -> None:
    ran, counts = select_tasks(list(reversed(tasks())), max_tasks=5)
    assert [t.name for t in ran] == [f"pod-{i:04d}" for i in range(5)]
    assert counts["tasks_used"] == 5


def test_scaled_policy_sums_to_cluster_and_keeps_proportions() -> None:
    p = scale_policy(EXAMPLE, 313)
    assert sum(t.quota_gpus for t in p.teams) == 313
    assert p.team("perception").quota_gpus / 313 == pytest.approx(24 / 64, abs=0.01)
    for t in p.teams:
        assert t.lend_limit_gpus <= t.quota_gpus


def test_shape_cluster_is_stratified() -> None:
    ns = [TraceNode(f"a{i}", 8, "G2") for i in range(50)] + [TraceNode(f"b{i}", 2, "T4") for i in range(50)]
    out = shape_cluster(ns, 0.1)
    assert sorted(n.gpus for n in out) == [2] * 5 + [8] * 5
    assert all(len([m for m in out if m.leaf == n.leaf]) <= 4 for n in out)
    assert len({(n.leaf, n.gpus) for n in out}) == len({n.leaf for n in out}), "a leaf holds one node class"
