"""Packing node weights (controller/weights.py) and the daemon applying them within its budget."""

from __future__ import annotations

from dataclasses import replace

from nuro.slurm.actions import ActionResult, UpdateNodeWeight
from nuro.slurm.errors import SlurmUnavailable
from nuro.slurm.models import NodeInfo
from nuro.slurm_plugins.controller import weights
from nuro.slurm_plugins.controller.apply import ApplyBudget
from nuro.slurm_plugins.controller.daemon import Controller
from tests.unit.test_engine_builders import a_policy


def node(name: str, alloc: int, weight: int | None = 1, total: int = 8, state: str = "MIXED") -> NodeInfo:
    return NodeInfo(name, state, frozenset(state.split("+")), gpus_total=total, gpus_alloc=alloc, weight=weight)


def test_weight_is_one_plus_free_gpus_and_leaves_other_nodes_alone() -> None:
    assert weights.packing_weight(node("gpu001", 0, state="IDLE")) == 9
    assert weights.packing_weight(node("gpu002", 7)) == 2
    assert weights.packing_weight(node("gpu003", 8, state="ALLOCATED")) == 1
    assert weights.packing_weight(node("cpu001", 0, total=0, state="IDLE")) is None  # no GPUs: the admin's weight
    assert weights.packing_weight(node("gpu004", 0, state="IDLE+DRAIN")) is None  # nothing starts there
    assert weights.packing_weight(node("gpu005", 0, state="DOWN+NOT_RESPONDING")) is None


def test_one_update_per_distinct_weight_only_for_nodes_that_differ() -> None:
    nodes = [
        node("gpu001", 0, state="IDLE"),
        node("gpu002", 0, state="IDLE"),
        node("gpu003", 7),
        node("gpu004", 7, weight=2),  # already right: no call
        node("gpu005", 6, weight=None),  # unknown counts as different
        node("gpu006", 0, weight=9, state="IDLE"),
    ]
    assert weights.plan(nodes).updates == (
        UpdateNodeWeight("gpu003", 2),
        UpdateNodeWeight("gpu005", 3),
        UpdateNodeWeight("gpu[001-002]", 9),
    )
    assert weights.plan(nodes).nodes == 4
    settled = [node(n.name, n.gpus_alloc, weights.packing_weight(n), state=n.state) for n in nodes]
    assert weights.plan(settled).updates == ()  # a cycle after: nothing to send


def test_a_reverted_weight_is_set_again() -> None:
    """``scontrol reconfigure`` or a restart puts slurm.conf's Weight back: the next read sees it and sets it again."""
    assert weights.plan([node("gpu001", 4, weight=1)]).updates == (UpdateNodeWeight("gpu001", 5),)


class Recorder:
    """The backend calls the daemon's reweigh makes (no cluster: a pure record)."""

    def __init__(self, fail: str | None = None) -> None:
        self.applied: list[UpdateNodeWeight] = []
        self.fail = fail

    def apply(self, action: UpdateNodeWeight) -> ActionResult:
        if self.fail == "raise":
            raise SlurmUnavailable("slurmctld down")
        self.applied.append(action)
        if self.fail == "refuse":
            return ActionResult(action, ok=False, message="Invalid node name specified")
        return ActionResult(action, ok=True)


def test_the_daemon_sets_the_planned_weights_and_counts_nodes() -> None:
    backend = Recorder()
    ctl = Controller(backend, a_policy(16).team("a", quota=16).build(), node_weights=True)  # type: ignore[arg-type]
    done = ctl.reweigh([node("gpu001", 0, state="IDLE"), node("gpu002", 0, state="IDLE"), node("gpu003", 3)])
    assert done == 3
    assert backend.applied == [UpdateNodeWeight("gpu003", 6), UpdateNodeWeight("gpu[001-002]", 9)]


def test_a_refused_or_failed_update_costs_only_itself() -> None:
    for fail in ("refuse", "raise"):
        ctl = Controller(Recorder(fail), a_policy(8).team("a", quota=8).build(), node_weights=True)  # type: ignore[arg-type]
        assert ctl.reweigh([node("gpu001", 0, state="IDLE"), node("gpu002", 3)]) == 0


def test_weights_wait_when_the_budget_is_spent_and_dry_run_sends_nothing() -> None:
    backend = Recorder()
    ctl = Controller(backend, a_policy(8).team("a", quota=8).build(), node_weights=True)  # type: ignore[arg-type]
    spent = ApplyBudget(1.0)
    spent.spend(1.0, 0)
    assert ctl.reweigh([node("gpu001", 3)], spent) == 0 and backend.applied == []
    dry = Controller(backend, a_policy(8).team("a", quota=8).build(), dry_run=True, node_weights=True)  # type: ignore[arg-type]
    assert dry.reweigh([node("gpu001", 3)]) == 0 and backend.applied == []


def test_a_stopping_controller_leaves_slurms_default_weight_on_every_gpu_node() -> None:
    nodes = [node("gpu001", 3, weight=6), node("gpu002", 0, weight=9, state="IDLE+DRAIN"), node("gpu003", 0, weight=1),
             node("cpu001", 0, weight=7, total=0, state="IDLE")]  # fmt: skip
    assert weights.plan(nodes, weights.neutral_weight).updates == (UpdateNodeWeight("gpu[001-002]", 1),)


class _Cluster(Recorder):
    """A backend for ``Controller.cycle``: a fixed snapshot, nothing held, every action recorded and accepted."""

    def __init__(self, snapshot: object) -> None:
        super().__init__()
        self.snapshot = snapshot

    def read_snapshot(self) -> object:
        return self.snapshot

    def site_factors(self) -> dict[int, int]:
        return {}


def test_a_cycle_sets_the_packing_weights_and_a_later_one_nothing() -> None:
    from tests.unit.test_engine_builders import NOW, a_cluster

    snap = a_cluster().nodes(3).build()
    backend = _Cluster(snap)
    ctl = Controller(backend, a_policy(24).team("a", quota=24).build(), clock=lambda: NOW, node_weights=True)  # type: ignore[arg-type]
    assert ctl.cycle().weights == 3
    assert backend.applied == [UpdateNodeWeight(weights.plan(snap.nodes).updates[0].node, 9)]
    backend.snapshot = replace(snap, nodes=tuple(replace(n, weight=9) for n in snap.nodes))
    assert ctl.cycle().weights == 0 and len(backend.applied) == 1
