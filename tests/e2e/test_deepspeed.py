"""DeepSpeed jobs through nuro end to end (issue 17): a real ZeRO-2 engine on two emulated nodes survives a crashed
node and a preemption, resuming from its committed checkpoint each time.

Everything is the product's path: ``nuro-train submit --deepspeed-config`` as a team member (the config checked at
submit), the rendered script, ``nuro-launch`` on each node, ``examples/train_deepspeed`` with
``Checkpointer(engine=...)`` (DeepSpeed's own files staged on the node, uploaded to SeaweedFS by the node agent,
committed by a manifest), ``PreemptionGuard``, the failure detector, the controller's reclaim of a borrower with
its checkpoint-confirmed ack, and Slurm's requeue.
"""

from __future__ import annotations

import contextlib
import re
import tempfile
from pathlib import Path

import pytest

from nuro.checkpoint.restore import latest_committed_step, load_manifest
from nuro.devcluster import scenario
from nuro.objectstore import ObjectStore
from nuro.slurm import JobPhase
from tests.e2e.test_survive import _completed_log, _crash_and_wait, in_service
from tests.integration.conftest import (
    LiveCluster,
    apply_example_policy,
    cancel_jobs_of,
    controller_process,
    controller_progress,
    wait_until,
)
from tests.integration.test_controller import MEMBERS, _submit

pytestmark = pytest.mark.slurm

CKPT_INTERVAL_S = 3
GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "sbatch_deepspeed_8node.sh"
_STEP = re.compile(r"^step (\d+) loss ([0-9.]+)")


@pytest.fixture(scope="module")
def prepared_ds(cluster: LiveCluster) -> tuple[Path, str, Path]:
    """The DeepSpeed example's dataset (multi-agent tracks) and code repository, once per module."""
    work = Path(tempfile.mkdtemp(prefix="nuro-e2e-ds-", dir="/tmp"))
    work.chmod(0o755)
    dataset, repo = scenario.prepare(cluster.env, work, dataset="demo-tracks", example=scenario.DEEPSPEED_EXAMPLE)
    return work, dataset, repo


def _launch(script: str) -> list[str]:
    """A rendered script's DeepSpeed launch, with what differs between jobs (interpreter, GPUs per node, script
    and arguments, the user's --env exports) taken out: the shape the golden file and the real job must share."""
    lines = script.splitlines()
    block = lines[lines.index("# 4. launch: nuro-launch per node (srun) starts the workers, rendezvous on the first "
                              "node of the allocation;"):]  # fmt: skip
    block = block[: block.index("NURO_STEP_PID=$!") + 1]
    out = []
    for line in block:
        if line.startswith("export ") and "NURO_" not in line:
            continue  # the job's own --env
        line = re.sub(r"^(\s*)\S+ -m nuro\.wrappers\.launch", r"\1PYTHON -m nuro.wrappers.launch", line)
        line = re.sub(r"--nproc-per-node=\d+", "--nproc-per-node=N", line)
        line = re.sub(r":-\d+\}", ":-N}", line)  # the site's rendezvous port range
        entry = r"^    \S+\.py .*(--deepspeed --deepspeed_config) \S+\.json &$"
        line = re.sub(entry, r"    SCRIPT ARGS \1 CONFIG &", line)
        out.append(line)
    exports = [line for line in lines if line.startswith("export NURO_DEEPSPEED_CONFIG=")]
    assert len(exports) == 1, exports
    return [*out, re.sub(r"=.*", "=CONFIG", exports[0])]


def _losses(text: str) -> list[tuple[int, float]]:
    return [(int(m[1]), float(m[2])) for line in text.splitlines() if (m := _STEP.match(line))]


def _resumed_step(log: str) -> int:
    found = re.findall(r"resumed from the checkpoint of step (\d+)", log)
    assert len(found) == 1, f"expected one resume, found {found}:\n{log[-3000:]}"
    return int(found[0])


def _check_continuous(log: str, restored: int) -> None:
    """The resumed run continues the loss curve: its first losses are those of a trained model, not a fresh one
    (a lost optimizer or weights would restart near the first step's loss)."""
    losses = _losses(log)
    first = losses[0][1]
    after = [loss for step, loss in losses if step > restored][:5]
    before = [loss for step, loss in losses if restored - 5 < step <= restored]
    assert after and before, losses[-20:]
    print(f"loss: first {first:.3f}, before the stop {before}, after the resume {after}")
    assert max(after) < 0.7 * first, f"the resumed run starts over: first loss {first}, after resume {after}"


def test_a_deepspeed_run_survives_a_crashed_node_from_its_zero_checkpoint(
    cluster: LiveCluster, prepared_ds: tuple[Path, str, Path]
) -> None:
    work, dataset, repo = prepared_ds
    env, backend = cluster.env, cluster.backend
    store = ObjectStore.from_env(env)
    run = scenario.submit(env, work, dataset, repo, deepspeed=True, steps=260, step_time_s=0.05,
                          ckpt_interval_s=CKPT_INTERVAL_S)  # fmt: skip
    with contextlib.ExitStack() as on_failure:
        try:
            job = wait_until(lambda: (j := backend.find_job(run.job_id)) and j.phase == JobPhase.RUNNING
                             and len(j.nodes) == 2 and j, 180, "the DeepSpeed run to start on 2 nodes")  # fmt: skip
            step = wait_until(lambda: latest_committed_step(store, run.team, run.name), 180, "a committed checkpoint")
            manifest = load_manifest(store, run.team, run.name, step)
            assert manifest.world_size == 2 and {s.path for s in manifest.shards} == {
                "mp_rank_00_model_states.pt", "zero_pp_rank_0_mp_rank_00_optim_states.pt",
                "zero_pp_rank_1_mp_rank_00_optim_states.pt"}, manifest.shards  # fmt: skip
            victim = job.nodes[-1]
            _, final = _crash_and_wait(cluster, run, victim, on_failure)
        finally:
            cancel_jobs_of(cluster, ("alice",))
        log = _completed_log(run, final)
        assert final.restart_count == 1 and victim not in final.nodes
        ran = cluster.run(["scontrol", "write", "batch_script", str(run.job_id), "-"]).stdout
        assert _launch(ran) == _launch(GOLDEN.read_text()), "the golden DeepSpeed render drifted from what runs"
        restored = _resumed_step(log)
        assert restored >= step, (restored, step)
        _check_continuous(log, restored)
        # each node's prolog staged its share only: the model states and its own rank's shard, 2 of 3 files
        for node in final.nodes:
            hooks = (cluster.layout.log / f"hooks-{node}.log").read_text(errors="replace")
            pattern = rf"job={run.job_id} team=\S+ run={re.escape(run.name)} staged step=\d+ .*files=(\d+)/(\d+)"
            staged = re.findall(pattern, hooks)
            assert staged and staged[-1] == ("2", "3"), (node, staged, hooks[-2000:])
        on_failure.pop_all()
        scenario.revive_node(env, victim)
        scenario.wait_for(f"{victim} to be resumed", lambda: in_service(cluster, victim), 60)


def test_a_deepspeed_borrower_is_preempted_with_its_checkpoint_acknowledged(
    cluster: LiveCluster, prepared_ds: tuple[Path, str, Path], tmp_path: Path
) -> None:
    """Perception at its quota runs the DeepSpeed job on borrowed GPUs; prediction claims them back: the controller
    signals it, every rank stops at one step, the engine's checkpoint is committed, rank 0 acknowledges, the job is
    requeued at once (not at grace end) and later resumes from exactly the acknowledged step and completes."""
    work, dataset, repo = prepared_ds
    env, backend = cluster.env, cluster.backend
    store = ObjectStore.from_env(env)
    policy = apply_example_policy(cluster, tmp_path, grace_s=60, min_run_s=0)
    log_path = tmp_path / "controller.log"
    members = tuple(MEMBERS.values())
    cancel_jobs_of(cluster, members)
    try:
        with controller_process(cluster, policy, log_path):
            # perception's 24-GPU quota, controls' and simulation's: 6 of the 8 nodes busy, prediction's idle
            sleepers = [_submit(cluster, "perception") for _ in range(3)]
            fillers = [_submit(cluster, t) for t in ("simulation", "simulation", "controls")]
            for job_id in sleepers + fillers:
                backend.wait_for_job(job_id, {JobPhase.RUNNING}, timeout_s=60)
            run = scenario.submit(env, work, dataset, repo, deepspeed=True, steps=700, step_time_s=0.05,
                                  ckpt_interval_s=CKPT_INTERVAL_S)  # fmt: skip
            job = wait_until(lambda: (j := backend.find_job(run.job_id)) and j.phase == JobPhase.RUNNING and j, 90,
                             "the DeepSpeed job to run on borrowed GPUs")  # fmt: skip
            assert job.qos == "b-perception", job
            wait_until(lambda: latest_committed_step(store, run.team, run.name), 120, "a committed checkpoint")
            claimant = _submit(cluster, "prediction")  # a whole node: only the DeepSpeed job's can be freed
            wait_until(lambda: (j := backend.find_job(run.job_id)) and j.restart_count >= 1, 90,
                       "the DeepSpeed borrower to be requeued")  # fmt: skip
            backend.wait_for_job(claimant, {JobPhase.RUNNING}, timeout_s=60)
            heard = controller_progress(cluster, run.job_id)  # through the node agent, never the job comment
            assert heard is not None and heard.ack_step is not None, heard
            acked = heard.ack_step
            load_manifest(store, run.team, run.name, acked)  # an ack promises a committed checkpoint
            controller_log = log_path.read_text()
            assert f"decision=Preempt job={run.job_id} " in controller_log, controller_log[-3000:]
            assert "requeued after ack" in controller_log, controller_log[-3000:]
            # give the GPUs back: the requeued run starts again and resumes from the acknowledged step
            cluster.run(["scancel", str(claimant), *map(str, sleepers)], check=False)
            final = backend.wait_for_job(run.job_id, timeout_s=300)
        log = _completed_log(run, final)
        assert final.restart_count == 1
        assert _resumed_step(log) == acked, log[-3000:]
        _check_continuous(log, acked)
    finally:
        cancel_jobs_of(cluster, members)
