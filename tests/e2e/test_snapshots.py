"""In-memory snapshots make a node loss cost seconds of training, whatever the persistent checkpoint interval
(issue 31 item 3): a real 2-node DDP run (``nuro-train submit`` as a team member, nuro-launch, torchrun, gloo) takes a
snapshot every second, each node's share sent to the other node; its persistent checkpoint interval is longer than
the run, so nothing is committed before the crash. A node is crashed like a host.

- requeue path: the surviving node's epilog promotes the newest complete snapshot; the requeued run restores it;
- hot spare: no epilog runs; the restarted step's restore promotes it (inline, the team's own credential) first.

Either way the run resumes a few steps behind, from a manifest that says ``tier: memory``, and its ``restored`` run
event says ``copy=memory`` (``nuro-train events``). How many seconds that saves over a run is bench/bench_goodput.py's.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest

from nuro.checkpoint.restore import latest_committed_step, load_manifest
from nuro.devcluster import scenario
from nuro.lifecycle import run_events
from nuro.objectstore import ObjectStore
from nuro.slurm import JobPhase
from tests.e2e.test_survive import _completed_log, _crash_and_wait, in_service
from tests.integration.conftest import LiveCluster, cancel_jobs_of

pytestmark = [pytest.mark.slurm]


@pytest.mark.parametrize("spare", [False, True], ids=["requeue", "spare"])
def test_a_node_loss_resumes_from_the_in_memory_snapshot_seconds_behind(
    cluster: LiveCluster, prepared: tuple[Path, str, Path], spare: bool
) -> None:
    work, dataset, repo = prepared
    env, backend = cluster.env, cluster.backend
    store = ObjectStore.from_env(env)
    width = 3 if spare else 2
    run = scenario.submit(
        env, work, dataset, repo, steps=300, ckpt_interval_s=600, spare_nodes=int(spare), snapshot_interval_s=1
    )  # nuro-train submit --snapshot-interval 1
    with contextlib.ExitStack() as on_failure:
        try:
            job = scenario.wait_for(f"the run to start on {width} nodes", lambda: (j := backend.find_job(run.job_id))
                                    and j.phase == JobPhase.RUNNING and len(j.nodes) == width and j, 180)  # fmt: skip
            scenario.wait_for("40 steps", lambda: any(s >= 40 for _, s in scenario.steps_logged(run.log)), 120)
            assert latest_committed_step(store, run.team, run.name) is None, "a persistent checkpoint came first"
            victim = job.nodes[1]  # the second training node (the first is the batch host; a spare is the last)
            _killed, final = _crash_and_wait(cluster, run, victim, on_failure)
        finally:
            cancel_jobs_of(cluster, ("alice",))
        log = _completed_log(run, final)
        assert final.restart_count == (0 if spare else 1), log[-3000:]
        if spare:
            assert f"nuro: node(s) {victim} lost; going on with spare(s) {job.nodes[2]}" in log, log[-3000:]
        lines = log.splitlines()
        resumed_line = next(n for n, line in enumerate(lines) if "resumed from the checkpoint of step" in line)
        restored = int(lines[resumed_line].rsplit(" ", 1)[1])
        last = max(s for n, s in scenario.steps_logged(run.log) if n < resumed_line)
        print(f"\n{'spare' if spare else 'requeue'}: resumed from the in-memory snapshot of step {restored}; "
              f"{last - restored} steps redone")  # fmt: skip
        assert restored >= 30 and last - restored <= 40, (restored, last)
        assert load_manifest(store, run.team, run.name, restored).tier == "memory"
        resumed = [e for e in run_events.read(store, run.team, run.name, run.job_id) if e.kind == "restored"]
        assert resumed and resumed[-1].fields.get("copy") == "memory", resumed
        on_failure.pop_all()
        scenario.revive_node(env, victim)
        scenario.wait_for(f"{victim} to be resumed", lambda: in_service(cluster, victim), 60)
