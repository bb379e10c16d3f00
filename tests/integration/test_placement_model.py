"""Node weights on the real cluster: the replay's model of slurmctld's node choice (bench/sim/slurm.py) predicts
where Slurm puts each job of a scripted scenario, and nuro's controller steers a single-node job onto a busy node.

The scenario sets node weights by hand (``scontrol update weight=``) and submits one job at a time; before each
submission the model, given the same nodes, leaves, weights and free GPUs, names the nodes it expects, and the job's
real allocation must be those nodes. It runs on every Slurm version of the suite: topology/tree on 22.05 and 24.11,
topology/block on 26.05 (``placement_for``).
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.sim.slurm import SchedParams, SlurmSim, placement_for
from bench.sim.trace import NodeSpec
from nuro.slurm import JobPhase, render_argv
from nuro.slurm.models import NodeInfo
from nuro.slurm_plugins.controller import weights
from tests.integration.conftest import (
    TEST_ACCOUNT,
    TEST_SLURM,
    TEST_TOPOLOGY,
    TEST_USERS,
    LiveCluster,
    apply_example_policy,
    cancel_jobs_of,
    controller_process,
    wait_until,
)

pytestmark = [pytest.mark.slurm, pytest.mark.every_slurm]

BIN = Path(sys.executable).parent
SLEEP = "#!/bin/bash\nsleep 600\n"

#: (weights to set first: node -> weight, "*" for every other node; the job: nodes, GPUs per node, pinned node)
SCENARIO: tuple[tuple[dict[str, int], tuple[int, int, str | None]], ...] = (
    ({}, (1, 1, None)),
    ({}, (1, 1, "gpu006")),
    ({}, (1, 1, None)),
    ({}, (2, 8, None)),  # tree: the first of two equal leaves; block: the last of two equal blocks
    ({"gpu007": 5, "*": 10}, (1, 1, None)),  # the one node of the lowest weight, wherever it is
    ({"gpu004": 3, "gpu008": 3, "*": 10}, (1, 2, None)),  # lowest weight group of two: leaf / name order
    ({"gpu003": 2, "*": 10}, (2, 8, None)),  # a lower-weight node is forced into the gang
    ({}, (1, 4, None)),
)


def _set_weights(cluster: LiveCluster, wanted: dict[str, int]) -> dict[str, int]:
    """Set the scenario step's weights on the cluster (one call per value, as the controller renders them:
    ``weights.plan``); the full map of node -> weight now."""
    nodes = cluster.backend.nodes()
    full = {n.name: wanted.get(n.name, wanted.get("*", 1)) for n in nodes}
    for update in weights.plan(nodes, lambda n: full[n.name]).updates:
        cluster.run(render_argv(update))
    return full


@pytest.fixture
def neutral(cluster: LiveCluster) -> Iterator[list[NodeInfo]]:
    """No job of the test users, every node in service at Slurm's default weight, before and after."""
    cancel_jobs_of(cluster, TEST_USERS)
    _set_weights(cluster, {})
    try:
        yield cluster.backend.nodes()
    finally:
        cancel_jobs_of(cluster, TEST_USERS)
        with contextlib.suppress(Exception):
            _set_weights(cluster, {})


def _run(cluster: LiveCluster, nodes: int, gpus: int, pinned: str | None, user: str = TEST_USERS[0]) -> list[str]:
    args = [f"--account={TEST_ACCOUNT}", "--output=/dev/null", f"--nodes={nodes}", f"--gres=gpu:{gpus}"]
    if pinned:
        args.append(f"--nodelist={pinned}")
    job_id = cluster.sbatch_as(user, args, SLEEP)
    info = cluster.backend.wait_for_job(job_id, {JobPhase.RUNNING}, timeout_s=60)
    return sorted(info.nodes)


def test_the_model_names_the_nodes_slurm_picks(cluster: LiveCluster, neutral: list[NodeInfo]) -> None:
    version = cluster.backend.version()
    rule = placement_for((version.major, version.minor), TEST_TOPOLOGY)
    assert all(n.switch for n in neutral), "the dev cluster's nodes carry their leaf or block"
    specs = [NodeSpec(n.name, n.gpus_total, n.switch or "") for n in neutral]
    model = SlurmSim(specs, {}, {}, {}, SchedParams(placement=rule))
    seen = []
    for step_weights, (count, gpus, pinned) in SCENARIO:
        full = _set_weights(cluster, step_weights)
        model.weight = [full[n] for n in model.names]
        predicted = (
            [pinned] if pinned else [model.names[i] for i in model.place(gpus, count, model.free) or ()]
        )  # fmt: skip
        got = _run(cluster, count, gpus, pinned)
        seen.append((step_weights, count, gpus, predicted, got))
        assert got == sorted(predicted), f"Slurm {TEST_SLURM} ({rule}): steps so far {seen}"
        for name in got:
            model.free[model.index_of(name)] -= gpus


def test_the_controllers_weights_steer_a_one_gpu_job_onto_a_busy_node(
    cluster: LiveCluster, neutral: list[NodeInfo], tmp_path: Path
) -> None:
    """With one GPU in use on gpu003, Slurm alone starts the next 1-GPU job on gpu001 (first node of the first
    leaf, or first by name); with nuro's packing weights it goes to gpu003, keeping gpu001 whole. A clean stop of
    the controller leaves Slurm's default weight behind, and a reconfigure's revert is set again."""
    user = TEST_USERS[0]
    assert _run(cluster, 1, 1, "gpu003", user) == ["gpu003"]
    assert _run(cluster, 1, 1, None, user) == ["gpu001"], "Slurm alone: its own first node"
    cancel_jobs_of(cluster, TEST_USERS)
    assert _run(cluster, 1, 1, "gpu003", user) == ["gpu003"]
    policy = apply_example_policy(cluster, tmp_path)
    log_path = tmp_path / "controller.log"

    def weight_of(name: str) -> int | None:
        return next(n.weight for n in cluster.backend.nodes() if n.name == name)

    with controller_process(cluster, policy, log_path):
        wait_until(lambda: weight_of("gpu003") == 8 and weight_of("gpu001") == 9, 30, "packing weights set")
        assert _run(cluster, 1, 1, None, user) == ["gpu003"], log_path.read_text()[-2000:]
        wait_until(lambda: weight_of("gpu003") == 7, 30, "gpu003's weight follows its second job")
        cluster.run(["scontrol", "reconfigure"])
        wait_until(lambda: weight_of("gpu003") == 7, 60, "the weights set again after scontrol reconfigure")
    assert {n.weight for n in cluster.backend.nodes() if n.gpus_total} == {1}, "a clean stop leaves weight 1"
