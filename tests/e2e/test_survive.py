"""A real 2-node DDP run survives a crashed node: detection, requeue, restart elsewhere, resume, little lost.

The whole path is real: ``nuro-train submit`` as a team member, the rendered batch script, ``nuro-launch`` and torchrun
on two emulated nodes (gloo), checkpoints staged on the node and uploaded to SeaweedFS, the node agents' heartbeats,
the controller's failure detector, Slurm's requeue, the restore of the newest valid checkpoint. The node is crashed
like a host (``devcluster kill-node``: SIGKILL of its slurmd, its job processes and its agent).

Bounds are the issue's (detection ≤ 10 s, resume ≤ 90 s, lost progress ≤ one checkpoint interval); the measured
values are printed, and benchmarks (bench/bench_resume.py) track them against Slurm alone.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import pytest

from nuro.checkpoint.restore import latest_committed_step
from nuro.devcluster import scenario
from nuro.objectstore import ObjectStore
from nuro.runs import timeline_report
from nuro.slurm import JobInfo, JobPhase
from tests.integration.conftest import TEST_SLURM, LiveCluster, cancel_jobs_of

pytestmark = [pytest.mark.slurm, pytest.mark.every_slurm]

CKPT_INTERVAL_S = 4


def test_a_crashed_node_is_detected_and_the_run_resumes_from_its_checkpoint(
    cluster: LiveCluster, prepared: tuple[Path, str, Path]
) -> None:
    work, dataset, repo = prepared
    store = ObjectStore.from_env(cluster.env)
    sample_log = work / "runs" / "samples"
    run = scenario.submit(cluster.env, work, dataset, repo, steps=200, ckpt_interval_s=CKPT_INTERVAL_S,
                          script_args=("--sample-log", str(sample_log)))  # fmt: skip
    with contextlib.ExitStack() as on_failure:  # a failed check must not leave the node dead for the next tests
        restored = _check_recovery(cluster, run, store, on_failure)
    _check_samples_exactly_once(sample_log, restored)


@pytest.mark.skipif(
    TEST_SLURM == "24.11",
    reason="Slurm 24.11.5 (the cached rootfs) has a ping race: healthy nodes are set DOWN 'not responding' when a ping "
    "round to a dead node outlasts SlurmdTimeout (6 s here), so the --no-kill job loses its batch host and is requeued "
    "after nuro's swap already resumed it; fixed in 24.11.6 ('Fix ping cycle race condition with last_response "
    "updates'). docs/stragglers.md",
)
def test_a_node_kill_with_a_hot_spare_goes_on_without_a_requeue(
    cluster: LiveCluster, prepared: tuple[Path, str, Path]
) -> None:
    """Issue 16 item 3: 2 training nodes + 1 spare (--no-kill); a training node is crashed; Slurm takes it out of
    the job, nuro-launch --step starts the step again on the survivor and the spare, the training restores its newest
    checkpoint; accounting shows one attempt, no requeue."""
    work, dataset, repo = prepared
    env, backend = cluster.env, cluster.backend
    store = ObjectStore.from_env(env)
    run = scenario.submit(env, work, dataset, repo, spare_nodes=1, steps=200, ckpt_interval_s=CKPT_INTERVAL_S)
    victim = None
    with contextlib.ExitStack() as on_failure:
        try:
            job = scenario.wait_for("the run to start on 3 nodes", lambda: (j := backend.find_job(run.job_id))
                                    and j.phase == JobPhase.RUNNING and len(j.nodes) == 3 and j, 180)  # fmt: skip
            scenario.wait_for("a committed checkpoint", lambda: latest_committed_step(store, run.team, run.name), 180)
            victim = job.nodes[1]  # the second training node (the first is the batch host, the last the spare)
            killed, final = _crash_and_wait(cluster, run, victim, on_failure)
        finally:
            cancel_jobs_of(cluster, ("alice",))
        log = _completed_log(run, final)
        assert final.restart_count == 0, "no requeue: the spare took the lost node's place"
        assert [a.state for a in backend.attempts(run.job_id)] == ["COMPLETED"], "one attempt in accounting"
        assert f"nuro: node(s) {victim} lost; going on with spare(s) {job.nodes[2]}" in log, log[-3000:]

        tl, notes = timeline_report.gather(run.job_id, backend, Path(env["NURO_EVENT_LOG"]), store)
        assert not notes, notes
        (rec,) = tl.recoveries
        summary = rec.to_json()
        print(f"\nspare swap of job {run.job_id}: {summary}")
        assert summary["via"] == "spare" and summary["node"] == victim and summary["requeue_s"] is None
        assert summary["resume_s"] is not None and summary["resume_s"] <= 90
        before = [e.step for e in tl.entries if e.kind == "checkpoint_committed" and e.ts < killed["at"]]
        assert before and summary["resumed_step"] >= max(before) + 1, (summary, before)

        on_failure.pop_all()
        scenario.revive_node(env, victim)
        scenario.wait_for(f"{victim} to be resumed", lambda: in_service(cluster, victim), 60)


def _check_samples_exactly_once(sample_log: Path, restored: int, world: int = 2, batch: int = 64) -> None:
    """The data the run trained on, pieced together as the model saw it (steps up to the restored checkpoint from
    the first attempt, the rest from the second): every epoch reads each sample at most once, and every epoch that
    finished (the one the node was lost in included) reads every sample exactly once."""
    attempts: dict[int, dict[int, list[int]]] = {}
    for path in sample_log.parent.glob(f"{sample_log.name}.rank*"):
        for line in path.read_text().splitlines():
            restart, step, idx = line.split(" ")
            attempts.setdefault(int(restart), {}).setdefault(int(step), []).extend(map(int, idx.split(",")))
    first, second = attempts[0], attempts[1]
    trained = {s: v for s, v in first.items() if s <= restored} | {s: v for s, v in second.items() if s > restored}
    assert sorted(trained) == list(range(max(trained) + 1)), "a step with no data"
    samples = 8192  # examples/train_ddp/make_dataset.py
    per_epoch = samples // (world * batch)
    for epoch in range(max(trained) // per_epoch + 1):
        seen = [i for s in range(epoch * per_epoch, (epoch + 1) * per_epoch) for i in trained.get(s, [])]
        assert len(seen) == len(set(seen)), f"epoch {epoch}: a sample was read twice"
        if (epoch + 1) * per_epoch <= max(trained) + 1:
            assert sorted(seen) == list(range(samples)), f"epoch {epoch}: samples skipped"
    print(f"data: {len(trained)} steps, resumed after step {restored}, every sample once per epoch")


def _check_recovery(
    cluster: LiveCluster, run: scenario.Run, store: ObjectStore, on_failure: contextlib.ExitStack
) -> int:
    """Check detection, requeue and resume; the step the run resumed from."""
    env, backend = cluster.env, cluster.backend
    victim = None
    try:

        def running():
            j = backend.find_job(run.job_id)
            assert j is not None and j.phase not in (JobPhase.FAILED, JobPhase.COMPLETED), f"job ended early: {j}"
            return j if j.phase == JobPhase.RUNNING and len(j.nodes) == 2 else None

        job = scenario.wait_for("the run to start on 2 nodes", running, 180)
        scenario.wait_for("a committed checkpoint", lambda: latest_committed_step(store, run.team, run.name), 180)
        victim = job.nodes[-1]
        killed, final = _crash_and_wait(cluster, run, victim, on_failure)
    finally:
        cancel_jobs_of(cluster, ("alice",))
    log = _completed_log(run, final)
    assert final.restart_count == 1, "exactly one requeue: the node loss"
    assert victim not in final.nodes, "the restart ran on healthy nodes"

    tl, notes = timeline_report.gather(run.job_id, backend, Path(env["NURO_EVENT_LOG"]), store)
    assert not notes, notes
    (rec,) = tl.recoveries
    summary = rec.to_json()
    print(f"\nrecovery of job {run.job_id}: {summary}")
    # nuro's detector found the loss (from the last heartbeat), not Slurm's SlurmdTimeout. The acceptance
    # limits (the brief's: 10 s, 90 s) are checked here with their full slack; our own targets (3 s, 30 s) are speed
    # targets, measured side by side with Slurm alone in bench/detection.py and bench/resume.py.
    assert summary["node"] == victim and summary["from"] == "last_heartbeat"
    assert summary["detect_s"] <= 10, f"detection took {summary['detect_s']} s (issue: ≤ 10 s, target 3 s)"
    assert summary["resume_s"] <= 90, f"first step after resume at {summary['resume_s']} s (issue: ≤ 90 s)"
    # The in-band path (issue 16 item 5): the survivor's launcher saw gloo lose its peer and told its agent, which
    # beat the report at once; the controller looked the job's nodes up. Whether that made the loss come sooner
    # depends on timing (bench/bench_resume.py measures it); that the chain works does not.
    survivor = next(n for n in job.nodes if n != victim)
    logs = cluster.layout.log
    scenario.wait_for("the survivor's agent to take the report", lambda: f"job={run.job_id} reports a lost peer"
                      in (logs / f"agent-{survivor}.log").read_text(errors="replace"), 5)  # fmt: skip
    assert f"in-band report: job {run.job_id} " in (logs / "controller.log").read_text(errors="replace")
    events = _events(Path(env["NURO_EVENT_LOG"]))
    losses = [e for e in events if e.get("kind") == "node_lost" and e.get("node") == victim]
    print(f"node_lost: {losses[-1] if losses else None}")

    # Lost progress, from rank 0's own log: steps done before the crash that were done again after the restore.
    lines = log.splitlines()
    resumed_line = next(n for n, line in enumerate(lines) if "resumed from the checkpoint of step" in line)
    restored = int(lines[resumed_line].rsplit(" ", 1)[1])
    lost = max(s for n, s in scenario.steps_logged(run.log) if n < resumed_line) - restored
    print(f"lost {lost} steps (checkpoint interval {CKPT_INTERVAL_S} s)")
    # Nothing committed is lost: the restart resumed from the newest checkpoint committed before the crash (or one
    # whose commit landed just after it), never an older one.
    before = [e.step for e in tl.entries if e.kind == "checkpoint_committed" and e.ts < killed["at"]]
    assert before and restored >= max(before), (restored, before)
    assert summary["resumed_step"] == restored + 1

    # The crashed node comes back only through its agent's healthy heartbeats (the controller resumes it).
    on_failure.pop_all()
    scenario.revive_node(env, victim)
    scenario.wait_for(f"{victim} to be resumed", lambda: in_service(cluster, victim), 60)
    return restored


def _crash_and_wait(
    cluster: LiveCluster, run: scenario.Run, victim: str, on_failure: contextlib.ExitStack
) -> tuple[dict, JobInfo]:
    """Crash ``victim`` like a host (revived by ``on_failure`` if the test fails) and wait for the job's end."""
    on_failure.callback(_revive_quietly, cluster.env, victim)
    killed = scenario.kill_node(cluster.env, victim)
    return killed, cluster.backend.wait_for_job(run.job_id, timeout_s=400)


def _completed_log(run: scenario.Run, final: JobInfo) -> str:
    """The run's output, once it is known the job ended COMPLETED (else the test fails with its tail)."""
    log = run.log.read_text()
    assert final.phase == JobPhase.COMPLETED, f"job {run.job_id} ended {final.state}:\n{log[-3000:]}"
    return log


def _events(path: Path) -> list[dict]:
    out = []
    for line in path.read_text(errors="replace").splitlines():
        with contextlib.suppress(ValueError):
            out.append(json.loads(line))
    return out


def _revive_quietly(env: dict[str, str], node: str) -> None:
    with contextlib.suppress(Exception):  # the test's own failure is the one to report
        scenario.revive_node(env, node)


def in_service(cluster: LiveCluster, node: str) -> bool:
    info = next((n for n in cluster.backend.nodes() if n.name == node), None)
    return info is not None and not info.flags & {"DOWN", "DRAIN", "NOT_RESPONDING"}
