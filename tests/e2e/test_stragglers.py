"""A straggler on a real cluster (issue 16 item 2): moved away from when that pays, left alone when it does not.

A throttled GPU is emulated for real: the node's job processes get a quarter of a CPU (a cgroup v1 cpu quota,
``devcluster.cgroups.throttle_node``) and the example's stand-in compute burns a fixed amount of CPU per step
(``--burn``), so that node's rank is ~4x slower. The job runs ``StragglerWatch`` with a ``MovePolicy``
(``--move-stragglers``) on 2 nodes plus a hot spare. Not every_slurm: the decision and the stop are the training's
own; the swap they end in is the one tests/e2e/test_survive.py proves on every Slurm version.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from nuro.devcluster import cgroups, scenario
from nuro.lifecycle import run_events
from nuro.objectstore import ObjectStore
from nuro.slurm import JobPhase
from tests.integration.conftest import LiveCluster, cancel_jobs_of

pytestmark = [pytest.mark.slurm]

CKPT_INTERVAL_S = 4


def test_a_straggler_is_moved_away_from_only_when_it_pays(
    cluster: LiveCluster, prepared: tuple[Path, str, Path]
) -> None:
    """Issue 16 item 2: a training node's processes are limited to a quarter of a CPU (a cgroup quota: a throttled
    GPU's slowdown, for real). A long job flags its rank, finds moving pays, checkpoints at one agreed step and goes
    on with the spare: COMPLETED, one attempt, no step redone. A job near its end flags it too and stays."""
    work, dataset, repo = prepared
    env, backend = cluster.env, cluster.backend
    store = ObjectStore.from_env(env)
    burn = ("--burn", "--move-stragglers")
    long = scenario.submit(env, work, dataset, repo, spare_nodes=1, steps=400, step_time_s=0.03,
                           ckpt_interval_s=CKPT_INTERVAL_S, script_args=burn)  # fmt: skip
    short = None
    try:
        job = scenario.wait_for("the run to start on 3 nodes", lambda: (j := backend.find_job(long.job_id))
                                and j.phase == JobPhase.RUNNING and len(j.nodes) == 3 and j, 180)  # fmt: skip
        slow = job.nodes[1]
        _throttle(cluster, slow)
        final = backend.wait_for_job(long.job_id, timeout_s=400)
        log = long.log.read_text()
        assert final.phase == JobPhase.COMPLETED and final.restart_count == 0, log[-3000:]
        assert f"nuro: the training left straggler {slow}; going on with spare(s) {job.nodes[2]}" in log, log[-3000:]
        events = run_events.read(store, long.team, long.name, long.job_id)
        # the first decision moves; a later one may flag a rank slowed by a busy box (CI runs three clusters), and
        # must then not be worth a move of its own (one swap below)
        decision = next(e.fields for e in events if e.kind == "straggler_decision")
        assert decision["move"] is True and decision["node_of_rank"] == slow, decision
        (swap,) = [e.fields for e in events if e.kind == "spare_swap"]
        assert swap["why"] == "straggler" and swap["lost"] == [slow]
        stop = next(e for e in events if e.kind == "preempted")
        resumed = next(e for e in events if e.kind == "restored" and e.ts > stop.ts)
        assert stop.fields["why"] == "move" and resumed.step == stop.step, "the move checkpointed where it stopped"
        print(f"\nmoved job {long.job_id} off {slow}: {decision['why']}")

        # near its end: flagged after two windows of 20 steps (slow from its first step), 10 to go: staying is cheaper
        short = scenario.submit(env, work, dataset, repo, spare_nodes=1, steps=50, step_time_s=0.03,
                                ckpt_interval_s=CKPT_INTERVAL_S, script_args=burn)  # fmt: skip
        job = scenario.wait_for("the short run to start", lambda: (j := backend.find_job(short.job_id))
                                and j.phase == JobPhase.RUNNING and len(j.nodes) == 3 and j, 180)  # fmt: skip
        _throttle(cluster, job.nodes[1])
        final = backend.wait_for_job(short.job_id, timeout_s=300)
        assert final.phase == JobPhase.COMPLETED, short.log.read_text()[-3000:]
        events = run_events.read(store, short.team, short.name, short.job_id)
        decisions = [e.fields for e in events if e.kind == "straggler_decision"]
        assert decisions and not any(d["move"] for d in decisions), decisions
        assert not [e for e in events if e.kind == "spare_swap"]
        print(f"left job {short.job_id} alone: {decisions[0]['why']}")
    finally:
        cancel_jobs_of(cluster, ("alice",))


def _throttle(cluster: LiveCluster, node: str) -> None:
    """A quarter of a CPU for ``node``'s job processes from the moment its launcher runs: the workers it starts
    inherit the quota, so every training step there is slow (and so every straggler window)."""
    scenario.wait_for(f"job processes on {node}", lambda: cgroups.throttle_node(cluster.layout.root, node, 0.25), 60,
                      poll_s=0.05)  # fmt: skip
