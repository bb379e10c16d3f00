"""The dev cluster behaves like a real GPU cluster: gang starts, topology, GPUs per node, drain/resume, read-back.

Every test talks to real slurmctld/slurmd/slurmdbd through the adapter (nuro.slurm.CliBackend) or plain Slurm
clients, never a mock.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest

from nuro.slurm import JobInfo, JobPhase, SlurmError
from tests.integration.conftest import TEST_ACCOUNT, TEST_TOPOLOGY, LiveCluster, wait_until

pytestmark = pytest.mark.slurm


def _job(cluster: LiveCluster, job_id: int) -> JobInfo | None:
    return next((j for j in cluster.backend.jobs() if j.job_id == job_id), None)


def _wait_phase(cluster: LiveCluster, job_id: int, phases: set[JobPhase] | None = None) -> JobInfo:
    return cluster.backend.wait_for_job(job_id, phases, timeout_s=60)


def _run_to_end(cluster: LiveCluster, script: str, out: Path, *args: str) -> tuple[JobInfo, list[str]]:
    job_id = cluster.backend.submit(script, f"--output={out}", *args)
    job = _wait_phase(cluster, job_id)
    assert job.phase == JobPhase.COMPLETED, f"job {job_id} ended {job.state}: {out.read_text()}"
    return job, out.read_text().split("\n")


def _cancel_quietly(cluster: LiveCluster, job_id: int) -> None:
    """Clean-up cancel: a job that already ended makes scancel complain, which is fine here."""
    with contextlib.suppress(SlurmError):
        cluster.backend.cancel(job_id)


def _task_lines(lines: list[str]) -> list[list[str]]:
    return [line.split() for line in lines if line.startswith("TASK ")]


def test_four_node_gang_starts_together(cluster: LiveCluster, shared_tmp: Path) -> None:
    script = (
        "#!/bin/bash\n#SBATCH --nodes=4 --ntasks-per-node=1 --job-name=gang4\n"
        "srun bash -c 'echo TASK $SLURMD_NODENAME $(date +%s.%N)'\n"
    )
    job, lines = _run_to_end(cluster, script, shared_tmp / "gang.out")
    tasks = _task_lines(lines)
    nodes = sorted(t[1] for t in tasks)
    assert len(tasks) == 4 and len(set(nodes)) == 4, lines
    assert sorted(job.nodes) == nodes
    starts = [float(t[2]) for t in tasks]
    # together: one allocation of all four nodes, one srun launch (slack for a loaded box; a job that got its nodes
    # one at a time would show the scheduler's cycles between them, and a 4-node job cannot start with fewer)
    assert max(starts) - min(starts) < 5.0, f"tasks started {max(starts) - min(starts):.3f} s apart"


#: How a job asks to stay within one leaf: topology/tree's --switches, topology/block's --segment (whole job = one
#: segment, so all of it in one block).
ONE_LEAF = {"tree": "--switches=1@0:10", "block": "--segment=4"}


@pytest.mark.every_slurm
def test_a_gang_asking_for_one_leaf_lands_on_a_single_leaf(cluster: LiveCluster, shared_tmp: Path) -> None:
    """With gpu001 busy, leaf01 has only 3 free nodes: a 4-node job that asks for one leaf (--switches=1 on
    topology/tree, --segment=4 on topology/block) must take leaf02 whole. The adapter reads either topology."""
    leaf_of = {n.name: n.switch for n in cluster.backend.nodes()}
    assert leaf_of["gpu001"] == "leaf01" and leaf_of["gpu008"] == "leaf02", leaf_of
    blocker = cluster.backend.submit(
        "#!/bin/bash\nsleep 300\n", "--nodelist=gpu001", "--nodes=1", f"--output={shared_tmp}/blocker.out"
    )
    try:
        _wait_phase(cluster, blocker, {JobPhase.RUNNING})
        script = f"#!/bin/bash\n#SBATCH --nodes=4 --exclusive {ONE_LEAF[TEST_TOPOLOGY]}\nsrun hostname\n"
        job, _ = _run_to_end(cluster, script, shared_tmp / "leaf.out")
        leaves = {leaf_of[n] for n in job.nodes}
        assert leaves == {"leaf02"}, f"job ran on {job.nodes} across {leaves}"
    finally:
        _cancel_quietly(cluster, blocker)


def test_eight_gpus_visible_on_every_node(cluster: LiveCluster, shared_tmp: Path) -> None:
    script = (
        "#!/bin/bash\n#SBATCH --nodes=2 --ntasks-per-node=1 --gpus-per-node=8\n"
        "srun bash -c 'echo TASK $SLURMD_NODENAME $SLURM_GPUS_ON_NODE $CUDA_VISIBLE_DEVICES'\n"
    )
    job, lines = _run_to_end(cluster, script, shared_tmp / "gpus.out")
    tasks = _task_lines(lines)
    assert len(tasks) == 2, lines
    for _, node, gpus_on_node, visible in tasks:
        assert gpus_on_node == "8", f"{node}: SLURM_GPUS_ON_NODE={gpus_on_node}"
        assert visible.split(",") == [str(i) for i in range(8)], f"{node}: CUDA_VISIBLE_DEVICES={visible}"
    assert job.gpus_per_node == 8


def test_drained_node_takes_no_job_until_resumed(cluster: LiveCluster, shared_tmp: Path) -> None:
    backend = cluster.backend
    backend.drain("gpu008", "nuro test: drain")
    try:
        node = next(n for n in backend.nodes() if n.name == "gpu008")
        assert node.is_drained and node.reason == "nuro test: drain", node
        job_id = backend.submit("#!/bin/bash\nhostname\n", "--nodelist=gpu008", f"--output={shared_tmp}/d.out")
        pending = _wait_phase(cluster, job_id, {JobPhase.PENDING})
        wait_until(
            lambda: (_job(cluster, job_id) or pending).reason not in (None, "", "None"),
            20,
            f"job {job_id} to get a pending reason",
        )
        job = _job(cluster, job_id)
        assert job is not None and job.phase == JobPhase.PENDING and job.reason in ("ReqNodeNotAvail", "Resources")
    finally:
        backend.resume("gpu008")
    done = _wait_phase(cluster, job_id)
    assert done.phase == JobPhase.COMPLETED and list(done.nodes) == ["gpu008"], done
    assert not next(n for n in backend.nodes() if n.name == "gpu008").is_drained


def test_adapter_reads_back_what_sbatch_set(cluster: LiveCluster, shared_tmp: Path) -> None:
    """A job submitted by a team member with plain sbatch is read back field by field through the adapter."""
    comment = '{"note":"r-123","x":1}'
    res = cluster.run(
        [
            "sbatch", "--parsable", "--job-name=readback", f"--account={TEST_ACCOUNT}", "--nodes=2",
            "--gres=gpu:4", "--requeue", f"--comment={comment}", "--hold",
            f"--output={shared_tmp}/rb.out", "--wrap", "sleep 1",
        ],
        user="nuro-alice",
    )  # fmt: skip
    job_id = int(res.stdout.strip().split(";")[0])
    try:
        job = _wait_phase(cluster, job_id, {JobPhase.PENDING})
        assert job.name == "readback"
        assert job.user == "nuro-alice"
        assert job.account == TEST_ACCOUNT
        assert job.qos == "normal"
        assert job.node_count == 2
        assert job.gpus_per_node == 4
        assert job.comment == comment
        assert job.requeue is True
        assert job.restart_count == 0
        assert job.submit_time is not None
        cluster.backend.release(job_id)
        done = _wait_phase(cluster, job_id)
        assert done.phase == JobPhase.COMPLETED and len(done.nodes) == 2 and done.start_time is not None
    finally:
        _cancel_quietly(cluster, job_id)
